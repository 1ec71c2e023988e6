"""The SLURM profiles: a dry run of the site profile, and a tiny workflow run through the local
profile on a real one-node SLURM cluster (tests/slurm/cluster.sh) to prove jobs, GPU requests
included, really go through sbatch."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from local_cluster import (  # noqa: E402
    LOCAL_PROFILE,
    REPO,
    LocalCluster,
    run_snakemake,
    slurm_cluster,  # noqa: F401  (module-scoped fixture)
)
from local_cluster import fields as _fields  # noqa: E402
from local_cluster import scontrol_job as _scontrol_job  # noqa: E402
from local_cluster import tail as _tail  # noqa: E402

SITE_PROFILE = REPO / "profiles" / "slurm"
# whole-workflow bound for the tiny two-job Snakefile below
SNAKEMAKE_TIMEOUT_S = 150
GPU_RULES = ("pretrain", "finetune", "evaluate")

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


def _jobcomp_record(cluster: LocalCluster, job_id: str) -> dict[str, str]:
    for line in cluster.jobcomp_log.read_text().splitlines():
        record = _fields(line)
        if record.get("JobId") == job_id:
            return record
    raise AssertionError(f"job {job_id} not in {cluster.jobcomp_log}\n{cluster.log_tails()}")


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
            "--executor", "slurm",
            "--profile", str(LOCAL_PROFILE),
            "--workflow-profile", "none",
            "--verbose",
        ],
        cwd=tmp_path,
        timeout_s=SNAKEMAKE_TIMEOUT_S,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"snakemake exited {result.returncode} (124: timed out)\n{_tail(log)}\n"
        f"{slurm_cluster.log_tails()}"
    )
    # the executor polled with squeue and did not silently fall back to sacct
    assert "command=squeue" in log
    assert "Falling back to 'sacct'" not in log

    cpu = _fields((tmp_path / "cpu.txt").read_text())
    gpu = _fields((tmp_path / "gpu.txt").read_text())
    for out in (cpu, gpu):
        assert out["job"].isdigit(), f"output not written inside a SLURM job: {out}"
    assert cpu["job"] != gpu["job"]

    calls = _sbatch_calls(log)
    assert set(calls) == {"cpu_job", "gpu_job"}, calls
    assert "--gpus=1" in calls["gpu_job"]
    assert "--gpus" not in calls["cpu_job"]
    assert "-p debug" in calls["gpu_job"] and "-p debug" in calls["cpu_job"]

    # the controller's own record: same job ids, finished, and only one asked for a GPU
    for rule, out in (("cpu_job", cpu), ("gpu_job", gpu)):
        record = _scontrol_job(out["job"])
        assert record["JobState"] == "COMPLETED", record
        assert record["Comment"] == f"rule_{rule}", record
        assert Path(record["WorkDir"]) == tmp_path, record
        assert record["Partition"] == "debug", record
        assert _jobcomp_record(slurm_cluster, out["job"])["JobState"] == "COMPLETED"
    assert "gres:gpu:1" in _scontrol_job(gpu["job"]).get("TresPerJob", ""), gpu
    assert "gpu" not in _scontrol_job(cpu["job"]).get("TresPerJob", "")
    # SLURM's gpu plugin bound the (fake) device to the GPU job's step and to no other
    assert gpu["cuda"] != "", gpu
    assert cpu["cuda"] == "", cpu


def test_site_profile_gives_gpu_rules_their_resources(tmp_path: Path):
    """A dry run with profiles/slurm: every key is a valid option and the GPU rules get GPUs."""
    rules = "\n".join(
        f'rule {name}:\n    output: "{name}.txt"\n    shell: "touch {{output}}"\n'
        for name in GPU_RULES
    )
    targets = ", ".join(f'"{name}.txt"' for name in GPU_RULES)
    (tmp_path / "Snakefile").write_text(f"rule all:\n    input: {targets}\n\n{rules}")
    result = run_snakemake(
        [
            "--snakefile", str(tmp_path / "Snakefile"),
            "--directory", str(tmp_path),
            "--profile", str(SITE_PROFILE),
            "--workflow-profile", "none",
            "--dry-run",
        ],
        cwd=tmp_path,
        timeout_s=SNAKEMAKE_TIMEOUT_S,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, _tail(log)
    resources = dict(re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", log, re.M))
    for name in GPU_RULES:
        assert name in resources, f"no resources line for {name}:\n{_tail(log)}"
        res = _fields(resources[name].replace(",", " "))
        assert int(res["gpu"]) >= 1, res
        assert int(res["cpus_per_gpu"]) >= 1, res
        assert "slurm_partition" in res and "slurm_account" in res, res
    assert "gpu" not in _fields(resources["all"].replace(",", " "))
