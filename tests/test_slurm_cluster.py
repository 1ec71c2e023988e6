"""A tiny workflow run through profiles/slurm on a real one-node SLURM cluster (tests/slurm/cluster.sh), to
prove jobs, GPU requests included, really go through sbatch and are seen to finish through accounting."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from local_cluster import (
    CLUSTER_ACCOUNT,
    CLUSTER_PARTITION,
    SITE_PROFILE,
    LocalCluster,
    cluster_default_resources,
    run_snakemake,
    slurm_cluster,  # noqa: F401  (module-scoped fixture)
)
from local_cluster import fields as _fields
from local_cluster import scontrol_job as _scontrol_job
from local_cluster import tail as _tail

# whole-workflow bound for the tiny two-job Snakefile below (the profile's first status query comes 40 s
# after submission)
SNAKEMAKE_TIMEOUT_S = 240

# Two rules submitted as SLURM jobs; each writes the variables only a SLURM job step has.
# Rules run under `set -euo pipefail`, hence the `:-` defaults.
TINY_SNAKEFILE = textwrap.dedent(
    """\
    rule all:
        input: "cpu.txt", "gpu.txt"

    rule cpu_job:
        output: "cpu.txt"
        threads: 1
        shell: "echo job=${{SLURM_JOB_ID:-}} cuda=${{CUDA_VISIBLE_DEVICES:-}} > {output}"

    rule gpu_job:
        output: "gpu.txt"
        threads: 1
        resources: gpu=1, cpus_per_gpu=1
        shell:
            "echo job=${{SLURM_JOB_ID:-}} cuda=${{CUDA_VISIBLE_DEVICES:-}}"
            " gpus=${{SLURM_JOB_GPUS:-}} > {output}"
    """
)


def _sbatch_calls(log: str) -> dict[str, str]:
    """rule name -> the sbatch command line the executor logged for it (with --verbose)."""
    calls = {}
    for line in log.splitlines():
        if line.startswith("sbatch call:"):
            match = re.search(r"--comment (\S+)", line)
            assert match, f"no --comment in {line}"
            calls[match.group(1).removeprefix("rule_")] = line
    return calls


@pytest.mark.slurm
def test_rules_run_as_slurm_jobs_with_gpu_request(slurm_cluster: LocalCluster, tmp_path: Path):
    (tmp_path / "Snakefile").write_text(TINY_SNAKEFILE)
    result = run_snakemake(
        [
            "--snakefile", str(tmp_path / "Snakefile"),
            "--directory", str(tmp_path),
            # the site profile, outside the repository: by path, and without the workflow's own profile
            "--profile", str(SITE_PROFILE),
            "--workflow-profile", "none",
            "--default-resources", *cluster_default_resources(),
            "--verbose",
        ],
        cwd=tmp_path,
        timeout_s=SNAKEMAKE_TIMEOUT_S,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"snakemake exited {result.returncode} (124: timed out)\n{_tail(log)}\n{slurm_cluster.log_tails()}"
    )
    # the executor saw the jobs finish through the accounting database (sacct), as on a real cluster
    assert "command=sacct" in log

    cpu = _fields((tmp_path / "cpu.txt").read_text())
    gpu = _fields((tmp_path / "gpu.txt").read_text())
    for out in (cpu, gpu):
        assert out["job"].isdigit(), f"output not written inside a SLURM job: {out}"
    assert cpu["job"] != gpu["job"]

    calls = _sbatch_calls(log)
    assert set(calls) == {"cpu_job", "gpu_job"}, calls
    assert "--gpus=1" in calls["gpu_job"]
    assert "--gpus" not in calls["cpu_job"]
    for call in calls.values():
        assert f"-p {CLUSTER_PARTITION}" in call and f"-A {CLUSTER_ACCOUNT}" in call and "--requeue" in call, call

    # the controller's own record: same job ids, finished, and only one asked for a GPU
    for rule, out in (("cpu_job", cpu), ("gpu_job", gpu)):
        record = _scontrol_job(out["job"])
        assert record["JobState"] == "COMPLETED", record
        assert record["Comment"] == f"rule_{rule}", record
        assert Path(record["WorkDir"]) == tmp_path, record
        assert record["Partition"] == CLUSTER_PARTITION, record
        assert slurm_cluster.jobcomp_record(out["job"])["JobState"] == "COMPLETED"
    assert "gres:gpu:1" in _scontrol_job(gpu["job"]).get("TresPerJob", ""), gpu
    assert "gpu" not in _scontrol_job(cpu["job"]).get("TresPerJob", "")
    # SLURM's gpu plugin bound the (fake) device to the GPU job's step and to no other
    assert gpu["cuda"] != "", gpu
    assert cpu["cuda"] == "", cpu
