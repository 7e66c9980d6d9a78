"""The user documentation (README.md and docs/*.md) states what is, for users: no
development-log wording (issue numbers, commit ids, work sessions, "used to", "fixed the
same day", targets, earlier runs, the build machines' paths), and every page is listed
in docs/index.md and in the site's navigation (mkdocs.yml). History belongs in
CHANGELOG.md, which this check leaves out. ``make test`` runs it with the rest of pytest.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.glob("*.md")])

# Wording of a development log, not of user documentation, and why.
DEV_LOG = {
    r"\bissues? #?\d+": "an issue number",
    r"\bPR #?\d+|\bpull request #?\d+": "a pull request number",
    r"\bsessions?\b(?! token)": "a work session",
    # (kvikio's commits are fine: they say which kvikio a result is of.)
    r"(?<!kvikio )\b(?:commit|build|wheel|revision)s? `?[0-9a-f]{7,40}\b": "a commit id",
    r"(?<![\w/.-])[0-9a-f]{7,12}\.\.[0-9a-f]{7,12}\b": "a commit range",
    r"/root/": "a path on the build machine",
    r"\bused to\b": "history (say what is)",
    r"\bthe same day\b": "history (say what is)",
    r"\bnot lent\b": "the build machines' availability",
    r"\btarget: ": "a development target",
    r"\b(?:an )?earlier run\b": "history (say what is)",
    r"\bwe (?:fixed|found|changed)\b": "history (say what is)",
    r"\b(?:here|there), on the GPU machine\b|\bon the GPU machine\b.*\bhere\b": (
        "the developers' machines"
    ),
    r"`make [\w-]+`\s+here\b|\bhere, then `make|\btar here\b": "the developers' machines",
}

# Pages whose subject is the project's own test runs: they may name the machines.
MACHINE_REPORTS = {"gpu-test-report.md"}


def _lines(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks (commands and output may say anything)."""
    out, fenced = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_user_pages_have_no_development_log_wording(page):
    found = []
    for n, line in _lines(page):
        for pattern, why in DEV_LOG.items():
            if page.name in MACHINE_REPORTS and "machine" in why:
                continue
            m = re.search(pattern, line, re.IGNORECASE)
            if m:
                found.append(f"{page.name}:{n}: {m[0]!r} ({why}): {line.strip()[:120]}")
    assert not found, "development-log wording in user documentation:\n" + "\n".join(found)


def test_the_check_catches_development_log_wording(tmp_path):
    page = tmp_path / "x.md"
    page.write_text(
        "Fixed in issue 12, commit 4cff70e; it used to cost more.\n```\nissue 12\n```\n"
    )
    hits = [p for _, line in _lines(page) for p in DEV_LOG if re.search(p, line, re.I)]
    assert len(hits) == 3, hits


def _linked_pages(text: str) -> set[str]:
    return {m.split("#", 1)[0] for m in re.findall(r"\]\(([^)\s]+\.md(?:#[^)]*)?)\)", text)}


def _nav_pages(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(x) for x in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(v) for v in nav.values())) if nav else set()
    return set()


def test_every_docs_page_is_listed_in_the_index():
    index = _linked_pages((DOCS / "index.md").read_text())
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    missing = sorted(pages - index)
    assert not missing, f"docs/index.md does not list: {missing}"


def test_every_docs_page_is_in_the_site_navigation():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    nav = _nav_pages(config["nav"])
    pages = {p.name for p in DOCS.glob("*.md")}
    assert not sorted(pages - nav), f"mkdocs.yml's nav lacks: {sorted(pages - nav)}"
    assert not sorted(nav - pages), f"mkdocs.yml's nav names missing pages: {sorted(nav - pages)}"


# Names of the tools and machine paths of the workplace kvikpy was developed in: the tree
# speaks of the project and of public tools only.
NOT_OURS = {
    "device" + " tool": "a development tool that is not the project's",
    "search" + " tool": "a development tool that is not the project's",
    "/work" + "/.": "a path on a development machine",
    "/root" + "/out": "a path on a development machine",
}


def test_no_file_of_the_tree_names_the_workplaces_tools_or_paths() -> None:
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False, timeout=60
    )
    if listed.returncode:
        pytest.skip("not a git checkout")
    found = []
    for name in listed.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for needle, why in NOT_OURS.items():
            if needle in text:
                found.append(f"{name}: {needle!r} ({why})")
    assert found == []
