"""``pmlm tokenize``: write tokenized Parquet shards and a manifest."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import labelled_paths
from pmlm.outputs import OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="SPLIT=FASTA",
        help="split name and FASTA (plain or .gz); repeat for each split and file",
    )
    p.add_argument(
        "--out-dir",
        required=True,
        help="a folder of its own for manifest.json and <split>/part-*.parquet (a folder holding files this command "
        "did not write is refused; --overwrite keeps them and replaces only its own)",
    )
    p.add_argument("--num-shards", type=int, default=8, help="Parquet files per split (fixed, from config)")
    p.add_argument("--row-group-size", type=int, default=2048, help="rows per Parquet row group")
    p.add_argument(
        "--compression-level",
        type=int,
        default=1,
        help="zstd level (1: token bytes compress as well as at 3 and ~2.5x faster)",
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.shards import tokenize

    inputs: dict[str, list[str]] = {}
    for split, path in labelled_paths(args.input, "--input", unique=False, form="SPLIT=FASTA"):
        inputs.setdefault(split, []).append(path)
    manifest = tokenize(
        inputs, args.out_dir, args.num_shards, args.row_group_size, args.compression_level, overwrite=args.overwrite
    )
    parts = ", ".join(f"{s}: {m['rows']} sequences / {m['residues']} residues" for s, m in manifest["splits"].items())
    print(f"tokenize: {parts} -> {args.out_dir}", file=sys.stderr)
    return 0
