"""``pmlm split``: cluster with MMseqs2, decontaminate, split train/valid by cluster.

Options left out keep ``pmlm.data.split.SplitConfig``'s defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from pmlm.outputs import OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("fasta", help="clean FASTA from pmlm ingest (unique ids)")
    p.add_argument(
        "--out-dir",
        required=True,
        help="a folder of its own: writes train.fasta, valid.fasta, split_stats.json (a folder holding files this "
        "command did not write is refused; --overwrite keeps them and replaces only its own)",
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument("--method", choices=("linclust", "cluster"))
    p.add_argument("--min-seq-id", type=float)
    p.add_argument("--coverage", type=float)
    p.add_argument("--cov-mode", type=int)
    p.add_argument("--valid-fraction", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--decontaminate",
        nargs="*",
        default=[],
        metavar="FASTA",
        help="evaluation sequences; training sequences similar to any of them are removed",
    )
    p.add_argument("--decontam-min-seq-id", type=float)
    p.add_argument("--decontam-coverage", type=float)
    p.add_argument("--threads", type=int)
    p.add_argument("--mmseqs", help="MMseqs2 executable")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.split import SplitConfig, split

    # the options given (named after SplitConfig's fields); the rest keep SplitConfig's defaults
    given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(SplitConfig)}
    cfg = SplitConfig(**{name: value for name, value in given.items() if value is not None})
    stats = split(args.fasta, args.out_dir, cfg, references=args.decontaminate or None, overwrite=args.overwrite)
    print(
        f"split: {stats['sequences_in']} sequences in {stats['clusters']} clusters; "
        f"removed {stats['decontamination']['removed_sequences']} similar to evaluation sets; "
        f"train {stats['train']['sequences']} ({stats['train']['clusters']} clusters), "
        f"valid {stats['valid']['sequences']} ({stats['valid']['clusters']} clusters)",
        file=sys.stderr,
    )
    return 0
