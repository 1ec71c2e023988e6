"""The fine-tuning loop: one function from a pre-trained encoder and a task file to the final head weights.

Single process (CPU or one GPU). Resumes from the newest complete checkpoint in ``out_dir``
by itself; on SIGTERM / SIGUSR1 it saves at the next step boundary and exits with
``REQUEUE_EXIT_CODE``. Checkpoints hold the trained weights only (the head, plus the encoder
under full fine-tuning), the optimizer, the RNG states and the loader position.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pmlm.artefacts import write_head
from pmlm.config.finetuning import FinetuneConfig
from pmlm.errors import ConfigError
from pmlm.finetune.data import IGNORE_LABEL, Batch, TaskData, TaskLoader, contact_rate, read_task_data
from pmlm.finetune.head_scoring import HEADLINE, score_task
from pmlm.model.task_heads import TaskModel, build_head, resolve_features, set_contact_prior
from pmlm.pretrained import load_encoder, pick_device
from pmlm.progress import Progress
from pmlm.train.checkpoint import (
    capture_rng,
    gather_states,
    latest_checkpoint,
    load_checkpoint,
    load_states,
    restore_rng,
    save_checkpoint,
)
from pmlm.train.runtime import (
    METRICS_CSV,
    MetricsLog,
    StopSignals,
    autocast_factory,
    check_compatible,
    requeue_exit,
    stop_if_diverged,
)
from pmlm.utils import file_digest, versions

PRIOR_PROTEINS = 256  # training proteins whose contact rate initialises a contact head's output bias
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

    after_step: Callable[[int, TaskModel], None] | None = None  # after each optimizer step: (steps done, model)


def task_loss(task: str, logits: torch.Tensor, batch: Batch, min_separation: int) -> tuple[torch.Tensor, int]:
    """Mean loss of one batch and the number of terms it averages.

    contact: BCE over valid pairs i < j with j - i >= min_separation; ss3: CE per labelled
    residue; remote homology: CE per protein. An empty selection gives 0 (no NaN).
    """
    logits = logits.float()
    if task == "contact":
        L = logits.shape[-1]
        idx = torch.arange(L, device=logits.device)
        far = (idx[None, :] - idx[:, None]) >= min_separation  # (L, L) upper triangle, |i - j| >= s
        scored = batch.valid & far  # (B, L, L)
        n = int(scored.sum())
        loss = F.binary_cross_entropy_with_logits(logits[scored], batch.targets[scored].float(), reduction="sum")
        return loss / max(n, 1), n
    if task == "ss3":
        n = int(batch.targets.ne(IGNORE_LABEL).sum())
        loss = F.cross_entropy(
            logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE_LABEL, reduction="sum"
        )
        return loss / max(n, 1), n
    return F.cross_entropy(logits, batch.targets), batch.targets.numel()


def finetune(
    cfg: FinetuneConfig,
    encoder_path: str | Path,
    train_path: str | Path,
    out_dir: str | Path,
    final_path: str | Path | None = None,
    valid_path: str | Path | None = None,
    hooks: FinetuneHooks | None = None,
) -> int:
    """Fine-tune per ``cfg``; returns 0 when done or REQUEUE_EXIT_CODE after a stop signal."""
    hooks = hooks or FinetuneHooks()
    out_dir = Path(out_dir)
    device = pick_device(cfg.device, option="device:")
    stop = StopSignals().install()
    log = progress = None
    try:
        autocast = autocast_factory(device, cfg.bf16)

        # -- data ------------------------------------------------------------------------------------
        d = cfg.data
        train_data, valid_data = _read_data(cfg, train_path, valid_path)

        # -- model: the pre-trained encoder plus a freshly initialised head ---------------------------
        encoder, encoder_info, _ = load_encoder(encoder_path)
        encoder_sha = file_digest(encoder_path)
        cfg, model, window, crop = _task_model(cfg, encoder, train_data)
        trainable = model.to(device).trainable()
        loader = TaskLoader(train_data.examples, cfg.task, d.batch_size, crop, cfg.seed, d.contact_threshold)
        optimizer, groups = _adamw(trainable, cfg, device)
        trained_params = [p for g in groups for p in g["params"]]

        # -- resume from the newest complete checkpoint, if any ---------------------------------------
        resumed_from = latest_checkpoint(out_dir)
        step = (
            0 if resumed_from is None else _resume(resumed_from, cfg, encoder_sha, trainable, optimizer, groups, loader)
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        log = MetricsLog(out_dir / METRICS_CSV, CSV_FIELDS, step)
        progress = Progress(
            "pmlm finetune", cfg.optim.total_steps, unit="steps", start=step, rates=("proteins",), each_tenth=True
        )
        seen = 0

        def save(at_step: int) -> None:
            weights, optim_state = gather_states(None, trainable, optimizer)
            state = {
                "step": at_step,
                "optimizer": optim_state,
                "rng": capture_rng(),
                "loader": loader.state_dict(),
                "encoder_sha256": encoder_sha,
            }
            save_checkpoint(out_dir, at_step, weights, state, cfg.to_dict(), cfg.keep_last_checkpoints)

        def validate() -> dict:
            metrics, n_long = score_task(
                model,
                valid_data,
                batch_size=d.batch_size,
                window=window,
                too_long="crop",
                threshold=d.contact_threshold,
                device=device,
                autocast=autocast,
            )
            name = HEADLINE[cfg.task]
            log.write(
                {
                    "split": "valid",
                    "step": step,
                    "epoch": loader.epoch,
                    "metric": name,
                    "value": metrics[name][0],
                    "proteins": len(valid_data.examples),
                }
            )
            return {"step": step, **{k: v for k, (v, _) in metrics.items()}, "n_too_long": n_long}

        # -- the loop ----------------------------------------------------------------------------------
        o = cfg.optim
        saved_step = step if resumed_from is not None else None
        valid_scores = None
        window_sums = {"loss": 0.0, "batches": 0, "proteins": 0}
        norms: list[float] = []
        model.train()
        while step < o.total_steps:
            scale = o.scale_at(step)
            for group in optimizer.param_groups:
                group["lr"] = group["peak_lr"] * scale
            optimizer.zero_grad(set_to_none=True)
            for _ in range(cfg.grad_accum):
                batch = loader.next_batch().to(device)
                with autocast():
                    logits = model(batch.tokens, batch.mask)
                loss, _ = task_loss(cfg.task, logits, batch, d.min_separation)
                (loss / cfg.grad_accum).backward()
                window_sums["loss"] += float(loss.detach())
                window_sums["batches"] += 1
                window_sums["proteins"] += len(batch.ids)
                seen += len(batch.ids)
            grad_norm = nn.utils.clip_grad_norm_(trained_params, o.clip_norm or math.inf)  # inf: measure only
            finite = bool(torch.isfinite(grad_norm)) and math.isfinite(window_sums["loss"])
            stop_if_diverged(finite, step, loss.detach(), out_dir)
            optimizer.step()
            step += 1
            norms.append(float(grad_norm))
            if hooks.after_step:
                hooks.after_step(step, model)
            progress.update(
                step,
                loss=window_sums["loss"] / window_sums["batches"],
                lr=o.lr * scale,
                head_lr=o.head_lr * scale,
                proteins=seen,
            )

            if step % cfg.log_every == 0 or step == o.total_steps:
                log.write(
                    {
                        "split": "train",
                        "step": step,
                        "epoch": loader.epoch,
                        "lr": o.lr * scale,
                        "head_lr": o.head_lr * scale,
                        "loss": window_sums["loss"] / window_sums["batches"],
                        "grad_norm": sum(norms) / len(norms),
                        "proteins": window_sums["proteins"],
                    }
                )
                window_sums = {"loss": 0.0, "batches": 0, "proteins": 0}
                norms.clear()
            if valid_data is not None and cfg.eval_every and step % cfg.eval_every == 0:
                valid_scores = validate()
                model.train()

            stopping = stop.received is not None
            if (cfg.save_every and step % cfg.save_every == 0) or stopping:
                save(step)
                saved_step = step
            if stopping:
                return requeue_exit("finetune", stop.received, step)

        # -- finish: checkpoint, final validation, the declared head artefact -------------------------
        if saved_step != step:
            save(step)
        if valid_data is not None and (valid_scores is None or valid_scores["step"] != step):
            valid_scores = validate()
        if final_path is not None:
            info = _head_info(
                cfg, step, encoder_sha, encoder_info, train_data, train_path, valid_path, valid_data, valid_scores
            )
            write_head(final_path, trainable.state_dict(), info, encoder_path)
        return 0
    finally:
        stop.restore()
        for part in (progress, log):
            if part is not None:
                part.close()


def _read_data(cfg: FinetuneConfig, train_path, valid_path) -> tuple[TaskData, TaskData | None]:
    """The training set (at most ``data.max_proteins``) and the optional validation set; skips announced."""
    d = cfg.data
    read = {
        "fmt": d.format,
        "contact_atom": d.contact_atom,
        "threshold": d.contact_threshold,
        "on_error": d.on_error,
        "num_classes": cfg.num_classes,
    }
    train_data = read_task_data(train_path, cfg.task, limit=d.max_proteins, **read)
    valid_data = read_task_data(valid_path, cfg.task, **read) if valid_path else None
    for data in filter(None, (train_data, valid_data)):
        if data.counts.n_skipped:
            print(
                f"pmlm finetune: {data.path}: skipped {data.counts.n_skipped} bad records "
                f"{dict(data.counts.skipped)}; first: {data.counts.first_skip}",
                file=sys.stderr,
            )
    return train_data, valid_data


def _task_model(cfg: FinetuneConfig, encoder, train_data: TaskData) -> tuple[FinetuneConfig, TaskModel, int, int]:
    """(cfg with the features resolved, the encoder plus a fresh head, the encoder's window, the crop)."""
    d = cfg.data
    features = resolve_features(cfg.head.features, cfg.task, encoder)
    cfg = dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, features=features))
    window = encoder.cfg.max_len - 2  # residues the encoder takes (max_len counts <cls> and <eos>)
    crop = d.crop or window
    if crop > window:
        raise ConfigError(
            f"data.crop must be <= the encoder's window of {window} residues (max_len "
            f"{encoder.cfg.max_len} minus <cls> and <eos>), got {crop}"
        )
    torch.manual_seed(cfg.seed)
    head = build_head(cfg, encoder.cfg.hidden)
    if cfg.task == "contact":
        rate = contact_rate(train_data.examples, d.contact_threshold, d.min_separation, PRIOR_PROTEINS)
        if rate is not None and 0.0 < rate < 1.0:
            set_contact_prior(head, rate)
    return cfg, TaskModel(encoder, head, cfg.task, features, cfg.freeze_encoder), window, crop


