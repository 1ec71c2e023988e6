"""Pre-training engine: Parquet shard loader, training loop, checkpoints and the `pmlm pretrain` command.

Importing this package is cheap (no torch); ``train``, ``TrainConfig`` and friends load on first use.
"""

from __future__ import annotations

import importlib

# Exit status of a run stopped by SIGTERM / SIGUSR1 after saving a checkpoint: "resume me".
# A job script or scheduler hook requeues on it (e.g. `[ $? -eq 99 ] && scontrol requeue $SLURM_JOB_ID`);
# rerunning the same command resumes from the checkpoint. Distinct from the codes that shells,
# signals (128 + n), timeout(1) (124, 137) and pmlm's own errors (2) use.
REQUEUE_EXIT_CODE = 99

_LAZY = {
    "train": "pmlm.train.loop",
    "TrainHooks": "pmlm.train.loop",
    "TrainingDiverged": "pmlm.train.runtime",
    "TrainConfig": "pmlm.train.config",
    "ShardStream": "pmlm.train.loader",
}

__all__ = ["REQUEUE_EXIT_CODE", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pmlm.train' has no attribute {name!r}")
