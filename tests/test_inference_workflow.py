"""A proteome through the workflow without a cluster: the FASTA checked once and cut into contiguous shards balanced
by residues (`pmlm shard-fasta`), the gather's refusals (parts of another shard, of another encoder, missing, with
other settings), the config's checks and defaults, and `snakemake --cores 2 inference` whose gathered files equal
the single commands' outputs on the whole FASTA. tests/test_slurm_inference.py runs the same through the local SLURM
cluster, with a shard job killed mid-way; the two share their helpers (conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import PROTEOME_MAX_LEN as MAX_LEN
from conftest import PROTEOME_RUN as RUN
from conftest import (
    REPO,
    assert_equals_single_commands,
    assert_same_rows,
    gathered,
    inference_config,
    proteome,
    single_commands,
)
from tiny_models import tiny_encoder, write_fasta
from workflow_rules import workflow_config

from pmlm.cli import build_parser, main
from pmlm.data.fasta import read_fasta
from pmlm.inference.embedding import PER_SEQUENCE_SUFFIX
from pmlm.inference.fasta_shards import MANIFEST, assign_shards, read_manifest, shard_count
from pmlm.inference.gather import SETTINGS_KEY
from pmlm.tokens import DEFAULT_TOKENS_PER_BATCH
from pmlm.vocabulary import INFERENCE_OUTPUTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS

SNAKEMAKE = Path(sys.executable).parent / "snakemake"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def settings(path: Path) -> dict:
    return json.loads(pq.read_schema(path).metadata[SETTINGS_KEY])


def snakemake(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


# -- the shards ------------------------------------------------------------------------------------------------------


def test_shards_are_contiguous_runs_balanced_by_residues():
    # 100 residues, at most 30 a shard: 4 ranges of 25; each record in the range of its middle residue (5, 15, 25, ...:
    # 25 is the second range's first)
    assert shard_count(100, 10, 30) == 4
    assert assign_shards([10] * 10, 30) == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]
    # a record longer than a range leaves the first range empty: shards are numbered without gaps
    assert assign_shards([1000, 10, 10, 10], 300) == [0, 1, 1, 1]
    # never more shards than records, one at least
    assert assign_shards([5, 5], 1) == [0, 1] and assign_shards([5], 1000) == [0]
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2000, size=500).tolist()
    shards = assign_shards(lengths, 20_000)
    assert shards == sorted(shards) and sorted(set(shards)) == list(range(shards[-1] + 1))  # contiguous, in order
    sizes = np.bincount(shards, weights=lengths)
    # a range of T / N <= 20,000 residues, give or take the halves of the records at its two ends
    assert sum(lengths) / len(sizes) <= 20_000
    assert np.abs(sizes - sum(lengths) / len(sizes)).max() <= max(lengths)


def test_shard_fasta_checks_the_whole_file_once_and_writes_what_the_commands_read(tmp_path, capsys):
    fasta = write_fasta(tmp_path / "in.fasta", {"a": "MKVLAAGIVG", "b": "mkvbaagivg", "c": "MKVLA"})
    # a letter outside the alphabet: one line naming the file and the line of the letter
    assert main(["shard-fasta", str(fasta), "-o", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"pmlm shard-fasta: error: {fasta}:4: record 'b': character 'b'"), err
    assert not (tmp_path / "refused").exists()
    # ids repeated far apart: no shard job could see it; the error names both lines
    twice = write_fasta(tmp_path / "twice.fasta", {"a": "MKV", "b": "MKV"})
    twice.write_text(twice.read_text() + ">a again\nMKV\n")
    assert main(["shard-fasta", str(twice), "-o", str(tmp_path / "twice")]) == 2
    assert "twice.fasta:5: duplicate id 'a' (first at line 1)" in capsys.readouterr().err

    assert (
        main(["shard-fasta", str(fasta), "-o", str(tmp_path / "x"), "--unknown", "x", "--residues-per-shard", "15"])
        == 0
    )
    err = capsys.readouterr().err
    assert "pmlm shard-fasta: 1 letter outside the alphabet read as X in 1 sequence" in err, err
    manifest = read_manifest(tmp_path / "x")
    assert [(s.name, s.records, s.residues) for s in manifest.shards] == [("00000", 1, 10), ("00001", 2, 15)]
    assert manifest.repairs["unknown_letters"] == 1 and manifest.repairs["lowercase_sequences"] == 1
    # the records as every command reads them, headers kept
    assert (
        tmp_path / "x" / "00001.fasta"
    ).read_text() == ">b some description\nMKVXAAGIVG\n>c some description\nMKVLA\n"
    assert main(["shard-fasta", str(fasta), "-o", str(tmp_path / "skip"), "--unknown", "skip"]) == 0
    assert [r.id for r in read_fasta(tmp_path / "skip" / "00000.fasta")] == ["a", "c"]
    assert read_manifest(tmp_path / "skip").repairs["skipped_sequences"] == 1
    # its folder is its own: a folder holding other files is refused before any work
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine\n")
    assert main(["shard-fasta", str(fasta), "-o", str(tmp_path / "mine"), "--unknown", "x"]) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine\n" and not (tmp_path / "mine" / MANIFEST).exists()


# -- the gather ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_shards(tmp_path_factory):
    """40 sequences in 3 shards, each embedded by the tiny encoder and by another one."""
    root = tmp_path_factory.mktemp("gather")
    fasta = write_fasta(root / "in.fasta", proteome(40))
    models = {name: tiny_encoder(root / name / "model.safetensors", max_len=MAX_LEN, seed=seed)
              for name, seed in (("tiny", 0), ("other", 1))}  # fmt: skip
    assert main(["shard-fasta", str(fasta), "-o", str(root / "shards"), "--residues-per-shard", "600"]) == 0
    names = [s.name for s in read_manifest(root / "shards").shards]
    for name, model in models.items():
        for shard in names:
            argv = [
                "embed",
                str(model),
                str(root / "shards" / f"{shard}.fasta"),
                "-o",
                str(root / name / f"{shard}.parquet"),
            ]
            assert main(argv) == 0
    return root, fasta, models, names


def _gather(root: Path, parts: Path, out: str, *extra: str) -> int:
    return main(
        [
            "gather",
            OUTPUT_EMBEDDINGS,
            "--shards",
            str(root / "shards"),
            "--parts",
            str(parts),
            "-o",
            str(root / out),
            *extra,
        ]
    )


def test_gathered_embeddings_are_the_whole_files_in_order(embedded_shards, capsys):
    root, fasta, models, names = embedded_shards
    assert len(names) == 3
    assert _gather(root, root / "tiny", "all.parquet", "--model", str(models["tiny"])) == 0
    assert main(["embed", str(models["tiny"]), str(fasta), "-o", str(root / "whole.parquet")]) == 0
    assert_same_rows(root / "all.parquet", root / "whole.parquet")
    assert_same_rows(root / f"all{PER_SEQUENCE_SUFFIX}", root / f"whole{PER_SEQUENCE_SUFFIX}")
    recorded = settings(root / "all.parquet")
    manifest = read_manifest(root / "shards")
    assert recorded["model_sha256"] == settings(root / "whole.parquet")["model_sha256"]
    assert recorded["inference"]["input_sha256"] == manifest.input_sha256
    assert recorded["inference"]["shards"] == 3 and recorded["inference"]["strategy"] == manifest.settings["strategy"]
    assert recorded["inference"]["rows"] == manifest.residues
    assert settings(root / f"all{PER_SEQUENCE_SUFFIX}")["inference"]["rows"] == 40


def test_the_gather_refuses_parts_that_are_not_the_shards_computed_alike(embedded_shards, tmp_path, capsys):
    root, _, models, names = embedded_shards

    def parts(**replaced: Path) -> Path:
        folder = tmp_path / f"parts{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        for name in names:
            source = replaced.get(f"s{name}", root / "tiny" / f"{name}.parquet")
            if source is not None:
                for suffix in (".parquet", PER_SEQUENCE_SUFFIX):
                    (folder / f"{name}{suffix}").write_bytes(
                        Path(str(source).removesuffix(".parquet") + suffix).read_bytes()
                    )
        return folder

    def refused(folder: Path, *extra: str) -> str:
        assert _gather(root, folder, "refused.parquet", *extra) == 2
        assert not (root / "refused.parquet").exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("pmlm gather: error: "), err
        return err[0]

    # a shard computed by another encoder: the two files and the setting named
    mixed = parts(**{f"s{names[1]}": root / "other" / f"{names[1]}.parquet"})
    assert "computed with model" in refused(mixed) and f"{names[1]}.parquet" in refused(mixed)
    assert "not by" in refused(parts(), "--model", str(models["other"]))
    # a shard's part copied in place of another: its rows are not that shard's records
    assert "not of its shard" in refused(parts(**{f"s{names[2]}": root / "tiny" / f"{names[0]}.parquet"}))
    # a shard without its part
    assert "no such file (1 of 3 shards' parts are missing)" in refused(parts(**{f"s{names[0]}": None}))


# -- the config ------------------------------------------------------------------------------------------------------


def test_the_schema_names_the_vocabulary_and_the_commands_defaults():
    section = yaml.safe_load(SCHEMA.read_text())["properties"]["inference"]["properties"]
    assert tuple(section["outputs"]["items"]["enum"]) == INFERENCE_OUTPUTS
    assert section["tokens_per_batch"]["default"] == DEFAULT_TOKENS_PER_BATCH
    options = {
        name: {a.dest: a for a in sub._actions}
        for name, sub in build_parser()._subparsers._group_actions[0].choices.items()
    }
    assert section["layer"]["default"] == options["embed"]["layer"].default
    assert section["residues_per_shard"]["default"] == options["shard-fasta"]["residues_per_shard"].default
    assert (
        section["contacts"]["properties"]["min_separation"]["default"] == options["contacts"]["min_separation"].default
    )
    # the choices the workflow passes on are the commands' own
    assert section["marginal"]["enum"] == list(options["score"]["marginal"].choices)
    assert section["contacts"]["properties"]["readout"]["enum"] == list(options["contacts"]["readout"].choices)
    assert section["unknown"]["enum"] == list(options["embed"]["unknown"].choices)
    assert section["unknown"]["enum"] == list(options["shard-fasta"]["unknown"].choices)


@pytest.mark.parametrize(
    ("inference", "message"),
    [
        ({"fasta": "in.fasta"}, "config.inference.encoders: name at least one encoder"),
        ({"encoders": {"a": "demo/pmlm-tiny"}}, "config.inference.fasta: the sequences"),
        ({"fasta": "in.fasta", "encoders": {"shards": "demo/pmlm-tiny"}}, "config.inference.encoders.shards: 'shards'"),
        ({"fasta": "in.fasta", "encoders": {"a": "demo/pmlm-small"}},
         "config.inference.encoders.a: 'demo/pmlm-small' is neither an encoder of pretrain.models (have: demo/pmlm-tiny)"),
    ],
)  # fmt: skip
def test_the_inference_section_is_checked_in_one_line(inference, message):
    config = {
        "pretrain": {"models": [{"dataset": "demo", "objective": "pmlm", "preset": "tiny"}]},
        "inference": inference,
    }
    with pytest.raises(workflow_config.ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        workflow_config._check_inference(config)


def test_all_runs_inference_only_when_the_config_has_sequences(tmp_path):
    """The demo's `all` plans no inference job; with an inference section naming a trained encoder of the demo, `all`
    gathers its outputs, and the encoder is trained before anything that reads it (the gather checks its sha256)."""
    demo = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(REPO / "config" / "config.yaml"))
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "shard_fasta" not in demo.stdout and "gather_" not in demo.stdout
    extra = tmp_path / "inference.yaml"
    fasta = write_fasta(tmp_path / "in.fasta", proteome(5))
    extra.write_text(yaml.safe_dump({"inference": {"fasta": str(fasta), "encoders": {"pmlm": "demo/pmlm-tiny"}}}))
    planned = snakemake(
        tmp_path, "-n", "--cores", "2", "--configfile", str(REPO / "config" / "config.yaml"), str(extra)
    )
    assert planned.returncode == 0, planned.stderr[-2000:]
    for job in ("shard_fasta", "gather_embeddings", "pretrain"):
        assert f"rule {job}:" in planned.stdout or f"checkpoint {job}:" in planned.stdout, job
    gather = planned.stdout[planned.stdout.index("rule gather_embeddings:") :]
    assert "results/demo/pretrain/demo/pmlm-tiny/model.safetensors" in gather.split("\n\n")[0]


def test_the_shipped_inference_configs_are_valid():
    """config/inference.yaml is a valid config naming the released PMLM-650M by its pretrain.models entry (the
    workflow fetches and imports it); an encoder folder that is not there is one line; config/inference_demo.yaml
    plans the demo's inference from the repository root."""
    shipped = yaml.safe_load((REPO / "config" / "inference.yaml").read_text())
    jsonschema.Draft202012Validator(yaml.safe_load(SCHEMA.read_text())).validate(shipped)
    workflow_config._check_inference(shipped)
    shipped["inference"]["encoders"]["pmlm650m"] = "pmlm-650m"
    with pytest.raises(
        workflow_config.ConfigError, match=r"^config.inference.encoders.pmlm650m: 'pmlm-650m' is neither"
    ):
        workflow_config._check_inference(shipped)
    configs = [str(REPO / "config" / name) for name in ("config.yaml", "inference_demo.yaml")]
    planned = snakemake(REPO, "-n", "--cores", "2", "inference", "--configfile", *configs)
    assert planned.returncode == 0, planned.stderr[-2000:]


