"""``pmlm report``: the figures and pages of the workflow report (curves, contact maps, precision by
separation, run information); arguments in pmlm/commands/report.py."""

from __future__ import annotations

import importlib
import sys

# item -> the module that computes it (each defines run(args) -> list of written paths)
ITEM_ENGINES = {
    "curves": "pmlm.reports.curves",
    "contact-maps": "pmlm.reports.contact_maps",
    "separation": "pmlm.reports.separation",
    "run-info": "pmlm.reports.run_info",
}


def run(args) -> int:
    # imported by item: a curve or the run page should not wait for torch, which only contact maps need
    engine = importlib.import_module(ITEM_ENGINES[args.item])
    paths = engine.run(args)
    print(f"pmlm report {args.item}: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return 0
