"""The last screen of a run (`pmlm summary`, the Snakefile's onsuccess): the tables and where they are, their
headline numbers beside the paper's, the pre-training losses, the figures, the report command, the wall time."""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import REPO, snakemake

from pmlm.cli import main
from pmlm.reports import paper
from pmlm.reports.pretrain_scores import PRETRAIN_COLUMNS
from pmlm.reports.results import write_all
from pmlm.reports.run_summary import last_screen, report_command, summary_text
from pmlm.reports.tables import write_table

STARTED = 1_000_000.0  # a run's start (time.time()) for the screens below; it ends 65 s later


def _results(root: Path) -> Path:
    """A results folder as a run leaves it: tables through the table writers, a metrics log, figures."""
    results = root / "results" / "r"
    tables = results / "tables"
    ours = [
        {"source": "ours", "model": "MLM-tiny", "data": "d", "params": "108K", "step": 30, "l_mlm": 2.704},
        {"source": "ours", "model": "PMLM-tiny", "data": "d", "step": 30, "l_mlm": 2.713, "l_pmlm": 5.398},
    ]
    rows = [{"source": "paper", **r} for r in paper.PRETRAIN_SCORES] + ours
    write_table(rows, PRETRAIN_COLUMNS, tables / "pretrain_scores", caption="Pre-training")
    evaluation = root / "eval.tsv"
    evaluation.write_text(
        "model\thead\tfeatures\ttest_set\tmetric\tvalue\tn_proteins\n"
        "PMLM-tiny@d\tlinear\tmplus\theld_out\tP@L/5_medium_long\t0.25\t3\n"
        "MLM-tiny@d\tlinear\tencoder\theld_out\tP@L/5_medium_long\t0.125\t3\n"
    )
    ss3 = root / "ss3.tsv"
    ss3.write_text(
        "model\ttask\thead\tfeatures\ttest_set\tmetric\tvalue\tn_proteins\nPMLM-tiny@d\tss3\tmlp\tencoder\theld_out\tQ3\t0.5\t3\n"
    )
    # the run's tables folder holds the other table rules' files too, as aggregate_tables' --overwrite keeps them
    write_all(
        [("tape_contact", str(evaluation)), ("secondary_structure", str(ss3))],
        tables,
        "held-out chains",
        overwrite=True,
    )
    run = results / "pretrain_runs" / "d" / "pmlm-tiny"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "split,step,loss,l_mlm,l_pmlm\ntrain,10,8.99,2.99,6.0\nvalid,10,,2.9,5.9\ntrain,30,8.1,2.7,5.4\n"
    )
    (results / "figures" / "contact_maps" / "d").mkdir(parents=True)
    for figure in ("figures/curves.svg", "figures/curves.png", "figures/contact_maps/d/resnet.svg"):
        (results / figure).write_text("<svg/>")
    return results


def _line(screen: str, start: str) -> str:
    """The line that starts with ``start`` with its continuation lines (indented deeper), single-spaced."""
    lines = screen.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    rest = [line.strip() for line in lines[first + 1 :]]
    ends = next((k for k, line in enumerate(lines[first + 1 :]) if not line.startswith(" " * 10)), len(rest))
    return " ".join(" ".join([lines[first], *rest[:ends]]).split())  # single spaces


