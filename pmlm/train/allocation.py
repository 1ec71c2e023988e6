"""The SLURM side of ``pmlm launch``: what a launch runs on (the nodes, GPUs and CPUs of the allocation), the
port at which a multi-node job's nodes meet, and putting the job back in its queue.

The allocation is read from SLURM's environment or, where the Snakemake executor stripped the variables before
the rule's shell ran, from the job record (``scontrol show job``). Node lists are expanded by SLURM itself,
``scontrol show hostnames`` (:func:`expand_hostlist`); :func:`parse_hostlist` reads the same syntax where scontrol
cannot run. :func:`requeue_job` is how a job whose trainers saved a checkpoint after SLURM's time-limit warning
goes back in the queue under the same job id, instead of failing.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pmlm.errors import ConfigError

# CUDA_VISIBLE_DEVICES values that mean "no GPU" (SLURM writes NoDevFiles when a GPU has no device file)
_NO_GPU_VALUES = {"", "-1", "NoDevFiles", "none", "void"}
_RANGE = re.compile(r"\s*(\d+)(?:-(\d+))?\s*")
# Without --port, a multi-node job's rendezvous port is PORT_BASE + job id mod PORT_SPAN: below Linux's
# ephemeral ports (32768-60999, from which outgoing connections, gloo's many among them, take theirs), and
# different for jobs that share a first node unless their ids differ by a multiple of PORT_SPAN; the
# launcher, which runs on the first node, then moves to the next free port.
PORT_BASE = 29500
PORT_SPAN = 2000
DEFAULT_PORT = PORT_BASE  # outside SLURM (no job id)
PORT_PROBES = 64


@dataclass(frozen=True)
class Allocation:
    """What the launcher runs on, read from SLURM's environment (or the job record when the variables
    were stripped, as the Snakemake SLURM executor does before a rule's shell command runs)."""

    job_id: str | None  # SLURM job id; None outside SLURM
    in_step: bool  # already inside a job step (srun): start workers here, never a nested srun
    nodes: int  # nodes to spread over: the job's in a batch script, the step's inside a step
    nodelist: str | None  # SLURM hostlist of those nodes, e.g. gpu[07-08]
    gpus_per_node: int  # one worker per GPU; 0 means one CPU worker
    cpus_per_node: int | None  # CPUs of the job on each node (given to the srun step), when known

    def __post_init__(self):
        if self.nodes < 1:
            raise ConfigError(f"node count must be at least 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise ConfigError(f"--gpus-per-node must be 0 or more, got {self.gpus_per_node}")
        if self.nodes > 1 and not self.nodelist:
            raise ConfigError(
                f"{self.nodes} nodes but no node list (SLURM_JOB_NODELIST); cannot pick a rendezvous host"
            )

    @property
    def procs_per_node(self) -> int:
        return max(1, self.gpus_per_node)

    @property
    def in_batch(self) -> bool:
        """In a SLURM batch script (or salloc), outside any job step: the launcher starts the step itself."""
        return self.job_id is not None and not self.in_step


def count_visible_gpus(value: str | None) -> int:
    """Devices named by CUDA_VISIBLE_DEVICES (indices or UUIDs); 0 when unset or hidden."""
    if value is None or value.strip() in _NO_GPU_VALUES:
        return 0
    return len([d for d in value.split(",") if d.strip()])


def expand_hostlist(nodelist: str) -> list[str]:
    """Every host of a SLURM hostlist, in order: ``gpu[07-08],cpu1`` -> gpu07, gpu08, cpu1. The first is the job's
    first node (the rendezvous host of a multi-node launch). SLURM's own expansion, ``scontrol show hostnames``;
    where scontrol cannot run (not installed, or no SLURM configuration on this host: a launch outside SLURM given
    SLURM_JOB_NODELIST by hand, the tests without SLURM), :func:`parse_hostlist`."""
    hosts = scontrol_hostnames(nodelist)
    return parse_hostlist(nodelist) if hosts is None else hosts


def scontrol_hostnames(nodelist: str) -> list[str] | None:
    """`scontrol show hostnames NODELIST`; None where scontrol cannot run. A list scontrol cannot read (it says so
    on stderr, yet exits 0, or lets a bracket through) is a one-line ConfigError."""
    if not nodelist.strip():  # scontrol would expand SLURM_JOB_NODELIST instead
        raise _unreadable(nodelist)
    try:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist.strip()], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # e.g. "Could not establish a configuration source": no SLURM here
        return None
    hosts = done.stdout.split()
    if not hosts or any(ch in host for host in hosts for ch in "[]"):
        said = done.stderr.strip().splitlines()
        raise _unreadable(nodelist, f"scontrol: {said[-1]}" if said else None)
    return hosts


