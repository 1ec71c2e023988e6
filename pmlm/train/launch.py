"""``pmlm launch``: start a Python command once per GPU on every node of a SLURM allocation (torchrun
rendezvous from SLURM's environment), forward stop signals to it, and keep its "requeue me" exit code.

``python -m pmlm.train.launch`` is the small in-process wrapper that the launcher puts between torchrun
and each worker (it records a worker's requeue exit, which torchrun itself reports as a plain failure).
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pmlm.errors import ConfigError
from pmlm.train import REQUEUE_EXIT_CODE

# torchrun's own default rendezvous port; jobs on separate nodes never share it
DEFAULT_PORT = 29500
# signals a scheduler sends before stopping a job (USR1: SLURM's --signal warning; TERM: time limit,
# preemption, scancel); INT is forwarded as well so that Ctrl-C reaches workers in their own sessions
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# a worker that exits with the requeue code leaves a file with this prefix in the marker folder
MARKER_PREFIX = "requeue-"
# CUDA_VISIBLE_DEVICES values that mean "no GPU" (SLURM writes NoDevFiles when a GPU has no device file)
_NO_GPU_VALUES = {"", "-1", "NoDevFiles", "none", "void"}

MODES = ("exec", "torchrun", "srun")
# this module, run as the wrapper between torchrun and each worker
WORKER_MODULE = "pmlm.train.launch"


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


@dataclass(frozen=True)
class LaunchPlan:
    """The command to run and how: ``exec`` replaces this process, the others run under supervision."""

    mode: str  # exec | torchrun | srun
    argv: list[str]
    nodes: int
    procs_per_node: int
    marker_dir: Path | None  # where workers under torchrun record a requeue exit

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"launch mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def describe(self) -> str:
        where = "inside SLURM's srun step" if self.mode == "srun" else "on this node"
        return f"{self.nodes} node(s) x {self.procs_per_node} process(es), {where}"


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


def plan_launch(
    alloc: Allocation,
    python_args: Sequence[str],
    *,
    port: int = DEFAULT_PORT,
    marker_dir: Path | None = None,
    python: str = sys.executable,
) -> LaunchPlan:
    """The command line for ``alloc``: a plain process, torchrun on this node, or torchrun per node via srun."""
    if not python_args:
        raise ConfigError("no command: give the Python arguments after --, e.g. pmlm launch -- -m pmlm pretrain ...")
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    procs, nodes = alloc.procs_per_node, alloc.nodes
    in_batch = alloc.job_id is not None and not alloc.in_step

    if procs == 1 and nodes == 1:
        worker = [python, *python_args]
        marker = None
    else:
        marker = marker_dir or default_marker_dir(alloc.job_id)
        # the agent ignores USR1 (SLURM signals every process of a step; the default action would kill it)
        # and the workers inherit that until the trainer installs its own handler
        worker = [python, "-m", WORKER_MODULE, "--ignore-usr1", "-m", "torch.distributed.run"]
        if nodes == 1:
            worker += ["--standalone", "--nproc_per_node", str(procs)]
        else:
            worker += [
                "--nnodes", str(nodes), "--nproc_per_node", str(procs),
                "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{first_host(alloc.nodelist)}:{port}",
                "--rdzv_id", str(alloc.job_id),
            ]  # fmt: skip
        worker += ["-m", WORKER_MODULE, "--requeue-marker", str(marker), *python_args]

    if in_batch:
        # Our own job step: SLURM's step signals (--signal=USR1@T, scancel --signal) then reach the workers
        # and not the batch shell or Snakemake. The executor strips SLURM_* before the rule runs, so the
        # step's geometry is spelled out rather than inherited.
        srun = ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        if alloc.cpus_per_node:
            srun.append(f"--cpus-per-task={alloc.cpus_per_node}")
        return LaunchPlan("srun", srun + worker, nodes, procs, marker)
    if marker is None:
        return LaunchPlan("exec", worker, nodes, procs, None)
    return LaunchPlan("torchrun", worker, nodes, procs, marker)


def default_marker_dir(job_id: str | None) -> Path:
    """A fresh folder in the working directory: shared with the other nodes of a job, unlike /tmp."""
    return Path.cwd() / f".pmlm-launch-{job_id or socket.gethostname()}-{os.getpid()}"


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (Linux /proc): torchrun starts workers in sessions of their own,
    out of reach of a process-group signal."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may contain spaces
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def supervise(plan: LaunchPlan) -> int:
    """Run a torchrun / srun plan as a child, forward stop signals, map a worker's requeue exit to ours."""
    child: subprocess.Popen | None = None
    pending: list[int] = []  # signals that arrived before the child existed

    def forward(signum, frame):
        if child is None:
            pending.append(signum)
        elif plan.mode == "srun":
            # srun relays TERM/USR1 to every process of its step; a lone INT only makes it print status
            child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)
        else:
            for pid in [child.pid, *_descendants(child.pid)]:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    if plan.marker_dir is not None:
        plan.marker_dir.mkdir(parents=True, exist_ok=True)
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        try:
            child = subprocess.Popen(plan.argv)
        except FileNotFoundError:
            raise ConfigError(f"{plan.argv[0]} not found on PATH (needed for {plan.mode} mode)") from None
        for signum in pending:
            forward(signum, None)
        returncode = child.wait()
        markers = plan.marker_dir is not None and any(
            p.name.startswith(MARKER_PREFIX) for p in plan.marker_dir.iterdir()
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if plan.marker_dir is not None:
            shutil.rmtree(plan.marker_dir, ignore_errors=True)
    if returncode == REQUEUE_EXIT_CODE or markers:
        print(f"pmlm launch: a worker exited with {REQUEUE_EXIT_CODE} (checkpoint saved after a stop signal); "
              f"exiting with {REQUEUE_EXIT_CODE} so the job is resubmitted and resumes", file=sys.stderr, flush=True)
        return REQUEUE_EXIT_CODE
    return 128 - returncode if returncode < 0 else returncode  # killed by signal n: the shell's 128 + n


# -- `pmlm launch` --------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "pmlm launch [--gpus-per-node N] [--port P] [--dry-run] -- PYTHON_ARGS..."
    parser.epilog = (
        "Outside SLURM, or inside a job step: one process per GPU on this node (torchrun --standalone), or the "
        "command itself for one GPU. In a SLURM batch job (the Snakemake executor with the `mpi` resource, or "
        "salloc): one `srun` step with one torchrun per node and a c10d rendezvous on the first node. "
        f"A worker's exit {REQUEUE_EXIT_CODE} (checkpoint saved on SIGTERM/SIGUSR1) becomes this command's exit "
        f"{REQUEUE_EXIT_CODE}; SIGTERM and SIGUSR1 are forwarded to the workers."
    )
    parser.add_argument("--gpus-per-node", type=int, metavar="N",
                        help="workers per node (default: the devices in CUDA_VISIBLE_DEVICES, else "
                             "SLURM_GPUS_ON_NODE, else one CPU worker)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="P",
                        help=f"rendezvous port on the first node of a multi-node job (default {DEFAULT_PORT})")
    parser.add_argument("--marker-dir", metavar="DIR",
                        help="folder where workers record a requeue exit; must be shared by all nodes "
                             "(default: a fresh hidden folder in the working directory, removed afterwards)")
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")
    parser.add_argument("python_args", nargs=argparse.REMAINDER, metavar="PYTHON_ARGS",
                        help="what to run, as arguments to python: -m MODULE ARGS..., SCRIPT ARGS... or -c CODE")


def run(args: argparse.Namespace) -> int:
    command = list(args.python_args)
    if command[:1] == ["--"]:
        command = command[1:]
    alloc = read_allocation(os.environ, gpus_per_node=args.gpus_per_node)
    plan = plan_launch(alloc, command, port=args.port,
                       marker_dir=Path(args.marker_dir).resolve() if args.marker_dir else None)
    if args.dry_run:
        print(shlex.join(plan.argv))
        return 0
    print(f"pmlm launch: {plan.describe()}: {shlex.join(plan.argv)}", file=sys.stderr, flush=True)
    if plan.mode == "exec":
        # nothing to supervise: the command becomes this process, so its signals and exit code are SLURM's
        sys.stdout.flush()
        os.execv(plan.argv[0], plan.argv)
    return supervise(plan)


# -- the per-worker wrapper: python -m pmlm.train.launch [--requeue-marker DIR] [--ignore-usr1] PYTHON_ARGS ---


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def run_python_args(python_args: Sequence[str]) -> int:
    """Run ``-m MODULE ARGS``, ``-c CODE ARGS`` or ``SCRIPT ARGS`` in this interpreter, as python would."""
    if not python_args:
        raise SystemExit("pmlm.train.launch: no command (expected -m MODULE, -c CODE or SCRIPT)")
    head, rest = python_args[0], list(python_args[1:])
    try:
        if head in ("-m", "-c"):
            if not rest:
                raise SystemExit(f"pmlm.train.launch: {head} needs an argument")
            target, rest = rest[0], rest[1:]
            if head == "-m":
                sys.argv = [target, *rest]
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.argv = ["-c", *rest]
                exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
        elif head.startswith("-"):
            raise SystemExit(f"pmlm.train.launch: unsupported python option {head} (use -m, -c or a script)")
        else:
            sys.argv = [head, *rest]
            sys.path[0] = os.path.dirname(os.path.abspath(head))
            runpy.run_path(head, run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc)
    return 0


def worker_main(argv: Sequence[str]) -> int:
    args = list(argv)
    marker_dir = None
    while args and args[0] in ("--requeue-marker", "--ignore-usr1"):
        option = args.pop(0)
        if option == "--ignore-usr1":
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        elif not args:
            raise SystemExit("pmlm.train.launch: --requeue-marker needs a folder")
        else:
            marker_dir = Path(args.pop(0))
    code = run_python_args(args)
    if code == REQUEUE_EXIT_CODE and marker_dir is not None:
        # torchrun reports any failing worker as exit 1: this file tells the launcher it was a requeue
        name = f"{MARKER_PREFIX}{os.environ.get('RANK', '0')}-{socket.gethostname()}-{os.getpid()}"
        marker_dir.mkdir(parents=True, exist_ok=True)
        (marker_dir / name).write_text(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    raise SystemExit(worker_main(sys.argv[1:]))
