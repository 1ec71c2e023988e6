"""``pmlm tables``: assemble result tables (CSV, Markdown, LaTeX, HTML) with the paper's rows beside ours."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import labelled_paths
from pmlm.errors import InputError
from pmlm.outputs import OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="table", required=True, metavar="<table>")
    pre = sub.add_parser("pretrain-scores", help="the paper's 'Validation Losses and Accuracy Scores' table")
    pre.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="LABEL:DATASET:WEIGHTS",
        help="one pre-trained model (final weights with their .json); repeatable",
    )
    pre.add_argument("--out-prefix", required=True, help="writes PREFIX.csv, PREFIX.md, PREFIX.tex, PREFIX.html")
    pre.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    res = sub.add_parser(
        "results",
        help="downstream tables (contact, ablation, secondary structure, remote homology, "
        "unsupervised contacts) from evaluation TSVs",
    )
    res.add_argument(
        "--result",
        action="append",
        required=True,
        metavar="TABLE=TSV",
        help="an evaluation TSV and the table it feeds (tape_contact, raptorx_contact, "
        "secondary_structure, remote_homology, unsupervised_contact); repeatable",
    )
    res.add_argument(
        "--out-dir",
        required=True,
        help="a folder of its own: writes <table>.csv / .md / .tex / .html for every table (a folder holding files "
        "this command did not write is refused; --overwrite keeps them and replaces only its own)",
    )
    res.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    res.add_argument("--test-label", default="the configured test sets", help="how captions name our test sets")
    task = sub.add_parser(
        "task",
        help="the table of one task outside the paper's (fluorescence, stability, a task of your own) from its "
        "evaluation TSVs: the task's metrics per encoder, head and test set",
    )
    task.add_argument("--result", action="append", required=True, metavar="TSV", help="an evaluation TSV; repeatable")
    task.add_argument("--out-prefix", required=True, help="writes PREFIX.csv, PREFIX.md, PREFIX.tex, PREFIX.html")
    task.add_argument("--title", default=None, help="the table's caption (default: the task and its metrics)")
    task.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    if args.table == "pretrain-scores":
        from pmlm.reports.pretrain_scores import write_pretrain_scores

        entries = []
        for item in args.model:
            parts = item.split(":", 2)
            if len(parts) != 3:
                raise InputError(item, "expected LABEL:DATASET:WEIGHTS")
            entries.append(tuple(parts))
        paths = write_pretrain_scores(entries, args.out_prefix, overwrite=args.overwrite)
        print(f"tables: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    elif args.table == "task":
        from pmlm.reports.task_tables import write_task_table

        paths = write_task_table(args.result, args.out_prefix, args.title, overwrite=args.overwrite)
        print(f"tables: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    else:
        from pmlm.reports.results import write_all

        results = labelled_paths(args.result, "--result", unique=False)
        paths = write_all(results, args.out_dir, args.test_label, overwrite=args.overwrite)
        print(f"tables: wrote {len(paths)} files under {args.out_dir}", file=sys.stderr)
    return 0