def _adamw(trainable: nn.ModuleDict, cfg: FinetuneConfig, device) -> tuple[torch.optim.AdamW, list[dict]]:
    """AdamW, head and encoder at their own peak rates (``peak_lr`` per group), decay on matrices only."""
    o = cfg.optim
    groups = []
    for part, peak in (("head", o.head_lr), ("encoder", o.lr)):
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


def _resume(path: Path, cfg: FinetuneConfig, encoder_sha: str, trainable, optimizer, groups, loader) -> int:
    """Load a checkpoint into the run's state; returns its step."""
    ckpt = load_checkpoint(path)
    check_compatible(ckpt.config, cfg.to_dict(), ("task", "freeze_encoder", "head"), path, "finetune")
    saved_sha = ckpt.state.get("encoder_sha256")
    if saved_sha != encoder_sha:
        raise ConfigError(
            f"{path}: written while fine-tuning a different encoder (sha256 {str(saved_sha)[:12]}...); "
            "use a new --out folder"
        )
    load_states(None, trainable, optimizer, ckpt.model, ckpt.state["optimizer"])
    # the saved groups carry the old hyper-parameters; the current config's are the ones announced
    o = cfg.optim
    for group, fresh in zip(optimizer.param_groups, groups):
        group.update(peak_lr=fresh["peak_lr"], weight_decay=fresh["weight_decay"], betas=o.betas, eps=o.eps)
    restore_rng(ckpt.state["rng"])
    loader.load_state_dict(ckpt.state["loader"])
    print(f"pmlm finetune: resuming from {path} (step {ckpt.step})", file=sys.stderr)
    return ckpt.step


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
) -> dict:
    """The head sidecar's description of this run (the encoder's path is added by ``write_head``)."""
    return {
        "config": cfg.to_dict(),
        "task": cfg.task,
        "head": cfg.head.kind,
        "features": cfg.head.features,
        "encoder_trained": not cfg.freeze_encoder,
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
        "versions": versions(),
    }
