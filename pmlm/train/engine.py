"""The one training loop of pmlm. Pre-training (``train.pretrain``) and fine-tuning (``finetune.finetune``) each
build their data, model and optimizer and hand the engine a ``TrainingRun``: what differs between them (their
batches and loss, their learning rates, their metrics rows, their state to save). The engine runs the rest, in
this order: resume (only the run's own checkpoint, ``train.run_folder``), then per optimizer step the learning rate,
the step's batch, forward / backward over its micro-batches, clipping, the divergence stop, the step, the metrics
row, validation (and the run's early stop), checkpoints and the stop -> save -> requeue exit; at the end the last
checkpoint and validation.

The gradient of a step is the sum of its micro-batches' backward passes: a run returns each micro-batch's share of
the step's loss, normalised by the step's own counts (``begin_step`` draws the whole step first), so the update
does not depend on how the step is cut into micro-batches and ranks.
"""

from __future__ import annotations

import abc
import math
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from pmlm.progress import Progress
from pmlm.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from pmlm.train.run_folder import finished, own_checkpoint, stop_exit, stops_without_progress
from pmlm.train.runtime import METRICS_CSV, MetricsLog, StopSignals, stop_if_diverged, weights_diverged
from pmlm.train.step_layout import agree


class TrainingRun(abc.ABC):
    """What a run hands the engine. The engine calls these in the loop's order; a run keeps its own counts."""

    command: str  # "pretrain" | "finetune": names the run in its lines
    counted: str  # the running count its progress lines show per second ("tokens", "proteins")
    csv_fields: tuple[str, ...]  # the columns of its metrics.csv
    module: nn.Module  # switched to train() for the loop and back after each validation
    optimizer: torch.optim.Optimizer
    accumulation: int = 1  # micro-batches per optimizer step on this rank
    validates: bool = True  # whether there is a validation set
    step: int = 0  # optimizer steps done (the engine keeps it current, for the run's error lines)

    @abc.abstractmethod
    def parameters(self) -> Iterable[nn.Parameter]:
        """The parameters whose gradients are clipped together."""

    @abc.abstractmethod
    def learning_rates(self, step: int) -> dict[str, float]:
        """Set the optimizer's learning rates for optimizer step ``step`` (0-based); returns them by name."""

    @abc.abstractmethod
    def begin_step(self, step: int) -> None:
        """Draw optimizer step ``step``'s batch (all of its micro-batches) and the counts its loss is divided by."""

    @abc.abstractmethod
    def micro_batch_loss(self, step: int, micro: int) -> torch.Tensor:
        """Micro-batch ``micro``'s forward pass and its share of the step's loss, the tensor to backward (the run
        adds it to its own sums)."""

    def gradient_sync(self, enabled: bool) -> AbstractContextManager:
        """Context of one micro-batch's forward / backward: whether gradients are reduced across ranks."""
        return nullcontext()

    def finite(self) -> bool:
        """Whether the run's own sums are finite (beyond the gradient norm the engine checks)."""
        return True

    @abc.abstractmethod
    def mean_loss(self) -> float | None:
        """Mean training loss since the last metrics row."""

    @abc.abstractmethod
    def seen(self) -> int:
        """The running count named by ``counted``."""

    @abc.abstractmethod
    def log_train(self, log: MetricsLog | None, step: int, lrs: dict[str, float], grad_norm: float) -> None:
        """Write the training row (``log`` is None off the main rank; ``grad_norm``: the window's mean) and start a
        new window."""

    @abc.abstractmethod
    def validate(self, log: MetricsLog | None, step: int, lrs: dict[str, float]) -> None:
        """Score the validation set and write its row; the run keeps the scores for its outputs."""

    def stop_early(self) -> bool:
        """Whether the run is done before ``total_steps`` (fine-tuning's patience on validation); checked before
        each step, so a resumed run that had stopped stays stopped."""
        return False

    @abc.abstractmethod
    def state(self, step: int) -> tuple[dict, dict] | None:
        """(weights, training state) to save; None off the main rank (every rank calls it: it may be collective)."""

    @abc.abstractmethod
    def restore(self, ckpt: Checkpoint) -> None:
        """Load a checkpoint into the run's state."""


