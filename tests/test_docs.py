"""The README is a guide, and the guide and docs/ stay true cheaply: at most 350 lines with a table of contents whose
anchors exist; every relative link of the README and of docs/*.md resolves; every docs/ page is linked from the
README. That every command shown runs as written is tests/test_documented_commands.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 350
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation other than - and _ dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(text: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", _outside_code(text), flags=re.M)}


def _outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def test_readme_is_a_guide_within_its_length():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; details belong in docs/"


def test_readme_has_a_table_of_contents_whose_anchors_exist():
    text = README.read_text()
    section = re.search(r"^## Contents\s*$(.*?)^## ", text, flags=re.M | re.S)
    assert section, "README.md has no '## Contents' section"
    anchors = re.findall(r"\]\(#([^)]+)\)", section.group(1))
    assert len(anchors) >= 5
    assert set(anchors) <= headings(text), set(anchors) - headings(text)
    sections = [slug(h) for h in re.findall(r"^## (.+?)\s*$", _outside_code(text), flags=re.M)]
    assert [s for s in sections if s != "contents"] == anchors, "the contents list every section, in order"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(_outside_code(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        missing_anchor = resolved.exists() and anchor and resolved.suffix == ".md"
        if not resolved.exists() or (missing_anchor and anchor not in headings(resolved.read_text())):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to what does not exist: {broken}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    orphans = [p.name for p in DOCS if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"
