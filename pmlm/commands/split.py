"""``pmlm split``: cluster with MMseqs2, decontaminate, split train/valid by cluster.

Options left out keep ``pmlm.data.split.SplitConfig``'s defaults (the engine fills them in).
"""

from __future__ import annotations

import argparse

ENGINE = "pmlm.data.split"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("fasta", help="clean FASTA from pmlm ingest (unique ids)")
    p.add_argument("--out-dir", required=True, help="writes train.fasta, valid.fasta, split_stats.json")
    p.add_argument("--method", choices=("linclust", "cluster"))
    p.add_argument("--min-seq-id", type=float)
    p.add_argument("--coverage", type=float)
    p.add_argument("--cov-mode", type=int)
    p.add_argument("--valid-fraction", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--decontaminate", nargs="*", default=[], metavar="FASTA",
                   help="evaluation sequences; training sequences similar to any of them are removed")
    p.add_argument("--decontam-min-seq-id", type=float)
    p.add_argument("--decontam-coverage", type=float)
    p.add_argument("--threads", type=int)
    p.add_argument("--mmseqs", help="MMseqs2 executable")