@dataclass
class Schedule:
    """The loop's own settings, read from either run's config."""

    total_steps: int
    clip_norm: float
    log_every: int
    eval_every: int
    save_every: int

    @classmethod
    def of(cls, cfg) -> Schedule:
        return cls(
            cfg.optim.total_steps,
            cfg.optim.clip_norm,
            cfg.log_every,
            cfg.eval_every,
            cfg.save_every,
        )


def fit(
    run: TrainingRun,
    cfg,
    out_dir: Path,
    device: torch.device,
    stop: StopSignals,
    *,
    record: dict,
    extend: bool = False,
    rank: int = 0,
    world: int = 1,
    after_step: Callable[[int], None] | None = None,
    after_backward: Callable[[int], None] | None = None,
    tensorboard_dir: Path | None = None,
) -> int:
    """Train ``run`` per ``cfg`` (its ``optim`` and intervals), resuming from the newest checkpoint in ``out_dir``
    if it belongs to the run ``record`` describes (``train.run_folder``; ``extend``: or differs from it only in its
    length); returns 0 when done or REQUEUE_EXIT_CODE after a stop signal (``run.step``: the steps done).
    ``after_backward(step)``: called once a step's gradients are complete (reduced across ranks), before clipping;
    ``after_step(steps done)``: after the optimizer step. Both must leave the run's state alone."""
    s = Schedule.of(cfg)
    is_main = rank == 0
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)

    # -- resume from the newest checkpoint if it is this run's (another run's is moved aside) -----------
    resumed_from = own_checkpoint(out_dir, record, run.command, extend=extend, rank=rank, world=world)
    stops_before = stops_without_progress(out_dir)
    if resumed_from is not None:
        ckpt = load_checkpoint(resumed_from)
        run.restore(ckpt)
        run.step = ckpt.step
        if is_main:
            print(f"pmlm {run.command}: resuming from {resumed_from} (step {ckpt.step})", file=sys.stderr)
    step = started = run.step
    log = progress = None
    if is_main:
        log = MetricsLog(out_dir / METRICS_CSV, run.csv_fields, step, tensorboard_dir)
        # a line per tenth of the run (and per minute) in the rule's log
        progress = Progress(
            f"pmlm {run.command}", s.total_steps, unit="steps", start=step, rates=(run.counted,), each_tenth=True
        )

    def save(at_step: int) -> None:
        _save(run, at_step, out_dir, cfg, record, device, rank, world)

    def stopped() -> int:
        """A stop signal at a step boundary: exit for a requeue, unless stops keep ending without progress."""
        return stop_exit(out_dir, run.command, stop.received, started, step, stops_before, announce=is_main)

    try:
        # a stop signal during start-up: nothing new to save (it counts as a stop without progress)
        if step < s.total_steps and agree(stop.received is not None, device, world):
            return stopped()
        if is_main and resumed_from is not None:  # start-up is over: a stop signal from here on follows a step
            print(f"pmlm {run.command}: resumed; training from step {step} of {s.total_steps}", file=sys.stderr)

        # -- the loop ----------------------------------------------------------------------------------
        saved_step = step if resumed_from is not None else None
        valid_step = None
        lrs = run.learning_rates(step)
        norms = NormWatch(run, device, out_dir)  # gradient norms since the last metrics row; divergence
        run.module.train()
        while step < s.total_steps and not run.stop_early():
            lrs = run.learning_rates(step)
            run.optimizer.zero_grad(set_to_none=True)
            run.begin_step(step)
            for micro in range(run.accumulation):
                # gradients are reduced across ranks once per optimizer step, on the last micro-batch
                with run.gradient_sync(micro == run.accumulation - 1):
                    loss = run.micro_batch_loss(step, micro)
                    loss.backward()
            if after_backward is not None:
                after_backward(step)
            grad_norm = nn.utils.clip_grad_norm_(run.parameters(), s.clip_norm or math.inf)  # inf: measure only
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()  # a sharded (DTensor) norm -> the global value
            # under DDP / FSDP the norm is taken after the gradient all-reduce: every rank reaches the same verdict
            norms.observe(grad_norm, step, loss)
            run.optimizer.step()
            step = run.step = step + 1
            if after_step is not None:
                after_step(step)
            if progress is not None:  # loss: mean since the last metrics row, read only when a line is due
                progress.update(step, loss=run.mean_loss, **lrs, **{run.counted: run.seen()})

            if step % s.log_every == 0 or step == s.total_steps:
                run.log_train(log, step, lrs, norms.mean())
            if run.validates and s.eval_every and step % s.eval_every == 0:
                run.validate(log, step, lrs)
                valid_step = step
                run.module.train()

            stopping = agree(stop.received is not None, device, world)
            if (s.save_every and step % s.save_every == 0) or stopping:
                norms.check()  # never save past a diverged step
                save(step)
                saved_step = step
            if stopping:
                return stopped()

        # -- finish: checkpoint, final validation ----------------------------------------------------------
        if is_main and step < s.total_steps:
            print(f"pmlm {run.command}: stopped early at step {step} of {s.total_steps}", file=sys.stderr)
        norms.check()
        if saved_step != step:
            save(step)
        if run.validates and valid_step != step:
            run.validate(log, step, lrs)
        if is_main:
            finished(out_dir)
        return 0
    finally:
        for part in (progress, log):
            if part is not None:
                part.close()


