"""``pmlm proteingym``: the steps of the ProteinGym benchmark (arguments in pmlm/commands/proteingym.py)."""

from __future__ import annotations

import importlib

# step -> the module that computes it (each defines run(args) -> exit code); imported by step: selecting the
# assays or writing the tables should not wait for torch
ITEM_ENGINES = {
    "select": "pmlm.proteingym.reference",
    "score": "pmlm.proteingym.scoring",
    "aggregate": "pmlm.proteingym.summary",
    "tables": "pmlm.proteingym.report",
}


def run(args) -> int:
    return importlib.import_module(ITEM_ENGINES[args.step]).run(args)
