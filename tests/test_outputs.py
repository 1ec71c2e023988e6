"""Outputs that never destroy (pmlm.outputs): the rule itself, then every writing command held to it.

The bar, for every command that writes: no file the command did not write is removed or changed; ``-o`` (or
``--out-prefix``, ``--out-dir``) naming an existing folder, ``.`` or an existing file of the wrong kind is one line on
stderr, exit 2, and nothing half-written anywhere (the whole tree, names and bytes, is as it was). A command's own
earlier result is replaced without ``--overwrite`` (a workflow rerun passes the checks); ``--overwrite`` keeps the
files it did not write.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import make_sequences, write_shards
from tiny_models import (
    assay_text,
    pdb_text,
    random_letters,
    result_file,
    tiny_encoder,
    write_fasta,
    write_reference,
    write_structures,
    write_zip,
)

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
    """A writing command: ``argv(inputs, target)`` writes ``target``, a ``file``, ``prefix``, ``folder`` or ``run``
    (a run folder it resumes) target given as ``option``, or a ``named`` file (of no format of the command's own:
    fetch's download, extract's member); ``suffixes`` are what a file or prefix target writes. ``name`` is the
    command's words (``tables results``), then `` --option`` where the case is about another of its options.
    ``skip``: bad targets the command takes by design (the reason in ``RERUN_EXEMPT``'s neighbour, ``TAKEN``)."""

    name: str
    shape: str
    option: str
    argv: object
    suffixes: tuple[str, ...] = ()
    needs: str | None = None  # an executable the full run needs (refusals come before it is looked for)
    skip: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        return self.name.split()[0]

    @property
    def words(self) -> str:
        return self.name.split(" --")[0]


CPU = ("--device", "cpu")
PRETRAIN = lambda i: ["pretrain", "--config", i["recipe"], "--shards", i["shards"]]  # noqa: E731
FINETUNE = lambda i: ["finetune", "--config", i["recipe"], "--encoder", i["encoder"], "--train", i["structures"]]  # noqa: E731
CURVES = lambda i: ["coevolution", "curves", "--config", i["recipe"]]  # noqa: E731
PG_TABLES = lambda i: ["proteingym", "tables", "--summary", i["pg_summary"], "--assays-scored", i["pg_assays_scored"]]  # noqa: E731

CASES = [
    Case(
        "fetch",
        "named",
        "-o",
        lambda i, t: ["fetch", f"file://{i['fasta']}", "-o", t],
        (".fasta",),
        skip=("wrong_kind",),
    ),
    Case("extract", "named", "-o", lambda i, t: ["extract", i["archive"], "in.fasta", "-o", t], (".fasta",)),
    Case("ingest", "file", "-o", lambda i, t: ["ingest", i["fasta"], "-o", t, "--stats", "stats.json"], (".fasta",)),
    Case(
        "ingest --stats",
        "file",
        "--stats",
        lambda i, t: ["ingest", i["fasta"], "-o", "clean.fasta", "--stats", t],
        (".json",),
    ),
    Case(
        "split",
        "folder",
        "--out-dir",
        lambda i, t: ["split", i["fasta"], "--out-dir", t, "--threads", "1"],
        needs="mmseqs",
    ),
    Case(
        "split-structures",
        "folder",
        "--out-dir",
        lambda i, t: ["split-structures", i["structures"], "--out-dir", t],
        needs="mmseqs",
    ),
    Case(
        "split-table",
        "folder",
        "--out-dir",
        lambda i, t: ["split-table", i["table"], "--split-column", "split", "--out-dir", t],
    ),
    Case(
        "contacts-from-pdb",
        "file",
        "-o",
        lambda i, t: ["contacts-from-pdb", "--chains", i["chains"], "--pdb-dir", i["pdb_dir"], "-o", t],
        (".jsonl",),
    ),
    Case(
        "tokenize",
        "folder",
        "--out-dir",
        lambda i, t: ["tokenize", "--input", f"train={i['fasta']}", "--num-shards", "2", "--out-dir", t],
    ),
    Case("pretrain", "run", "--out", lambda i, t: [*PRETRAIN(i), "--out", t, "--final", "w.safetensors"]),
    Case(
        "pretrain --final",
        "file",
        "--final",
        lambda i, t: [*PRETRAIN(i), "--out", "run", "--final", t],
        (".safetensors",),
    ),
    Case(
        "pretrain --scores",
        "file",
        "--scores",
        lambda i, t: [*PRETRAIN(i), "--out", "run", "--final", "w.safetensors", "--scores", t],
        (".json",),
    ),
    Case(
        "pretrain --metrics",
        "file",
        "--metrics",
        lambda i, t: [*PRETRAIN(i), "--out", "run", "--final", "w.safetensors", "--metrics", t],
        (".csv",),
    ),
    Case(
        "throughput",
        "file",
        "-o",
        lambda i, t: ["throughput", i["throughput_result"], "--allow-cpu", "-o", t],
        (".yaml",),
    ),
    Case("synth", "folder", "--out", lambda i, t: ["synth", "--out", t, *i["synth_args"]]),
    Case("coevolution curves", "run", "--out", lambda i, t: [*CURVES(i), "--out", t]),
    Case(
        "coevolution curves --figure",
        "prefix",
        "--figure",
        lambda i, t: [*CURVES(i), "--out", "curves", "--figure", t],
        FIGURE,
    ),
    Case(
        "coevolution curves-report",
        "prefix",
        "--out-prefix",
        lambda i, t: ["coevolution", "curves-report", "--results", i["curves_tsv"], "--out-prefix", t],
        (".md", *FIGURE),
    ),
    Case(
        "coevolution curves-report --figure",
        "prefix",
        "--figure",
        lambda i, t: [
            *("coevolution", "curves-report", "--results", i["curves_tsv"], "--out-prefix", "c", "--figure", t),
        ],
        FIGURE,
    ),
    Case("finetune", "run", "--out", lambda i, t: [*FINETUNE(i), "--out", t, "--final", "h.safetensors"]),
    Case(
        "finetune --final",
        "file",
        "--final",
        lambda i, t: [*FINETUNE(i), "--out", "run", "--final", t],
        (".safetensors",),
    ),
    Case(
        "finetune --metrics",
        "file",
        "--metrics",
        lambda i, t: [*FINETUNE(i), "--out", "run", "--final", "h.safetensors", "--metrics", t],
        (".csv",),
    ),
    Case(
        "evaluate",
        "file",
        "--out",
        lambda i, t: [
            *("evaluate", "--head", "pair-kl", "--encoder", i["encoder"], "--test", f"t={i['structures']}", *CPU),
            *("--out", t),
        ],
        (".tsv",),
    ),
    Case("embed", "file", "-o", lambda i, t: ["embed", i["encoder"], i["fasta"], "-o", t, *CPU], (".parquet",)),
    Case(
        "embed --per-sequence",
        "file",
        "--per-sequence",
        lambda i, t: ["embed", i["encoder"], i["fasta"], "-o", "emb.parquet", "--per-sequence", t, *CPU],
        (".parquet",),
    ),
    Case("contacts", "folder", "-o", lambda i, t: ["contacts", i["encoder"], i["fasta"], "-o", t, *CPU]),
    Case(
        "contacts --out NAME.parquet",
        "file",
        "-o",
        lambda i, t: ["contacts", i["encoder"], i["fasta"], "-o", t, *CPU],
        (".parquet",),
        skip=("an_existing_folder", "dot"),
    ),
    Case(
        "score",
        "file",
        "-o",
        lambda i, t: [
            "score",
            i["encoder"],
            "--sequence",
            i["wild_type"],
            "--mutations",
            i["mutations"],
            "-o",
            t,
            *CPU,
        ],
        (".tsv",),
    ),
    Case("export", "folder", "-o", lambda i, t: ["export", i["encoder"], "-o", t]),
    Case("import", "folder", "-o", lambda i, t: ["import", i["exported"], "-o", t]),
    Case(
        "proteingym select",
        "file",
        "-o",
        lambda i, t: ["proteingym", "select", "--reference", i["pg_reference"], "--archive", i["pg_archive"], "-o", t],
        (".tsv",),
    ),
    Case(
        "proteingym score",
        "prefix",
        "--out-prefix",
        lambda i, t: [
            *("proteingym", "score", i["encoder"], "--archive", i["pg_archive"], "--assays", i["pg_selection"]),
            *("--assay", "ONE_TEST_2020", "--permutations", "0", *CPU, "--out-prefix", t),
        ],
        (".tsv", ".json"),
    ),
    Case(
        "proteingym aggregate",
        "prefix",
        "--out-prefix",
        lambda i, t: [
            *("proteingym", "aggregate", "--assays", i["pg_selection"], "--encoder", f"tiny={i['pg_scores']}"),
            *("--out-prefix", t),
        ],
        (".tsv", "_assays.tsv"),
    ),
    Case(
        "proteingym tables",
        "prefix",
        "--table-prefix",
        lambda i, t: [*PG_TABLES(i), "--table-prefix", t, "--figure-prefix", "figure"],
        (*TABLE, "_categories.csv", "_assays.csv", "_doubles.csv"),
    ),
    Case(
        "proteingym tables --figure-prefix",
        "prefix",
        "--figure-prefix",
        lambda i, t: [*PG_TABLES(i), "--table-prefix", "table", "--figure-prefix", t],
        ("_categories.png", "_categories.svg", "_doubles.png", "_doubles.svg"),
    ),
    Case("shard-fasta", "folder", "-o", lambda i, t: ["shard-fasta", i["fasta"], "-o", t]),
    Case(
        "gather",
        "file",
        "-o",
        lambda i, t: ["gather", "embeddings", "--shards", i["fasta_shards"], "--parts", i["parts"], "-o", t],
        (".parquet",),
    ),
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
]
IDS = [case.name for case in CASES]
# cases held to the refusals only: a full run costs more than the suite can spend (each is refused before any work,
# so the refusals cost nothing); their rerun rule is each command's own test file's, where one is named
RERUN_EXEMPT = {
    "pretrain": "a training run (tests/test_rerun.py resumes one)",
    "pretrain --final": "a training run",
    "pretrain --scores": "a training run",
    "pretrain --metrics": "a training run",
    "finetune": "a training run (tests/test_finetune.py resumes one)",
    "finetune --final": "a training run",
    "finetune --metrics": "a training run",
    "coevolution curves": "trains encoders (tests/test_coevolution_curves.py)",
    "coevolution curves --figure": "trains encoders",
    "coevolution curves-report": "reads the curves' results (tests/test_coevolution_curves.py makes some)",
    "coevolution curves-report --figure": "reads the curves' results",
}
# bad targets a command takes by design
TAKEN = {
    ("contacts --out NAME.parquet", "an_existing_folder"): "contacts -o DIR writes a folder (the 'contacts' case)",
    ("contacts --out NAME.parquet", "dot"): "contacts -o DIR writes a folder (the 'contacts' case)",
    ("fetch", "wrong_kind"): "an existing DEST is fetch's to judge: kept when it matches the digests, else fetched "
    "again (tests/test_fetch.py::test_existing_dest_is_kept_when_it_matches_and_replaced_when_not)",
}
# options that name an output but are not output targets of this rule, and why
NOT_TARGETS = {
    ("launch", "--marker-dir"): "a scratch folder the workers share for a requeue mark (default: a fresh hidden one, "
    "removed afterwards), not a result",
    ("coevolution curves", "--doc"): "a documentation page whose marked block is replaced in place, by design",
    ("coevolution curves-report", "--doc"): "a documentation page whose marked block is replaced in place, by design",
}
# how an option that names an output is spelled (anything else is an input or a setting)
OUTPUT_OPTIONS = {
    *("-o", "--out", "--output", "--out-dir", "--out-prefix", "--table-prefix", "--figure-prefix", "--figure"),
    *("--per-sequence", "--final", "--scores", "--metrics", "--stats", "--marker-dir", "--doc"),
}


def output_options() -> dict[tuple[str, str], set[str]]:
    """Every (command words, option) of the CLI's own parsers that names an output: walks pmlm.cli.SUBCOMMANDS
    and their subcommands' parsers; the option's spellings as the value."""
    from pmlm.cli import SUBCOMMANDS, build_parser

    found: dict[tuple[str, str], set[str]] = {}

    def walk(parser: argparse.ArgumentParser, words: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{words} {name}")
                continue
            spellings = set(action.option_strings)
            named = spellings & OUTPUT_OPTIONS
            if named:
                found[words, max(spellings, key=len)] = spellings

    top = build_parser()
    (commands,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(SUBCOMMANDS)
    for name in SUBCOMMANDS:
        walk(commands.choices[name], name)
    return found


def test_every_option_that_names_an_output_is_held_to_the_rule():
    """A command that writes, added to pmlm.cli.SUBCOMMANDS (or a subcommand, or an output option of one), is
    covered by a Case here or listed in NOT_TARGETS with its reason; nothing listed that the CLI does not have."""
    options = output_options()
    covered = {(case.words, case.option) for case in CASES} | set(NOT_TARGETS)
    missing = [
        f"pmlm {words} {option}"
        for (words, option), spellings in sorted(options.items())
        if not any((words, s) in covered for s in spellings)
    ]
    assert not missing, f"output options without a Case in tests/test_outputs.py: {', '.join(missing)}"
    known = {(words, s) for (words, _), spellings in options.items() for s in spellings}
    assert not sorted(covered - known), "Cases or NOT_TARGETS naming options the CLI does not have"
    assert set(RERUN_EXEMPT) <= set(IDS) and {name for name, _ in TAKEN} <= set(IDS)
    assert ("embed", "--out") in options and ("report run-info", "--out-prefix") in options  # the walk finds them


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Inputs every command reads, each valid (the commands succeed on a fresh target), under one folder."""
    import tarfile

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
    fasta = write_fasta(root / "in.fasta", {"a": random_letters(12, 1), "b": random_letters(30, 2)})
    with tarfile.open(root / "archive.tar", "w") as tar:
        tar.add(fasta, arcname="in.fasta")
    target = random_letters(20, seed=3)
    wild_type = write_fasta(root / "wt.fasta", {"wt": target})
    mutant = f"{target[1]}2{'A' if target[1] != 'A' else 'C'}"
    mutations = root / "mutations.csv"
    mutations.write_text(f"mutant\n{mutant}\n")
    table = root / "table.csv"
    table.write_text("sequence,label,split\n" + "".join(f"{random_letters(15, k)},{k},{s}\n" for k, s in enumerate(
        ("train", "train", "valid", "test"))))  # fmt: skip
    pdb_dir = root / "pdb"
    pdb_dir.mkdir()
    (pdb_dir / "1abc.pdb").write_text(pdb_text())
    chains = root / "chains.txt"
    chains.write_text("1abcA\n")
    recipe = root / "recipe.yaml"
    recipe.write_text("{}\n")  # never read: every pretrain / finetune / curves case is refused before its config
    synth_args = ["--families", "2", "--length", "24", "--sequences", "20", "--chains", "2", "--burn-in", "2"]
    curves = root / "curves.tsv"  # never read: the curves-report cases are refused before
    # ProteinGym: the reference and archive of one assay, its selection, scores, summary and aggregate
    pg = root / "proteingym"
    pg.mkdir()
    reference = write_reference(pg / "ref.csv", [{"DMS_id": "ONE_TEST_2020", "UniProt_ID": "ONE_TEST",
                                                 "target_seq": target, "coarse_selection_type": "Stability"}])  # fmt: skip
    archive = write_zip(pg / "assays.zip", {"ONE_TEST_2020.csv": assay_text(target, [mutant, f"{target[4]}5W"])})
    selection, scores, summary = pg / "assays.tsv", pg / "scores" / "ONE_TEST_2020", pg / "summary"
    assert (
        main(["proteingym", "select", "--reference", str(reference), "--archive", str(archive), "-o", str(selection)])
        == 0
    )
    assert main([
        "proteingym", "score", str(encoder), "--archive", str(archive), "--assays", str(selection),
        "--assay", "ONE_TEST_2020", "--permutations", "0", *CPU, "--out-prefix", str(scores),
    ]) == 0  # fmt: skip
    assert main(["proteingym", "aggregate", "--assays", str(selection), "--encoder", f"tiny={scores.parent}",
                 "--out-prefix", str(summary)]) == 0  # fmt: skip
    # inference shards and one embedding part each
    fasta_shards, parts = root / "fasta_shards", root / "parts"
    assert main(["shard-fasta", str(fasta), "-o", str(fasta_shards)]) == 0
    for shard in sorted(fasta_shards.glob("*.fasta")):
        assert main(["embed", str(encoder), str(shard), "-o", str(parts / f"{shard.stem}.parquet"), *CPU]) == 0
    paths = {
        "encoder": encoder,
        "fasta": fasta,
        "archive": root / "archive.tar",
        "exported": exported,
        "shards": write_shards(root / "shards", {"valid": make_sequences(4, seed=1, max_len=30)}),
        "structures": write_structures(root / "test.jsonl", 6, seed=1, lengths=(12, 30)),
        "contact_tsv": contact,
        "task_tsv": task,
        "metrics": metrics,
        "wild_type": wild_type,
        "mutations": mutations,
        "table": table,
        "pdb_dir": pdb_dir,
        "chains": chains,
        "recipe": recipe,
        "curves_tsv": curves,
        "throughput_result": result_file(root / "throughput.json"),
        "pg_reference": reference,
        "pg_archive": archive,
        "pg_selection": selection,
        "pg_scores": scores.parent,
        "pg_summary": summary.with_suffix(".tsv"),
        "pg_assays_scored": Path(f"{summary}_assays.tsv"),
        "fasta_shards": fasta_shards,
        "parts": parts,
    }
    return {k: str(v) for k, v in paths.items()} | {"root": root, "synth_args": synth_args}


def _refused(case: Case, inputs: dict, target: str, work: Path, capsys) -> str:
    before = tree(work, inputs["root"])
    assert main(case.argv(inputs, target)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pmlm {case.command}: error: {case.option} "), err
    assert tree(work, inputs["root"]) == before
    return err


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("target", ["an_existing_folder", "dot", "wrong_kind"])
def test_a_target_that_is_not_the_commands_is_one_line_and_changes_nothing(
    case, target, inputs, tmp_path, monkeypatch, capsys
):
    if target in case.skip:
        pytest.skip(TAKEN[case.name, target])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.txt").write_text("the user's\n")
    directory = case.shape in ("folder", "run")
    if target == "an_existing_folder":
        given = "results" if case.shape != "prefix" else "results/"
    elif target == "dot":
        given = "."
    elif directory:
        given = "keep.txt"
        (tmp_path / given).write_text("a file where the folder goes\n")
    else:
        given = "old" + (case.suffixes[0] if case.shape != "prefix" else "")  # a prefix writes old<suffix>
        wrong = {".png": b"not a png\n", ".parquet": b"text\n", ".safetensors": b"text\n"}
        (tmp_path / f"old{case.suffixes[0]}").write_bytes(wrong.get(case.suffixes[0], b"\x00\x01binary"))
    kind = "." + case.suffixes[0].rsplit(".", 1)[-1] if case.suffixes else ""
    says = {
        ("file", "an_existing_folder"): "is a folder",
        ("file", "dot"): "is a folder",
        ("file", "wrong_kind"): f"exists and is not a {case.suffixes[0] if case.suffixes else ''} file",
        ("named", "an_existing_folder"): "is a folder",
        ("named", "dot"): "is a folder",
        ("named", "wrong_kind"): f"exists and is not a {kind} file",
        ("prefix", "an_existing_folder"): "a prefix names files",
        ("prefix", "dot"): "a prefix names files",
        ("prefix", "wrong_kind"): f"exists and is not a {case.suffixes[0] if case.suffixes else ''} file",
        ("folder", "an_existing_folder"): "did not write (keep.txt)",
        ("folder", "dot"): "is the working folder",
        ("folder", "wrong_kind"): "exists and is a file",
        ("run", "an_existing_folder"): "did not write (keep.txt)",
        ("run", "dot"): "is the working folder",
        ("run", "wrong_kind"): "exists and is a file",
    }[case.shape, target]
    assert says in _refused(case, inputs, given, tmp_path, capsys)


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c.shape not in ("folder", "run")],
    ids=[c.name for c in CASES if c.shape not in ("folder", "run")],
)
def test_a_folder_where_one_of_the_files_goes_is_refused(case, inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = "out" + (case.suffixes[0] if case.shape != "prefix" else "")
    (tmp_path / (name if case.shape != "prefix" else f"out{case.suffixes[-1]}")).mkdir()
    _refused(case, inputs, name, tmp_path, capsys)


def test_a_run_folder_of_its_own_is_taken_and_a_foreign_one_refused(inputs, tmp_path, monkeypatch, capsys):
    """pretrain / finetune keep and resume their --out: what such a run keeps there (and the workflow's log, and
    --final inside it) is its own; the rest is refused before any work, the folder as it was."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    (run / "final").mkdir()
    for name in ("metrics.csv", "train.log", "stops.json"):
        (run / name).write_text("x\n")
    argv = ["pretrain", "--config", "missing.yaml", "--shards", inputs["shards"], "--out", "run"]
    assert main([*argv, "--final", "run/final/model.safetensors"]) == 2  # past the targets: the config is missing
    assert "missing.yaml" in capsys.readouterr().err
    (run / "notes.txt").write_text("the user's\n")
    before = tree(tmp_path)
    assert main([*argv, "--final", "run/final/model.safetensors"]) == 2
    assert "--out run: the folder holds files pmlm pretrain did not write (notes.txt)" in capsys.readouterr().err
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.name not in RERUN_EXEMPT], ids=[c for c in IDS if c not in RERUN_EXEMPT]
)
def test_a_rerun_replaces_only_the_commands_own_files(case, inputs, tmp_path, monkeypatch, capfd):
    """A workflow reruns a command on its own earlier outputs: no --overwrite needed; a file of the user's beside
    them (or, with --overwrite, inside the command's folder) is kept byte for byte. (capfd: MMseqs2 writes its log to
    the command's stderr by descriptor.)"""
    if case.needs and shutil.which(case.needs) is None:
        pytest.skip(f"needs {case.needs}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    keep = tmp_path / "out" / "keep.txt"
    keep.write_text("the user's\n")
    target = "out/result" + (case.suffixes[0] if case.shape in ("file", "named") else "")
    argv = case.argv(inputs, target)
    assert main(argv) == 0, capfd.readouterr().err
    first = tree(tmp_path)
    assert main(argv) == 0, capfd.readouterr().err
    assert sorted(tree(tmp_path)) == sorted(first) and keep.read_text() == "the user's\n"
    if case.shape == "folder":
        written = Path(target)
        assert json.loads((written / MANIFEST).read_text())["command"] == f"pmlm {case.words}"
        modes = {stat.S_IMODE(p.stat().st_mode) for p in written.rglob("*") if p.is_file()}
        assert modes == {new_file_mode()}
        (written / "mine.txt").write_text("the user's\n")
        assert main(argv) == 2
        assert "did not write (mine.txt)" in capfd.readouterr().err
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
    assert main(["embed", inputs["encoder"], inputs["fasta"], "-o", "an_existing_folder", *CPU]) == 2
    assert "-o an_existing_folder: is a folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["an_existing_folder"]


def test_a_run_folder_holding_what_a_run_keeps_is_resumed(tmp_path):
    """Everything the trainers keep in a run folder (their own names: checkpoints, a changed run's set-aside ones,
    metrics, TensorBoard, stops, scores, Inductor's cache, the workflow's log) makes it the run's own; a file of the
    user's beside them does not."""
    from pmlm.outputs import run_folder_target
    from pmlm.train.run_folder import RUN_FOLDER_NAMES

    run = tmp_path / "run"
    for name in RUN_FOLDER_NAMES:
        target = run / name.replace("*", "1")
        if "." in name and "superseded" not in name:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("x")
        else:
            target.mkdir(parents=True)
    assert {p.name for p in run.iterdir()} >= {"checkpoints", "inductor-cache", "checkpoints.superseded-1"}
    assert run_folder_target(run, command="pmlm pretrain", names=RUN_FOLDER_NAMES) == run
    (run / "notes.txt").write_text("the user's")
    with pytest.raises(OutputError, match=r"notes.txt"):
        run_folder_target(run, command="pmlm pretrain", names=RUN_FOLDER_NAMES)
