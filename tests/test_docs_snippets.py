"""Every Python block of README.md and docs/getting-started.md runs as written.

The marking convention (stated on both pages): a block runs on its own, in an empty
folder, with only kvikpy and numpy, on any machine, unless its first line is a needs
comment naming what else it needs, for example::

    # needs a GPU and torch

The items after ``# needs`` are separated by ``,`` or ``and``: ``a GPU`` (an NVIDIA GPU
and driver: ``kvikpy.cuda_available()``) or the name of an importable package (``torch``,
``cupy``, ``jax``, ``pyarrow``...). Each block runs in a fresh interpreter in its own
temporary folder, with a timeout; a block that needs something this machine lacks is
skipped, so CI without a GPU runs every other one. A block that uses an optional package
or a GPU without saying so fails here (it would fail for a reader too), and so does a
needs line that does not parse.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import clean_env

import kvikpy

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]
TIMEOUT_S = 120

NEEDS = re.compile(r"#\s*needs\s+(?P<items>.+?)\s*$")
GPU = "a GPU"
# Packages a block may import without a needs line: kvikpy, numpy and the standard library.
PLAIN_IMPORTS = {"kvikpy", "numpy", *sys.stdlib_module_names}


@dataclass(frozen=True)
class Block:
    """One fenced Python block: where it starts, its code and what it says it needs."""

    page: str
    line: int
    code: str
    needs: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse_needs(first_line: str) -> tuple[str, ...] | None:
    """The items of a ``# needs ...`` first line (``("a GPU", "torch")``); None when the
    line is not a needs comment. Raises ValueError for a needs comment that does not parse."""
    m = NEEDS.fullmatch(first_line.strip())
    if not m:
        if re.match(r"#\s*needs\b", first_line.strip()):
            raise ValueError(f"a needs comment without items: {first_line!r}")
        return None
    items = tuple(i.strip() for i in re.split(r",|\band\b", m["items"]) if i.strip())
    for item in items:
        if item != GPU and not re.fullmatch(r"[A-Za-z_][\w.]*", item):
            raise ValueError(f"{first_line!r}: {item!r} is neither {GPU!r} nor a package name")
    return items


def python_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks tagged ``python``, in order."""
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    start, body = 0, []
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is None:
            if stripped.startswith(("```", "~~~")):
                fence = stripped[:3]
                is_python = stripped[3:].strip().lower() in ("python", "py", "python3")
                start, body = (n + 1, []) if is_python else (0, [])
            continue
        if stripped.startswith(fence) and stripped.strip("`~") == "":
            if start:
                code = "\n".join(body) + "\n"
                first = next((b for b in body if b.strip()), "")
                needs = parse_needs(first) or ()
                blocks.append(Block(page.name, start, code, needs))
            fence = None
            continue
        if start:
            body.append(line)
    assert fence is None, f"{page.name}: a fenced block is never closed"
    return blocks


def imported_packages(code: str) -> set[str]:
    """Top-level names of the packages a block imports."""
    names = set(re.findall(r"^\s*import\s+([A-Za-z_]\w*)", code, re.MULTILINE))
    names |= set(re.findall(r"^\s*from\s+([A-Za-z_]\w*)[\w.]*\s+import\b", code, re.MULTILINE))
    return names


def missing(needs: tuple[str, ...]) -> list[str]:
    """What of ``needs`` this machine lacks."""
    out = []
    for item in needs:
        if item == GPU:
            if not kvikpy.cuda_available():
                out.append(item)
        elif importlib.util.find_spec(item.split(".")[0]) is None:
            out.append(item)
    return out


BLOCKS = [b for page in PAGES for b in python_blocks(page)]


def test_the_pages_have_blocks_of_both_kinds():
    assert len(BLOCKS) >= 8, [b.id for b in BLOCKS]
    assert any(not b.needs for b in BLOCKS), "no block runs without a GPU"
    assert any(GPU in b.needs for b in BLOCKS), "no block is marked as needing a GPU"


def test_the_extractor_and_the_convention(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\nimport numpy\n```\n\n```bash\nmake\n```\n"
        "```python\n# needs a GPU, torch and cupy\nimport torch\n```\n"
    )
    plain, marked = python_blocks(page)
    assert (plain.line, plain.code, plain.needs) == (3, "import numpy\n", ())
    assert marked.needs == ("a GPU", "torch", "cupy")
    assert parse_needs("# a comment") is None
    with pytest.raises(ValueError):
        parse_needs("# needs a fast disk")
    with pytest.raises(ValueError):
        parse_needs("# needs")
    assert imported_packages("import torch\nfrom jax.numpy import x\nimport os.path\n") == {
        "torch",
        "jax",
        "os",
    }


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_unmarked_blocks_need_only_kvikpy_and_numpy(block):
    others = imported_packages(block.code) - PLAIN_IMPORTS - set(block.needs)
    assert not others, (
        f"{block.id} imports {sorted(others)}: name them on a first line "
        f"'# needs {', '.join(sorted(others))}'"
    )


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_block_runs_as_written(block, tmp_path):
    lacking = missing(block.needs)
    if lacking:
        pytest.skip(f"needs {', '.join(lacking)}")
    try:
        result = subprocess.run(
            [sys.executable, "-c", block.code],
            cwd=tmp_path,
            env=clean_env(PYTHONSAFEPATH="1"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id} ran past {TIMEOUT_S} s")
    hint = (
        ""
        if block.needs
        else f" (a block that needs a GPU or another package says so: '# needs {GPU}')"
    )
    assert result.returncode == 0, (
        f"{block.id} failed{hint}:\n{block.code}\n--- stderr ---\n{result.stderr[-3000:]}"
    )
