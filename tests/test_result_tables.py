"""The result tables (`pmlm tables`, pmlm/reports/results.py): paper rows beside ours, the formats, and the
pre-training scores assembled from sidecars. The report that shows them: tests/test_report.py."""

import csv
import json

import pytest

from pmlm.artefacts import ENCODER_FORMAT
from pmlm.cli import main
from pmlm.model.config import model_config
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model
from pmlm.reports import paper
from pmlm.reports.tables import Column, write_table


def test_paper_reference_numbers_are_consistent():
    # dAcc = Acc_pmlm - Acc_mlm^2, as the paper defines it (reported rounded)
    for row in paper.PRETRAIN_SCORES:
        if row["dacc"] is not None:
            assert row["acc_pmlm"] - row["acc_mlm"] ** 2 == pytest.approx(row["dacc"], abs=6e-4), row


def test_write_table_formats(tmp_path):
    rows = [
        {"source": "paper", "model": "A_1", "acc": 0.48, "loss": None},
        {"source": "ours", "model": "B", "acc": 0.1234, "loss": float("nan")},
    ]
    cols = [Column("model", "model"), Column("acc", "Acc (%)", "{:.1f}", percent=True), Column("loss", "L", "{:.3f}")]
    csv_path, md_path, tex_path, html_path = write_table(rows, cols, tmp_path / "t", caption="Scores & more")
    with open(csv_path) as fh:
        got = list(csv.DictReader(fh))
    assert got[0] == {"source": "paper", "model": "A_1", "acc": "0.48", "loss": ""}
    md = md_path.read_text()
    assert "| paper | A_1 | 48.0 | – |" in md and "| ours | B | 12.3 | – |" in md
    tex = tex_path.read_text()
    assert r"A\_1" in tex and r"Scores \& more" in tex and r"\midrule" in tex and "--" in tex
    page = html_path.read_text()
    assert "<caption>Scores &amp; more</caption>" in page
    assert '<tr class="paper"><td>paper</td><td>A_1</td><td>48.0</td><td>–</td></tr>' in page


def test_pretrain_scores_table_from_sidecars(tmp_path, capsys):
    from safetensors.torch import save_file

    entries = []
    for objective in ("mlm", "pmlm"):
        cfg = model_config("tiny")
        model = build_model(cfg, ObjectiveConfig(name=objective))
        weights = tmp_path / objective / "model.safetensors"
        weights.parent.mkdir()
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
        scores = {"step": 7, "l_mlm": 2.5, "l_pmlm": 5.1, "acc_mlm": 0.2, "acc_pmlm": 0.05, "dacc": 0.01}
        weights.with_suffix(".json").write_text(
            json.dumps(
                {
                    "format": ENCODER_FORMAT,
                    "model": cfg.to_dict(),
                    "objective": {"name": objective},
                    "final_scores": scores,
                }
            )
        )
        entries.append(f"{objective.upper()}-tiny:demo:{weights}")
    argv = ["tables", "pretrain-scores", "--out-prefix", str(tmp_path / "scores")]
    for e in entries:
        argv += ["--model", e]
    assert main(argv) == 0
    with open(tmp_path / "scores.csv") as fh:
        rows = list(csv.DictReader(fh))
    ours = [r for r in rows if r["source"] == "ours"]
    assert len(rows) == len(paper.PRETRAIN_SCORES) + 2
    assert ours[0]["model"] == "MLM-tiny" and ours[0]["l_pmlm"] == "" and ours[0]["dacc"] == ""
    assert ours[1]["l_pmlm"] == "5.1" and ours[1]["step"] == "7"
    assert ours[0]["dacc_ratio"] == "" and float(ours[1]["dacc_ratio"]) == pytest.approx(0.01 / 0.05)
    n_params = sum(p.numel() for p in build_model(model_config("tiny"), ObjectiveConfig(name="pmlm")).parameters())
    assert ours[1]["params"] == f"{n_params / 1e3:.0f}K"
    assert main(["tables", "pretrain-scores", "--model", "broken", "--out-prefix", str(tmp_path / "x")]) == 2


