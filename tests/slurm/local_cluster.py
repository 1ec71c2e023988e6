"""Helpers for tests that run Snakemake on the one-node SLURM cluster of cluster.sh: the module-scoped
``slurm_cluster`` fixture, the command-line values of that cluster (its CPU partition and account, the only
settings a run gives beside ``--profile slurm``), a bounded Snakemake call, and readers for what SLURM and
the executor record.

Import from a test module with ``sys.path.insert(0, str(Path(__file__).parent / "slurm"))``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
SITE_PROFILE = REPO / "profiles" / "slurm"
# what cluster.sh sets up: the default (CPU) partition, the GPU partition under the name profiles/slurm gives
# its GPU rules, and the account the tests charge
CLUSTER_PARTITION = "debug"
CLUSTER_GPU_PARTITION = "gpu"
CLUSTER_ACCOUNT = "pmlm-test"
# the snakemake (and python) of the interpreter running the tests: the project's venv
VENV_BIN = Path(sys.executable).parent
SNAKEMAKE = VENV_BIN / "snakemake"

# cluster.sh's exit status for "this machine cannot host the cluster" (not root, no SLURM, no apt)
UNSUPPORTED_EXIT = 2
# a first start may install the Debian packages
CLUSTER_START_TIMEOUT_S = 600
CLUSTER_STOP_TIMEOUT_S = 120
# after SIGINT, Snakemake cancels its jobs; SIGKILL if that takes longer than this
SNAKEMAKE_KILL_AFTER_S = 30
LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class LocalCluster:
    """Where the running test cluster keeps its files."""

    state_dir: Path

    @property
    def jobcomp_log(self) -> Path:
        return self.state_dir / "log" / "jobcomp.log"

    def jobcomp_record(self, job_id: str) -> dict[str, str]:
        """The line SLURM appended when the job finished (kept for good, unlike squeue's view)."""
        for line in self.jobcomp_log.read_text().splitlines():
            record = fields(line)
            if record.get("JobId") == job_id:
                return record
        raise AssertionError(f"job {job_id} not in {self.jobcomp_log}\n{self.log_tails()}")

    def log_tails(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "jobcomp.log"):
            path = self.state_dir / "log" / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                parts.append(f"--- {path} ---\n" + "\n".join(lines))
        return "\n".join(parts)


def _cluster(command: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=timeout)


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


def cluster_default_resources() -> list[str]:
    """``--default-resources`` values for the local cluster: profiles/slurm's own, with this cluster's partition
    and account in place of the placeholders (a key on the command line replaces the profile's whole key)."""
    profile = yaml.safe_load((SITE_PROFILE / "config.yaml").read_text())["default-resources"]
    values = {**profile, "slurm_partition": CLUSTER_PARTITION, "slurm_account": CLUSTER_ACCOUNT}
    return [f"{key}={value}" for key, value in values.items()]


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def fields(line: str) -> dict[str, str]:
    """`key=value key=value` (the format of SLURM's job records)."""
    return dict(token.split("=", 1) for token in line.split() if "=" in token)


def scontrol_job(job_id: str) -> dict[str, str]:
    """The controller's record, or {} once it is gone (MinJobAge keeps it 5 minutes after the job ends)."""
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
    return fields(out.stdout) if out.returncode == 0 else {}


def snakemake_command(args: list[str], timeout_s: int) -> list[str]:
    # SIGINT, not SIGTERM: Snakemake answers SIGTERM by waiting for its running jobs
    return ["timeout", "-s", "INT", "-k", str(SNAKEMAKE_KILL_AFTER_S), str(timeout_s), str(SNAKEMAKE), *args]


def snakemake_env() -> dict[str, str]:
    """Rules call `python`: the venv's must come first on PATH, in the jobs too (sbatch --export=ALL)."""
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def run_snakemake(args: list[str], cwd: Path, timeout_s: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_command(args, timeout_s), cwd=cwd, capture_output=True, text=True, env=snakemake_env()
    )


@dataclass(frozen=True)
class Submission:
    """One sbatch of the executor, as logged with --verbose."""

    rule: str
    job_id: str
    sbatch: str  # the sbatch command line
    log: Path  # the job's SLURM log


def submissions(log: str) -> list[Submission]:
    """Every job the executor submitted, in order (a resubmitted job appears again)."""
    queued: dict[str, list[str]] = {}
    found = []
    for line in log.splitlines():
        call = re.match(r"sbatch call: (.*--output (\S+)/%j\.log.*)$", line)
        if call:
            queued.setdefault(call.group(2), []).append(call.group(1))
            continue
        done = re.search(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)", line)
        if done:
            job_log = Path(done.group(2))
            calls = queued.get(str(job_log.parent))
            assert calls, f"no sbatch call logged before {line!r}"
            rule = next(p for p in job_log.parts if p.startswith("rule_")).removeprefix("rule_")
            found.append(Submission(rule, done.group(1), calls.pop(0), job_log))
    return found
