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
import sys

from pmlm.choices import Device, Precision
from pmlm.errors import ConfigError


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
        type=Precision.argument,
        choices=Precision.values(),
        default=Precision.AUTO,
        help=f"arithmetic of the forward passes: auto (default) = what {recorded_by} run recorded (fp32 if nothing, "
        "and fp32 off CUDA, said on stderr), or fp32 / bf16 (bf16 needs CUDA); the outputs record which",
    )


def add_device(parser: argparse.ArgumentParser) -> None:
    """``--device``, shared by the commands that run a model."""
    parser.add_argument("--device", type=Device.argument, choices=Device.values(), default=Device.AUTO)


def add_adapter(parser: argparse.ArgumentParser) -> None:
    """``--adapter``, shared by the commands that run an encoder (embed, score, contacts): the adapters of a
    fine-tuned run put into MODEL (pmlm.pretrained.with_adapter)."""
    parser.add_argument(
        "--adapter",
        metavar="RUN",
        help="a fine-tuned run with adapters (its head.safetensors or folder, trained on MODEL: checked by sha256): "
        "its adapters are put into the encoder, its head is not used",
    )


# the choices of --unknown (pmlm.inference.sequences.UNKNOWN_CHOICES; tests/test_embed.py holds them equal): written
# out here, where the parsers are built without the engine's imports
UNKNOWN_CHOICES = ("error", "x", "skip")


def add_unknown(parser: argparse.ArgumentParser) -> None:
    """``--unknown``, shared by the commands that read protein sequences from FASTA (embed, contacts, score): what
    a letter outside the alphabet does (pmlm.inference.sequences); the repairs are counted on stderr
    (``print_repairs``)."""
    parser.add_argument(
        "--unknown",
        choices=UNKNOWN_CHOICES,
        default="error",
        help="letters outside the alphabet (B, Z, J, U, O, ...): error (default: one line naming the file and line), "
        "x = read each as X, the unknown residue, or skip = leave such records out; repairs are counted on stderr",
    )


def print_repairs(command: str, report) -> None:
    """One stderr line per repair ``--unknown`` made (a pmlm.inference.sequences.SequenceReport), as ``pmlm embed:
    3 letters outside the alphabet read as X in 2 sequences``."""
    for line in report.repairs():
        print(f"{command}: {line}", file=sys.stderr)


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


def run_targets(args: argparse.Namespace, command: str, names: tuple[str, ...]) -> None:
    """Check a training run's outputs before any work (pmlm.outputs): ``--out`` a run folder of its own (new, empty
    or holding only ``names``, what such a run keeps there, so resumed), ``--final`` a .safetensors file (its .json sidecar
    beside it), ``--scores`` a .json and ``--metrics`` a .csv file. Files named inside the run folder count as
    the run's own."""
    # on use, as every engine import of the command layer: building the parsers stays light
    from pathlib import Path

    from pmlm.outputs import OutputError, file_target, run_folder_target

    final = file_target(args.final, suffixes=(".safetensors",), option="--final", what="final weights")
    files = [final, file_target(final.with_suffix(".json"), suffixes=(".json",), option="--final", what="sidecar")]
    for option in ("--scores", "--metrics"):
        value = getattr(args, option[2:], None)
        if value is not None:
            suffix = ".json" if option == "--scores" else ".csv"
            files.append(file_target(value, suffixes=(suffix,), option=option, what=option[2:]))
    out, inside = Path(args.out).resolve(), []
    for f in files:  # an output inside the run folder (--final RUN/final/model.safetensors): its entry is the run's
        if f.resolve().is_relative_to(out) and f.resolve() != out:
            inside.append(f.resolve().relative_to(out).parts[0])
    run_folder_target(args.out, command=command, names=(*names, *inside))
    resolved = [f.resolve() for f in files]
    if len(set(resolved)) < len(resolved):
        raise OutputError(f"--final {args.final}: names the same file as another output of {command}")


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
