"""What ``pmlm launch`` runs in the processes it starts: ``python -m pmlm.train.wrapper [OPTIONS] PYTHON_ARGS``.

Two thin wrappers, each running its command in-process (``-m MODULE``, ``-c CODE`` or a script, as python would):

- around torchrun on each node (``--node-report DIR``): it says where the node is and whom it meets, makes the
  rendezvous host really host the store (so that a port taken by another job fails loudly instead of joining that
  job), and leaves one line on how its torchrun ended in DIR, from which the launcher writes its one-line failure
  summary; ``--ignore-usr1`` keeps SLURM's USR1, which reaches every process of the step, from killing torchrun;
- between torchrun and each worker (``--requeue-marker DIR``): it says which rank runs where, and records a
  worker's requeue exit in DIR, since torchrun reports any failing worker as a plain exit 1.

Standard library only: it starts before torch is imported.
"""

from __future__ import annotations

import ipaddress
import os
import runpy
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.allocation import same_host

# a worker that exits with the requeue code leaves a file with this prefix in the marker folder
MARKER_PREFIX = "requeue-"
# each node's torchrun wrapper leaves its outcome in a file with this prefix there
REPORT_PREFIX = "node-"
# the interface variables that keep gloo / NCCL off a loopback address
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def say(text: str) -> None:
    """One line to stderr in one write: the lines of the processes of several nodes arrive through one srun and
    would otherwise run into each other."""
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), (text + "\n").encode(errors="replace"))


def address(host: str) -> str | None:
    """The address ``host`` resolves to here (IPv4 first), or None."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    addresses = [info[4][0] for info in infos]
    return next((a for a in addresses if ":" not in a), addresses[0] if addresses else None)


def _is_loopback(value: str | None) -> bool:
    try:
        return value is not None and ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


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
        raise SystemExit("pmlm.train.wrapper: no command (expected -m MODULE, -c CODE or SCRIPT)")
    head, rest = python_args[0], list(python_args[1:])
    try:
        if head in ("-m", "-c"):
            if not rest:
                raise SystemExit(f"pmlm.train.wrapper: {head} needs an argument")
            target, rest = rest[0], rest[1:]
            if head == "-m":
                sys.argv = [target, *rest]
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.argv = ["-c", *rest]
                exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
        elif head.startswith("-"):
            raise SystemExit(f"pmlm.train.wrapper: unsupported python option {head} (use -m, -c or a script)")
        else:
            sys.argv = [head, *rest]
            sys.path[0] = os.path.dirname(os.path.abspath(head))
            runpy.run_path(head, run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc)
    return 0


# -- around torchrun, once per node ---------------------------------------------------------------------------


def _torchrun_options(args: Sequence[str]) -> int:
    """Where torchrun's own options end in ``-m torch.distributed.run OPTIONS... -m MODULE ...`` (the launcher's
    plans always name the worker as a module)."""
    return next((i for i in range(2, len(args)) if args[i] in ("-m", "--module")), len(args))


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
    here = address(host)
    args = list(python_args)
    procs = _option(args, "--nproc_per_node")
    endpoint = _option(args, "--rdzv_endpoint")
    code, outcome = 0, ""
    if endpoint is None:
        say(f"pmlm launch: node {host}: torchrun for {procs} process(es) on this node")
    else:
        rdzv_host, _, rdzv_port = endpoint.rpartition(":")
        rdzv_address = address(rdzv_host)
        hosted = same_host(rdzv_host, host)
        say(
            f"pmlm launch: node {host} ({here or 'unresolved'}): torchrun for {procs} process(es); "
            f"rendezvous {rdzv_host}:{rdzv_port} = {rdzv_address or 'unresolved'}{', hosted here' if hosted else ''}"
        )
        if rdzv_address is None:
            code, outcome = 2, f"cannot resolve the rendezvous host {rdzv_host} on {host}"
        elif _is_loopback(here) and not any(os.environ.get(n) for n in INTERFACE_VARIABLES):
            say(
                f"pmlm launch: warning: {host} resolves to {here} (loopback) here, which gloo and NCCL would "
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
    say(f"pmlm launch: node {host}: {outcome}")
    return code


# -- between torchrun and each worker ---------------------------------------------------------------------------


def worker_main(argv: Sequence[str]) -> int:
    args = list(argv)
    marker_dir = report_dir = None
    while args and args[0] in ("--requeue-marker", "--ignore-usr1", "--node-report"):
        option = args.pop(0)
        if option == "--ignore-usr1":
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        elif not args:
            raise SystemExit(f"pmlm.train.wrapper: {option} needs a folder")
        elif option == "--requeue-marker":
            marker_dir = Path(args.pop(0))
        else:
            report_dir = Path(args.pop(0))
    if report_dir is not None:
        return node_main(args, report_dir)
    if marker_dir is not None and "RANK" in os.environ:
        # the rank -> host map of a multi-node run
        env, host = os.environ, socket.gethostname()
        say(
            f"pmlm launch: rank {env.get('RANK')} of {env.get('WORLD_SIZE')} (local rank {env.get('LOCAL_RANK')}) "
            f"on {host} ({address(host) or 'unresolved'}), pid {os.getpid()}; process group via "
            f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
        )
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
