"""``pmlm launch``: start a Python command once per GPU on every node of a SLURM allocation, forward stop signals to
it, and keep its "requeue me" exit; in a batch job, requeue the job in place. What each part is for:

- the plan (:func:`plan_launch`): the command itself for one process; torchrun on this node for several; in a SLURM
  batch script, one ``srun`` step with one torchrun per node, so that SLURM's step signals (the time-limit warning
  ``--signal=USR1@T``, ``scancel --signal``) reach the trainers and not the batch shell or Snakemake around them;
- the rendezvous port (:func:`pick_rendezvous_port`): from the job id, so that jobs sharing a first node do not
  meet in one store;
- supervision (:func:`supervise`): stop signals forwarded in the form srun relays; a worker's exit 99 (checkpoint
  saved after a stop signal), which torchrun reports as 1, kept as 99; in a batch job, the job put back in its
  queue under the same id (``allocation.requeue_job``), so that a run longer than the time limit
  goes on without spending the workflow's retries; on a failure, one line saying how each node ended;
- what it prints at start (:func:`_announce`): where, how many, how they meet, so that a failed multi-node start
  can be diagnosed from the job's log alone.

The allocation is read in ``train.allocation``; the wrappers around each node's torchrun and each worker are
``train.wrapper``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pmlm.choices import Choice
from pmlm.errors import ConfigError
from pmlm.train import COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S, REQUEUE_EXIT_CODE
from pmlm.train.allocation import (
    Allocation,
    expand_hostlist,
    pick_rendezvous_port,
    read_allocation,
    rendezvous_port,
    requeue_job,
)
from pmlm.train.wrapper import MARKER_PREFIX, REPORT_PREFIX, say

# How long the nodes wait for each other at the rendezvous (torchrun's join_timeout); together with the
# workers' collective timeout (COLLECTIVE_TIMEOUT_ENV, read by the trainer) it bounds how long a job whose
# node failed to start, hangs or vanished can hold its allocation. Defaults: PMLM_JOIN_TIMEOUT, else this.
JOIN_TIMEOUT_ENV = "PMLM_JOIN_TIMEOUT"
DEFAULT_JOIN_TIMEOUT_S = 600
# the network settings a multi-node start prints (set them with --env, or in the job's environment)
NETWORK_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG")
# signals a scheduler sends before stopping a job (USR1: SLURM's --signal warning; TERM: time limit,
# preemption, scancel); INT is forwarded as well so that Ctrl-C reaches workers in their own sessions
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class LaunchMode(Choice):
    """How the command runs: ``exec`` becomes this process, ``torchrun`` or ``srun`` (one step) its child."""

    EXEC = "exec"
    TORCHRUN = "torchrun"
    SRUN = "srun"

    @property
    def supervised(self) -> bool:
        return self is not LaunchMode.EXEC

    @property
    def srun_step(self) -> bool:
        return self is LaunchMode.SRUN


TORCHRUN_LOGS = "torchrun-logs"  # torchrun's --log-dir, inside the marker folder
# the wrapper around each node's torchrun and each worker
WRAPPER_MODULE = "pmlm.train.wrapper"


@dataclass(frozen=True)
class LaunchPlan:
    mode: LaunchMode  # how the command runs
    argv: list[str]
    nodes: int
    procs_per_node: int
    marker_dir: Path | None  # where workers under torchrun record a requeue exit (and nodes their outcome)
    hosts: list[str] = field(default_factory=list)  # the nodes, when known (a SLURM job)
    rendezvous: str | None = None  # host:port of a multi-node rendezvous
    env: dict[str, str] = field(default_factory=dict)  # set for the command on every node

    def __post_init__(self):
        object.__setattr__(self, "mode", LaunchMode.parse(self.mode, "launch mode"))

    def describe(self) -> str:
        where = "inside SLURM's srun step" if self.mode.srun_step else "on this node"
        return f"{self.nodes} node(s) x {self.procs_per_node} process(es), {where}"

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def plan_launch(
    alloc: Allocation,
    python_args: Sequence[str],
    *,
    port: int | None = None,
    marker_dir: Path | None = None,
    python: str = sys.executable,
    join_timeout: int = DEFAULT_JOIN_TIMEOUT_S,
    collective_timeout: int = DEFAULT_COLLECTIVE_TIMEOUT_S,
) -> LaunchPlan:
    """The command line for ``alloc``: a plain process, torchrun on this node, or torchrun per node via srun.
    ``port``: the rendezvous port of a multi-node job (default: from the job id, see :func:`rendezvous_port`)."""
    if not python_args:
        raise ConfigError("no command: give the Python arguments after --, e.g. pmlm launch -- -m pmlm pretrain ...")
    if port is None:
        port = rendezvous_port(alloc.job_id)
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    for name, seconds in (("--join-timeout", join_timeout), ("--collective-timeout", collective_timeout)):
        if seconds < 1:
            raise ConfigError(f"{name} must be at least 1 second, got {seconds}")
    procs, nodes = alloc.procs_per_node, alloc.nodes
    hosts = expand_hostlist(alloc.nodelist) if alloc.nodelist else []
    rendezvous = None

    if procs == 1 and nodes == 1:
        worker = [python, *python_args]
        marker = None
    else:
        marker = marker_dir or default_marker_dir(alloc.job_id)
        # the agent ignores USR1 (SLURM signals every process of a step; the default action would kill it)
        # and the workers inherit that until the trainer installs its own handler
        # torchrun's own log folder (its workers' error files) inside the marker folder, removed with it, rather than
        # a torchelastic_* folder left in the system's temporary folder by every launch
        worker = [python, "-m", WRAPPER_MODULE, "--ignore-usr1", "--node-report", str(marker),
                  "-m", "torch.distributed.run", "--log-dir", str(marker / TORCHRUN_LOGS)]  # fmt: skip
        if nodes == 1:
            worker += ["--standalone", "--nproc_per_node", str(procs)]
        else:
            rendezvous = f"{hosts[0]}:{port}"
            # no restarts: a failed node fails the job, which resumes from its checkpoint when resubmitted
            worker += [
                "--nnodes", str(nodes), "--nproc_per_node", str(procs),
                "--rdzv_backend", "c10d", "--rdzv_endpoint", rendezvous,
                "--rdzv_id", str(alloc.job_id), "--rdzv_conf", f"join_timeout={join_timeout}",
                "--max_restarts", "0",
            ]  # fmt: skip
        worker += ["-m", WRAPPER_MODULE, "--requeue-marker", str(marker), *python_args]
    env = {COLLECTIVE_TIMEOUT_ENV: str(collective_timeout)}

    if alloc.in_batch:
        # Our own job step: SLURM's step signals (--signal=USR1@T, scancel --signal) then reach the workers
        # and not the batch shell or Snakemake. The step's geometry is spelled out rather than inherited: the
        # executor strips SLURM_* before the rule runs, and a user's batch script has the job's task count.
        srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        if alloc.cpus_per_node:
            srun.append(f"--cpus-per-task={alloc.cpus_per_node}")
        return LaunchPlan(LaunchMode.SRUN, srun + worker, nodes, procs, marker, hosts, rendezvous, env)
    if marker is None:
        return LaunchPlan(LaunchMode.EXEC, worker, nodes, procs, None, hosts, None, env)
    return LaunchPlan(LaunchMode.TORCHRUN, worker, nodes, procs, marker, hosts, rendezvous, env)


def default_marker_dir(job_id: str | None) -> Path:
    """A fresh folder in the working directory: shared with the other nodes of a job, unlike /tmp."""
    return Path.cwd() / f".pmlm-launch-{job_id or socket.gethostname()}-{os.getpid()}"


# -- supervision ------------------------------------------------------------------------------------------------


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


def supervise(plan: LaunchPlan, requeue_job_id: str | None = None) -> int:
    """Run a torchrun / srun plan as a child, forward stop signals, map a worker's requeue exit to ours (and, given
    ``requeue_job_id``, requeue that job); when it fails, one line that says how each node ended."""
    child: subprocess.Popen | None = None
    pending: list[int] = []  # signals that arrived before the child existed
    stops_to_srun = 0

    def forward(signum, frame):
        nonlocal stops_to_srun
        if child is None:
            pending.append(signum)
        elif plan.mode.srun_step:
            # srun relays USR1 to every process of its step, but answers TERM (and a second INT) by killing the
            # step outright: a first TERM / INT goes to it as USR1, so the trainers save and exit 99 (the agents
            # ignore USR1); a second one as TERM
            if signum != signal.SIGUSR1:
                stops_to_srun += 1
                signum = signal.SIGUSR1 if stops_to_srun == 1 else signal.SIGTERM
            child.send_signal(signum)
        else:
            for pid in [child.pid, *_descendants(child.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    if plan.marker_dir is not None:
        plan.marker_dir.mkdir(parents=True, exist_ok=True)
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    srun_errors: list[str] = []
    started = time.monotonic()
    try:
        try:
            # srun's own stderr passes through here, so that its account of failed tasks can be summed up
            child = subprocess.Popen(plan.argv, stderr=subprocess.PIPE if plan.mode.srun_step else None)
        except FileNotFoundError:
            raise ConfigError(f"{plan.argv[0]} not found on PATH (needed for {plan.mode} mode)") from None
        relay = None
        if child.stderr is not None:
            relay = threading.Thread(target=_relay_stderr, args=(child.stderr, srun_errors), daemon=True)
            relay.start()
        for signum in pending:
            forward(signum, None)
        returncode = child.wait()
        if relay is not None:
            relay.join(timeout=10)
        found = list(plan.marker_dir.iterdir()) if plan.marker_dir is not None else []
        markers = any(p.name.startswith(MARKER_PREFIX) for p in found)
        reports = {
            p.name.removeprefix(REPORT_PREFIX): p.read_text(errors="replace").strip()
            for p in found
            if p.name.startswith(REPORT_PREFIX)
        }
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if plan.marker_dir is not None:
            shutil.rmtree(plan.marker_dir, ignore_errors=True)
    if returncode == REQUEUE_EXIT_CODE or markers:
        return _requeue(requeue_job_id)
    code = 128 - returncode if returncode < 0 else returncode  # killed by signal n: the shell's 128 + n
    if code != 0:
        say(failure_summary(plan, code, time.monotonic() - started, reports, srun_errors))
    return code


def _requeue(job_id: str | None) -> int:
    """After a worker's exit 99: the job back in its queue when ``job_id`` is given, and exit 99 either way."""
    saved = f"a worker exited with {REQUEUE_EXIT_CODE} (checkpoint saved after a stop signal)"
    if job_id is None:
        say(f"pmlm launch: {saved}; exiting with {REQUEUE_EXIT_CODE} so the job is resubmitted and resumes")
        return REQUEUE_EXIT_CODE
    try:
        requeued, record = requeue_job(job_id)
    except ConfigError as exc:
        say(
            f"pmlm launch: error: {saved}, but the job could not be requeued ({exc}); exiting with "
            f"{REQUEUE_EXIT_CODE} so that it can be resubmitted"
        )
        return REQUEUE_EXIT_CODE
    if not requeued:
        say(f"pmlm launch: {saved}; job {job_id} is {record.get('JobState', '?')} (SLURM requeues or ends it itself)")
        return REQUEUE_EXIT_CODE
    say(
        f"pmlm launch: {saved}; job {job_id} requeued in place (restart {int(record.get('Restarts', 0)) + 1}): it "
        "starts again under the same id when SLURM lets it, and resumes from that checkpoint"
    )
    return REQUEUE_EXIT_CODE


