"""Outputs that never destroy (pmlm.outputs): the rule itself, then every writing command held to it.

The bar, for every command that writes: no file the command did not write is removed or changed; ``-o`` (or
``--out-prefix``, ``--out-dir``) naming an existing folder, ``.`` or an existing file of the wrong kind is one line on
stderr, exit 2, and nothing half-written anywhere (the whole tree, names and bytes, is as it was). A command's own
earlier result is replaced without ``--overwrite`` (a workflow rerun passes the checks); ``--overwrite`` keeps the
files it did not write.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import make_sequences, write_shards
from test_finetune import write_structures
from tiny_models import random_letters, tiny_encoder, write_fasta

from pmlm.cli import main
from pmlm.outputs import (
    MANIFEST,
    OutputError,
    file_target,
    folder_target,
    prefix_targets,
    writing_files,
    writing_folder,
)

pytestmark = pytest.mark.usefixtures("single_thread")

TABLE = (".csv", ".md", ".tex", ".html")
FIGURE = (".png", ".svg")


def tree(*roots: Path) -> dict[str, bytes | None]:
    """Every path under ``roots`` with its bytes (None for a folder): what must not change."""
    return {str(p): (p.read_bytes() if p.is_file() else None) for root in roots for p in sorted(Path(root).rglob("*"))}


def new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# -- the rule (pmlm/outputs.py) -----------------------------------------------------------------------------------


def test_a_file_target_is_a_file_of_the_commands_format(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.parquet").write_text("my notes")
    (tmp_path / "old.parquet").write_bytes(b"PAR1" + b"\0" * 8 + b"PAR1")
    (tmp_path / "empty.parquet").write_bytes(b"")
    for bad, says in (
        ("folder", "is a folder"),
        ("folder/", "is a folder"),
        (".", "is a folder"),
        ("notes.parquet", "exists and is not a .parquet file"),
        ("out.tsv", "the output is written as .parquet"),
    ):
        with pytest.raises(OutputError, match=says):
            file_target(bad, suffixes=(".parquet",))
    assert file_target("old.parquet", suffixes=(".parquet",)) == Path("old.parquet")  # a previous result
    assert file_target("empty.parquet", suffixes=(".parquet",)) == Path("empty.parquet")
    assert file_target("notes.parquet", suffixes=(".parquet",), overwrite=True) == Path("notes.parquet")
    with pytest.raises(OutputError, match="a prefix names files"):
        prefix_targets("tables/", (".csv",))
    with pytest.raises(OutputError, match="a prefix names files"):
        prefix_targets(".", (".csv",))
    assert prefix_targets("t/run.v1", (".csv", ".md")) == [Path("t/run.v1.csv"), Path("t/run.v1.md")]


def test_files_appear_together_readable_or_not_at_all(tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "sub" / "b.tsv"
    a.write_text("previous\n")
    with pytest.raises(RuntimeError, match="midway"), writing_files([a, b]) as (ta, tb):
        Path(ta).write_text("new a\n")
        raise RuntimeError("midway")
    assert a.read_text() == "previous\n" and not b.exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.tsv", "sub"]  # no temporaries left
    with writing_files([a, b]) as (ta, tb):
        Path(ta).write_text("new a\n")
        Path(tb).write_text("b\n")
        os.chmod(tb, 0o600)  # as safetensors and mkstemp make them
    assert (a.read_text(), b.read_text()) == ("new a\n", "b\n")
    assert {stat.S_IMODE(p.stat().st_mode) for p in (a, b)} == {new_file_mode()}
    with pytest.raises(OutputError, match="two outputs have the same name"), writing_files([a, tmp_path / "a.tsv"]):
        pass


def test_a_folder_records_its_files_and_overwrite_keeps_the_others(tmp_path):
    out = tmp_path / "out"
    with writing_folder(out, command="pmlm demo") as staged:
        (staged / "one.txt").write_text("1")
        (staged / "two.txt").write_text("2")
        os.chmod(staged / "two.txt", 0o600)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest == {"command": "pmlm demo", "files": ["one.txt", "two.txt"]}
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {new_file_mode()}
    # its own folder again: no --overwrite needed; a file it no longer writes is removed
    with writing_folder(out, command="pmlm demo") as staged:
        (staged / "one.txt").write_text("1 again")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "one.txt"]
    # another command's folder, or one with a file of the user's, is refused before any work...
    (out / "mine.txt").write_text("the user's")
    with pytest.raises(OutputError, match=r"holds files pmlm demo did not write \(mine.txt\)"):
        folder_target(out, command="pmlm demo")
    with pytest.raises(OutputError, match="holds files pmlm other did not write"):
        folder_target(out, command="pmlm other")
    # ... and --overwrite replaces only the command's own files
    with writing_folder(out, command="pmlm demo", overwrite=True) as staged:
        (staged / "two.txt").write_text("2 again")
    assert (out / "mine.txt").read_text() == "the user's" and not (out / "one.txt").exists()
    assert json.loads((out / MANIFEST).read_text())["files"] == ["two.txt"]


def test_a_failing_block_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError), writing_folder("new", command="pmlm demo") as staged:
        (staged / "half.txt").write_text("half")
        raise RuntimeError("midway")
    assert list(tmp_path.iterdir()) == []
    with writing_folder("kept", command="pmlm demo") as staged:
        (staged / "a.txt").write_text("a")
    before = tree(tmp_path)
    with pytest.raises(RuntimeError), writing_folder("kept", command="pmlm demo") as staged:
        (staged / "a.txt").write_text("changed")
        raise RuntimeError("midway")
    assert tree(tmp_path) == before
    with pytest.raises(OutputError, match="is the working folder"):
        folder_target(".", command="pmlm demo")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="exists and is a file"):
        folder_target("file", command="pmlm demo")


def test_staged_prefix_outputs_appear_together(tmp_path):
    from pmlm.reports.staging import staged, staged_outputs

    targets = prefix_targets(tmp_path / "t" / "x", (".csv", ".md"))
    with pytest.raises(RuntimeError, match=r"did not write x\.md"), staged_outputs(targets) as folder:
        (staged(folder, tmp_path / "t" / "x").with_suffix(".csv")).write_text("a\n")
    assert [p.name for p in (tmp_path / "t").iterdir()] == []
    with staged_outputs(targets) as folder:
        for target in targets:
            (folder / target.name).write_text(target.suffix)
    assert [t.read_text() for t in targets] == [".csv", ".md"]
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["x.csv", "x.md"]


# -- every writing command ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A writing command: ``argv(inputs, target)`` writes ``target``, a ``file``, ``prefix`` or ``folder`` target
    given as ``option``; ``suffixes`` are what a file or prefix target writes."""

    name: str
    shape: str
    option: str
    argv: object
    suffixes: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        return self.name.split()[0]


