"""Fine-tuning and evaluation engine: task heads, task data, the fine-tuning loop and `pmlm evaluate`.

Importing this package is cheap (no torch); the names below load on first use.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "FinetuneConfig": "pmlm.finetune.config",
    "TaskModel": "pmlm.finetune.heads",
    "build_head": "pmlm.finetune.heads",
    "read_task_data": "pmlm.finetune.data",
    "TaskLoader": "pmlm.finetune.data",
    "finetune": "pmlm.finetune.loop",
    "FinetuneHooks": "pmlm.finetune.loop",
    "load_finetuned": "pmlm.finetune.scoring",
    "score_task": "pmlm.finetune.scoring",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pmlm.finetune' has no attribute {name!r}")
