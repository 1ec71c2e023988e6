"""Tasks as types: a task of one's own in one module plus its registration (tests/task_plugin.py), a user's labelled
table (regression, classification, per-residue classes) read, split, fine-tuned, evaluated and tabled, and TAPE's
fluorescence and stability files read in TAPE's layout."""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import task_plugin
from tiny_models import random_letters, tiny_encoder

from pmlm import alphabet
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.errors import ConfigError, InputError
from pmlm.finetune.finetune import finetune
from pmlm.finetune.head_scoring import evaluate
from pmlm.reports.task_tables import write_task_table
from pmlm.tasks import registry
from pmlm.tasks.registry import TaskFormat, read_task_data, register, register_format, task_named, task_names
from pmlm.tasks.sequence_tasks import macro_f1
from pmlm.tasks.task import Example, Task, TaskSettings
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
    assert list(test.columns) == ["sequence", "y", "split", "source_line"] and set(test["split"]) == {"test"}
    assert test["y"].tolist() == list(range(2, 30, 3)) and test["source_line"].tolist() == list(range(4, 32, 3))
    rows[4]["split"] = "validation"
    with pytest.raises(InputError, match=r"t2.csv:6: split is 'validation', expected one of train, valid, test"):
        split_table(str(_table(tmp_path / "t2.csv", rows)), str(tmp_path / "x"), split_column="split")
    stats = split_table(
        str(path), str(tmp_path / "by_identity"), cfg=SplitConfig(valid_fraction=0.0), fractions=(0.6, 0.2, 0.2)
    )
    kept = sum(stats[s]["rows"] for s in ("train", "valid", "test")) + sum(stats["dropped"].values())
    assert kept == 30 and stats["clusters"] == 30  # random sequences: every one its own cluster


def test_split_table_keeps_types_refuses_empty_sequences_and_names_the_users_lines(tmp_path):
    """The split files hold the CSV's columns in their types (an integer label stays an integer, with a missing
    cell too) and each row's line in the CSV, counted as an editor does (a blank line, a quoted cell over two
    lines); an empty or blank sequence is refused naming that line; a bad row met later in a split file is named
    by the CSV's line, the split file beside."""
    from pmlm.data.tablesplit import split_table

    header = "id,sequence,y,f,note,split\n"
    rows = [
        "a,MKV,1,0.5,x,train\n",
        "\n",  # line 3: blank
        'b,ACDE,2,,"two\nlines",valid\n',  # lines 4-5
        "c,MK1,3,2.5,y,train\n",  # line 6: no residue letter, found when the split file is read
        "d,GGS,,1.5,z,test\n",
    ]
    path = tmp_path / "t.csv"
    path.write_text(header + "".join(rows))
    split_table(str(path), str(tmp_path / "s"), split_column="split")
    train = pq.read_table(tmp_path / "s" / "train.parquet")
    types = {f.name: f.type for f in train.schema}
    assert types == {
        "id": pa.string(),
        "sequence": pa.string(),
        "y": pa.int64(),
        "f": pa.float64(),
        "note": pa.string(),
        "split": pa.string(),
        "source_line": pa.int64(),
    }
    assert train.column("y").to_pylist() == [1, 3] and train.column("source_line").to_pylist() == [2, 6]
    test = pq.read_table(tmp_path / "s" / "test.parquet")
    assert test.column("y").to_pylist() == [None] and test.schema.field("y").type == pa.int64()
    assert pq.read_table(tmp_path / "s" / "valid.parquet").column("source_line").to_pylist() == [4]
    with pytest.raises(
        InputError,
        match=rf"^{path}:6: protein c: the sequence has non-residue letter '1' .*"
        rf"\({tmp_path / 's' / 'train.parquet'} row 2\)$",
    ):
        read_task_data(tmp_path / "s" / "train.parquet", "sequence_regression", label_column="y")
    with pytest.raises(InputError, match=rf"^{path}:6: protein c: the sequence has non-residue letter '1'"):
        read_task_data(path, "sequence_regression", label_column="y")  # the CSV itself: the same line
    for empty in ("", "   "):
        bad = tmp_path / f"e{len(empty)}.csv"
        bad.write_text(header + "".join(rows[:3]) + f"e,{empty},4,1.0,w,train\n")
        for split in ("split", None):
            with pytest.raises(InputError, match=rf"^{bad}:6: empty sequence in column 'sequence'$"):
                split_table(str(bad), str(tmp_path / "x"), split_column=split)
    assert not (tmp_path / "x").exists()


def test_evaluate_offers_every_format_a_task_reads():
    """pmlm evaluate --format: auto and the formats the task types declare, table among them."""
    import argparse

    from pmlm.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    action = next(a for a in commands["evaluate"]._actions if "--format" in a.option_strings)
    declared = {f for name in task_names() for f in task_named(name).formats}
    assert action.choices[0] == "auto" and set(action.choices[1:]) == declared and "table" in declared


def _read_fasta_values(path, task, options, counts):
    """A plug-in's reader: FASTA whose header holds the protein's name and its value (``>p1 0.25``)."""
    for block in Path(path).read_text().split(">")[1:]:
        header, residues = block.split("\n", 1)
        name, value = header.split()
        counts.read += 1
        yield Example(name, alphabet.encode(residues.replace("\n", "")), value=float(value))