def _relay_stderr(stream, srun_errors: list[str]) -> None:
    """Copy a child's stderr to ours line by line, keeping srun's own error lines."""
    out = sys.stderr.buffer
    for raw in iter(stream.readline, b""):
        out.write(raw)
        out.flush()
        line = raw.decode(errors="replace").rstrip()
        if line.startswith("srun: error:"):
            srun_errors.append(line.removeprefix("srun: error:").strip())
    stream.close()


def failure_summary(
    plan: LaunchPlan, code: int, seconds: float, reports: Mapping[str, str], srun_errors: Sequence[str]
) -> str:
    """One line: how each node's torchrun ended (from its report), which sent none, and what srun said (a single
    process, without torchrun, has only srun's account)."""
    where = ""  # one process, without torchrun: srun's account is all there is
    if plan.marker_dir is not None:
        nodes = [
            f"{host}: {reports[host]}"
            if host in reports
            else f"{host}: no report (its processes were killed, or the node was lost, before torchrun ended)"
            for host in plan.hosts or sorted(reports)
        ]
        nodes += [f"{host}: {text}" for host, text in sorted(reports.items()) if plan.hosts and host not in plan.hosts]
        where = ": " + ("; ".join(nodes) if nodes else "no node reported")
    said = f"; srun: {' | '.join(srun_errors[:4])}" if srun_errors else ""
    return f"pmlm launch: error: exit {code} after {seconds:.0f} s on {plan.nodes} node(s){where}{said}"


