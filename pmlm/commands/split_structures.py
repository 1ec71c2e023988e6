"""``pmlm split-structures``: train/valid/test split of a structure set by sequence identity."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import add_identity_split, identity_split_config
from pmlm.outputs import OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("structures", help="structure JSONL(.gz): id, chain, seq, dssp, ca, cb per line")
    p.add_argument(
        "--out-dir",
        required=True,
        help="a folder of its own: writes train.jsonl, valid.jsonl, test.jsonl and stats (a folder holding files "
        "this command did not write is refused; --overwrite keeps them and replaces only its own)",
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_identity_split(p, (0.7, 0.1, 0.2))


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.structsplit import split_structures

    cfg = identity_split_config(args)
    stats = split_structures(args.structures, args.out_dir, cfg, tuple(args.fractions), overwrite=args.overwrite)
    print(
        f"split-structures: {stats['chains']} chains in {stats['clusters']} clusters -> train {stats['train']['chains']}, "
        f"valid {stats['valid']['chains']}, test {stats['test']['chains']} (dropped as similar to train: "
        f"{stats['dropped_similar_to_train']})",
        file=sys.stderr,
    )
    return 0
