"""The inference rules' helpers (workflow/lib/inference.py): paths, the flags of each shard command, the targets,
the shards the checkpoint wrote, the CPU jobs' resources, and the rule of each output's shard jobs that `pmlm plan`
reads the profile's time limit of (workflow/lib/shard_rules.yaml)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from tiny_models import write_fasta
from workflow_rules import REPO, read_rules, workflow_module

from pmlm.inference.fasta_shards import shard_fasta
from pmlm.inference.output_types import OUTPUTS
from pmlm.inference.pricing import section_defaults
from pmlm.vocabulary import INFERENCE_OUTPUTS, OUTPUT_CONTACTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS

inference = workflow_module("inference")
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
MODELS = [{"dataset": "demo", "objective": "pmlm", "preset": "tiny"}]


def run(checkpoints=None, **section) -> object:
    config = {"pretrain": {"models": MODELS}, "inference": {**section_defaults(SCHEMA), **section}}
    return inference.Inference(config, "results/run", lambda m: f"trained/{m['objective']}.safetensors", checkpoints)


def test_paths_and_targets():
    r = run(fasta="in.fasta", encoders={"a": "demo/pmlm-tiny", "b": "enc/dir", "c": "enc/w.safetensors"},
            outputs=list(INFERENCE_OUTPUTS))  # fmt: skip
    assert r.fasta() == "in.fasta" and r.enabled() and r.shards == "results/run/inference/shards"
    weights = {e: r.encoder_weights(SimpleNamespace(encoder=e)) for e in "abc"}
    assert weights == {"a": "trained/pmlm.safetensors", "b": "enc/dir/model.safetensors", "c": "enc/w.safetensors"}
    assert r.part(OUTPUT_CONTACTS) == "results/run/inference/{encoder}/shards/contacts/{shard}.parquet"
    assert r.part(OUTPUT_EMBEDDINGS, inference.PER_SEQUENCE).endswith("embeddings/{shard}.per_sequence.parquet")
    assert r.file("{encoder}", "{kind}") == "results/run/inference/{encoder}/{kind}.parquet"
    assert r.files("a", OUTPUT_EMBEDDINGS) == [
        "results/run/inference/a/embeddings.parquet", "results/run/inference/a/embeddings.per_sequence.parquet"
    ]  # fmt: skip
    assert len(r.targets()) == 3 * 4 and r.targets()[:4] == [
        *r.files("a", OUTPUT_EMBEDDINGS), r.file("a", OUTPUT_SUBSTITUTIONS), r.file("a", OUTPUT_CONTACTS)
    ]  # fmt: skip
    assert inference.ONE_FILE_OUTPUTS == [OUTPUT_SUBSTITUTIONS, OUTPUT_CONTACTS]
    assert r.gathered_parts_dir(SimpleNamespace(encoder="a")) == "results/run/inference/a/shards/embeddings"
    kind = SimpleNamespace(encoder="a", kind=OUTPUT_CONTACTS)
    assert r.gathered_parts_dir(kind) == "results/run/inference/a/shards/contacts"
    # no sequences: no inference jobs
    assert run(fasta=None, encoders={"a": "demo/pmlm-tiny"}).targets() == []


def test_each_shard_command_gets_its_own_flags_then_every_shard_jobs():
    r = run(fasta="in.fasta", encoders={"a": "enc"}, unknown="x", device="cuda", tokens_per_batch=4096)
    common = "--tokens-per-batch 4096 --device cuda --precision auto"
    wildcards = SimpleNamespace(encoder="a", shard="0")
    assert r.shard_fasta_args(wildcards) == "--residues-per-shard 250000 --unknown x"
    assert r.shard_args(OUTPUT_EMBEDDINGS)(wildcards) == f"--layer -1 --unknown x {common}"
    assert r.shard_args(OUTPUT_SUBSTITUTIONS)(wildcards) == f"--marginal masked {common}"
    # the contacts section in sorted order; top: all is the command's default, given by no --top
    assert r.shard_args(OUTPUT_CONTACTS)(wildcards) == f"--min-separation 6 --readout auto --top L {common}"
    every = run(
        fasta="in.fasta", encoders={"a": "enc"}, contacts={"top": "all", "readout": "pair", "min_separation": 4}
    )
    assert every.shard_args(OUTPUT_CONTACTS)(wildcards).startswith("--min-separation 4 --readout pair --tokens")


def test_the_parts_are_the_checkpoints_shards(tmp_path):
    fasta = write_fasta(tmp_path / "in.fasta", {"a": "MKV" * 10, "b": "LLA" * 10, "c": "WY" * 10})
    shard_fasta(fasta, tmp_path / "shards", residues_per_shard=30)
    checkpoints = SimpleNamespace(
        shard_fasta=SimpleNamespace(get=lambda: SimpleNamespace(output=[tmp_path / "shards"]))
    )
    r = run(checkpoints, fasta=str(fasta), encoders={"a": "enc"})
    names = r.shard_names()
    assert len(names) == 3
    parts = r.parts(OUTPUT_EMBEDDINGS, inference.PER_SEQUENCE)(SimpleNamespace(encoder="a"))
    assert parts == [f"results/run/inference/a/shards/embeddings/{n}.per_sequence.parquet" for n in names]
    wildcard = r.parts(None)(SimpleNamespace(encoder="a", kind=OUTPUT_SUBSTITUTIONS))
    assert wildcard == [f"results/run/inference/a/shards/substitutions/{n}.parquet" for n in names]


def test_the_cpu_jobs_resources_grow_with_input_and_attempt(tmp_path):
    mib = tmp_path / "in.fasta"
    mib.write_bytes(b"x" * (120 * 2**20))
    assert inference.shard_fasta_mem_mb(None, [mib], 2) == 2 * (1000 + 120)
    assert inference.shard_fasta_runtime(None, [mib], 1) == 15 + 2
    assert inference.gather_mem_mb(None, 3) == 24000
    assert inference.gather_runtime(None, [mib] * 20, 2) == 2 * (15 + 2)


@pytest.mark.parametrize("output", INFERENCE_OUTPUTS)
def test_each_outputs_shard_rule_runs_its_command_and_has_a_profile_block(output):
    rule = yaml.safe_load((REPO / "workflow" / "lib" / "shard_rules.yaml").read_text())[output]
    rules = read_rules()
    assert rules[rule].path.name == "inference.smk" and rules[rule].pmlm_commands == [OUTPUTS[output].command]
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["set-resources"][rule]["gpu"] == 1
