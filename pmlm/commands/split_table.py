"""``pmlm split-table``: train/valid/test files of a labelled table, by its split column or by sequence identity."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import add_identity_split, identity_split_config
from pmlm.outputs import OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", help="CSV, TSV (optionally .gz) or Parquet: a sequence column, labels, any other columns")
    p.add_argument(
        "--out-dir",
        required=True,
        help="a folder of its own: writes train.parquet, valid.parquet, test.parquet and stats (a folder holding "
        "files this command did not write is refused; --overwrite keeps them and replaces only its own)",
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument("--sequence-column", default="sequence")
    p.add_argument(
        "--split-column",
        default=None,
        help="a column saying train, valid or test for each row; without it rows are split by sequence identity",
    )
    add_identity_split(p, (0.8, 0.1, 0.1))


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.tablesplit import split_table

    cfg = identity_split_config(args)
    stats = split_table(
        args.table,
        args.out_dir,
        sequence_column=args.sequence_column,
        split_column=args.split_column,
        cfg=cfg,
        fractions=tuple(args.fractions),
        overwrite=args.overwrite,
    )
    print(
        f"split-table: {stats['rows']} rows -> train {stats['train']['rows']}, valid {stats['valid']['rows']}, "
        f"test {stats['test']['rows']} (dropped as similar to train: {stats['dropped']})",
        file=sys.stderr,
    )
    return 0
