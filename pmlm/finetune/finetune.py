"""Fine-tuning: a pre-trained encoder and a task file to the final head weights; the loop itself is the engine's
(``train.engine``), handed this module's ``FinetuneRun``.

Single process (CPU or one GPU). Resumes from the newest complete checkpoint in ``out_dir``
by itself; on SIGTERM / SIGUSR1 it saves at the next step boundary and exits with
``REQUEUE_EXIT_CODE``. Checkpoints hold the trained weights only (the head, plus the encoder
under full fine-tuning or its adapters under ``adapter``, ``pmlm.adapters``), the optimizer, the RNG states, the
loader position and the best validation so far (``finetune.selection``): the head file written at the end holds the
best validation's weights, or the last step's without a validation set.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pmlm.adapters import adapter_parameters, attach, resolve_targets
from pmlm.artefacts import write_head
from pmlm.config.finetuning import NOT_IN_FINGERPRINT, FinetuneConfig
from pmlm.errors import ConfigError
from pmlm.files import file_digest, run_record
from pmlm.finetune.data import Batch, TaskLoader
from pmlm.finetune.head_scoring import score_task
from pmlm.finetune.selection import Selection
from pmlm.model.task_heads import TaskModel, resolve_features
from pmlm.pretrained import load_encoder, pick_device
from pmlm.tasks.registry import read_task_data
from pmlm.tasks.task import Task, TaskData
from pmlm.tokens import max_residues
from pmlm.train.checkpoint import Checkpoint, capture_rng, gather_states, load_states, restore_rng
from pmlm.train.engine import TrainingRun, fit
from pmlm.train.run_folder import content_digest, publish_metrics
from pmlm.train.runtime import StopSignals
from pmlm.train.runtime import autocast as precision_context
from pmlm.version import versions

CSV_FIELDS = (
    "split",
    "step",
    "epoch",
    "lr",
    "head_lr",
    "loss",
    "metric",
    "value",
    "grad_norm",
    "proteins",
    "elapsed_s",
)


@dataclass
class FinetuneHooks:
    """Optional callbacks, for tests and monitoring; they must not change the run's state."""

    after_backward: Callable[[int, TaskModel], None] | None = None  # a step's gradients, complete: (step, model)
    after_step: Callable[[int, TaskModel], None] | None = None  # after each optimizer step: (steps done, model)


