"""No import circles between files: the engine (``rust/core/src``) and the package
(``kvikpy/``) each keep one direction, a file never imports (directly or through others)
a file that imports it. Rust arrows are ``crate::``/``super::``/``self::`` paths (outside
comments); Python arrows are every ``import`` in the file, those inside functions too."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINE = ROOT / "rust" / "core" / "src"
PACKAGE = ROOT / "kvikpy"

Graph = dict[str, set[str]]

# Comments, strings (raw ones too) and char literals, in one pass so that "s3://" is a string.
_NOT_CODE = re.compile(
    r'//[^\n]*|/\*.*?\*/|r(#*)".*?"\1|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'', re.S
)


def _rust_module(path: pathlib.Path, root: pathlib.Path) -> tuple[str, ...]:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def _expand(text: str, start: int) -> tuple[list[list[str]], int]:
    """The paths of one ``a::b::{c, d::e}`` tail from ``start``; returns them and the end."""
    paths: list[list[str]] = [[]]
    i = start
    while i < len(text):
        m = re.compile(r"\s*::\s*(\w+|\{)").match(text, i)
        if not m:
            break
        i = m.end()
        if m.group(1) != "{":
            for p in paths:
                p.append(m.group(1))
            continue
        inner: list[list[str]] = []
        while True:
            w = re.compile(r"\s*(\w+|\})\s*").match(text, i)
            if not w or w.group(1) == "}":
                i = w.end() if w else i
                break
            sub, i = _expand(text, w.end())
            inner += [[w.group(1), *s] for s in sub]
            comma = re.compile(r"\s*(?:as\s+\w+\s*)?,?").match(text, i)
            i = comma.end() if comma else i
        paths = [p + s for p in paths for s in inner] or paths
        break
    return paths, i


def _rust_paths(text: str, module: tuple[str, ...]) -> list[tuple[tuple[str, ...], bool]]:
    """Every crate path that ``text`` names, made absolute, and whether a ``pub use`` names it."""
    children = "|".join(re.findall(r"\bmod\s+(\w+)\s*;", text)) or "(?!)"
    lead = re.compile(rf"(?<![\w:])(crate|super|self|{children})(?=\s*::)")
    exported = [m.span() for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\b[^;]*;", text)]
    found = []
    for m in lead.finditer(text):
        word = m.group(1)
        base = {"crate": (), "self": module, "super": module[:-1]}.get(word, (*module, word))
        public = any(a <= m.start() < b for a, b in exported)
        for tail in _expand(text, m.end())[0]:
            root = base
            while tail and tail[0] == "super":
                root, tail = root[:-1], tail[1:]
            found.append(((*root, *tail), public))
    return found


def rust_graph(root: pathlib.Path) -> Graph:
    """File -> the files whose items it names, for every ``.rs`` under ``root``.

    Unit tests (from the first ``#[cfg(test)]`` module on) are left out, and a name that a
    file only hands on (``pub use``) is followed to the file that defines it.
    """
    files = {_rust_module(p, root): p.relative_to(root).as_posix() for p in root.rglob("*.rs")}
    named: dict[str, list[tuple[tuple[str, ...], bool]]] = {}
    handed_on: dict[str, dict[str, tuple[str, ...]]] = {}
    for module, name in files.items():
        text = _NOT_CODE.sub(" ", (root / name).read_text())
        text = re.split(r"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:\s]*\))?\s+)?mod\s", text)[0]
        named[name] = _rust_paths(text, module)
        handed_on[name] = {full[-1]: full for full, public in named[name] if public and full}

    def owner(full: tuple[str, ...], depth: int = 0) -> str:
        # The longest prefix that is a file of the crate, through any `pub use` it holds.
        cut = max(c for c in range(len(full) + 1) if full[:c] in files)
        target, tail = files[full[:cut]], full[cut:]
        again = handed_on[target].get(tail[0]) if tail else None
        if again is not None and again != full and depth < 8:
            return owner((*again, *tail[1:]), depth + 1)
        return target

    graph: Graph = {name: set() for name in files.values()}
    for name, paths in named.items():
        graph[name] = {owner(full) for full, _ in paths} - {name}
    return graph


def _py_module(path: pathlib.Path, root: pathlib.Path) -> tuple[str, ...]:
    parts = (root.name, *path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def python_graph(root: pathlib.Path) -> Graph:
    """File -> the package's files it imports (anywhere in the file)."""
    files = {_py_module(p, root): p.relative_to(root).as_posix() for p in root.rglob("*.py")}
    graph: Graph = {name: set() for name in files.values()}
    # The compiled extension (its stub stands for it) is a leaf: it imports nothing here.
    files |= {_py_module(p, root): p.relative_to(root).as_posix() for p in root.rglob("*.pyi")}
    for module, name in files.items():
        if name.endswith(".pyi"):
            continue
        package = module if name.endswith("__init__.py") else module[:-1]
        for node in ast.walk(ast.parse((root / name).read_text())):
            targets: list[tuple[str, ...]] = []
            if isinstance(node, ast.Import):
                targets = [tuple(a.name.split(".")) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else ()
                if node.module:
                    base = (*base, *node.module.split("."))
                # `from a import b` names the file a/b.py when there is one, else a itself.
                targets = [
                    (*base, a.name) if (*base, a.name) in files else base for a in node.names
                ]
            for target in targets:
                for cut in range(len(target), 0, -1):
                    hit = files.get(target[:cut])
                    if hit is not None:
                        if hit != name:
                            graph[name].add(hit)
                        break
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected groups of more than one file (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_parsers_see_the_trees():
    engine, package = rust_graph(ENGINE), python_graph(PACKAGE)
    assert len(engine) > 20 and sum(map(len, engine.values())) > 50
    assert "error.rs" in engine["source/posix.rs"]
    assert "source/base.rs" in engine["source/posix.rs"]
    assert len(package) > 20 and "_lib.pyi" in package["cufile.py"]
    assert "defaults.py" in package["__init__.py"]


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_rust_paths_are_expanded(tmp_path: pathlib.Path):
    (tmp_path / "lib.rs").write_text("mod a; mod b; mod d;\npub use d::Y;\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mod.rs").write_text("use crate::{b::X, c};\n// crate::d::Y\n")
    (tmp_path / "a" / "leaf.rs").write_text("use super::super::b;\nfn f() { super::g() }\n")
    (tmp_path / "b.rs").write_text(
        "fn f() { crate::a::leaf::h(crate::Y) }\n#[cfg(test)]\nmod tests { use super::*; }\n"
    )
    (tmp_path / "d.rs").write_text("")
    graph = rust_graph(tmp_path)
    assert graph["a/mod.rs"] == {"b.rs", "lib.rs"}
    assert graph["a/leaf.rs"] == {"b.rs", "a/mod.rs"}
    assert graph["b.rs"] == {"a/leaf.rs", "d.rs"}
    assert graph["lib.rs"] == {"d.rs"}


def test_no_import_circles_in_the_engine():
    assert circles(rust_graph(ENGINE)) == []


def test_no_import_circles_in_the_package():
    assert circles(python_graph(PACKAGE)) == []


def folded(graph: Graph) -> Graph:
    """``graph`` with the files of each folder made one node named after the folder (the
    rooms of a plan of the tree), so that a file of a folder importing a file above the
    folder while another file of it is imported from there shows as a circle too."""

    def room(name: str) -> str:
        return name.split("/", 1)[0] + "/" if "/" in name else name

    out: Graph = {}
    for name, targets in graph.items():
        out.setdefault(room(name), set()).update(room(t) for t in targets)
    for node, targets in out.items():
        targets.discard(node)
    return out


def test_a_circle_through_a_folder_is_found():
    graph = {"s/a.rs": {"r.rs"}, "r.rs": {"s/b.rs"}, "s/b.rs": set()}
    assert circles(graph) == []
    assert circles(folded(graph)) == [["r.rs", "s/"]]


def test_no_circles_between_the_engine_folders():
    assert circles(folded(rust_graph(ENGINE))) == []


def test_no_circles_between_the_package_folders():
    assert circles(folded(python_graph(PACKAGE))) == []
