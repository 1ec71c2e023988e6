"""``pmlm launch``: start a Python command once per GPU on every node of a SLURM allocation (torchrun
rendezvous from SLURM's environment), forward stop signals to it, and keep its "requeue me" exit code.
The allocation itself is read in ``train.allocation``.

``python -m pmlm.train.launch`` is the small in-process wrapper that the launcher puts around torchrun on
each node (it says where the node is and how its torchrun ended, in the log and in a report file) and
between torchrun and each worker (it says which rank runs where, and records a worker's requeue exit,
which torchrun itself reports as a plain failure). What the launcher prints at start and on failure is
meant to make a failed multi-node start diagnosable from the job's log alone.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import runpy
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

from pmlm.errors import ConfigError
from pmlm.train import COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S, REQUEUE_EXIT_CODE
from pmlm.train.allocation import Allocation, expand_hostlist, first_host, read_allocation

# Without --port, a multi-node job's rendezvous port is PORT_BASE + job id mod PORT_SPAN: below Linux's
# ephemeral ports (32768-60999, from which outgoing connections, gloo's many among them, take theirs), and
# different for jobs that share a first node unless their ids differ by a multiple of PORT_SPAN; the
# launcher, which runs on the first node, then moves to the next free port.
PORT_BASE = 29500
PORT_SPAN = 2000
DEFAULT_PORT = PORT_BASE  # outside SLURM (no job id)
PORT_PROBES = 64
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
# a worker that exits with the requeue code leaves a file with this prefix in the marker folder
MARKER_PREFIX = "requeue-"
# each node's torchrun wrapper leaves its outcome in a file with this prefix there
REPORT_PREFIX = "node-"

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
    marker_dir: Path | None  # where workers under torchrun record a requeue exit (and nodes their outcome)
    hosts: list[str] = field(default_factory=list)  # the nodes, when known (a SLURM job)
    rendezvous: str | None = None  # host:port of a multi-node rendezvous
    env: dict[str, str] = field(default_factory=dict)  # set for the command on every node

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"launch mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def describe(self) -> str:
        where = "inside SLURM's srun step" if self.mode == "srun" else "on this node"
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
    in_batch = alloc.job_id is not None and not alloc.in_step
    hosts = expand_hostlist(alloc.nodelist) if alloc.nodelist else []
    rendezvous = None

    if procs == 1 and nodes == 1:
        worker = [python, *python_args]
        marker = None
    else:
        marker = marker_dir or default_marker_dir(alloc.job_id)
        # the agent ignores USR1 (SLURM signals every process of a step; the default action would kill it)
        # and the workers inherit that until the trainer installs its own handler
        worker = [python, "-m", WORKER_MODULE, "--ignore-usr1", "--node-report", str(marker),
                  "-m", "torch.distributed.run"]  # fmt: skip
        if nodes == 1:
            worker += ["--standalone", "--nproc_per_node", str(procs)]
        else:
            rendezvous = f"{first_host(alloc.nodelist)}:{port}"
            # no restarts: a failed node fails the job, which resumes from its checkpoint when resubmitted
            worker += [
                "--nnodes", str(nodes), "--nproc_per_node", str(procs),
                "--rdzv_backend", "c10d", "--rdzv_endpoint", rendezvous,
                "--rdzv_id", str(alloc.job_id), "--rdzv_conf", f"join_timeout={join_timeout}",
                "--max_restarts", "0",
            ]  # fmt: skip
        worker += ["-m", WORKER_MODULE, "--requeue-marker", str(marker), *python_args]
    env = {COLLECTIVE_TIMEOUT_ENV: str(collective_timeout)}

    if in_batch:
        # Our own job step: SLURM's step signals (--signal=USR1@T, scancel --signal) then reach the workers
        # and not the batch shell or Snakemake. The step's geometry is spelled out rather than inherited: the
        # executor strips SLURM_* before the rule runs, and a user's batch script has the job's task count.
        srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        if alloc.cpus_per_node:
            srun.append(f"--cpus-per-task={alloc.cpus_per_node}")
        return LaunchPlan("srun", srun + worker, nodes, procs, marker, hosts, rendezvous, env)
    if marker is None:
        return LaunchPlan("exec", worker, nodes, procs, None, hosts, None, env)
    return LaunchPlan("torchrun", worker, nodes, procs, marker, hosts, rendezvous, env)


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
    if alloc.nodes < 2 or not alloc.nodelist or not _same_host(first_host(alloc.nodelist), socket.gethostname()):
        return port, note
    for candidate in range(port, port + PORT_PROBES):
        wrapped = PORT_BASE + (candidate - PORT_BASE) % PORT_SPAN
        if port_is_free(wrapped):
            return wrapped, note if wrapped == port else f"{note}: {port} was in use here, {wrapped} is free"
    raise ConfigError(
        f"no free rendezvous port on {socket.gethostname()} among the {PORT_PROBES} from {port}; give one with --port"
    )


def _same_host(node: str, hostname: str) -> bool:
    """A SLURM node name and a host name (which some sites give in full: gpu07.cluster.example) name one host."""
    return node.split(".")[0] == hostname.split(".")[0]


def default_marker_dir(job_id: str | None) -> Path:
    """A fresh folder in the working directory: shared with the other nodes of a job, unlike /tmp."""
    return Path.cwd() / f".pmlm-launch-{job_id or socket.gethostname()}-{os.getpid()}"


def _say(text: str) -> None:
    """One line to stderr in one write: the lines of the processes of several nodes arrive through one srun and
    would otherwise run into each other."""
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), (text + "\n").encode(errors="replace"))


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
    """Run a torchrun / srun plan as a child, forward stop signals, map a worker's requeue exit to ours; when
    it fails, one line that says how each node ended."""
    child: subprocess.Popen | None = None
    pending: list[int] = []  # signals that arrived before the child existed
    stops_to_srun = 0

    def forward(signum, frame):
        nonlocal stops_to_srun
        if child is None:
            pending.append(signum)
        elif plan.mode == "srun":
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
            child = subprocess.Popen(plan.argv, stderr=subprocess.PIPE if plan.mode == "srun" else None)
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
        _say(
            f"pmlm launch: a worker exited with {REQUEUE_EXIT_CODE} (checkpoint saved after a stop signal); "
            f"exiting with {REQUEUE_EXIT_CODE} so the job is resubmitted and resumes"
        )
        return REQUEUE_EXIT_CODE
    code = 128 - returncode if returncode < 0 else returncode  # killed by signal n: the shell's 128 + n
    if code != 0:
        _say(failure_summary(plan, code, time.monotonic() - started, reports, srun_errors))
    return code


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
    """One line: how each node's torchrun ended (from its report), which sent none, and what srun said."""
    nodes = [
        f"{host}: {reports[host]}"
        if host in reports
        else f"{host}: no report (its processes were killed, or the node was lost, before torchrun ended)"
        for host in plan.hosts or sorted(reports)
    ]
    nodes += [f"{host}: {text}" for host, text in sorted(reports.items()) if plan.hosts and host not in plan.hosts]
    where = "; ".join(nodes) if nodes else "no node reported"
    said = f"; srun: {' | '.join(srun_errors[:4])}" if srun_errors else ""
    return f"pmlm launch: error: exit {code} after {seconds:.0f} s on {plan.nodes} node(s): {where}{said}"


