"""``pmlm launch``: run a Python command once per GPU across the nodes of a SLURM allocation."""

from __future__ import annotations

import argparse

from pmlm.train import COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S, REQUEUE_EXIT_CODE
from pmlm.train.allocation import PORT_BASE, PORT_SPAN
from pmlm.train.launch import DEFAULT_JOIN_TIMEOUT_S, JOIN_TIMEOUT_ENV  # the launcher is standard library only


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "pmlm launch [--gpus-per-node N] [--port P] [--env NAME=VALUE]... [--join-timeout S] "
        "[--collective-timeout S] [--no-requeue] [--dry-run] -- PYTHON_ARGS..."
    )
    parser.epilog = (
        "Outside SLURM, or inside a job step: one process per GPU on this node (torchrun --standalone), or the "
        "command itself for one GPU. In a SLURM batch job (the Snakemake executor with the `mpi` resource, or "
        "salloc): one `srun` step with one torchrun per node and a c10d rendezvous on the first node. "
        f"A worker's exit {REQUEUE_EXIT_CODE} (checkpoint saved on SIGTERM/SIGUSR1) becomes this command's exit "
        f"{REQUEUE_EXIT_CODE}, and in a batch job the job goes back in its queue (requeue in place: same job id, "
        "it resumes from the checkpoint); SIGTERM and SIGUSR1 are forwarded to the workers. At start it prints the "
        "nodes, the world size, the rendezvous and the network settings, and each rank its host; on a failure, one "
        "line with how each node's torchrun ended."
    )
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="N",
        help="workers per node (default: the devices in CUDA_VISIBLE_DEVICES, else "
        "SLURM_GPUS_ON_NODE, else one CPU worker)",
    )
    parser.add_argument(
        "--port",
        type=int,
        metavar="P",
        help=f"rendezvous port on the first node of a multi-node job (default: {PORT_BASE} + the "
        f"job id mod {PORT_SPAN}, or the next port free on the first node, so that jobs "
        "sharing a node do not meet at the same port)",
    )
    parser.add_argument(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        help="set an environment variable for the command on every node, e.g. "
        "NCCL_SOCKET_IFNAME=ib0 or GLOO_SOCKET_IFNAME=eth0 (repeatable)",
    )
    parser.add_argument(
        "--join-timeout",
        type=int,
        metavar="S",
        help="seconds the nodes wait for each other at the rendezvous before the job fails "
        f"(default: ${JOIN_TIMEOUT_ENV}, else {DEFAULT_JOIN_TIMEOUT_S})",
    )
    parser.add_argument(
        "--collective-timeout",
        type=int,
        metavar="S",
        help="seconds a worker waits in one collective for the other ranks before it fails, "
        "e.g. when a node hangs or vanishes (default: "
        f"${COLLECTIVE_TIMEOUT_ENV}, else {DEFAULT_COLLECTIVE_TIMEOUT_S})",
    )
    parser.add_argument(
        "--marker-dir",
        metavar="DIR",
        help="folder where workers record a requeue exit; must be shared by all nodes "
        "(default: a fresh hidden folder in the working directory, removed afterwards)",
    )
    parser.add_argument(
        "--no-requeue",
        dest="requeue",
        action="store_false",
        help=f"in a SLURM batch job, only exit with {REQUEUE_EXIT_CODE} when a worker does, for a batch script that "
        "requeues the job itself (default: put the job back in its queue with scontrol requeue, so that it starts "
        "again under the same job id and resumes)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")
    parser.add_argument(
        "python_args",
        nargs=argparse.REMAINDER,
        metavar="PYTHON_ARGS",
        help="what to run, as arguments to python: -m MODULE ARGS..., SCRIPT ARGS... or -c CODE",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.train.launch import run as run_engine

    return run_engine(args)
