"""The README is a guide, and the guide and docs/ stay true cheaply: at most 350 lines with a table of contents whose
anchors exist; every relative link of the README and of docs/*.md resolves; every docs/ page is linked from the
README; every `pmlm` command shown in a code block names a real subcommand (and step) and only options its parser
knows."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pmlm.cli import SUBCOMMANDS, build_parser

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


def code_blocks(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)]


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


def commands(text: str) -> list[str]:
    """The `pmlm ...` command lines of the code blocks, continuation lines joined, comments dropped; output lines
    that quote a command's own log (`pmlm launch: ...`) are not commands."""
    found = []
    for block in code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            words = line.split()
            if len(words) >= 2 and words[0] == "pmlm" and not words[1].endswith(":"):
                found.append(line.split(" # ")[0].split("  #")[0])
    return found


DOC_COMMANDS = sorted({(str(p.relative_to(REPO)), c) for p in PAGES for c in commands(p.read_text())})


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_commands_are_found():
    assert len(DOC_COMMANDS) >= 20  # the README's and docs/cli.md's lists are read


@pytest.mark.parametrize(("page", "command"), DOC_COMMANDS)
def test_documented_command_exists(page, command):
    words = command.split()
    name = words[1]
    assert name in SUBCOMMANDS, f"{page}: `pmlm {name}` is not a subcommand ({command})"
    parser = _subparsers(build_parser(name))[name]
    rest = words[2:]
    steps = _subparsers(parser)
    if steps and rest and not rest[0].startswith("-") and rest[0] != "...":
        for step in rest[0].split("|"):
            assert step in steps, f"{page}: `pmlm {name} {step}` is not a step of pmlm {name} ({command})"
        parser, rest = steps[rest[0].split("|")[0]], rest[1:]
    if "--" in rest:
        rest = rest[: rest.index("--")]  # what follows is the command pmlm launch runs
    known = _options(parser)
    for token in re.findall(r"(?<![\w-])(--[a-z][\w-]*|-[a-zA-Z])\b", " ".join(rest)):
        assert token in known, f"{page}: pmlm {name} has no option {token} ({command})"
