"""The rendered API reference (docs/api.md through mkdocstrings) tells the truth.

Checked on the HTML that users read, not on the docstrings: every function and method
with parameters has a Parameters table with one row per parameter of its signature, in
order, and nothing else; no row stands for several parameters or exceptions
(numpy-style ``offset, size`` entries render as two rows sharing one description and the
first one's type and default); ``read()``'s rows carry their own types and defaults; every
public name is rendered; the protocol methods have their section.

``make docs`` builds site/ and runs this module on it (``KVIKPY_SITE_DIR``); run alone,
the module builds the site into a temporary folder first (about two seconds).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

import kvikpy

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Rendered:
    """One object of the reference: its anchor, heading text and sections' table rows."""

    id: str
    heading: str = ""
    sections: dict[str, list[list[str]]] = field(default_factory=dict)


class ReferenceParser(HTMLParser):
    """Collects mkdocstrings' objects (``<hN class="doc doc-heading" id=...>``) and the
    rows of their section tables (Parameters, Returns, Raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: list[Rendered] = []
        self._heading_tag: str | None = None
        self._in_title = False
        self._title: list[str] = []
        self._rows: list[list[str]] | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.anchors: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.anchors.add(str(a["id"]))
        classes = (a.get("class") or "").split()
        if re.fullmatch(r"h[1-6]", tag) and "doc-heading" in classes and a.get("id"):
            self.objects.append(Rendered(str(a["id"])))
            self._heading_tag = tag
        elif tag == "span" and "doc-section-title" in classes:
            self._in_title, self._title = True, []
        elif tag == "tr" and "doc-section-item" in classes and self._rows is not None:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == self._heading_tag:
            self._heading_tag = None
        elif tag == "span" and self._in_title:
            self._in_title = False
            title = "".join(self._title).strip().rstrip(":")
            if self.objects:
                self._rows = self.objects[-1].sections.setdefault(title, [])
        elif tag == "td" and self._cell is not None and self._row is not None:
            self._row.append(re.sub(r"\s+", " ", "".join(self._cell)).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._rows is not None:
            self._rows.append(self._row)
            self._row = None
        elif tag == "table":
            self._rows = None

    def handle_data(self, data: str) -> None:
        if self._heading_tag and self.objects:
            self.objects[-1].heading += data
        if self._in_title:
            self._title.append(data)
        if self._cell is not None:
            self._cell.append(data)


def signature_parameters(heading: str) -> list[str] | None:
    """The parameter names in a rendered heading ``name(a, *, b=1, **kw) ¶``, stars kept
    on ``*args``/``**kwargs``; None for headings without a call signature (properties,
    modules, classes shown without one)."""
    text = re.sub(r"\s+", "", heading)
    start = text.find("(")
    if start < 0:
        return None
    depth, end = 0, None
    for i in range(start, len(text)):
        depth += text[i] in "([{"
        depth -= text[i] in ")]}"
        if depth == 0:
            end = i
            break
    assert end is not None, heading
    inner = text[start + 1 : end]
    parts, depth, current = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        current += ch
    if current:
        parts.append(current)
    names = [p.split("=")[0].split(":")[0] for p in parts]
    return [n for n in names if n not in ("*", "/", "self", "cls")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("KVIKPY_SITE_DIR")
    if given:
        path = Path(given)
        assert (path / "api" / "index.html").is_file(), f"no built site in {path}"
        return path
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.skip("mkdocs is not installed here (make test installs it)")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def reference(site: Path) -> ReferenceParser:
    parser = ReferenceParser()
    parser.feed((site / "api" / "index.html").read_text(encoding="utf-8"))
    assert parser.objects, "the API page rendered no objects"
    return parser


def by_id(reference: ReferenceParser) -> dict[str, Rendered]:
    return {o.id: o for o in reference.objects}


def test_the_parser_sees_a_combined_entry():
    # What the check below looks for, on a hand-made page rendered the way mkdocstrings
    # renders a numpy-style "offset, size" entry: two rows, one description.
    page = """
    <h3 id="m.f" class="doc doc-heading"><code>f(offset=0, size=None)</code></h3>
    <p><span class="doc-section-title">Parameters:</span></p>
    <table><tbody>
    <tr class="doc-section-item"><td><code>offset</code></td><td>int</td>
      <td>The byte range.</td><td>0</td></tr>
    <tr class="doc-section-item"><td><code>size</code></td><td>int</td>
      <td>The byte range.</td><td>0</td></tr>
    </tbody></table>"""
    parser = ReferenceParser()
    parser.feed(page)
    (obj,) = parser.objects
    assert signature_parameters(obj.heading) == ["offset", "size"]
    assert combined_rows(obj) == [("offset", "size")]


def combined_rows(obj: Rendered) -> list[tuple[str, str]]:
    """Pairs of Parameters rows that share one description: a combined entry."""
    rows = obj.sections.get("Parameters", [])
    seen: dict[str, str] = {}
    pairs = []
    for row in rows:
        name, description = row[0], row[2]
        if description in seen:
            pairs.append((seen[description], name))
        else:
            seen[description] = name
    return pairs


def test_no_entry_stands_for_several_names(reference):
    for obj in reference.objects:
        assert not combined_rows(obj), f"{obj.id}: combined parameter entries"
        for title, rows in obj.sections.items():
            for row in rows:
                if title in ("Parameters", "Raises"):
                    assert "," not in row[0], f"{obj.id} {title}: {row[0]!r} names several"


def test_every_parameter_has_its_own_row(reference):
    checked = 0
    for obj in reference.objects:
        params = signature_parameters(obj.heading)
        if not params:
            continue
        rows = [row[0] for row in obj.sections.get("Parameters", [])]
        assert rows == params, f"{obj.id}: documented {rows}, signature has {params}"
        checked += 1
    assert checked >= 30, f"only {checked} signatures found: did the page layout change?"


def test_read_rows_have_their_own_types_and_defaults(reference):
    rows = {row[0]: row for row in by_id(reference)["kvikpy.read"].sections["Parameters"]}
    _, type_, _, default = rows["offset"]
    assert (type_, default) == ("int", "0")
    _, type_, _, default = rows["size"]
    assert type_.replace(" ", "") == "int|None" and default == "None", rows["size"]
    _, type_, _, default = rows["dtype"]
    assert type_ == "DTypeLike" and default == "'uint8'", rows["dtype"]
    _, type_, _, default = rows["shape"]
    assert type_.replace(" ", "") == "ShapeLike|None", rows["shape"]
    assert default == "None", rows["shape"]
    descriptions = [row[2] for row in rows.values()]
    assert len(set(descriptions)) == len(descriptions)


def test_every_public_name_is_rendered(reference):
    ids = set(by_id(reference))
    missing = []
    for name in kvikpy.__all__:
        if name in ("__version__", "__git_commit__"):
            continue
        candidates = {f"kvikpy.{name}", f"kvikpy.errors.{name}", f"kvikpy.utils.{name}"}
        if not candidates & ids:
            missing.append(name)
    assert not missing, f"public names missing from docs/api.md: {missing}"


def test_buffer_shows_its_user_facing_members_only(reference):
    ids = set(by_id(reference))
    for member in ("ptr", "nbytes", "device", "dtype", "shape", "to_numpy"):
        assert f"kvikpy.Buffer.{member}" in ids
    # allocate and view are the engine's constructors for kvikpy's own modules.
    assert "kvikpy.Buffer.allocate" not in ids
    assert "kvikpy.Buffer.view" not in ids


def test_protocols_have_their_own_section(site):
    page = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="protocols"' in page
    section = page[page.index('id="protocols"') :]
    for name in (
        "__dlpack__",
        "__dlpack_device__",
        "__cuda_array_interface__",
        "__arrow_c_schema__",
        "__arrow_c_array__",
        "__arrow_c_device_array__",
        "__arrow_c_device_stream__",
        "Buffer protocol",
    ):
        assert name in section, name
    for parameter in ("stream", "max_version", "dl_device", "copy", "requested_schema"):
        assert f"<code>{parameter}</code>" in section, parameter
