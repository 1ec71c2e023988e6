"""``pmlm split-structures``: train/valid/test split of a structure set by sequence identity."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("structures", help="structure JSONL(.gz): id, chain, seq, dssp, ca, cb per line")
    p.add_argument("--out-dir", required=True, help="writes train.jsonl, valid.jsonl, test.jsonl and stats")
    p.add_argument("--fractions", type=float, nargs=3, default=(0.7, 0.1, 0.2), metavar=("TRAIN", "VALID", "TEST"))
    p.add_argument("--min-seq-id", type=float, default=0.3, help="identity that makes two chains 'near'")
    p.add_argument("--coverage", type=float, default=0.5)
    p.add_argument("--method", default="cluster", choices=("cluster", "linclust"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mmseqs", default="mmseqs")


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.split import SplitConfig
    from pmlm.data.structsplit import split_structures

    cfg = SplitConfig(
        method=args.method,
        min_seq_id=args.min_seq_id,
        coverage=args.coverage,
        seed=args.seed,
        threads=args.threads,
        mmseqs=args.mmseqs,
        valid_fraction=0.0,
    )
    stats = split_structures(args.structures, args.out_dir, cfg, tuple(args.fractions))
    print(
        f"split-structures: {stats['chains']} chains in {stats['clusters']} clusters -> train {stats['train']['chains']}, "
        f"valid {stats['valid']['chains']}, test {stats['test']['chains']} (dropped as similar to train: "
        f"{stats['dropped_similar_to_train']})",
        file=sys.stderr,
    )
    return 0