def _unreadable(nodelist: str, why: str | None = None) -> ConfigError:
    return ConfigError(f"cannot read the SLURM node list {nodelist!r} ({why or 'expected e.g. gpu[07-08],cpu1'})")


def parse_hostlist(nodelist: str) -> list[str]:
    """:func:`expand_hostlist` where scontrol cannot run: the hostlist syntax read here, hosts in the order
    ``scontrol show hostnames`` gives them (``rack[1-2]-n[01-02]`` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02;
    zero padding kept). Stricter than scontrol in places: ``[1-2]`` (no name) and ``a,,b`` are refused."""
    bad = _unreadable(nodelist)
    hosts: list[str] = []
    depth, entry = 0, ""
    for ch in nodelist.strip() + ",":
        if ch == "," and depth == 0:
            hosts += _expand_entry(entry.strip(), bad)
            entry = ""
            continue
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise bad
        entry += ch
    if depth != 0 or entry:
        raise bad
    return hosts


def _expand_entry(entry: str, bad: ConfigError) -> list[str]:
    """One comma-free entry: text with bracketed lists of numbers or ranges, zero padding kept."""
    parts = re.split(r"(\[[^\[\]]*\])", entry)
    if not entry or entry.startswith("[") or any(ch in p for p in parts[::2] for ch in "[]"):
        raise bad
    names = [""]
    for i, part in enumerate(parts):
        if i % 2 == 0:
            names = [n + part for n in names]
            continue
        values = []
        for item in part[1:-1].split(","):
            match = _RANGE.fullmatch(item)
            if not match or int(match.group(2) or match.group(1)) < int(match.group(1)):
                raise bad
            lo, hi = match.group(1), match.group(2) or match.group(1)
            values += [str(k).zfill(len(lo)) for k in range(int(lo), int(hi) + 1)]
        names = [n + v for n in names for v in values]
    return names


def same_host(node: str, hostname: str) -> bool:
    """A SLURM node name and a host name (which some sites give in full: gpu07.cluster.example) name one host."""
    return node.split(".")[0] == hostname.split(".")[0]