# -- `pmlm launch` ------------------------------------------------------------------------------------------------


def _seconds(value: str | None, name: str, default: int) -> int:
    if value is None or not value.strip():
        return default
    if not value.strip().isdigit() or int(value) < 1:
        raise ConfigError(f"{name} must be a whole number of seconds (at least 1), got {value!r}")
    return int(value)


def _announce(plan: LaunchPlan, alloc: Allocation, port_note: str, join_timeout: int, collective_timeout: int) -> None:
    """What a failed multi-process start needs to be diagnosed from the log: where, how many, how they meet."""
    where = f"job {alloc.job_id}: " if alloc.job_id else ""
    hosts = f" ({', '.join(plan.hosts)})" if 1 < len(plan.hosts) <= 16 else ""
    nodes = f"{plan.nodes} node(s) {alloc.nodelist}{hosts}" if alloc.nodelist else f"{plan.nodes} node(s)"
    say(
        f"pmlm launch: {where}{nodes} x {plan.procs_per_node} process(es) = world size {plan.world_size}; "
        "ranks are given out at the rendezvous, each says where it runs"
    )
    meet = (
        f"rendezvous c10d at {plan.rendezvous} ({port_note}), join timeout {join_timeout} s"
        if plan.rendezvous
        else "rendezvous on this node"
    )
    network = ", ".join(
        f"{name}={os.environ[name]}" if name in os.environ else f"{name} unset" for name in NETWORK_VARIABLES
    )
    say(f"pmlm launch: {meet}; collective timeout {collective_timeout} s; {network}")


