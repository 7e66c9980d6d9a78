"""Rules of the binding crate checked in its source: only ``blocking.rs`` releases the GIL
(through ``without_gil``, which also catches panics), so no other module may call
``py.detach`` (or pyo3's older ``allow_threads``) itself."""

from __future__ import annotations

import pathlib
import re

BINDING = pathlib.Path(__file__).resolve().parents[1] / "rust" / "python" / "src"

# The one module allowed to release the GIL.
GIL_HELPER = "blocking.rs"
RELEASES_THE_GIL = re.compile(r"\.\s*(detach|allow_threads)\s*\(|\ballow_threads\b")


def bare_gil_releases(root: pathlib.Path) -> list[str]:
    """``file:line: text`` for every GIL release outside :data:`GIL_HELPER`."""
    found = []
    for source in sorted(root.rglob("*.rs")):
        relative = source.relative_to(root).as_posix()
        if relative == GIL_HELPER:
            continue
        for number, line in enumerate(source.read_text().splitlines(), start=1):
            code = line.split("//", 1)[0]
            if RELEASES_THE_GIL.search(code):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_the_binding_sources_are_found():
    assert (BINDING / GIL_HELPER).is_file()
    assert len(list(BINDING.rglob("*.rs"))) > 5


def test_only_the_blocking_module_releases_the_gil():
    assert bare_gil_releases(BINDING) == []


def test_the_helper_itself_releases_the_gil():
    """The rule is about where, not whether: the helper is the one place that does."""
    assert RELEASES_THE_GIL.search((BINDING / GIL_HELPER).read_text())


def test_the_check_notices_a_bare_release(tmp_path):
    (tmp_path / GIL_HELPER).write_text("fn f(py: Python<'_>) { py.detach(|| ()) }\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.rs").write_text(
        "// py.detach in a comment is fine\nlet n = py.detach(work);\n"
    )
    (tmp_path / "b.rs").write_text("py.allow_threads(|| ())\n")
    (tmp_path / "c.rs").write_text("without_gil(py, work)\n")
    assert bare_gil_releases(tmp_path) == [
        "b.rs:1: py.allow_threads(|| ())",
        "sub/a.rs:2: let n = py.detach(work);",
    ]