CASES = [
    Case("embed", "file", "-o", lambda i, t: ["embed", i["encoder"], i["fasta"], "-o", t], (".parquet",)),
    Case(
        "embed --per-sequence",
        "file",
        "--per-sequence",
        lambda i, t: ["embed", i["encoder"], i["fasta"], "-o", "emb.parquet", "--per-sequence", t],
        (".parquet",),
    ),
    Case("export", "folder", "-o", lambda i, t: ["export", i["encoder"], "-o", t]),
    Case("import", "folder", "-o", lambda i, t: ["import", i["exported"], "-o", t]),
    Case(
        "kl",
        "prefix",
        "--out-prefix",
        lambda i, t: [
            "kl",
            *("--model", f"A={i['encoder']}", "--valid", f"v={i['shards']}"),
            *("--sequences", "2", "--pairs", "2", "--max-residues", "16", "--out-prefix", t),
        ],
        (*FIGURE, ".json"),
    ),
    Case(
        "tables pretrain-scores",
        "prefix",
        "--out-prefix",
        lambda i, t: ["tables", "pretrain-scores", "--model", f"PMLM-tiny:demo:{i['encoder']}", "--out-prefix", t],
        TABLE,
    ),
    Case(
        "tables results",
        "folder",
        "--out-dir",
        lambda i, t: ["tables", "results", "--result", f"tape_contact={i['contact_tsv']}", "--out-dir", t],
    ),
    Case(
        "tables task",
        "prefix",
        "--out-prefix",
        lambda i, t: ["tables", "task", "--result", i["task_tsv"], "--out-prefix", t],
        TABLE,
    ),
    Case(
        "report curves",
        "prefix",
        "--out-prefix",
        lambda i, t: ["report", "curves", "--kind", "pretrain", "--run", f"a={i['metrics']}", "--out-prefix", t],
        FIGURE,
    ),
    Case(
        "report contact-maps",
        "prefix",
        "--out-prefix",
        lambda i, t: [
            *("report", "contact-maps", "--head", "pair-kl", "--encoder", i["encoder"], "--test", i["structures"]),
            *("--label", "m", "--chains", "1", "--out-prefix", t),
        ],
        FIGURE,
    ),
    Case(
        "report separation",
        "prefix",
        "--out-prefix",
        lambda i, t: ["report", "separation", "--result", f"tape_contact={i['contact_tsv']}", "--out-prefix", t],
        FIGURE,
    ),
    Case(
        "report separation --table-prefix",
        "prefix",
        "--table-prefix",
        lambda i, t: [
            *("report", "separation", "--result", f"tape_contact={i['contact_tsv']}"),
            *("--out-prefix", "figure", "--table-prefix", t),
        ],
        TABLE,
    ),
    Case(
        "report run-info",
        "prefix",
        "--out-prefix",
        lambda i, t: ["report", "run-info", "--config-json", '{"seed": 1}', "--out-prefix", t],
        (".html", ".json"),
    ),
    # pmlm score and pmlm contacts write through pmlm.outputs too; their own test files hold them to this bar. A case
    # added here (its argv with the target in place, e.g. Case("score", "file", "-o", ..., (".tsv",))) runs through
    # every check below.
]
IDS = [case.name for case in CASES]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Inputs every command reads, each valid (the commands succeed on a fresh target), under one folder."""
    root = tmp_path_factory.mktemp("inputs")
    encoder = tiny_encoder(root / "pmlm" / "model.safetensors", "pmlm", max_len=40)
    info = json.loads(encoder.with_suffix(".json").read_text())
    info["final_scores"] = {"step": 7, "l_mlm": 2.5, "l_pmlm": 5.1, "acc_mlm": 0.2, "acc_pmlm": 0.05, "dacc": 0.01}
    encoder.with_suffix(".json").write_text(json.dumps(info))
    header = "model\ttask\thead\tfeatures\ttest_set\tmetric\tvalue\tn_proteins\n"
    contact = root / "contact.tsv"
    contact.write_text(
        header
        + "PMLM-tiny@demo\tcontact\tlinear\tM\tt\tP@L_short\t0.4\t3\n"
        + "PMLM-tiny@demo\tcontact\tlinear\tM\tt\tP@L/5_medium_long\t0.25\t3\n"
    )
    task = root / "task.tsv"
    task.write_text(
        header
        + "".join(f"PMLM-tiny@demo\tfluorescence\tmlp\tM\tt\t{m}\t0.5\t3\n" for m in ("spearman", "pearson", "mse"))
    )
    metrics = root / "metrics.csv"
    metrics.write_text("split,step,loss,l_mlm,l_pmlm,metric,value\ntrain,1,9.0,3.0,6.0,,\ntrain,2,8.0,2.9,5.1,,\n")
    exported = root / "exported"
    assert main(["export", str(encoder), "-o", str(exported)]) == 0
    paths = {
        "encoder": encoder,
        "fasta": write_fasta(root / "in.fasta", {"a": random_letters(12, 1), "b": random_letters(30, 2)}),
        "exported": exported,
        "shards": write_shards(root / "shards", {"valid": make_sequences(4, seed=1, max_len=30)}),
        "structures": write_structures(root / "test.jsonl", 2, seed=1, lengths=(12, 30)),
        "contact_tsv": contact,
        "task_tsv": task,
        "metrics": metrics,
    }
    return {k: str(v) for k, v in paths.items()} | {"root": root}


def _refused(case: Case, inputs: dict, target: str, work: Path, capsys) -> str:
    before = tree(work, inputs["root"])
    assert main([*case.argv(inputs, target), *(["--device", "cpu"] if case.command == "embed" else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pmlm {case.command}: error: {case.option} "), err
    assert tree(work, inputs["root"]) == before
    return err


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("target", ["an_existing_folder", "dot", "wrong_kind"])
def test_a_target_that_is_not_the_commands_is_one_line_and_changes_nothing(
    case, target, inputs, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.txt").write_text("the user's\n")
    if target == "an_existing_folder":
        given = "results" if case.shape != "prefix" else "results/"
    elif target == "dot":
        given = "."
    elif case.shape == "folder":
        given = "keep.txt"
        (tmp_path / given).write_text("a file where the folder goes\n")
    else:
        given = "old" + (case.suffixes[0] if case.shape == "file" else "")  # a prefix writes old<suffix>
        wrong = b"not a png\n" if case.suffixes[0] == ".png" else b"\x00\x01binary"
        (tmp_path / f"old{case.suffixes[0]}").write_bytes(wrong if case.suffixes[0] != ".parquet" else b"text\n")
    says = {
        ("file", "an_existing_folder"): "is a folder",
        ("file", "dot"): "is a folder",
        ("file", "wrong_kind"): "exists and is not a .parquet file",
        ("prefix", "an_existing_folder"): "a prefix names files",
        ("prefix", "dot"): "a prefix names files",
        ("prefix", "wrong_kind"): f"exists and is not a {''.join(case.suffixes[:1])} file",
        ("folder", "an_existing_folder"): "did not write (keep.txt)",
        ("folder", "dot"): "is the working folder",
        ("folder", "wrong_kind"): "exists and is a file",
    }[case.shape, target]
    assert says in _refused(case, inputs, given, tmp_path, capsys)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.shape != "folder"], ids=[c.name for c in CASES if c.shape != "folder"]
)
def test_a_folder_where_one_of_the_files_goes_is_refused(case, inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = "out.parquet" if case.shape == "file" else "out"
    (tmp_path / (name if case.shape == "file" else f"out{case.suffixes[-1]}")).mkdir()
    _refused(case, inputs, name, tmp_path, capsys)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_rerun_replaces_only_the_commands_own_files(case, inputs, tmp_path, monkeypatch, capsys):
    """A workflow reruns a command on its own earlier outputs: no --overwrite needed; a file of the user's beside
    them (or, with --overwrite, inside the command's folder) is kept byte for byte."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    keep = tmp_path / "out" / "keep.txt"
    keep.write_text("the user's\n")
    target = "out/result" + (case.suffixes[0] if case.shape == "file" else "")
    extra = ["--device", "cpu"] if case.command == "embed" else []
    argv = [*case.argv(inputs, target), *extra]
    assert main(argv) == 0, capsys.readouterr().err
    first = tree(tmp_path)
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(tree(tmp_path)) == sorted(first) and keep.read_text() == "the user's\n"
    if case.shape == "folder":
        written = Path(target)
        assert json.loads((written / MANIFEST).read_text())["command"] == f"pmlm {case.name.split(' --')[0]}"
        assert {stat.S_IMODE(p.stat().st_mode) for p in written.iterdir()} == {new_file_mode()}
        (written / "mine.txt").write_text("the user's\n")
        assert main(argv) == 2
        assert "did not write (mine.txt)" in capsys.readouterr().err
        assert main([*argv, "--overwrite"]) == 0
        assert (written / "mine.txt").read_text() == "the user's\n"
    else:
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert stat.S_IMODE(path.stat().st_mode) == new_file_mode(), path
    assert not list(tmp_path.rglob("*.tmp"))


def test_embed_into_an_existing_folder_leaves_no_half_written_file(inputs, tmp_path, monkeypatch, capsys):
    """The report that started this: `pmlm embed -o a_folder` gave a traceback and left
    a_folder.per_sequence.parquet behind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "an_existing_folder").mkdir()
    assert main(["embed", inputs["encoder"], inputs["fasta"], "-o", "an_existing_folder", "--device", "cpu"]) == 2
    assert "-o an_existing_folder: is a folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["an_existing_folder"]