def _address(host: str) -> str | None:
    """The address ``host`` resolves to here (IPv4 first), or None."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    addresses = [info[4][0] for info in infos]
    return next((a for a in addresses if ":" not in a), addresses[0] if addresses else None)


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


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
    _say(
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
    _say(f"pmlm launch: {meet}; collective timeout {collective_timeout} s; {network}")


# -- `pmlm launch` --------------------------------------------------------------------------------


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
    if plan.mode != "exec":
        _announce(plan, alloc, port_note, join_timeout, collective_timeout)
    _say(f"pmlm launch: {plan.describe()}: {shlex.join(plan.argv)}")
    if plan.mode == "exec":
        # nothing to supervise: the command becomes this process, so its signals and exit code are SLURM's
        sys.stdout.flush()
        os.execv(plan.argv[0], plan.argv)
    return supervise(plan)


# -- the wrappers: python -m pmlm.train.launch [--ignore-usr1] [--node-report DIR] [--requeue-marker DIR] ARGS ----


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


_TORCHRUN = ["-m", "torch.distributed.run"]


def _torchrun_options(args: Sequence[str]) -> int:
    """How many of ``args`` (``-m torch.distributed.run OPTIONS... -m SCRIPT...``) are torchrun's."""
    start = 2 if list(args[:2]) == _TORCHRUN else 0
    for i in range(start, len(args)):
        if args[i] in ("-m", "--module") or (not args[i].startswith("-") and not args[i - 1].startswith("--")):
            return i
    return len(args)


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of torchrun's option ``name VALUE`` in ``args``, or None."""
    own = list(args[: _torchrun_options(args)])
    return own[own.index(name) + 1] if name in own[:-1] else None


