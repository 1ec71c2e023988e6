"""The command layer: ``pmlm X`` is ``pmlm/commands/X.py`` (dashes become underscores), one module per
subcommand holding its arguments (``add_arguments(parser)``) and its ``run(args) -> int``, which checks what
argparse cannot, calls the engine functions that do the work and prints the one-line summary.

``run`` imports its engine when it runs, not at the top of the module: the engines import torch, pyarrow,
pandas or Biopython, and ``pmlm.cli`` must build every parser without them (``pmlm fetch`` runs where torch
is not installed, ``pmlm --help`` answers at once). So a command module imports only the standard library and
light contracts at module level; tests/test_envs.py checks that, and that the conda env of each rule holds
what its command's ``run`` imports. Options that several commands share are added here (``add_precision``).
"""

from __future__ import annotations

import argparse

from pmlm.errors import ConfigError
from pmlm.vocabulary import PRECISIONS


def labelled_paths(
    items: list[str], option: str, *, unique: bool = True, form: str = "LABEL=PATH"
) -> list[tuple[str, str]]:
    """``LABEL=PATH`` command-line items -> (label, path), in order; with ``unique`` a label may appear once
    (a run's curves, a test set), without it several paths may share one (the TSVs of one result table).
    ``form`` is how the option's help writes an item (``NAME=PATH``, ``SPLIT=FASTA``)."""
    out, seen = [], set()
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"{option} expects {form}, got {item!r}")
        if unique and label in seen:
            raise ConfigError(f"{option} {label} given twice")
        seen.add(label)
        out.append((label, path))
    return out


def add_precision(parser: argparse.ArgumentParser, recorded_by: str) -> None:
    """``--precision``, shared by the commands that evaluate, score or embed with a trained model; ``recorded_by``
    says whose run's record ``auto`` follows (``the head's``)."""
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help=f"arithmetic of the forward passes: auto (default) = what {recorded_by} run recorded (fp32 if nothing, "
        "and fp32 off CUDA, said on stderr), or fp32 / bf16 (bf16 needs CUDA); the outputs record which",
    )


def add_identity_split(p: argparse.ArgumentParser, fractions: tuple[float, float, float]) -> None:
    """The options of a train / valid / test split by sequence identity (MMseqs2), as split-structures and
    split-table take them."""
    p.add_argument("--fractions", type=float, nargs=3, default=fractions, metavar=("TRAIN", "VALID", "TEST"))
    p.add_argument("--min-seq-id", type=float, default=0.3, help="identity that makes two sequences 'near'")
    p.add_argument("--coverage", type=float, default=0.5)
    p.add_argument("--method", default="cluster", choices=("cluster", "linclust"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mmseqs", default="mmseqs")


def identity_split_config(args: argparse.Namespace):
    """The SplitConfig of ``add_identity_split``'s options."""
    from pmlm.data.split import SplitConfig  # on use: building the parsers imports no engine

    return SplitConfig(
        method=args.method,
        min_seq_id=args.min_seq_id,
        coverage=args.coverage,
        seed=args.seed,
        threads=args.threads,
        mmseqs=args.mmseqs,
        valid_fraction=0.0,
    )