def test_a_file_format_of_ones_own_is_one_registration(tmp_path, monkeypatch):
    """Registered in one call, a plug-in's format is told apart by auto, named by data.format and read for the
    tasks it labels: a user's file of it is read and fine-tuned on with nothing else changed."""
    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))  # the registration ends with this test
    fasta = TaskFormat(
        "fasta_values",
        lambda path: path.name.endswith(".fa"),
        (".fa",),
        read=_read_fasta_values,
        tasks=("sequence_regression",),
    )
    assert register_format(fasta) is fasta
    seqs = [random_letters(12 + i % 9, seed=i) for i in range(16)]
    path = tmp_path / "values.fa"
    path.write_text("".join(f">p{i} {i / 10}\n{s[:6]}\n{s[6:]}\n" for i, s in enumerate(seqs)))
    data = read_task_data(path, "sequence_regression")
    assert data.format == "fasta_values" and [e.value for e in data.examples] == [i / 10 for i in range(16)]
    assert [alphabet.decode(e.residues) for e in data.examples] == seqs
    with pytest.raises(InputError, match=r"a fasta_values file has no labels for task ss3 \(it reads structure_jsonl"):
        read_task_data(path, "ss3")
    with pytest.raises(InputError, match=r"expected \.jsonl\[\.gz\], .* \.parquet or \.fa\); set data\.format"):
        read_task_data(tmp_path / "values.txt", "sequence_regression")
    encoder = tiny_encoder(tmp_path / "enc" / "model.safetensors", max_len=34)
    cfg = _recipe("sequence_regression", steps=3, format="fasta_values")
    assert finetune(cfg, encoder, path, tmp_path / "run", tmp_path / "head.safetensors") == 0
    assert json.loads((tmp_path / "head.json").read_text())["train"]["format"] == "fasta_values"


def test_tasks_are_abstract_and_carry_the_settings_they_are_configured_with():
    """A task that leaves out a method is refused when built; ``configure`` binds the contact definition and the
    loss's separation to a copy, which every later call reads, and leaves the registered task as it was."""

    class Unfinished(Task):
        def read(self, path, options, counts):
            return iter(())

    with pytest.raises(TypeError, match="abstract"):
        Unfinished()
    contact = task_named("contact")
    near = contact.configure(TaskSettings(contact_threshold=5.0, min_separation=1))
    assert near is not contact and contact.settings == TaskSettings() and near.settings.min_separation == 1
    coords = np.array([[0.0, 0.0, 0.0], [4.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 6.0, 0.0]])
    protein = Example("p", alphabet.encode("ACDE"), coords=coords)
    targets = {t.settings.contact_threshold: t.targets([protein], [(0, 4)], 4)[0][0] for t in (contact, near)}
    assert targets[8.0][0, 3] and not targets[5.0][0, 3] and targets[5.0][0, 1]
    cfg = FinetuneConfig.from_dict({"data": {"contact_atom": "CA", "contact_threshold": 7.0, "min_separation": 3}})
    assert cfg.configured_task().settings == TaskSettings("CA", 7.0, 3)


def _doc_blocks(section: str) -> tuple[str, list[list[str]]]:
    """The python snippet and the pmlm command lines (continuations joined, split as a shell would) of a section
    of docs/tasks.md."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    text = page.split(f"### {section}\n", 1)[1].split("\n#", 1)[0]
    python = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    bash = re.search(r"```bash\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    return python, [shlex.split(line) for line in bash.splitlines() if line.startswith("pmlm ")]


def test_the_documented_classification_runs_end_to_end(tmp_path, monkeypatch, capsys):
    """docs/tasks.md's classification, as written, on a tiny encoder and the first 150 rows of the demo's table:
    split-table keeps the integer classes as integers and adds the source lines, finetune records the classes in
    numeric order and prints its final validation, evaluate --format table scores the test split."""
    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "data" / "demo").mkdir(parents=True)
    pd.read_csv(repo / "data" / "demo" / "net_charge.csv").head(150).to_csv(
        tmp_path / "data" / "demo" / "net_charge.csv", index=False
    )
    shutil.copytree(repo / "config" / "finetune", tmp_path / "config" / "finetune")
    encoder = tiny_encoder(tmp_path / "enc" / "model.safetensors", max_len=34)
    monkeypatch.chdir(tmp_path)
    python, commands = _doc_blocks("A classification")
    exec(python, {})
    assert [c[1] for c in commands] == ["split-table", "finetune", "evaluate"]
    for argv in commands:
        assert main([str(encoder) if a == "MODEL" else a for a in argv[1:]]) == 0, argv
    err = capsys.readouterr().err
    split = pq.read_table("charge_split/train.parquet")
    assert split.schema.field("sign").type == pa.int64() and split.schema.field("net_charge").type == pa.float64()
    assert split.column("source_line").to_pylist()[:4] == [2, 3, 4, 7]  # rows 0, 1, 2, 5 of the table: lines 2-4, 7
    head = json.loads(Path("charge_head/head.json").read_text())
    assert head["config"]["data"]["classes"] == ["-1", "0", "1"]
    kept = head["selected"]["step"]  # the best of the validations every eval_every steps (finetune.selection)
    line = re.search(
        rf"pmlm finetune: validation at step {kept} \(charge_split/valid.parquet, 30 proteins\): (.*)", err
    )
    assert line is not None, err
    shown = dict(part.rsplit(" ", 1) for part in line.group(1).split(", "))
    assert list(shown) == ["accuracy", "macro_F1"]
    assert float(shown["accuracy"]) == pytest.approx(head["valid"]["scores"]["accuracy"], abs=5e-4)
    scores = pd.read_csv("charge_eval.tsv", sep="\t").set_index("metric")
    assert (
        set(scores.index) >= {"accuracy", "macro_F1"}
        and (scores["n_proteins"] == 30).all()
        and 0 <= scores.loc["accuracy", "value"] <= 1
    )