def _with_host_flag(args: list[str]) -> list[str]:
    """torchrun's arguments with ``is_host=1`` in --rdzv_conf: this node hosts the rendezvous store, and fails
    loudly if its port is taken, instead of quietly joining whatever store listens there (another job's)."""
    args, end = list(args), _torchrun_options(args)
    if "--rdzv_conf" in args[: end - 1]:
        i = args.index("--rdzv_conf") + 1
        args[i] = f"{args[i]},is_host=1" if args[i] else "is_host=1"
    else:
        args[end:end] = ["--rdzv_conf", "is_host=1"]
    return args


def _torchrun_outcome(python_args: Sequence[str]) -> tuple[int, str]:
    """Run torchrun in this process; its exit code and one line on how it ended (instead of a traceback)."""
    try:
        code = run_python_args(python_args)
        return code, f"torchrun exited {code}"
    except Exception as exc:  # torchrun's own failures: say what they were in one line
        failures = getattr(exc, "failures", None)
        sigval = getattr(exc, "sigval", None)
        if failures:
            ends = []
            for rank, failure in sorted(failures.items()):
                how = (
                    f"killed by {signal.Signals(-failure.exitcode).name}"
                    if failure.exitcode < 0
                    else f"exit {failure.exitcode}" + (" (requeue)" if failure.exitcode == REQUEUE_EXIT_CODE else "")
                )
                ends.append(f"rank {rank} {how}")
            return 1, f"torchrun exited 1: {', '.join(ends)}"
        if sigval is not None:
            return 128 + int(sigval), f"torchrun stopped by {signal.Signals(sigval).name}"
        text = str(exc).strip().splitlines()
        return 1, f"torchrun failed: {type(exc).__name__}: {text[0] if text else ''}"


def node_main(python_args: Sequence[str], report_dir: Path) -> int:
    """One node's torchrun: say where this node is and whom it meets, run torchrun, report how it ended."""
    host = socket.gethostname()
    address = _address(host)
    args = list(python_args)
    procs = _option(args, "--nproc_per_node")
    endpoint = _option(args, "--rdzv_endpoint")
    code, outcome = 0, ""
    if endpoint is None:
        _say(f"pmlm launch: node {host}: torchrun for {procs} process(es) on this node")
    else:
        rdzv_host, _, rdzv_port = endpoint.rpartition(":")
        rdzv_address = _address(rdzv_host)
        hosted = _same_host(rdzv_host, host)
        _say(
            f"pmlm launch: node {host} ({address or 'unresolved'}): torchrun for {procs} process(es); "
            f"rendezvous {rdzv_host}:{rdzv_port} = {rdzv_address or 'unresolved'}{', hosted here' if hosted else ''}"
        )
        if rdzv_address is None:
            code, outcome = 2, f"cannot resolve the rendezvous host {rdzv_host} on {host}"
        elif _is_loopback(address) and not any(os.environ.get(n) for n in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")):
            _say(
                f"pmlm launch: warning: {host} resolves to {address} (loopback) here, which gloo and NCCL would "
                "offer the other nodes; fix the node's /etc/hosts or set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME "
                "(pmlm launch --env)"
            )
        if hosted:
            args = _with_host_flag(args)
    started = time.monotonic()
    if not outcome:
        code, outcome = _torchrun_outcome(args)
    outcome = f"{outcome} after {time.monotonic() - started:.0f} s"
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"{REPORT_PREFIX}{host}").write_text(outcome + "\n")
    _say(f"pmlm launch: node {host}: {outcome}")
    return code


def _rank_banner() -> None:
    """A worker under torchrun: which rank runs where (the rank -> host map of a multi-node run)."""
    host = socket.gethostname()
    env = os.environ
    _say(
        f"pmlm launch: rank {env.get('RANK')} of {env.get('WORLD_SIZE')} (local rank {env.get('LOCAL_RANK')}) "
        f"on {host} ({_address(host) or 'unresolved'}), pid {os.getpid()}; process group via "
        f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
    )


def worker_main(argv: Sequence[str]) -> int:
    args = list(argv)
    marker_dir = report_dir = None
    while args and args[0] in ("--requeue-marker", "--ignore-usr1", "--node-report"):
        option = args.pop(0)
        if option == "--ignore-usr1":
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        elif not args:
            raise SystemExit(f"pmlm.train.launch: {option} needs a folder")
        elif option == "--requeue-marker":
            marker_dir = Path(args.pop(0))
        else:
            report_dir = Path(args.pop(0))
    if report_dir is not None:
        return node_main(args, report_dir)
    if marker_dir is not None and "RANK" in os.environ:
        _rank_banner()
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
