"""Training: the loop every run goes through, :func:`pmlm.train.engine.fit`, handed pre-training's run by
:func:`pmlm.train.pretrain.train` (``pmlm pretrain``) and fine-tuning's by :func:`pmlm.finetune.finetune.finetune`
(``pmlm finetune``); the Parquet shard loader, checkpoints, run folders and the multi-GPU launcher. This package's
own module holds only light constants that the command layer reads."""

from __future__ import annotations

# Exit status of a run stopped by SIGTERM / SIGUSR1 after saving a checkpoint: "resume me".
# A job script or scheduler hook requeues on it (e.g. `[ $? -eq 99 ] && scontrol requeue $SLURM_JOB_ID`);
# rerunning the same command resumes from the checkpoint. Distinct from the codes that shells,
# signals (128 + n), timeout(1) (124, 137) and pmlm's own errors (2) use.
REQUEUE_EXIT_CODE = 99
# Seconds a worker waits in one collective (gradient all-reduce, checkpoint gather, barrier) for the other
# ranks before it fails: a rank that hangs or whose node vanished without closing its connections fails the
# job in bounded time (a rank that died is noticed at once). Read by the trainer from this variable, which
# `pmlm launch --collective-timeout` sets on every node; long checkpoint writes on a slow filesystem (the
# other ranks wait for rank 0 to write) need it raised.
COLLECTIVE_TIMEOUT_ENV = "PMLM_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT_S = 600
# what `pmlm pretrain --help` and `pmlm finetune --help` say about it
RESUME_NOTE = (
    "Resumes from the newest checkpoint in OUT/checkpoints if it belongs to this run (the same settings and data); "
    "a run with other settings starts afresh and moves the old checkpoints to OUT/checkpoints.superseded-N. On "
    f"SIGTERM or SIGUSR1 it saves a checkpoint at the next step and exits with {REQUEUE_EXIT_CODE}: rerun the same "
    "command to continue (after two stops in a row without a newer checkpoint it fails instead)."
)
# what `--extend` says in `pmlm pretrain --help` and `pmlm finetune --help`
EXTEND_HELP = (
    "continue the run in OUT from its newest checkpoint although optim.total_steps changed (e.g. raised to train "
    "longer); any other changed setting is an error (the number of ranks is no setting: a checkpoint resumes on "
    "any by itself)"
)
# the metrics log every training run writes in its run folder (train.runtime.MetricsLog), read by the training
# curves; here, free of torch, because the workflow declares it as the training rules' output
METRICS_CSV = "metrics.csv"
