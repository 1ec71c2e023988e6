"""``pmlm summary``: the last screen of a run (the tables and where they are, their headline numbers beside the
paper's, the pre-training losses, the figures, the report command), as the workflow prints it when a run ends."""

from __future__ import annotations

import argparse
import os

from pmlm.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULTS_DIR", help="a run's results folder, e.g. results/demo")
    p.add_argument(
        "--report-command",
        default="snakemake --report report.html",
        metavar="CMD",
        help="how the screen says to build the report (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.reports.run_summary import summary_text

    if not os.path.isdir(args.results):
        raise InputError(args.results, "no such results folder (the workflow writes results/<run>)")
    print(summary_text(args.results, report_command=args.report_command))
    return 0