@dataclass(eq=False)
class FinetuneRun(TrainingRun):
    """What fine-tuning hands the engine: task batches, the task's loss, the trained weights' state."""

    cfg: FinetuneConfig
    task: Task
    module: TaskModel
    trainable: nn.ModuleDict  # the head, plus the encoder under full fine-tuning
    optimizer: torch.optim.AdamW
    groups: list[dict]  # the optimizer's groups as built, with their peak rates
    loader: TaskLoader
    valid_data: TaskData | None
    encoder_window: int  # residues the encoder takes
    device: torch.device
    autocast: Callable
    sums: dict = field(default_factory=lambda: {"loss": 0.0, "steps": 0, "proteins": 0})  # since the last row
    proteins: int = 0
    batches: list[Batch] = field(default_factory=list)  # the current step's micro-batches
    terms: int = 0  # the terms their loss sums over, its divisor
    valid_scores: dict | None = None  # of the last validation
    selection: Selection | None = None  # the best validation so far
    command, counted, csv_fields = "finetune", "proteins", CSV_FIELDS

    def __post_init__(self) -> None:
        self.accumulation = self.cfg.grad_accum
        self.selection = Selection(self.task.headline, self.cfg.patience)

    @property
    def validates(self) -> bool:
        return self.valid_data is not None

    def parameters(self):
        return [p for g in self.groups for p in g["params"]]

    def learning_rates(self, step: int) -> dict[str, float]:
        o = self.cfg.optim
        scale = o.scale_at(step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["peak_lr"] * scale
        return {"lr": o.lr * scale, "head_lr": o.head_lr * scale}

    def begin_step(self, step: int) -> None:
        self.batches = [self.loader.next_batch().to(self.device) for _ in range(self.accumulation)]
        # the step's loss is the mean over all its terms, whichever micro-batch holds them
        self.terms = sum(self.task.terms(b) for b in self.batches)
        self.sums["steps"] += 1

    def micro_batch_loss(self, step: int, micro: int) -> torch.Tensor:
        batch = self.batches[micro]
        with self.autocast():
            logits = self.module(batch.tokens, batch.mask)
        loss = self.task.loss(logits, batch, self.module.head) / max(self.terms, 1)
        self.sums["loss"] += float(loss.detach())
        self.sums["proteins"] += len(batch.ids)
        self.proteins += len(batch.ids)
        return loss

    def finite(self) -> bool:
        return math.isfinite(self.sums["loss"])

    def mean_loss(self) -> float | None:
        return self.sums["loss"] / self.sums["steps"] if self.sums["steps"] else None

    def seen(self) -> int:
        return self.proteins

    def log_train(self, log, step: int, lrs: dict[str, float], grad_norm: float) -> None:
        row = {"split": "train", "step": step, "epoch": self.loader.epoch, **lrs}
        log.write({**row, "loss": self.mean_loss(), "grad_norm": grad_norm, "proteins": self.sums["proteins"]})
        self.sums = {"loss": 0.0, "steps": 0, "proteins": 0}

    def validate(self, log, step: int, lrs: dict[str, float]) -> None:
        metrics, n_long = score_task(
            self.module,
            self.valid_data,
            batch_size=self.cfg.data.batch_size,
            window=self.encoder_window,
            too_long="crop",
            device=self.device,
            autocast=self.autocast,
        )
        name = self.task.headline
        proteins = len(self.valid_data.examples)
        row = {"split": "valid", "step": step, "epoch": self.loader.epoch, "metric": name, "value": metrics[name][0]}
        log.write({**row, "proteins": proteins})
        self.valid_scores = {"step": step, **{k: v for k, (v, _) in metrics.items()}, "n_too_long": n_long}
        if self.selection.observe(step, self.valid_scores, self.trainable.state_dict()):
            print(f"pmlm finetune: step {step}: best validation so far, {name} {metrics[name][0]:.4f}", file=sys.stderr)

    def stop_early(self) -> bool:
        return self.selection.exhausted

    def kept(self) -> dict:
        """The weights the run's head file holds: the best validation's, else (no validation) the last step's."""
        return self.selection.weights if self.selection.weights is not None else self.trainable.state_dict()

    def state(self, step: int) -> tuple[dict, dict]:
        weights, optim_state = gather_states(None, self.trainable, self.optimizer)
        state = {
            "step": step,
            "optimizer": optim_state,
            "rng": capture_rng(),
            "loader": self.loader.state_dict(),
            "selection": self.selection.state_dict(),
        }
        return weights, state

    def restore(self, ckpt: Checkpoint) -> None:
        load_states(None, self.trainable, self.optimizer, ckpt.model, ckpt.state["optimizer"])
        restore_rng(ckpt.state["rng"])
        self.loader.load_state_dict(ckpt.state["loader"])
        self.selection.load_state_dict(ckpt.state.get("selection"))


def finetune(
    cfg: FinetuneConfig,
    encoder_path: str | Path,
    train_path: str | Path,
    out_dir: str | Path,
    final_path: str | Path | None = None,
    valid_path: str | Path | None = None,
    hooks: FinetuneHooks | None = None,
    extend: bool = False,
    metrics_path: str | Path | None = None,
) -> int:
    """Fine-tune per ``cfg``; returns 0 when done or REQUEUE_EXIT_CODE after a stop signal. ``extend``: continue
    the run's checkpoint under a changed ``optim.total_steps`` (``train.run_folder``); ``metrics_path``: where the
    finished run's metrics log is copied (``train.run_folder.publish_metrics``)."""
    hooks = hooks or FinetuneHooks()
    out_dir = Path(out_dir)
    device = pick_device(cfg.device, option="device:")
    stop = StopSignals().install()
    try:
        arithmetic = cfg.precision.on(device.type)
        autocast = precision_context(arithmetic, device)

        # -- the encoder, with its adapters' targets checked before the data are read ----------------------
        d = cfg.data
        task = cfg.configured_task()
        encoder, encoder_info, _ = load_encoder(encoder_path)
        encoder_sha = file_digest(encoder_path)
        if cfg.adapter is not None:
            targets = resolve_targets(cfg.adapter, encoder)
            cfg = dataclasses.replace(cfg, adapter=dataclasses.replace(cfg.adapter, targets=targets))

        # -- data ------------------------------------------------------------------------------------
        cfg, train_data, valid_data = _read_data(cfg, task, train_path, valid_path)

        # -- model: the pre-trained encoder plus a freshly initialised head (and adapters); AdamW -------
        cfg, model, window, crop = _task_model(cfg, task, encoder, train_data)
        trainable = model.to(device).trainable()
        loader = TaskLoader(train_data.examples, task, d.batch_size, crop, cfg.seed)
        optimizer, groups = _adamw(trainable, cfg, device)
        # what determines the result: the settings (features resolved), the encoder, the data, the precision
        data = {"train": content_digest(train_path), "valid": content_digest(valid_path) if valid_path else None}
        record = run_record(cfg.to_dict(), NOT_IN_FINGERPRINT, encoder=encoder_sha, **data, precision=arithmetic)

        # -- the loop: the engine's, from the newest checkpoint if any ---------------------------------
        run = FinetuneRun(cfg, task, model, trainable, optimizer, groups, loader, valid_data, window, device, autocast)
        after_step = (lambda step: hooks.after_step(step, model)) if hooks.after_step else None
        after_backward = (lambda step: hooks.after_backward(step, model)) if hooks.after_backward else None
        code = fit(
            run, cfg, out_dir, device, stop, record=record, extend=extend, after_step=after_step,
            after_backward=after_backward,
        )  # fmt: skip
        if code != 0:
            return code

        # -- finish: the declared head artefact -----------------------------------------------------------
        selected = run.selection.record(run.step)
        if final_path is not None:
            info = _head_info(
                cfg,
                selected["step"] if selected else run.step,  # the step whose weights the file holds
                encoder_sha,
                encoder_info,
                train_data,
                train_path,
                valid_path,
                valid_data,
                run.selection.scores,
                arithmetic,
            )
            info["selected"] = selected
            info["last_step"] = run.step
            if model.adapter is not None:
                info["adapter"] = {**cfg.to_dict()["adapter"], "parameters": adapter_parameters(model.adapter)}
            write_head(final_path, run.kept(), info, encoder_path)
        if metrics_path is not None:
            publish_metrics(out_dir, metrics_path)
        if selected is not None:  # the best of the engine's validations (FinetuneRun.validate)
            print(
                f"pmlm finetune: kept the weights of step {selected['step']} of {run.step}, the best of "
                f"{selected['validations']} validations by {selected['metric']}",
                file=sys.stderr,
            )
            print(validation_summary(task, run.selection.scores, valid_path, len(valid_data.examples)), file=sys.stderr)
        return 0
    finally:
        stop.restore()


# a task with more metrics than this (contacts: P@L, L/2, L/5 by range) has only its headline in the summary line
SUMMARY_METRICS = 4


def validation_summary(task: Task, scores: dict, valid_path, proteins: int) -> str:
    """The one stderr line of a finished run's final validation: the step, the validation file, and the task's
    metrics (headline first; the headline alone for a task with more than SUMMARY_METRICS), e.g. ``pmlm finetune:
    validation at step 100 (valid.parquet, 36 proteins): spearman 0.912, pearson 0.905, mse 0.013``."""
    names = [task.headline]
    if len(task.metric_names) <= SUMMARY_METRICS:
        names += [n for n in task.metric_names if n != task.headline]

    def value(name: str) -> str:
        v = scores.get(name)
        return "n/a" if v is None else f"{v:.3f}"

    metrics = ", ".join(f"{n} {value(n)}" for n in names)
    return f"pmlm finetune: validation at step {scores['step']} ({valid_path}, {proteins} proteins): {metrics}"


def _read_data(
    cfg: FinetuneConfig, task: Task, train_path, valid_path
) -> tuple[FinetuneConfig, TaskData, TaskData | None]:
    """(cfg with what the training set decides, e.g. a user's classes; the training set, at most
    ``data.max_proteins``; the optional validation set, read with the same classes); skips announced."""
    train_data = read_task_data(train_path, task, cfg.read_options(limit=cfg.data.max_proteins))
    cfg = task.resolve(cfg, train_data)
    valid_data = read_task_data(valid_path, task, cfg.read_options()) if valid_path else None
    for data in filter(None, (train_data, valid_data)):
        if data.counts.n_skipped:
            print(
                f"pmlm finetune: {data.path}: skipped {data.counts.n_skipped} bad records "
                f"{dict(data.counts.skipped)}; first: {data.counts.first_skip}",
                file=sys.stderr,
            )
    return cfg, train_data, valid_data


def _task_model(
    cfg: FinetuneConfig, task: Task, encoder, train_data: TaskData
) -> tuple[FinetuneConfig, TaskModel, int, int]:
    """(cfg with the features resolved, the encoder plus a fresh head, the encoder's window, the crop)."""
    d = cfg.data
    features = resolve_features(cfg.head.features, task.reads_pairs, encoder)
    cfg = dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, features=features))
    window = max_residues(encoder.cfg.max_len)  # residues the encoder takes
    crop = d.crop or window
    if crop > window:
        raise ConfigError(
            f"data.crop must be <= the encoder's window of {window} residues (max_len "
            f"{encoder.cfg.max_len} minus <cls> and <eos>), got {crop}"
        )
    torch.manual_seed(cfg.seed)
    head = task.build_head(cfg, encoder.cfg.hidden)
    task.prepare_head(head, train_data)
    adapter = attach(encoder, cfg.adapter) if cfg.adapter is not None else None  # peft's A: Kaiming from this seed
    return cfg, TaskModel(encoder, head, cfg.task, features, cfg.freeze_encoder, adapter), window, crop


