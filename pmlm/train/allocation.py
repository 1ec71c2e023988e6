"""What a launch runs on: the nodes, GPUs and CPUs of a SLURM allocation, read from SLURM's environment or,
when the variables were stripped, from the job record (``scontrol show job``)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pmlm.errors import ConfigError

# CUDA_VISIBLE_DEVICES values that mean "no GPU" (SLURM writes NoDevFiles when a GPU has no device file)
_NO_GPU_VALUES = {"", "-1", "NoDevFiles", "none", "void"}


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


def count_visible_gpus(value: str | None) -> int:
    """Devices named by CUDA_VISIBLE_DEVICES (indices or UUIDs); 0 when unset or hidden."""
    if value is None or value.strip() in _NO_GPU_VALUES:
        return 0
    return len([d for d in value.split(",") if d.strip()])


def first_host(nodelist: str) -> str:
    """First host of a SLURM hostlist, as `scontrol show hostnames` prints it first:
    ``gpu[07-08,12],cpu1`` -> ``gpu07``; ``rack[1-2]-n[01-04]`` -> ``rack1-n01``."""
    bad = ConfigError(f"cannot read the SLURM node list {nodelist!r} (expected e.g. gpu[07-08],cpu1)")
    depth, chars = 0, []
    for ch in nodelist.strip():
        if ch == "," and depth == 0:
            break
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise bad
        chars.append(ch)
    entry = "".join(chars)
    groups = re.findall(r"\[([^\]]*)\]", entry)
    if depth != 0 or not entry or entry.startswith("[") or not all(re.match(r"\s*\d", g) for g in groups):
        raise bad
    # inside brackets: numbers or ranges; the first range's start, zero padding kept, is the first host
    return re.sub(r"\[([^\]]*)\]", lambda m: re.match(r"\s*(\d+)", m.group(1)).group(1), entry)


def expand_hostlist(nodelist: str) -> list[str]:
    """Every host of a SLURM hostlist in `scontrol show hostnames` order: ``gpu[07-08],cpu1`` -> gpu07, gpu08,
    cpu1; ``rack[1-2]-n[01-02]`` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02."""
    hosts = []
    depth, entry = 0, []
    for ch in nodelist.strip() + ",":
        if ch == "," and depth == 0:
            hosts += _expand_entry("".join(entry).strip(), nodelist)
            entry = []
            continue
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            break
        entry.append(ch)
    if depth != 0 or entry:
        raise ConfigError(f"cannot read the SLURM node list {nodelist!r} (expected e.g. gpu[07-08],cpu1)")
    return hosts


def _expand_entry(entry: str, nodelist: str) -> list[str]:
    bad = ConfigError(f"cannot read the SLURM node list {nodelist!r} (expected e.g. gpu[07-08],cpu1)")
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
            match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", item)
            if not match:
                raise bad
            lo, hi = match.group(1), match.group(2) or match.group(1)
            if int(hi) < int(lo):
                raise bad
            values += [str(k).zfill(len(lo)) for k in range(int(lo), int(hi) + 1)]
        names = [n + v for n in names for v in values]
    return names


def scontrol_job_record(job_id: str) -> dict[str, str]:
    """`scontrol show job` as key=value pairs (NumNodes, NumCPUs, NodeList, ...)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True, check=True
        ).stdout
    except FileNotFoundError:
        raise ConfigError(
            f"SLURM job {job_id}: its node list is not in the environment and `scontrol` is not on PATH"
        ) from None
    except subprocess.CalledProcessError as exc:
        raise ConfigError(f"`scontrol show job {job_id}` failed: {exc.stderr.strip() or exc.returncode}") from None
    return dict(token.split("=", 1) for token in out.split() if "=" in token)


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
    if nodes is None or not nodelist:
        record = job_record(job_id)  # must answer: the rendezvous needs the nodes
    elif cpus is None:
        try:  # only for the step's CPU request; srun's default (one CPU per task) is the fallback
            record = job_record(job_id)
        except ConfigError:
            record = {}
    else:
        record = {}
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
