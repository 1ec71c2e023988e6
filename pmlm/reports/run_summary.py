"""The last screen of a run: the tables written and where, each table's headline numbers beside the paper's, the
pre-training losses from the first to the last logged step, the figures, the command that builds the report, and
the run's wall time.

``pmlm summary RESULTS_DIR`` prints it; the Snakefile's ``onsuccess`` prints it when a run that did something ends
(also under ``--profile slurm``, where ``onsuccess`` runs in the submitting Snakemake, never in a job). It reads only
what the rules wrote, CSV tables and metrics logs, with the standard library: no torch, nothing to wait for.

A table is a ``.csv`` with a ``.md`` beside it (``pmlm.reports.tables.write_table`` writes the four forms) under
``RESULTS_DIR/tables`` (the co-evolution study's page, ``RESULTS_DIR/coevolution/curves.md``, is named); the tables of the paper's kinds get their headline columns
(``HEADLINES``), our rows first, then for each objective among ours (the model name up to its first ``-``: MLM,
PMLM) the paper's first row of that objective, so ``PMLM-tiny`` is read beside ``PMLM-base``. Other tables are
listed with their row counts.
"""

from __future__ import annotations

import csv
import os
import shlex
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from pmlm.vocabulary import (
    TABLE_ABLATION,
    TABLE_PRECISION_BY_SEPARATION,
    TABLE_PRETRAIN_SCORES,
    TABLE_RAPTORX_CONTACT,
    TABLE_REMOTE_HOMOLOGY,
    TABLE_SECONDARY_STRUCTURE,
    TABLE_TAPE_CONTACT,
    TABLE_UNSUPERVISED_CONTACT,
)

DEFAULT_REPORT_COMMAND = "snakemake --report report.html"
TABLE_DIRS = ("tables",)  # under the results folder, where the rules write tables
STUDY_REPORT = ("coevolution", "curves.md")  # the co-evolution study's tables, one Markdown page
WIDTH = 118  # of the screen's lines
NAME_WIDTH = 26  # table names are padded to this
TASK_TABLE_COLUMNS = {"test_set", "n", "precision"}  # what marks a task's own table (its metrics between)
MISSING = "–"


@dataclass(frozen=True)
class Headline:
    """A table column worth showing: its CSV name, its label and how to print it."""

    column: str
    label: str
    percent: bool = False  # fractions shown as percentages with one decimal
    digits: int = 3  # decimals otherwise


LOSS = 2  # decimals of a loss
HEADLINES: dict[str, tuple[Headline, ...]] = {
    TABLE_PRETRAIN_SCORES: (
        Headline("l_mlm", "validation L_mlm", digits=LOSS),
        Headline("l_pmlm", "L_pmlm", digits=LOSS),
    ),
    TABLE_TAPE_CONTACT: (Headline("p_l5_s12", "P@L/5, s >= 12 (%)", percent=True),),
    TABLE_RAPTORX_CONTACT: (Headline("p_l_long", "P@L, s >= 24 (%)", percent=True),),
    TABLE_ABLATION: (Headline("p_l_long", "P@L, s >= 24 (%)", percent=True),),
    TABLE_UNSUPERVISED_CONTACT: (Headline("p_l5_s12", "P@L/5, s >= 12 (%)", percent=True),),
    TABLE_PRECISION_BY_SEPARATION: (Headline("P@L_long", "P@L long (%)", percent=True),),
    TABLE_REMOTE_HOMOLOGY: (
        Headline("fold", "fold"),
        Headline("superfamily", "superfamily"),
        Headline("family", "family"),
    ),
}
# secondary_structure: one Q3 column per test set, every column but these
SS3_TABLE, SS3_NOT_TEST_SETS = TABLE_SECONDARY_STRUCTURE, ("source", "model", "data", "head", "features", "precision")
# the order of the screen: the paper's tables as the paper has them, the others after them by name
ORDER = (
    TABLE_PRETRAIN_SCORES,
    TABLE_TAPE_CONTACT,
    TABLE_RAPTORX_CONTACT,
    TABLE_ABLATION,
    SS3_TABLE,
    TABLE_REMOTE_HOMOLOGY,
)


