"""Helpers for tests that run Snakemake on the SLURM cluster of cluster.sh: the fixtures ``slurm_cluster`` (any
node will do) and ``multinode_cluster`` (three nodes, each a slurmd in a network namespace of its own), both the one
cluster the session starts once; the command-line values of that cluster (its CPU partition and account, the only
settings a run gives beside ``--profile slurm``, and the tests' status-query delay), a bounded Snakemake call,
readers for what SLURM and the executor record, and the release of a requeued job.

Import from a test module with ``sys.path.insert(0, str(Path(__file__).parent / "slurm"))``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
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
# The profile's first status query comes 40 s after a submission and each query that finds nothing finished waits
# 10 s more: a courtesy to a busy controller, and most of the tests' time when they used it. The tests' jobs take
# seconds, so their Snakemake asks 5 s after a submission; nothing else of the profile changes.
FAST_STATUS = ["--slurm-init-seconds-before-status-checks", "5"]
# the snakemake (and python) of the interpreter running the tests: the project's venv
VENV_BIN = Path(sys.executable).parent
SNAKEMAKE = VENV_BIN / "snakemake"

# cluster.sh's exit status for "this machine cannot host the cluster" (not root, no SLURM, no apt)
UNSUPPORTED_EXIT = 2
# the multi-node cluster: its nodes (cluster.sh's PMLM_SLURM_NODE_PREFIX + 1..N) and their network
MULTINODE_NODES = ("pmlm-n1", "pmlm-n2", "pmlm-n3")
MULTINODE_SUBNET = "10.199.77"
# the interface of each node on the bridge (what GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name on a real cluster)
MULTINODE_INTERFACE = "eth0"
# a first start may install the Debian packages
CLUSTER_START_TIMEOUT_S = 600
CLUSTER_STOP_TIMEOUT_S = 120
# after SIGINT, Snakemake cancels its jobs; SIGKILL if that takes longer than this
SNAKEMAKE_KILL_AFTER_S = 30
LOG_TAIL_LINES = 40
# seconds between a requeued job's return to PENDING and its release (see release)
REQUEUE_SETTLE_S = 2


@dataclass(frozen=True)
class LocalCluster:
    """Where the running test cluster keeps its files."""

    state_dir: Path

    @property
    def jobcomp_log(self) -> Path:
        return self.state_dir / "log" / "jobcomp.log"

    def jobcomp_record(self, job_id: str) -> dict[str, str]:
        """The line SLURM appended when the job finished (kept for good, unlike squeue's view); a requeued job has
        one per run (those that ended in a requeue say PENDING): the last."""
        for line in reversed(self.jobcomp_log.read_text().splitlines()):
            record = fields(line)
            if record.get("JobId") == job_id:
                return record
        raise AssertionError(f"job {job_id} not in {self.jobcomp_log}\n{self.log_tails()}")

    def log_tails(self) -> str:
        parts = []
        logs = self.state_dir / "log"
        for path in [logs / "slurmctld.log", *sorted(logs.glob("slurmd-*.log")), logs / "jobcomp.log"]:
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                parts.append(f"--- {path} ---\n" + "\n".join(lines))
        return "\n".join(parts)


def _cluster(command: str, timeout: int, nodes: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "PMLM_SLURM_NODES": str(nodes)}
    return subprocess.run(["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=timeout, env=env)


# The one cluster of this pytest process: started (or found running) by the first module that needs it, stopped at
# the end of the session if it was started here. Three nodes serve every module: the one-node tests' jobs run on any
# of them. Where three cannot run (no network namespaces), one node serves the one-node modules and the multi-node
# module skips.
_SHARED: dict = {}


def _state_dir() -> Path:
    return Path(os.environ.get("PMLM_SLURM_DIR", "/tmp/pmlm-slurm"))


def _running_nodes() -> int | None:
    """The node count of the test cluster already up, or None."""
    if _cluster("status", CLUSTER_STOP_TIMEOUT_S).returncode != 0:
        return None
    layout = (_state_dir() / "layout").read_text()
    return int(re.search(r"^nodes=(\d+)$", layout, re.M).group(1))


def _shared_cluster(request: pytest.FixtureRequest) -> tuple[LocalCluster, int]:
    """The session's cluster and its node count (skips the module when no cluster can run here)."""
    if "skip" in _SHARED:
        pytest.skip(_SHARED["skip"])
    if "nodes" not in _SHARED:
        nodes = _running_nodes()
        if nodes is None:
            for tried in (len(MULTINODE_NODES), 1):
                start = _cluster("start", CLUSTER_START_TIMEOUT_S, tried)
                if start.returncode == 0:
                    nodes = tried
                    request.session.addfinalizer(_stop_shared)
                    break
                if start.returncode != UNSUPPORTED_EXIT:
                    pytest.fail(f"tests/slurm/cluster.sh start failed:\n{start.stdout}\n{start.stderr}")
                _SHARED.setdefault("why", []).append(start.stderr.strip())
            else:
                _SHARED["skip"] = f"no local SLURM cluster: {' / '.join(_SHARED['why'])}"
                pytest.skip(_SHARED["skip"])
        _SHARED["nodes"] = nodes
    return LocalCluster(_state_dir()), _SHARED["nodes"]


def _stop_shared() -> None:
    stop = _cluster("stop", CLUSTER_STOP_TIMEOUT_S)
    assert stop.returncode == 0, f"cluster.sh stop failed:\n{stop.stdout}\n{stop.stderr}"


@pytest.fixture(scope="module")
def slurm_cluster(request):
    """The session's cluster, of one node or more (a one-node test's jobs run on any node)."""
    return _shared_cluster(request)[0]


@pytest.fixture(scope="module")
def multinode_cluster(request):
    """Three nodes pmlm-n1..3, each a slurmd in a network namespace of its own (tests/slurm/README.md)."""
    cluster, nodes = _shared_cluster(request)
    if nodes < len(MULTINODE_NODES):
        why = " / ".join(_SHARED.get("why", [])) or "a one-node test cluster is running"
        pytest.skip(f"no {len(MULTINODE_NODES)}-node SLURM cluster here ({nodes} node(s)): {why}")
    return cluster


def cluster_default_resources() -> list[str]:
    """``--default-resources`` values for the local cluster: profiles/slurm's own, with this cluster's partition
    and account in place of the placeholders (a key on the command line replaces the profile's whole key)."""
    profile = yaml.safe_load((SITE_PROFILE / "config.yaml").read_text())["default-resources"]
    values = {**profile, "slurm_partition": CLUSTER_PARTITION, "slurm_account": CLUSTER_ACCOUNT}
    return [f"{key}={value}" for key, value in values.items()]


def cluster_set_resources(**rules: dict) -> list[str]:
    """``--set-resources`` values: profiles/slurm's own, with the given rules' resources in place of the profile's
    (a key on the command line replaces the profile's whole key, so a user who changes one rule gives them all)."""
    profile = yaml.safe_load((SITE_PROFILE / "config.yaml").read_text())["set-resources"]
    return [f"{rule}:{key}={value}" for rule, res in {**profile, **rules}.items() for key, value in res.items()]


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def fields(line: str) -> dict[str, str]:
    """`key=value key=value` (the format of SLURM's job records)."""
    return dict(token.split("=", 1) for token in line.split() if "=" in token)


def node_job_pids(node: str, job_id: str) -> list[int]:
    """The processes of a job on one node of the multi-node cluster: those in the node's network namespace
    whose environment names the job (slurmd and its slurmstepd do not)."""
    out = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True, check=True).stdout
    pids = []
    for pid in map(int, out.split()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if f"SLURM_JOB_ID={job_id}".encode() in environ:
            pids.append(pid)
    return pids


def scontrol_job(job_id: str) -> dict[str, str]:
    """The controller's record, or {} once it is gone (MinJobAge keeps it 5 minutes after the job ends)."""
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
    return fields(out.stdout) if out.returncode == 0 else {}


def job_state(job_id: str) -> str:
    return scontrol_job(job_id).get("JobState", "")


def release(job_id: str) -> None:
    """Start a job that was just requeued (and is PENDING again) in a few seconds instead of after SLURM's hold of
    about two minutes (its EligibleTime: the lifetime of job credentials, which a requeue revokes). A credential
    issued in the same second as the revocation is refused ("Killing non-startable batch job: Job credential
    revoked", and the job fails), hence the wait before the job may start."""
    time.sleep(REQUEUE_SETTLE_S)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True, capture_output=True)


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
