"""Tasks as types: a task of one's own in one module plus its registration (tests/task_plugin.py), a user's labelled
table (regression, classification, per-residue classes) read, split, fine-tuned, evaluated and tabled, and TAPE's
fluorescence and stability files read in TAPE's layout."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import task_plugin
from tiny_models import random_letters, tiny_encoder

from pmlm.config.finetuning import FinetuneConfig
from pmlm.errors import ConfigError, InputError
from pmlm.finetune.finetune import finetune
from pmlm.finetune.head_scoring import evaluate
from pmlm.reports.task_tables import write_task_table
from pmlm.tasks.registry import read_task_data, register, task_named, task_names
from pmlm.tasks.sequence_tasks import macro_f1
from pmlm.vocabulary import TASKS


def _table(path, rows: list[dict]):
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _recipe(task: str, head: dict | None = None, steps: int = 40, **data) -> FinetuneConfig:
    return FinetuneConfig.from_dict(
        {
            "task": task,
            "freeze_encoder": False,
            "head": {"mlp_hidden": 32, "dropout": 0.0, **(head or {})},
            "optim": {"lr": 3e-3, "head_lr": 1e-2, "warmup_steps": 2, "total_steps": steps},
            "data": {"batch_size": 8, "crop": None, **data},
            "save_every": 0,
            "device": "cpu",
        }
    )


def test_the_built_in_tasks_are_the_vocabularys():
    assert set(TASKS) <= set(task_names())
    with pytest.raises(ConfigError, match="task must be one of contact, ss3"):
        FinetuneConfig.from_dict({"task": "folding"})


def test_a_task_of_ones_own_is_one_module_and_its_registration(tmp_path):
    """Registered, the plug-in's task is fine-tuned, evaluated (TSV) and tabled by the same code as the built-in
    ones. Chance for 'is this residue charged' is the majority rate (about 0.8 on uniform letters): the head must
    do far better."""
    register(task_plugin.TASK)
    assert task_named("charged_residues") is task_plugin.TASK
    encoder = tiny_encoder(tmp_path / "enc" / "model.safetensors", max_len=34)
    rows = [{"sequence": random_letters(int(n), seed=i)} for i, n in enumerate(np.linspace(12, 40, 48))]
    train, test = _table(tmp_path / "train.csv", rows[:40]), _table(tmp_path / "test.csv", rows[40:])
    cfg = _recipe("charged_residues", {"kind": "residue_linear"}, steps=60)
    head = tmp_path / "head" / "head.safetensors"
    assert finetune(cfg, encoder, train, tmp_path / "run", head) == 0
    tsv = tmp_path / "eval.tsv"
    evaluate(str(head), {"held_out": str(test)}, tsv)
    scores = pd.read_csv(tsv, sep="\t").set_index("metric")["value"]
    charged = np.mean([c in task_plugin.CHARGED for r in rows[40:] for c in r["sequence"]])
    assert scores["accuracy"] > max(charged, 1 - charged) + 0.1, scores
    written = write_task_table([tsv], tmp_path / "tables" / "charged")
    assert "| ours | enc |  | residue_linear | M | held_out |" in written[1].read_text()


def test_a_value_per_protein_from_a_table_is_learned(tmp_path):
    """sequence_regression on a label the sequence determines (the fraction of K and R): the test set's Spearman
    must clear 5 standard deviations of its null distribution (1 / sqrt(n - 1) for n proteins)."""
    encoder = tiny_encoder(tmp_path / "enc" / "model.safetensors", max_len=34)
    rows = []
    for i in range(120):
        seq = random_letters(int(12 + i % 20), seed=100 + i)
        rows.append(
            {
                "id": f"p{i}",
                "sequence": seq.lower() if i % 7 == 0 else seq,
                "kr": sum(c in "KR" for c in seq) / len(seq),
            }
        )
    train, test = _table(tmp_path / "train.csv", rows[:80]), _table(tmp_path / "test.csv", rows[80:])
    head = tmp_path / "head" / "head.safetensors"
    assert (
        finetune(_recipe("sequence_regression", steps=80, label_column="kr"), encoder, train, tmp_path / "r", head) == 0
    )
    tsv = tmp_path / "eval.tsv"
    evaluate(str(head), {"test": str(test)}, tsv)
    scores = pd.read_csv(tsv, sep="\t").set_index("metric")["value"]
    assert scores["spearman"] > 5 / math.sqrt(40 - 1), scores
    assert scores["mse"] >= 0 and -1 <= scores["pearson"] <= 1
    table = write_task_table([tsv], tmp_path / "tables" / "kr")[0]
    assert list(pd.read_csv(table).columns[-5:]) == ["spearman", "pearson", "mse", "n", "precision"]


def test_classes_come_from_the_training_file_and_are_recorded(tmp_path):
    encoder = tiny_encoder(tmp_path / "enc" / "model.safetensors", max_len=34)
    rows = [{"sequence": random_letters(14, seed=i), "fold": ["beta", "alpha", "10"][i % 3]} for i in range(24)]
    train = _table(tmp_path / "train.csv", rows)
    head = tmp_path / "head" / "head.safetensors"
    cfg = _recipe("sequence_classification", steps=4, label_column="fold")
    assert finetune(cfg, encoder, train, tmp_path / "r", head) == 0
    recorded = json.loads(head.with_suffix(".json").read_text())["config"]["data"]["classes"]
    assert recorded == ["10", "alpha", "beta"]
    bad = _table(tmp_path / "bad.csv", [*rows[:3], {"sequence": "MKV", "fold": "gamma"}])
    with pytest.raises(InputError, match=r"bad.csv:5: protein 4: class 'gamma' is not one of the head's classes"):
        evaluate(str(head), {"t": str(bad)}, tmp_path / "e.tsv")
    assert macro_f1(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 2])) == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)


def test_bad_table_records_name_file_and_line(tmp_path):
    path = _table(tmp_path / "t.csv", [{"sequence": "MKV", "label": "1.5"}, {"sequence": "MK1", "label": "2"}])
    with pytest.raises(InputError, match=r"t.csv:3: protein 2: the sequence has non-residue letter '1'"):
        read_task_data(path, "sequence_regression")
    data = read_task_data(path, "sequence_regression", on_error="skip")
    assert [e.value for e in data.examples] == [1.5] and data.counts.n_skipped == 1
    nan = _table(tmp_path / "n.csv", [{"sequence": "MKV", "label": "inf"}])
    with pytest.raises(InputError, match="is not a finite number"):
        read_task_data(nan, "sequence_regression")
    with pytest.raises(InputError, match=r"no column 'score' \(set data.label_column"):
        read_task_data(path, "sequence_regression", label_column="score")


def test_per_residue_labels_as_strings_or_lists(tmp_path):
    frame = pd.DataFrame({"sequence": ["MKVL", "AAG"], "label": ["HHEC", None], "extra": [1, 2]})
    frame.loc[1, "label"] = '["C", null, "H"]'
    path = tmp_path / "r.parquet"
    frame.to_parquet(path)
    data = read_task_data(path, "residue_classification")
    assert data.classes == ("C", "E", "H")
    assert [e.labels.tolist() for e in data.examples] == [[2, 2, 1, 0], [0, -1, 2]]
    short = _table(tmp_path / "s.csv", [{"sequence": "MKVL", "label": "HHE"}])
    with pytest.raises(InputError, match=r"s.csv:2: protein 1: 3 per-residue labels for 4 residues"):
        read_task_data(short, "residue_classification")


@pytest.mark.parametrize("task,key", [("fluorescence", "log_fluorescence"), ("stability", "stability_score")])
def test_tapes_regression_files_in_its_layout(tmp_path, task, key):
    """TAPE's raw JSON: a list of records, the value as a 1-element list (as TAPE's files hold it) or a number."""
    folder = tmp_path / task
    folder.mkdir()
    records = [{"primary": "MKTAYIAKQR", "protein_length": 10, key: [3.25], "id": "a"}, {"primary": "GGS", key: 1}]
    path = folder / f"{task}_train.json"
    path.write_text(json.dumps(records))
    data = read_task_data(path, task)
    assert data.format == "tape" and [e.value for e in data.examples] == [3.25, 1.0]
    path.write_text(json.dumps([{"primary": "MKV", key: [1.0, 2.0]}]))
    with pytest.raises(InputError, match=f"record 0 \\(id 0\\): '{key}' must be one finite number"):
        read_task_data(path, task)


def test_split_table_by_column_and_by_identity(tmp_path):
    from pmlm.data.split import SplitConfig
    from pmlm.data.tablesplit import split_table

    rows = [
        {"sequence": random_letters(60, seed=i), "y": i, "split": ["train", "valid", "test"][i % 3]} for i in range(30)
    ]
    path = _table(tmp_path / "t.csv", rows)
    stats = split_table(str(path), str(tmp_path / "by_column"), split_column="split")
    assert (stats["train"]["rows"], stats["valid"]["rows"], stats["test"]["rows"]) == (10, 10, 10)
    test = pd.read_parquet(tmp_path / "by_column" / "test.parquet")
    assert list(test.columns) == ["sequence", "y", "split"] and set(test["split"]) == {"test"}
    rows[4]["split"] = "validation"
    with pytest.raises(InputError, match=r"t2.csv:6: split is 'validation', expected one of train, valid, test"):
        split_table(str(_table(tmp_path / "t2.csv", rows)), str(tmp_path / "x"), split_column="split")
    stats = split_table(
        str(path), str(tmp_path / "by_identity"), cfg=SplitConfig(valid_fraction=0.0), fractions=(0.6, 0.2, 0.2)
    )
    kept = sum(stats[s]["rows"] for s in ("train", "valid", "test")) + sum(stats["dropped"].values())
    assert kept == 30 and stats["clusters"] == 30  # random sequences: every one its own cluster
