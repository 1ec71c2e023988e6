"""Every command line the docs show runs as written. The `snakemake ...` and `pmlm ...` lines of README.md, docs/*.md
and the comments of config/*.yaml and profiles/*/config.yaml (code blocks, indented or fenced, with their continuation lines joined, and inline
code spans) are collected; each `snakemake` line plans, as a dry run (`-n` added), from a copy of the checkout with no
network, and each `pmlm` line is parsed by the CLI's own parser without running, so that an unknown option, a
missing required argument or a wrong choice fails. A line nothing can check is listed in SKIPPED with the reason, so
that a new line the test cannot read fails instead of passing unseen.

How a line is read. A code line's comment (`  # ...`) is dropped, and so is what follows three spaces (docs/cli.md's
descriptions). docs/cli.md's synopsis notation is expanded: `[--opt X]` is checked left out and put in (each of
`[a | b]` in turn), and `a|b` within a word is checked one alternative at a time. `...` for more of the same is
dropped; a line that ends in `...` elides the rest, and an inline code span names a command in prose, often in part:
for both, what is shown is checked (subcommand, step, options, values) but required arguments may be missing. An
upper-case word (`N`, `MODEL`, `DIR`) stands for a value: it is accepted where the option's type or choices would
refuse it literally, and a span may end in an option without its value (prose naming the option)."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pmlm.cli import SUBCOMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CONFIGS = sorted((REPO / "config").rglob("*.yaml")) + sorted((REPO / "profiles").glob("*/config.yaml"))
COMMAND = re.compile(r"(snakemake|pmlm)(?=\s|$)")
PLACEHOLDER = re.compile(r"\$?[A-Z][A-Z0-9_]*")
ELIDED = "..."
DRY_RUN_SECONDS = 300
# where a run writes (results, downloads, logs): a dry run leaves them absent
OUTPUT_FOLDERS = ("results", "resources", "logs", "benchmarks")
# a download the dry run attempted would go here and fail at once: a dry run only plans
NO_NETWORK = dict.fromkeys(("http_proxy", "https_proxy", "ftp_proxy", "all_proxy"), "http://127.0.0.1:9")

# Lines no check can run, by their text (comment dropped, continuations joined) -> why. An entry no page shows any more
# fails test_skipped_lines_are_still_documented.
SKIPPED: dict[str, str] = {
    "snakemake --report report.html": "reports a finished run's outputs; the dry run has none",
    "snakemake --sdm conda": "needs conda, which the test machine lacks (envs/*.yaml, docs/configuration.md)",
    "snakemake -n --profile slurm ...": "`...` stands for the rest of a command shown before it",
    "snakemake --profile slurm inference --configfile CONFIG": "CONFIG stands for a config with an inference section",
    "pmlm X": "X stands for any subcommand",
    "pmlm <command> --help": "<command> stands for any subcommand",
    "pmlm report <name> --help": "<name> stands for any step of pmlm report",
    "pmlm synth --seed 1000 s + g": "a formula for a family's seed (1000 s + g), not a command line",
}
# Lines that fail because the code, not the doc, is wrong -> the error (strict: the test says when it is fixed).
BROKEN: dict[str, str] = {}


@dataclass(frozen=True)
class Line:
    """A documented command line: where it is, its text, and whether it is an inline span (prose, often partial)."""

    where: str
    text: str
    inline: bool


def _command(text: str) -> str | None:
    """The command of a code line or span, or None: not a command (`pmlm.load`, `pmlm` alone as a name, a log line
    quoting a command's own output, `pmlm launch: ...`)."""
    text = text.strip().removeprefix("$ ")
    words = text.split()
    if not COMMAND.match(text) or (words[0] == "pmlm" and len(words) == 1):
        return None
    if len(words) > 1 and words[1].endswith(":"):
        return None
    return text


def _code_line(text: str) -> str:
    """A code line without its comment and without docs/cli.md's description after three spaces."""
    text = re.split(r"\s+#(?:\s|$)", text)[0]
    return re.split(r"\s{3,}", text.strip())[0]


def _spans(paragraph: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each inline code span of a paragraph, a span's line breaks as spaces."""
    text = "\n".join(line for _, line in paragraph)
    for match in re.finditer(r"(`+)(.+?)\1", text, flags=re.S):
        number = paragraph[0][0] + text.count("\n", 0, match.start())
        yield number, re.sub(r"\s*\n\s*", " ", match.group(2))


def _joined(code: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Code lines with a trailing backslash joined to the next."""
    pending: tuple[int, str] | None = None
    for number, line in code:
        if pending:
            number, line = pending[0], pending[1] + " " + line.strip()
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1].rstrip())
            continue
        pending = None
        yield number, line


def _paragraphs(prose: list[tuple[int, str]]) -> Iterator[list[tuple[int, str]]]:
    paragraph: list[tuple[int, str]] = []
    for number, line in prose:
        if line.strip():
            paragraph.append((number, line))
        elif paragraph:
            yield paragraph
            paragraph = []
    if paragraph:
        yield paragraph


def markdown_lines(path: Path) -> Iterator[Line]:
    """The command lines of a Markdown page: fenced and indented code blocks, and inline code spans."""
    where = str(path.relative_to(REPO))
    code, prose, fence, indented, after_blank = [], [], None, False, True
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if fence:
            if line.strip().startswith(fence):
                fence = None
                code.append((number, ""))  # ends a continuation
            else:
                code.append((number, line))
            continue
        opening = re.match(r"\s*(```+|~~~+)", line)
        if opening:
            fence = opening.group(1)
            prose.append((number, ""))
            continue
        if line.strip() and line.startswith("    ") and (indented or after_blank):
            indented = True
            code.append((number, line))
        elif line.strip():
            indented = False
            prose.append((number, line))
        else:
            prose.append((number, ""))
        after_blank = not line.strip()
    for number, line in _joined(code):
        text = _command(_code_line(line))
        if text:
            yield Line(f"{where}:{number}", text, inline=False)
    for paragraph in _paragraphs(prose):
        for number, span in _spans(paragraph):
            text = _command(span)
            if text:
                yield Line(f"{where}:{number}", text, inline=True)


def config_lines(path: Path) -> Iterator[Line]:
    """The command lines of a config's (or a profile's) comments: indented ones (`#   snakemake ...`) and inline code
    spans."""
    where = str(path.relative_to(REPO))
    comments = [
        (number, line.lstrip()[1:] if line.lstrip().startswith("#") else "")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
    ]
    code = [(number, text) for number, text in comments if re.match(r"\s{2,}\S", text)]
    for number, line in _joined(code):
        text = _command(_code_line(line)) if re.match(r"\s*(snakemake|pmlm)\s", line) else None
        if text:
            yield Line(f"{where}:{number}", text, inline=False)
    for paragraph in _paragraphs(comments):
        for number, span in _spans(paragraph):
            text = _command(span)
            if text:
                yield Line(f"{where}:{number}", text, inline=True)


def documented_lines() -> list[Line]:
    return [line for page in PAGES for line in markdown_lines(page)] + [
        line for config in CONFIGS for line in config_lines(config)
    ]


LINES = documented_lines()


def _cases(program: str) -> list:
    """One test per distinct line of a program (and way of reading it), with every place it is written."""
    found: dict[tuple[str, bool], list[str]] = {}
    for line in LINES:
        if line.text.split()[0] == program:
            inline = line.inline and program == "pmlm"  # a snakemake span runs as it is
            found.setdefault((line.text, inline), []).append(line.where)
    cases = []
    for (text, inline), where in sorted(found.items()):
        marks = []
        if text in SKIPPED:
            marks.append(pytest.mark.skip(reason=SKIPPED[text]))
        elif text in BROKEN:
            marks.append(pytest.mark.xfail(strict=True, reason=BROKEN[text]))
        cases.append(pytest.param(text, inline, where, marks=marks, id=text))
    return cases


# --- pmlm: parsed, not run ---------------------------------------------------------------------------------------


def variants(text: str) -> list[list[str]]:
    """The argument lists a synopsis stands for: optional groups left out, then each put in alone (each of its
    `|` alternatives in turn); within a word, `a|b` as each alternative; `...` dropped."""
    groups = list(re.finditer(r"\[([^\[\]]*)\]", text))

    def filled(chosen: dict[int, str]) -> str:
        pieces, start = [], 0
        for index, group in enumerate(groups):
            pieces += [text[start : group.start()], chosen.get(index, "")]
            start = group.end()
        return "".join(pieces) + text[start:]

    alternatives = [re.split(r"\s+\|\s+", group.group(1).strip()) for group in groups]
    texts = [filled({})] + [filled({i: each}) for i, group in enumerate(alternatives) for each in group]
    argvs = []
    for variant in texts:
        words = [word for word in shlex.split(variant) if word != ELIDED]
        first = [word.split("|")[0] if word != "|" else word for word in words]
        argvs.append(first)
        for i, word in enumerate(words):
            if "|" in word and word != "|":
                argvs += [[*first[:i], each, *first[i + 1 :]] for each in word.split("|")[1:]]
    return [list(argv) for argv in dict.fromkeys(map(tuple, argvs))]


class _Refused(Exception):
    pass


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


def _checking_parser(command: str | None, partial: bool) -> argparse.ArgumentParser:
    """pmlm's parser, refusing with an exception instead of exiting; placeholders taken as values; with `partial`,
    no argument required."""
    parser = build_parser(command)
    for each in _parsers(parser):

        def refuse(message, prog=each.prog):
            raise _Refused(f"{prog}: error: {message}")

        def get_value(action, arg, original=each._get_value):
            try:
                return original(action, arg)
            except argparse.ArgumentError:
                if PLACEHOLDER.fullmatch(arg):
                    return arg
                raise

        def check_value(action, value, original=each._check_value):
            placeholder = isinstance(value, str) and PLACEHOLDER.fullmatch(value)
            if not (placeholder and not isinstance(action, argparse._SubParsersAction)):
                original(action, value)

        each.error, each._get_value, each._check_value = refuse, get_value, check_value
        if partial:
            for action in each._actions:
                action.required = False
            for group in each._mutually_exclusive_groups:
                group.required = False
    return parser


def parse(argv: list[str], partial: bool = False) -> str | None:
    """None if pmlm's parser takes ``argv`` (the words after `pmlm`), else its error. A partial line may end in an
    option without its value (prose naming the option)."""
    error = _parse(argv, partial)
    if error and partial and argv[-1:] and argv[-1].startswith("-") and re.search(r"expected .*argument", error):
        return _parse([*argv, "VALUE"], partial)
    return error


def _parse(argv: list[str], partial: bool) -> str | None:
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = _checking_parser(command if command in SUBCOMMANDS else None, partial)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except _Refused as refused:
        return str(refused)
    except SystemExit as done:  # --help
        return None if done.code == 0 else f"exit {done.code}"
    return None


PMLM_CASES = _cases("pmlm")


@pytest.mark.parametrize(("text", "inline", "where"), PMLM_CASES)
def test_pmlm_line_parses(text, inline, where):
    partial = inline or text.split()[-1] == ELIDED
    errors = [f"pmlm {' '.join(argv)}: {e}" for argv in variants(text) if (e := parse(argv[1:], partial))]
    assert not errors, f"{', '.join(where)}: {text}\n" + "\n".join(errors)


# --- snakemake: planned as a dry run ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The checkout's files (tracked and new, links as links) in a folder of their own: no results of another run,
    and nothing written into the checkout. What the pages have the reader make first is made as they say:
    docs/proteingym.md's my_proteingym.yaml."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, files):
        source, target = REPO / name, copy / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted, not yet staged
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    proteingym = yaml.safe_load((REPO / "config" / "proteingym.yaml").read_text())
    own = {key: proteingym[key] for key in ("sources", "proteingym")}
    (copy / "my_proteingym.yaml").write_text(yaml.safe_dump(own, sort_keys=False))
    return copy


def dry_run(text: str) -> list[str]:
    argv = shlex.split(text)
    if not {"-n", "--dry-run", "--dryrun"} & set(argv):
        argv.insert(1, "-n")
    return [str(SNAKEMAKE), *argv[1:]]


SNAKEMAKE_CASES = _cases("snakemake")


@pytest.mark.parametrize(("text", "inline", "where"), SNAKEMAKE_CASES)
def test_snakemake_line_plans(text, inline, where, checkout):
    env = {**os.environ, **NO_NETWORK, "no_proxy": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(dry_run(text), cwd=checkout, env=env, capture_output=True, text=True, timeout=DRY_RUN_SECONDS)
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, f"{', '.join(where)}: {text}\n{output}"
    written = [name for name in OUTPUT_FOLDERS if (checkout / name).exists()]
    assert not written, f"{text}: a dry run wrote {written}"


# options that take every word up to the next option, and what each of those words looks like
SEVERAL_VALUES = {"--configfile": r".+\.(ya?ml|json)", "--resources": r"\w+=.+", "--set-resources": r".+=.+"}


def test_targets_come_before_options_of_several_values():
    """`--configfile` takes every word up to the next option as a config file (and `--resources` as a resource), so a
    target written after one is read as a value (`FileNotFoundError: 'pretraining'`): checked on every snakemake line,
    the skipped ones too."""
    wrong = []
    for line in LINES:
        words = line.text.split()
        for i, word in enumerate(words):
            if words[0] != "snakemake" or word not in SEVERAL_VALUES:
                continue
            values = list(itertools.takewhile(lambda w: not w.startswith("-"), words[i + 1 :]))
            if not values or not all(re.fullmatch(SEVERAL_VALUES[word], v) or PLACEHOLDER.fullmatch(v) for v in values):
                wrong.append(f"{line.where}: {line.text}")
    assert not wrong, "targets go before --configfile and --resources:\n" + "\n".join(wrong)


# --- the collection itself ---------------------------------------------------------------------------------------


def test_lines_are_found():
    """The collector reads every kind of place: fenced and indented blocks, inline spans, config comments."""
    places = {line.where.split(":")[0] for line in LINES}
    assert {"README.md", "docs/cli.md", "docs/gpu.md", "docs/huggingface.md", "config/paper.yaml"} <= places
    assert len(PMLM_CASES) >= 80 and len(SNAKEMAKE_CASES) >= 15
    assert any(line.inline for line in LINES) and any(not line.inline for line in LINES)


def test_the_parse_check_refuses_what_pmlm_refuses():
    """An unknown option, a wrong choice, a missing required argument, a value of the wrong type; placeholders pass,
    and a partial line (prose) may leave out what is required."""
    assert "unrecognized arguments: --bogus" in parse(["embed", "M", "F", "-o", "x", "--bogus"])
    assert "invalid choice: 'bogus'" in parse(["embed", "M", "F", "-o", "x", "--unknown", "bogus"])
    assert "required" in parse(["embed", "MODEL"])
    assert "invalid int value: 'n'" in parse(["plan", "--configfile", "c.yaml", "--gpus", "n"])
    assert "invalid choice: 'X'" in parse(["X"], partial=True)
    assert parse(["plan", "--configfile", "c.yaml", "--gpus", "N"]) is None
    assert parse(["plan", "--gpus", "8"], partial=True) is None and "required" in parse(["plan", "--gpus", "8"])
    assert parse(["launch", "--port"], partial=True) is None


def test_skipped_lines_are_still_documented():
    texts = {line.text for line in LINES}
    assert not (set(SKIPPED) | set(BROKEN)) - texts, "entries of lines no page shows any more"
