"""Every entry point of the binding crate runs under ``#[boundary]``, which turns a panic
into ``kvikpy.InternalError``: checked in the source, so a new ``#[pyfunction]`` or
``#[pymethods]`` block without it fails the suite."""

from __future__ import annotations

import pathlib
import re

BINDING = pathlib.Path(__file__).resolve().parents[1] / "rust" / "python" / "src"


def entry_points_without_boundary() -> list[str]:
    missing = []
    for source in sorted(BINDING.rglob("*.rs")):
        lines = source.read_text().splitlines()
        for number, line in enumerate(lines):
            if re.fullmatch(r"\s*#\[(pyfunction|pymethods)\]\s*", line):
                # The attributes stacked above this one, up to the previous item.
                above = []
                k = number - 1
                while k >= 0 and lines[k].strip().startswith(("#[", "///")):
                    above.append(lines[k].strip())
                    k -= 1
                if "#[boundary]" not in above:
                    relative = source.relative_to(BINDING).as_posix()
                    missing.append(f"{relative}:{number + 1}: {line.strip()}")
    return missing


def test_the_binding_sources_are_found():
    assert len(list(BINDING.rglob("*.rs"))) > 5


def test_every_pyfunction_and_pymethods_block_is_under_boundary():
    assert entry_points_without_boundary() == []


def test_the_check_notices_a_missing_boundary(tmp_path, monkeypatch):
    (tmp_path / "a.rs").write_text("/// doc\n#[pyfunction]\nfn f() {}\n")
    (tmp_path / "b.rs").write_text("#[boundary]\n#[pymethods]\nimpl X {}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.rs").write_text("#[pymethods]\nimpl Y {}\n")
    monkeypatch.setattr(__import__(__name__), "BINDING", tmp_path)
    assert entry_points_without_boundary() == ["a.rs:2: #[pyfunction]", "sub/c.rs:1: #[pymethods]"]