def rendezvous_port(job_id: str | None) -> int:
    """The rendezvous port of a multi-node job without --port: PORT_BASE + job id mod PORT_SPAN."""
    digits = re.sub(r"\D", "", job_id or "")
    return PORT_BASE + int(digits) % PORT_SPAN if digits else DEFAULT_PORT


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` on this host now (as torchrun's store will, SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def pick_rendezvous_port(alloc: Allocation) -> tuple[int, str]:
    """The port from the job id, or the next free one when this host, the rendezvous host, has it in use; with
    a note on how it was chosen. Elsewhere (e.g. salloc on a login node) it cannot be probed: the job id's."""
    port = rendezvous_port(alloc.job_id)
    note = f"from job id {alloc.job_id}"
    if alloc.nodes < 2 or not alloc.nodelist or not same_host(expand_hostlist(alloc.nodelist)[0], socket.gethostname()):
        return port, note
    for candidate in range(port, port + PORT_PROBES):
        wrapped = PORT_BASE + (candidate - PORT_BASE) % PORT_SPAN
        if port_is_free(wrapped):
            return wrapped, note if wrapped == port else f"{note}: {port} was in use here, {wrapped} is free"
    raise ConfigError(
        f"no free rendezvous port on {socket.gethostname()} among the {PORT_PROBES} from {port}; give one with --port"
    )


def _scontrol(*args: str) -> str:
    """`scontrol ARGS`' output; a one-line ConfigError when it is missing or fails."""
    try:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError:
        raise ConfigError(f"`scontrol {' '.join(args)}`: scontrol is not on PATH") from None
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or "").strip().splitlines()
        raise ConfigError(f"`scontrol {' '.join(args)}` failed: {said[-1] if said else exc.returncode}") from None


def scontrol_job_record(job_id: str) -> dict[str, str]:
    """`scontrol show job` as key=value pairs (NumNodes, NumCPUs, NodeList, Restarts, ...)."""
    out = _scontrol("show", "job", "--oneliner", job_id)
    return dict(token.split("=", 1) for token in out.split() if "=" in token)


def requeue_job(job_id: str) -> tuple[bool, dict[str, str]]:
    """Put the running job back in its queue (`scontrol requeue`): SLURM ends this run of it (SIGTERM to what is
    left, then KillWait) and starts it again under the same id when it is eligible. A job that is no longer running
    (SLURM requeues or ends it itself: a preemption, a requeue by an administrator, the hard time limit) is left
    alone. Returns whether it was requeued here, and its record from just before."""
    record = scontrol_job_record(job_id)
    if record.get("JobState") != "RUNNING":
        return False, record
    _scontrol("requeue", job_id)
    return True, record


def _int_env(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            # SLURM writes some counts as "2(x3)" or ranges as "2-2"; the leading number is the one we need
            match = re.match(r"\d+", value)
            if not match:
                raise ConfigError(f"{name}={value!r} is not a number")
            return int(match.group())
    return None


def read_allocation(
    env: Mapping[str, str],
    gpus_per_node: int | None = None,
    job_record: Callable[[str], dict[str, str]] = scontrol_job_record,
) -> Allocation:
    """Nodes, node list and GPUs per node from SLURM's variables; the job record fills what is missing."""
    gpus = gpus_per_node
    if gpus is None:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        gpus = count_visible_gpus(visible) if visible is not None else (_int_env(env, "SLURM_GPUS_ON_NODE") or 0)
    job_id = (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "").strip() or None
    if job_id is None:
        return Allocation(None, False, 1, None, gpus, None)

    if env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")) is not None:
        # e.g. the executor's own `srun -n1` around a rule, or a user's `srun -N2 --ntasks-per-node=1 pmlm launch`
        nodes = _int_env(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES") or 1
        tasks = _int_env(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        if tasks is not None and tasks != nodes:
            raise ConfigError(
                f"this job step runs {tasks} tasks on {nodes} node(s); run one `pmlm launch` per node "
                "(srun --ntasks-per-node=1), or call it from the batch script and let it start the step"
            )
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
        return Allocation(job_id, True, nodes, nodelist, gpus, None)

    nodes = _int_env(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    cpus = _int_env(env, "SLURM_CPUS_ON_NODE")
    record: Mapping[str, str] = {}
    if nodes is None or not nodelist:
        record = job_record(job_id)  # must answer: the rendezvous needs the nodes
    elif cpus is None:
        # only for the step's CPU request; srun's default (one CPU per task) is the fallback
        with contextlib.suppress(ConfigError):
            record = job_record(job_id)
    if nodes is None:
        nodes = _int_env(record, "NumNodes")
    if not nodelist and record.get("NodeList") not in (None, "", "(null)"):
        nodelist = record["NodeList"]
    total_cpus = _int_env(record, "NumCPUs")
    if cpus is None and total_cpus and nodes:
        cpus = total_cpus // nodes  # the nodes of one job are alike in practice; the step asks each for this many
    if nodes is None or not nodelist:
        raise ConfigError(f"SLURM job {job_id} has no nodes yet (is it still pending?); run this inside the job")
    return Allocation(job_id, False, nodes, nodelist, gpus, cpus)