def format_duration(seconds: float) -> str:
    """``75.4`` -> ``1 min 15 s``; under a minute ``42 s``; an hour or more ``1 h 02 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def summary_text(
    results_dir: str | Path,
    *,
    started: float | None = None,
    finished: float | None = None,
    report_command: str = DEFAULT_REPORT_COMMAND,
) -> str:
    """The last screen for ``results_dir``. ``started`` (a ``time.time()`` value) adds the wall time up to
    ``finished`` (default: now) and marks the tables no job of this run wrote."""
    results = Path(results_dir)
    finished = time.time() if finished is None else finished
    lines = []
    if started is not None:
        lines.append(f"pmlm: the run finished in {format_duration(finished - started)} (wall clock).")
    if not results.is_dir():
        lines.append(f"No results under {results} yet.")
        return "\n".join(lines)
    lines += _pretraining_lines(results)
    lines += _table_lines(results, started)
    lines += _figure_lines(results)
    lines.append(f"The report (tables, figures, configuration and versions in one page): {report_command}")
    return "\n".join(lines)


def report_command(snakefile: str | Path, configfiles: list, default_configfile: str | Path) -> str:
    """``snakemake --report report.html`` for the run in the current directory (the workflow's working directory):
    with ``-s`` unless the Snakefile is there, with ``--configfile`` unless the run read only the default config,
    and prefixed with ``cd DIR &&`` unless the shell that started it is there (``$PWD``)."""
    here = Path.cwd().resolve()
    words = ["snakemake", "--report", "report.html"]
    if Path(snakefile).resolve() != here / "Snakefile":
        words += ["-s", str(Path(snakefile).resolve())]
    configs = [Path(f).resolve() for f in configfiles]
    if configs != [Path(default_configfile).resolve()]:
        words += ["--configfile", *(str(c.relative_to(here)) if c.is_relative_to(here) else str(c) for c in configs)]
    shell = os.environ.get("PWD")
    started_here = shell is not None and Path(shell).resolve() == here
    return shlex.join(words) if started_here else f"cd {shlex.quote(str(here))} && {shlex.join(words)}"


def last_screen(
    results_dir: str | Path,
    *,
    started: float,
    snakefile: str | Path,
    configfiles: list,
    default_configfile: str | Path,
) -> str:
    """What the workflow's ``onsuccess`` prints: ``summary_text`` with this run's report command. It never raises:
    the run has succeeded by then, so a summary that fails is one line saying why, not a traceback after it."""
    try:
        command = report_command(snakefile, configfiles, default_configfile)
        return summary_text(results_dir, started=started, report_command=command)
    except Exception as exc:  # any failure here is reported in one line (docstring)
        return f"pmlm summary: no last screen for {results_dir}: {type(exc).__name__}: {exc}"


def _pretraining_lines(results: Path) -> list[str]:
    """One line per pre-training run: the training loss at its first and its last logged step."""
    runs = sorted(results.glob("pretrain_runs/*/*/metrics.csv"))
    lines = []
    for path in runs:
        rows = [r for r in _read_rows(path) or [] if r.get("split") == "train" and _number(r.get("loss")) is not None]
        if not rows:
            continue
        first, last = rows[0], rows[-1]
        name = f"{path.parent.parent.name}/{path.parent.name}"
        text = f"  {name:<{NAME_WIDTH - 2}} {_fall(first, last, 'loss')} (step {first['step']} -> {last['step']})"
        parts = [f"{label} {_fall(first, last, key)}" for key, label in (("l_mlm", "L_mlm"), ("l_pmlm", "L_pmlm"))]
        if _number(last.get("l_pmlm")) is not None:  # a pair objective: both terms
            text += "; " + ", ".join(parts)
        lines.append(text)
    return ["Pre-training, training loss from the first to the last logged step:", *lines] if lines else []


def _fall(first: dict, last: dict, key: str) -> str:
    a, b = _number(first.get(key)), _number(last.get(key))
    return MISSING if a is None or b is None else f"{a:.2f} -> {b:.2f}"


def _table_lines(results: Path, started: float | None) -> list[str]:
    lines = []
    for folder in TABLE_DIRS:
        found = [p for p in (results / folder).glob("*.csv") if p.with_suffix(".md").is_file()]
        tables = sorted(found, key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
        if not tables:
            continue
        forms = "/".join(sorted({s.suffix for t in tables for s in t.parent.glob(t.stem + ".*")}))
        lines.append(f"Tables in {results / folder} ({forms}):")
        for table in tables:
            earlier = started is not None and table.stat().st_mtime < started
            lines += _one_table(table, " (from an earlier run)" if earlier else "")
    study = results.joinpath(*STUDY_REPORT)
    if study.is_file():
        lines.append(
            f"The co-evolution study's tables (its answer with paired tests, curves, baselines, cost): {study}"
        )
    return lines or [f"No tables under {results} yet."]


def _one_table(path: Path, note: str) -> list[str]:
    """The table's name and its headline numbers, ours and the paper's, wrapped to the screen."""
    rows = _read_rows(path)
    name = f"  {path.stem:<{NAME_WIDTH - 2}}"
    if rows is None:
        return [f"{name} (could not be read){note}"]
    ours = [r for r in rows if r.get("source") == "ours"]
    paper = [r for r in rows if r.get("source") == "paper"]
    headlines = _headlines(path.stem, rows, ours)
    if not headlines:
        return [f"{name} {len(rows)} rows{note}"]
    label = _label(headlines)
    ours = [r for r in ours if any(_number(r.get(h.column)) is not None for h in headlines)]
    if not ours:
        return [f"{name} {label}: {'paper rows only, ' if paper else ''}no values of this run{note}"]
    text = f"{name} {label}{note}  ours: " + ", ".join(f"{_row_label(r, ours)} {_values(r, headlines)}" for r in ours)
    out = _wrap(text, NAME_WIDTH + 1)
    theirs = _headlines(path.stem, rows, paper)  # the paper's Q3 is on its own test sets
    reference = _reference_rows(ours, paper, theirs[0])
    if reference:
        label = "" if theirs == headlines else f" ({_label(theirs)})"
        text = f"paper{label}: " + ", ".join(f"{_paper_label(r)} {_values(r, theirs)}" for r in reference)
        out += _wrap(" " * (NAME_WIDTH + 1) + text, NAME_WIDTH + 1)
    return out


def _label(headlines: tuple[Headline, ...]) -> str:
    """``Q3 cb513 / casp12 / ts115`` for test-set columns, else the labels joined."""
    if len(headlines) > 1 and all(h.label.startswith("Q3 ") for h in headlines):
        return "Q3 " + " / ".join(h.column for h in headlines)
    return " / ".join(h.label for h in headlines)


def _wrap(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent=" " * indent, break_on_hyphens=False, drop_whitespace=True)


def _headlines(stem: str, rows: list[dict], shown_rows: list[dict]) -> tuple[Headline, ...]:
    """The columns to show of ``shown_rows`` (for secondary structure: the test sets they have values for)."""
    if stem == SS3_TABLE and rows:
        tests = [c for c in rows[0] if c not in SS3_NOT_TEST_SETS]
        shown = [c for c in tests if any(_number(r.get(c)) is not None for r in shown_rows)] or tests
        return tuple(Headline(c, f"Q3 {c}") for c in shown)
    if stem not in HEADLINES and rows and set(rows[0]) >= TASK_TABLE_COLUMNS:
        # a table of a task of its own (pmlm.reports.task_tables): its first metric, the task's headline
        columns = list(rows[0])
        first = columns[columns.index("test_set") + 1]
        tests = "/".join(sorted({r["test_set"] for r in shown_rows}))
        return (Headline(first, f"{first} {tests}".rstrip()),)
    return HEADLINES.get(stem, ())


def _reference_rows(ours: list[dict], paper: list[dict], first: Headline) -> list[dict]:
    """For each objective among our rows (in their order), the paper's first row of it with a value."""
    picked = []
    for family in dict.fromkeys(_family(r) for r in ours):
        row = next((r for r in paper if _family(r) == family and _number(r.get(first.column)) is not None), None)
        if row is not None:
            picked.append(row)
    return picked


def _family(row: dict) -> str:
    return (row.get("model") or "").split("-", 1)[0]


def _row_label(row: dict, ours: list[dict]) -> str:
    """The model; with its head when another of our rows has the same model."""
    model = row.get("model") or "?"
    twins = sum(r.get("model") == model for r in ours)
    head = row.get("head") or ""
    return f"{model} {head}" if twins > 1 and head not in ("", "-") else model


def _paper_label(row: dict) -> str:
    data = row.get("data") or ""
    return f"{row.get('model')} ({data})" if data not in ("", "-") else str(row.get("model"))


def _values(row: dict, headlines: tuple[Headline, ...]) -> str:
    return " / ".join(_show(_number(row.get(h.column)), h) for h in headlines)


def _show(value: float | None, headline: Headline) -> str:
    if value is None:
        return MISSING
    return f"{100 * value:.1f}" if headline.percent else f"{value:.{headline.digits}f}"


def _figure_lines(results: Path) -> list[str]:
    figures = results / "figures"
    drawn = sorted({p.with_suffix("") for p in figures.rglob("*") if p.suffix in (".svg", ".png")})
    if not drawn:
        return []
    top = [p.name for p in drawn if p.parent == figures]
    nested: dict[str, int] = {}
    for p in drawn:
        if p.parent != figures:
            folder = p.relative_to(figures).parts[0]
            nested[folder] = nested.get(folder, 0) + 1
    names = top + [f"{folder}/ ({n})" for folder, n in sorted(nested.items())]
    return _wrap(f"Figures in {figures} (.png, .svg): " + ", ".join(names), NAME_WIDTH + 1)


def _read_rows(path: Path) -> list[dict] | None:
    """The CSV's rows as dicts, or None when it cannot be read (the screen then says so; it never stops a run)."""
    try:
        with open(path, newline="") as fh:
            return list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