# -- the workflow on this machine ------------------------------------------------------------------------------------


def test_the_local_workflow_equals_the_single_commands(tmp_path):
    """`snakemake --cores 2 inference`: 60 sequences (one with a letter read as X) in 2 shards, every output of the
    tiny encoder, gathered equal to each command's output on the whole FASTA; a second run has nothing to do."""
    records = proteome(60)
    first = next(iter(records))
    records[first] = records[first][:4] + "B" + records[first][5:]
    fasta = write_fasta(tmp_path / "in.fasta", records)
    model = tiny_encoder(tmp_path / "encoder" / "model.safetensors", max_len=MAX_LEN)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(inference_config(fasta, model.parent, 1500, unknown="x")))
    workdir = tmp_path / "work"
    done = snakemake(workdir, "--cores", "2", "inference", "--configfile", str(config))
    assert done.returncode == 0, done.stderr[-4000:]
    manifest = read_manifest(workdir / "results" / RUN / "inference" / "shards")
    assert len(manifest.shards) == 2 and manifest.repairs["unknown_letters"] == 1
    log = (workdir / "logs" / RUN / "inference" / "shard_fasta.log").read_text()
    assert "1 letter outside the alphabet read as X in 1 sequence" in log, log

    # the single commands read the FASTA as the workflow's config says: letters outside the alphabet read as X
    # (pmlm score and contacts have no such option: they get the letters as read)
    as_read = write_fasta(tmp_path / "as_read.fasta", {**records, first: records[first].replace("B", "X")})
    reference = single_commands(model, as_read, tmp_path / "single")
    assert (
        main(
            ["embed", str(model), str(fasta), "-o", str(reference[OUTPUT_EMBEDDINGS]), "--unknown", "x", "--overwrite"]
        )
        == 0
    )
    assert_equals_single_commands(workdir, reference, list(records))
    recorded = settings(gathered(workdir, OUTPUT_SUBSTITUTIONS))
    assert recorded["inference"]["input_sha256"] == manifest.input_sha256 and recorded["marginal"] == "masked"
    assert settings(gathered(workdir, OUTPUT_EMBEDDINGS))["unknown"] == "x"
    # the shards' files were temporary: removed once gathered; a second run has nothing to do
    assert not list((workdir / "results" / RUN / "inference" / "tiny").glob("shards/*/*.parquet"))
    again = snakemake(workdir, "-n", "--cores", "2", "inference", "--configfile", str(config))
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]
