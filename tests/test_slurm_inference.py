"""A proteome through the workflow on the local SLURM cluster (tests/slurm/cluster.sh), as docs/inference.md runs it:
`snakemake --profile slurm inference` from the repository root. 300 sequences of the demo's UniProt sample in four
shards, every output of a tiny encoder: one SLURM job per shard and output, in the GPU partition with one GPU each.
One shard job is killed mid-way (SIGKILL to its process while it computes, its part not yet written): that job
fails, Snakemake resubmits that shard alone and no other, and the gathered files equal each command's output on the
whole FASTA, row for row: none lost, none twice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import PROTEOME_MAX_LEN as MAX_LEN
from conftest import PROTEOME_RUN as RUN
from conftest import assert_equals_single_commands, inference_config, proteome, single_commands
from tiny_models import tiny_encoder, write_fasta

from pmlm.inference.fasta_shards import read_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from local_cluster import (
    CLUSTER_GPU_PARTITION,
    FAST_STATUS,
    REPO,
    LocalCluster,
    cluster_default_resources,
    slurm_cluster,  # noqa: F401  (module-scoped fixture)
    snakemake_command,
    snakemake_env,
    submissions,
    tail,
)

pytestmark = pytest.mark.slurm

SEQUENCES = 300
RESIDUES_PER_SHARD = 3500  # 13,280 residues: four shards
SHARD_RULES = {"embed": "embed_shard", "score": "score_shard", "contacts": "contacts_shard"}  # command -> rule
# bounds against a hang only
SNAKEMAKE_TIMEOUT_S = 600
EVENT_WAIT_S = 300
POLL_S = 0.05


def _shard_processes(workdir: Path) -> list[tuple[int, str, str, str]]:
    """(pid, command, shard, its -o) of the shard jobs' `pmlm embed|score|contacts` processes running in ``workdir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
            if Path(os.readlink(entry / "cwd")) != workdir:
                continue
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if argv[1:3] != ["-m", "pmlm"] or argv[3] not in SHARD_RULES:
            continue
        shard = next((m.group(1) for a in argv if (m := re.search(r"/shards/(\d+)\.fasta$", a))), None)
        if shard is not None:
            found.append((int(entry.name), argv[3], shard, argv[argv.index("-o") + 1]))
    return found


def _kill_one_mid_way(workdir: Path, snakemake: subprocess.Popen, out_path: Path) -> tuple[str, str]:
    """SIGKILL to the first shard job found computing: stopped first (SIGSTOP), checked to be mid-way (its part
    not written), then killed. Returns (command, shard)."""
    started = time.monotonic()
    while True:
        assert snakemake.poll() is None, tail(out_path.read_text())
        assert time.monotonic() < started + EVENT_WAIT_S, "no shard job ran"
        for pid, command, shard, part in _shard_processes(workdir):
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            if (workdir / part).exists():  # it had finished: let it go, take another
                os.kill(pid, signal.SIGCONT)
                continue
            os.kill(pid, signal.SIGKILL)
            return command, shard
        time.sleep(POLL_S)


def _shard_submissions(log: str) -> Counter:
    """How often each shard job was submitted, by its sbatch --comment (rule_<rule>_wildcards_<encoder>_<shard>)."""
    return Counter(re.findall(r"^sbatch call: .*--comment (rule_(?:embed|score|contacts)_shard_\S*)", log, re.M))


def test_a_proteome_through_slurm_with_a_shard_killed_mid_way(slurm_cluster: LocalCluster, tmp_path):
    records = proteome(SEQUENCES)
    fasta = write_fasta(tmp_path / "proteome.fasta", records)
    model = tiny_encoder(tmp_path / "encoder" / "model.safetensors", max_len=MAX_LEN)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(inference_config(fasta, model.parent, RESIDUES_PER_SHARD)))
    workdir = tmp_path / "work"
    args = [
        "--profile", "slurm",
        "--default-resources", *cluster_default_resources(),
        *FAST_STATUS,
        "--directory", str(workdir),
        "--verbose",  # logs each sbatch call
        "inference",
        "--configfile", str(config),
    ]  # fmt: skip
    out_path = tmp_path / "snakemake.out"
    started = time.monotonic()
    with out_path.open("w") as out:
        snakemake = subprocess.Popen(snakemake_command(args, SNAKEMAKE_TIMEOUT_S), cwd=REPO, stdout=out,
                                     stderr=subprocess.STDOUT, text=True, env=snakemake_env())  # fmt: skip
        try:
            killed = _kill_one_mid_way(workdir, snakemake, out_path)
        finally:
            returncode = snakemake.wait()
    print(f"proteome through SLURM, one shard killed: {time.monotonic() - started:.0f} s")
    log = out_path.read_text()
    assert returncode == 0, f"snakemake exited {returncode} (124: timed out)\n{tail(log)}\n{slurm_cluster.log_tails()}"

    # one job per shard and output, in the GPU partition with a GPU each; the killed shard, and no other, was
    # submitted again (Snakemake's retry)
    shards = [s.name for s in read_manifest(workdir / "results" / RUN / "inference" / "shards").shards]
    assert len(shards) == 4, shards
    command, shard = killed
    expected = Counter(f"rule_{rule}_wildcards_tiny_{name}" for rule in SHARD_RULES.values() for name in shards)
    expected[f"rule_{SHARD_RULES[command]}_wildcards_tiny_{shard}"] += 1
    assert _shard_submissions(log) == expected, _shard_submissions(log)
    for job in submissions(log):
        if job.rule in SHARD_RULES.values():
            assert f"-p {CLUSTER_GPU_PARTITION}" in job.sbatch and "--gpus=1" in job.sbatch, job.sbatch
    failed = [j for j in submissions(log) if slurm_cluster.jobcomp_record(j.job_id)["JobState"] != "COMPLETED"]
    assert [j.sbatch.count(f"_wildcards_tiny_{shard}") for j in failed] == [1], failed
    assert len(re.findall(r"^Error in rule ", log, re.M)) == 1, tail(log)

    reference = single_commands(model, fasta, tmp_path / "single")
    assert_equals_single_commands(workdir, reference, list(records))