def run(args: argparse.Namespace) -> int:
    command = list(args.python_args)
    if command[:1] == ["--"]:
        command = command[1:]
    extra = {}
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"--env expects NAME=VALUE, got {item!r}")
        extra[name] = value
    env = {**os.environ, **extra}
    join_timeout = args.join_timeout
    if join_timeout is None:
        join_timeout = _seconds(env.get(JOIN_TIMEOUT_ENV), JOIN_TIMEOUT_ENV, DEFAULT_JOIN_TIMEOUT_S)
    collective_timeout = args.collective_timeout
    if collective_timeout is None:
        collective_timeout = _seconds(
            env.get(COLLECTIVE_TIMEOUT_ENV), COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S
        )
    alloc = read_allocation(env, gpus_per_node=args.gpus_per_node)
    if args.port is not None:
        port, port_note = args.port, "--port"
    elif args.dry_run:
        port, port_note = rendezvous_port(alloc.job_id), "from the job id"
    else:
        port, port_note = pick_rendezvous_port(alloc)
    plan = plan_launch(
        alloc,
        command,
        port=port,
        marker_dir=Path(args.marker_dir).resolve() if args.marker_dir else None,
        join_timeout=join_timeout,
        collective_timeout=collective_timeout,
    )
    if args.dry_run:
        print(shlex.join(plan.argv))
        return 0
    # for the command and, through srun (which passes this environment on), for every node
    os.environ.update({**extra, **plan.env})
    if plan.mode.supervised:
        _announce(plan, alloc, port_note, join_timeout, collective_timeout)
    say(f"pmlm launch: {plan.describe()}: {shlex.join(plan.argv)}")
    if not plan.mode.supervised:
        # nothing to supervise: the command becomes this process, so its signals and exit code are SLURM's
        sys.stdout.flush()
        os.execv(plan.argv[0], plan.argv)
    # requeue in place: only from a batch script, whose job the step belongs to (a step of its own would be
    # requeued once per node)
    return supervise(plan, alloc.job_id if args.requeue and alloc.in_batch else None)