def _adamw(trainable: nn.ModuleDict, cfg: FinetuneConfig, device) -> tuple[torch.optim.AdamW, list[dict]]:
    """AdamW, head and encoder at their own peak rates (``peak_lr`` per group), decay on matrices only."""
    o = cfg.optim
    groups = []
    for part, peak in (("head", o.head_lr), ("encoder", o.lr), ("adapter", o.lr)):
        if part not in trainable:
            continue
        named = [(n, p) for n, p in trainable[part].named_parameters() if p.requires_grad]
        for decay in (True, False):
            params = [p for _, p in named if (p.dim() >= 2) == decay]
            if params:
                groups.append(
                    {"params": params, "weight_decay": o.weight_decay if decay else 0.0, "peak_lr": peak, "part": part}
                )
    optimizer = torch.optim.AdamW(groups, lr=o.head_lr, betas=o.betas, eps=o.eps, fused=device.type == "cuda")
    return optimizer, groups


def _head_info(
    cfg: FinetuneConfig,
    step: int,
    encoder_sha: str,
    encoder_info: dict,
    train_data: TaskData,
    train_path,
    valid_path,
    valid_data: TaskData | None,
    valid_scores: dict | None,
    trained_in: str,
) -> dict:
    """The head sidecar's description of this run (the encoder's path is added by ``write_head``); ``trained_in``,
    the precision its forward passes used, is the one evaluation reads it in (``pmlm.artefacts.recorded_precision``)."""
    return {
        "config": cfg.to_dict(),
        "task": cfg.task,
        "head": cfg.head.kind,
        "features": cfg.head.features,
        "encoder_trained": not cfg.freeze_encoder and cfg.adapter is None,
        "step": step,
        "encoder": {"sha256": encoder_sha, "objective": encoder_info.get("objective", {}).get("name")},
        "train": {
            "path": str(train_path),
            "format": train_data.format,
            "proteins": len(train_data.examples),
            "contact_atom": train_data.contact_atom,
            "read": train_data.counts.as_dict(),
        },
        "valid": None if valid_data is None else {"path": str(valid_path), "scores": valid_scores},
        "precision": trained_in,
        "versions": versions(),
    }
