"""The SLURM profiles: a dry run of the site profile, and a tiny workflow run through the local
profile on a real one-node SLURM cluster (tests/slurm/cluster.sh) to prove jobs, GPU requests
included, really go through sbatch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
LOCAL_PROFILE = REPO / "profiles" / "slurm-local"
SITE_PROFILE = REPO / "profiles" / "slurm"
# the snakemake that belongs to the interpreter running the tests (the project's venv)
SNAKEMAKE = Path(sys.executable).with_name("snakemake")

# cluster.sh's exit status for "this machine cannot host the cluster" (not root, no SLURM, no apt)
UNSUPPORTED_EXIT = 2
# a first start may install the Debian packages
CLUSTER_START_TIMEOUT_S = 600
CLUSTER_STOP_TIMEOUT_S = 120
# submit + two jobs + status polling took ~20 s here; the bound only guards against a hang
SNAKEMAKE_TIMEOUT_S = 150
# after SIGINT, Snakemake cancels its jobs; SIGKILL if that takes longer than this
SNAKEMAKE_KILL_AFTER_S = 30
LOG_TAIL_LINES = 40

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


@dataclass(frozen=True)
class LocalCluster:
    """Where the running test cluster keeps its files."""

    state_dir: Path

    @property
    def jobcomp_log(self) -> Path:
        return self.state_dir / "log" / "jobcomp.log"

    def log_tails(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "jobcomp.log"):
            path = self.state_dir / "log" / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                parts.append(f"--- {path} ---\n" + "\n".join(lines))
        return "\n".join(parts)


def _cluster(command: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def slurm_cluster():
    """Start the local cluster (or reuse one already up); stop it afterwards if we started it."""
    state_dir = Path(os.environ.get("PMLM_SLURM_DIR", "/tmp/pmlm-slurm"))
    was_running = _cluster("status", CLUSTER_STOP_TIMEOUT_S).returncode == 0
    start = _cluster("start", CLUSTER_START_TIMEOUT_S)
    if start.returncode == UNSUPPORTED_EXIT:
        pytest.skip(f"no local SLURM cluster: {start.stderr.strip()}")
    if start.returncode != 0:
        pytest.fail(f"tests/slurm/cluster.sh start failed:\n{start.stdout}\n{start.stderr}")
    try:
        yield LocalCluster(state_dir)
    finally:
        if not was_running:
            stop = _cluster("stop", CLUSTER_STOP_TIMEOUT_S)
            assert stop.returncode == 0, f"cluster.sh stop failed:\n{stop.stdout}\n{stop.stderr}"


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def _fields(line: str) -> dict[str, str]:
    """`key=value key=value` (the format of our outputs and of SLURM's job records)."""
    return dict(token.split("=", 1) for token in line.split() if "=" in token)


def _scontrol_job(job_id: str) -> dict[str, str]:
    # MinJobAge keeps finished jobs in the controller, so their record is still there
    out = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return _fields(out)


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


def _run_snakemake(args: list[str], cwd: Path, timeout_s: int) -> subprocess.CompletedProcess:
    # SIGINT, not SIGTERM: Snakemake answers SIGTERM by waiting for its running jobs
    cmd = ["timeout", "-s", "INT", "-k", str(SNAKEMAKE_KILL_AFTER_S), str(timeout_s)]
    return subprocess.run(cmd + [str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.slurm
def test_rules_run_as_slurm_jobs_with_gpu_request(slurm_cluster: LocalCluster, tmp_path: Path):
    (tmp_path / "Snakefile").write_text(TINY_SNAKEFILE)
    result = _run_snakemake(
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
    result = _run_snakemake(
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