def test_results_writes_exactly_the_tables_the_workflow_declares(tmp_path):
    from pmlm.reports.results import TABLES, write_all

    tsv = tmp_path / "run.tsv"
    tsv.write_text(
        "model\thead\tfeatures\ttest_set\tmetric\tvalue\tn_proteins\n"
        "PMLM-tiny@demo\tlinear\tM+\tdemo_test\tP@L/5_medium_long\t0.25\t3\n"
    )
    written = write_all([("tape_contact", str(tsv))], tmp_path / "tables")
    # aggregate_tables declares TABLES x (md, csv, tex) plus each table's HTML form (the report's item)
    assert sorted(p.name for p in written) == sorted(
        f"{t}.{ext}" for t in TABLES for ext in ("md", "csv", "tex", "html")
    )
    assert (
        "| ours | PMLM-tiny | demo | linear | M+ | demo_test | 25.0 |"
        in (tmp_path / "tables" / "tape_contact.md").read_text()
    )


def test_tables_say_which_features_each_row_used(tmp_path):
    from pmlm.reports.results import write_all

    # the same encoder and head fine-tuned on M and on M+: two rows, never merged
    tsv = tmp_path / "run.tsv"
    tsv.write_text(
        "model\thead\tfeatures\ttest_set\tmetric\tvalue\tn_proteins\n"
        "PMLM-tiny@demo\tlinear\tM\tt\tP@L/5_medium_long\t0.25\t3\n"
        "PMLM-tiny@demo\tlinear\tM+\tt\tP@L/5_medium_long\t0.5\t3\n"
        "MLM-tiny@demo\tmlp\tM\tcb513\tQ3\t0.6\t3\n"
    )
    tables = tmp_path / "tables"  # a folder of its own (tmp_path holds the TSV)
    write_all([("tape_contact", str(tsv)), ("secondary_structure", str(tsv))], tables)
    contact = (tables / "tape_contact.md").read_text()
    assert "| ours | PMLM-tiny | demo | linear | M | t | 25.0 |" in contact
    assert "| ours | PMLM-tiny | demo | linear | M+ | t | 50.0 |" in contact
    # the paper's rows as its source marks them: PMLM-base UR50 57.7 from M, PMLM-large 66.7 from M+
    assert "| paper | PMLM-base | UR50 | linear | M | TAPE test | 57.7 |" in contact
    assert "| paper | PMLM-large | UR50 | linear | M+ | TAPE test | 66.7 |" in contact
    assert "| paper | PMLM-xl | UR50 | linear | – | TAPE test | 71.7 |" in contact  # not stated
    ablation = (tables / "ablation.md").read_text()
    assert "| paper | PMLM-base | linear | UR50 | M+ | RaptorX test | 39.2 |" in ablation
    assert "| ours | MLM-tiny | mlp | demo | M | cb513 | 60.0 |" not in ablation
    assert "| ours | MLM-tiny | demo | mlp | M | 0.600 |" in (tables / "secondary_structure.md").read_text()


def test_pretrain_table_has_the_papers_dacc_share():
    from pmlm.reports.pretrain_scores import PRETRAIN_COLUMNS, pretrain_rows
    from pmlm.reports.tables import _cell

    column = next(c for c in PRETRAIN_COLUMNS if c.key == "dacc_ratio")
    rows = [r for r in pretrain_rows([]) if r["dacc"] is not None]
    # the paper prints 1.0 %, 7.2 %, 6.7 %, 17.5 % for PMLM-base Pfam / UR50, PMLM-large, PMLM-xl
    assert [_cell(r["dacc_ratio"], column) for r in rows] == ["1.0", "7.2", "6.7", "17.5"]
    assert all(r["dacc_ratio"] is None for r in pretrain_rows([]) if r["dacc"] is None)
