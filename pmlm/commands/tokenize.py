"""``pmlm tokenize``: write tokenized Parquet shards and a manifest."""

from __future__ import annotations

import argparse

ENGINE = "pmlm.data.shards"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", action="append", required=True, metavar="SPLIT=FASTA",
                   help="split name and FASTA (plain or .gz); repeat for each split and file")
    p.add_argument("--out-dir", required=True, help="directory for manifest.json and <split>/part-*.parquet")
    p.add_argument("--num-shards", type=int, default=8, help="Parquet files per split (fixed, from config)")
    p.add_argument("--row-group-size", type=int, default=2048, help="rows per Parquet row group")
    p.add_argument("--compression-level", type=int, default=1,
                   help="zstd level (1: token bytes compress as well as at 3 and ~2.5x faster)")
