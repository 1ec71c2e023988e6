"""``pmlm tables``: arguments of the result tables (engine: pmlm.reports.cli)."""

from __future__ import annotations

import argparse

ENGINE = "pmlm.reports.cli"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="table", required=True, metavar="<table>")
    pre = sub.add_parser("pretrain-scores", help="the paper's 'Validation Losses and Accuracy Scores' table")
    pre.add_argument("--model", action="append", required=True, metavar="LABEL:DATASET:WEIGHTS",
                     help="one pre-trained model (final weights with their .json); repeatable")
    pre.add_argument("--out-prefix", required=True, help="writes PREFIX.csv, PREFIX.md, PREFIX.tex, PREFIX.html")
    res = sub.add_parser("results", help="downstream tables (contact, ablation, secondary structure, remote homology, "
                                         "unsupervised contacts) from evaluation TSVs")
    res.add_argument("--result", action="append", required=True, metavar="TABLE=TSV",
                     help="an evaluation TSV and the table it feeds (tape_contact, raptorx_contact, "
                          "secondary_structure, remote_homology, unsupervised_contact); repeatable")
    res.add_argument("--out-dir", required=True, help="writes <table>.csv / .md / .tex / .html for every table")
    res.add_argument("--test-label", default="the configured test sets", help="how captions name our test sets")