def test_screen_shows_each_table_with_ours_beside_the_paper(tmp_path):
    results = _results(tmp_path)
    os.utime(results / "tables" / "tape_contact.csv", (STARTED - 10, STARTED - 10))  # left by an earlier run
    screen = summary_text(results, started=STARTED, finished=STARTED + 65, report_command="make report")
    lines = screen.splitlines()
    assert lines[0] == "pmlm: the run finished in 1 min 05 s (wall clock)."
    assert (
        "d/pmlm-tiny" in lines[2]
        and "8.99 -> 8.10 (step 10 -> 30); L_mlm 2.99 -> 2.70, L_pmlm 6.00 -> 5.40" in lines[2]
    )
    assert f"Tables in {results / 'tables'} (.csv/.html/.md/.tex):" in lines
    mlm_base, pmlm_base = paper.PRETRAIN_SCORES[0], paper.PRETRAIN_SCORES[1]  # the first of each objective: Pfam
    assert _line(screen, "  pretrain_scores") == (
        "pretrain_scores validation L_mlm / L_pmlm ours: MLM-tiny 2.70 / –, PMLM-tiny 2.71 / 5.40 "
        f"paper: MLM-base (Pfam) {mlm_base['l_mlm']:.2f} / –, "
        f"PMLM-base (Pfam) {pmlm_base['l_mlm']:.2f} / {pmlm_base['l_pmlm']:.2f}"
    )
    tape = {(r["model"], r["data"]): r["p_l5_s12"] for r in paper.TAPE_CONTACT_P_L5}
    assert _line(screen, "  tape_contact") == (
        "tape_contact P@L/5, s >= 12 (%) (from an earlier run) ours: MLM-tiny 12.5, PMLM-tiny 25.0 "
        f"paper: MLM-base (Pfam) {tape['MLM-base', 'Pfam']:.1f}, PMLM-base (Pfam) {tape['PMLM-base', 'Pfam']:.1f}"
    )
    ss3 = _line(screen, "  secondary_structure")
    assert ss3.startswith("secondary_structure Q3 held_out ours: PMLM-tiny 0.500 paper (Q3 cb513 / casp12 / ts115): ")
    assert (
        _line(screen, "  remote_homology")
        == "remote_homology fold / superfamily / family: paper rows only, no values of this run"
    )
    assert _line(screen, "  unsupervised_contact") == "unsupervised_contact P@L/5, s >= 12 (%): no values of this run"
    # the paper's tables in the paper's order, the others after them
    names = [line.split()[0] for line in lines if re.match(r"  [a-z_]+ ", line)]
    assert names[:5] == ["pretrain_scores", "tape_contact", "raptorx_contact", "ablation", "secondary_structure"]
    assert _line(screen, "Figures") == f"Figures in {results / 'figures'} (.png, .svg): curves, contact_maps/ (1)"
    assert lines[-1] == "The report (tables, figures, configuration and versions in one page): make report"


def test_unreadable_table_is_a_note_and_an_empty_run_says_so(tmp_path):
    results = _results(tmp_path)
    (results / "tables" / "ablation.csv").write_bytes(b"\xff\xfe\x00junk")
    assert "  ablation                 (could not be read)" in summary_text(results).splitlines()
    (tmp_path / "empty").mkdir()
    assert "No tables under" in summary_text(tmp_path / "empty")
    assert summary_text(tmp_path / "none") == f"No results under {tmp_path / 'none'} yet."
    # a co-evolution study's page is named (its tables are Markdown, not one CSV each)
    (tmp_path / "empty" / "coevolution").mkdir()
    (tmp_path / "empty" / "coevolution" / "curves.md").write_text("| read-out |\n")
    assert f"tables (its answer with paired tests, curves, baselines, cost): {tmp_path}" in summary_text(
        tmp_path / "empty"
    )


def test_command_prints_the_screen_and_a_missing_folder_is_one_line(tmp_path, capsys):
    results = _results(tmp_path)
    assert main(["summary", str(results)]) == 0
    assert capsys.readouterr().out == summary_text(results) + "\n"
    assert main(["summary", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pmlm summary: error:") and "nope" in err


def test_report_command_names_what_differs_from_a_plain_run(tmp_path, monkeypatch):
    default = tmp_path / "config" / "config.yaml"
    other = tmp_path / "mine.yaml"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    assert report_command(tmp_path / "Snakefile", [default], default) == "snakemake --report report.html"
    assert report_command(tmp_path / "Snakefile", [other], default) == (
        "snakemake --report report.html --configfile mine.yaml"
    )
    monkeypatch.setenv("PWD", str(REPO))  # started elsewhere, e.g. with --directory
    assert report_command(REPO / "Snakefile", [default], default) == (
        f"cd {tmp_path} && snakemake --report report.html -s {REPO / 'Snakefile'}"
    )


def test_last_screen_never_raises(tmp_path):
    screen = last_screen(tmp_path, started=STARTED, snakefile=tmp_path, configfiles=[None], default_configfile="x")
    assert screen.startswith(f"pmlm summary: no last screen for {tmp_path}: TypeError")


def test_workflow_prints_the_screen_after_a_run_and_not_otherwise(tmp_path):
    """A one-job DAG of the demo: the screen closes the run; a dry run and a run with nothing to do print none."""
    target = "results/demo/report/run_info.html"
    args = ("--cores", "2", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), target)
    proc = snakemake(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wall = re.search(r"^pmlm: the run finished in (\d+ min )?\d+ s \(wall clock\)\.$", proc.stderr, re.M)
    assert wall, proc.stderr[-3000:]
    command = f"cd {tmp_path} && snakemake --report report.html -s {REPO / 'Snakefile'}"
    assert f"The report (tables, figures, configuration and versions in one page): {command}" in proc.stderr
    for again in (snakemake(*args, "-n", "--forcerun", "record_run_info"), snakemake(*args)):
        assert again.returncode == 0 and "the run finished" not in again.stdout + again.stderr