class NormWatch:
    """The steps' gradient norms and the divergence verdict. With a fused optimizer on CUDA both stay on the device
    and are read only when a metrics row is written or a checkpoint saved: meanwhile the optimizer skips a non-finite
    step itself (its ``found_inf``), so the GPU never waits for the verdict. Elsewhere a step is checked at once
    (reading a CPU tensor costs nothing)."""

    def __init__(self, run: TrainingRun, device: torch.device, out_dir: Path):
        self.run, self.out_dir = run, out_dir
        self.deferred = device.type == "cuda" and bool(run.optimizer.defaults.get("fused"))
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        self.count = 0
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)  # the first non-finite step, 0-based

    def observe(self, grad_norm: torch.Tensor, step: int, loss: torch.Tensor) -> None:
        """Step ``step``'s norm, before its optimizer step."""
        bad = ~torch.isfinite(grad_norm)
        if self.deferred:
            self.run.optimizer.found_inf = bad.float()  # the fused kernels leave weights and state alone where set
            self.first_bad = torch.where(bad & (self.first_bad < 0), step, self.first_bad)
        else:
            stop_if_diverged(not bool(bad) and self.run.finite(), step, loss.detach(), self.out_dir)
        self.total += torch.where(bad, 0.0, grad_norm.double())
        self.count += 1

    def check(self) -> None:
        """Stop as diverged if a step since the start was not finite (deferred: read now)."""
        if self.deferred:
            first = int(self.first_bad)
            stop_if_diverged(
                first < 0 and self.run.finite(), first if first >= 0 else self.run.step - 1, None, self.out_dir
            )

    def mean(self) -> float:
        """The mean norm since the last call, after ``check``."""
        self.check()
        mean = float(self.total) / max(self.count, 1)
        self.total.zero_()
        self.count = 0
        return mean


def _save(run: TrainingRun, step: int, out_dir: Path, cfg, record: dict, device, rank: int, world: int) -> None:
    """Checkpoint ``step``: every rank contributes its state, rank 0 writes the folder (with the run's record).
    Weights that are no longer finite are never saved: the run stops as diverged instead."""
    local = (p.to_local() if hasattr(p, "to_local") else p for p in run.parameters())  # this rank's shards
    if agree(not all(bool(torch.isfinite(p).all()) for p in local), device, world):
        raise weights_diverged(step, out_dir)
    saved = run.state(step)
    if rank == 0:
        weights, state = saved
        save_checkpoint(out_dir, step, weights, state, cfg.to_dict(), cfg.keep_last_checkpoints, run_record=record)
    if world > 1:
        dist.barrier()
