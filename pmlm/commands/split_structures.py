"""``pmlm split-structures``: train/valid/test split of a structure set by sequence identity."""

from __future__ import annotations

import argparse

ENGINE = "pmlm.data.structsplit"


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
