"""``pmlm launch``: start a Python command once per GPU on every node of a SLURM allocation (torchrun
rendezvous from SLURM's environment), forward stop signals to it, and keep its "requeue me" exit code.
The allocation itself is read in ``train.allocation``.

``python -m pmlm.train.launch`` is the small in-process wrapper that the launcher puts between torchrun
and each worker (it records a worker's requeue exit, which torchrun itself reports as a plain failure).
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pmlm.errors import ConfigError
from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.allocation import Allocation, first_host, read_allocation

# torchrun's own default rendezvous port; jobs on separate nodes never share it
DEFAULT_PORT = 29500
# signals a scheduler sends before stopping a job (USR1: SLURM's --signal warning; TERM: time limit,
# preemption, scancel); INT is forwarded as well so that Ctrl-C reaches workers in their own sessions
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# a worker that exits with the requeue code leaves a file with this prefix in the marker folder
MARKER_PREFIX = "requeue-"

MODES = ("exec", "torchrun", "srun")
# this module, run as the wrapper between torchrun and each worker
WORKER_MODULE = "pmlm.train.launch"


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
