"""The pre-training loop: one function from process-group set-up to the final weights.

Runs as a single process or under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK from the
environment; gloo on CPU, NCCL on CUDA). Resumes from the newest complete checkpoint in
``out_dir`` by itself, and on SIGTERM / SIGUSR1 saves at the next step boundary and exits
with ``REQUEUE_EXIT_CODE`` so a scheduler can requeue the job.
"""

from __future__ import annotations

import csv
import dataclasses
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from pmlm.errors import ConfigError, PmlmError
from pmlm.model.objectives import build_model, pretraining_losses
from pmlm.progress import Progress
from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.checkpoint import (
    capture_rng,
    gather_states,
    latest_checkpoint,
    load_checkpoint,
    load_states,
    restore_rng,
    save_checkpoint,
    save_weights,
)
from pmlm.train.config import TrainConfig
from pmlm.train.loader import Batch, ShardStream
from pmlm.utils import atomic_output, versions

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
METRICS_CSV = "metrics.csv"
SCORES_JSON = "final_scores.json"
CSV_FIELDS = ("split", "step", "epoch", "lr", "loss", "l_mlm", "l_pmlm", "acc_mlm", "acc_pmlm", "dacc",
              "grad_norm", "residues", "residues_per_s", "elapsed_s")
# running sums behind the logged metrics; summed over micro-batches and then over ranks
SUMS = ("loss", "l_mlm_x_n", "mlm_correct", "mlm_total", "l_pmlm_x_n", "pair_correct", "pair_total",
        "residues", "batches")
# the only buffer (sinusoidal positions) is identical everywhere, so no per-forward broadcast
# (the keyword was renamed in torch 2.13)
_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)
# independent random streams derived from (seed, rank, stream)
_DROPOUT_STREAM, _MASK_STREAM, _VALID_STREAM = 0, 1, 2


class TrainingDiverged(PmlmError):
    """The loss or gradient became NaN / inf; the run stops without saving."""


@dataclass
class TrainHooks:
    """Optional callbacks, for tests and monitoring; they must not change the run's state."""

    on_batch: Callable[[int, Batch], None] | None = None  # every micro-batch on every rank: (step, batch)
    after_step: Callable[[int, nn.Module], None] | None = None  # after each optimizer step: (steps done, model)


class PretrainingObjective(nn.Module):
    """Model plus objective as one module, the unit that DDP / FSDP wrap (their hooks run in forward)."""

    def __init__(self, model: nn.Module, objective):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, tokens: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return pretraining_losses(self.model, tokens, self.objective, generator)


def train(
    cfg: TrainConfig,
    shards_dir: str | Path,
    out_dir: str | Path,
    final_path: str | Path | None = None,
    scores_path: str | Path | None = None,
    hooks: TrainHooks | None = None,
) -> int:
    """Pre-train per ``cfg``; returns 0 when done or REQUEUE_EXIT_CODE after a stop signal."""
    hooks = hooks or TrainHooks()
    out_dir = Path(out_dir)
    scores_path = Path(scores_path) if scores_path else out_dir / SCORES_JSON

    # -- init: processes, devices, precision, signals ------------------------------------------------
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(cfg.device, local_rank)
    # FSDP also runs at world size 1 under torchrun (MASTER_ADDR set), so its code path runs on one GPU
    distributed = world > 1 or (cfg.fsdp and "MASTER_ADDR" in os.environ)
    own_group = distributed and not dist.is_initialized()  # a caller's own process group is left alone
    if own_group:
        on_gpu = device.type == "cuda"
        dist.init_process_group("nccl" if on_gpu else "gloo", device_id=device if on_gpu else None)
    stop = {"signal": None}
    previous_handlers = install_stop_handlers(stop)
    train_stream = log = progress = None
    try:
        use_bf16 = device.type == "cuda" if cfg.bf16 == "auto" else cfg.bf16
        if use_bf16 and device.type != "cuda":
            raise ConfigError("bf16 autocast is supported on CUDA only; set bf16: false (or auto) for CPU runs")
        autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else nullcontext
        if device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        is_main = rank == 0
        if is_main:
            out_dir.mkdir(parents=True, exist_ok=True)

        # -- data ------------------------------------------------------------------------------------
        stream_args = dict(tokens_per_batch=cfg.data.tokens_per_batch, max_len=cfg.max_len,
                           buffer_rows=cfg.data.buffer_rows, pad_to_multiple=cfg.data.pad_to_multiple,
                           seed=cfg.seed, rank=rank, world_size=world)
        train_stream = ShardStream(shards_dir, "train", num_workers=cfg.data.num_workers, **stream_args)
        valid_stream = ShardStream(shards_dir, "valid", **stream_args)

        # -- model: identical initial weights on every rank, then DDP / FSDP ----------------------------
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model.build(), cfg.objective).to(device)
        model.encoder.attention = cfg.attention
        objective = PretrainingObjective(model, cfg.objective)
        decay = {name for name, p in objective.named_parameters() if p.dim() >= 2}  # matrices; not biases / norms
        use_fsdp = cfg.fsdp and distributed
        if use_fsdp:
            from torch.distributed.fsdp import fully_shard

            if rank == 0:
                print(f"pmlm pretrain: sharding parameters and optimizer state with FSDP over {world} rank(s)",
                      file=sys.stderr)
            # per-layer units bound the gathered memory to about one layer; the root holds embeddings and heads
            for layer in model.encoder.layers:
                fully_shard(layer)
            wrapped = fully_shard(objective)
        elif world > 1:
            wrapped = nn.parallel.DistributedDataParallel(
                objective, device_ids=[device.index] if device.type == "cuda" else None, **_NO_BUFFER_SYNC
            )
        else:
            wrapped = objective
        if cfg.compile:
            model.encoder.compile_layers()  # per layer: the objective's dynamic shapes stay out of the graphs
        forward = wrapped
        # plain module for validation: FSDP's own hooks gather the shards, DDP's hooks are not needed
        evaluate_with = objective

        # -- optimizer: AdamW, learning rate set by hand from the schedule every step -------------------
        named = [(_clean_name(n), p) for n, p in wrapped.named_parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            [{"params": [p for n, p in named if n in decay], "weight_decay": cfg.optim.weight_decay},
             {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}],
            lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps, fused=device.type == "cuda",
        )
        generator = torch.Generator(device).manual_seed(_derived_seed(cfg.seed, rank, _MASK_STREAM))
        torch.manual_seed(_derived_seed(cfg.seed, rank, _DROPOUT_STREAM))  # dropout differs across ranks

        # -- resume from the newest complete checkpoint, if any ---------------------------------------
        step = 0
        resumed_from = latest_checkpoint(out_dir)
        if resumed_from is not None:
            ckpt = load_checkpoint(resumed_from)
            _check_compatible(ckpt.config, cfg, resumed_from)
            load_states(wrapped if use_fsdp else None, model, optimizer, ckpt.model, ckpt.state["optimizer"])
            # the saved groups carry the old hyper-parameters; the current config's are the ones announced
            for group, decay_rate in zip(optimizer.param_groups, (cfg.optim.weight_decay, 0.0)):
                group.update(betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=decay_rate)
            ranks = ckpt.state["ranks"]
            if len(ranks) == world:
                restore_rng(ranks[rank]["rng"])
                generator.set_state(ranks[rank]["generator"])
            else:  # fresh per-rank streams: the old ones cannot be split or merged faithfully
                generator.manual_seed(_derived_seed(cfg.seed + ckpt.step, rank, _MASK_STREAM))
                torch.manual_seed(_derived_seed(cfg.seed + ckpt.step, rank, _DROPOUT_STREAM))
            train_stream.load_state_dict(ranks[rank % len(ranks)]["loader"])
            step = ckpt.step
            if is_main:
                print(f"pmlm pretrain: resuming from {resumed_from} (step {step})", file=sys.stderr)
            del ckpt

        log = _MetricsLog(out_dir, step, cfg.tensorboard) if is_main else None
        # a line per tenth of the run (and per minute) in the rule's log; rank 0's residues x ranks as tokens
        progress = Progress("pmlm pretrain", cfg.optim.total_steps, unit="steps", start=step, rates=("tokens",),
                            each_tenth=True) if is_main else None
        seen = 0

        def save(at_step: int) -> None:
            """Every rank contributes its state; rank 0 writes the folder."""
            model_state, optim_state = gather_states(wrapped if use_fsdp else None, model, optimizer)
            mine = {"rng": capture_rng(), "generator": generator.get_state(), "loader": train_stream.state_dict()}
            ranks = [None] * world
            if world > 1:
                dist.all_gather_object(ranks, mine)
            else:
                ranks = [mine]
            if is_main:
                state = {"step": at_step, "optimizer": optim_state, "scheduler": {"last_step": at_step},
                         "world_size": world, "ranks": ranks}
                save_checkpoint(out_dir, at_step, model_state, state, cfg.to_dict(), cfg.keep_last_checkpoints)
            if world > 1:
                dist.barrier()

        def validate() -> tuple[int, dict]:
            metrics = _evaluate(evaluate_with, valid_stream, cfg, device, autocast, rank, world)
            if log is not None:
                log.write("valid", step, train_stream.epoch, optim_lr, metrics)
            return step, metrics

        # -- the loop ----------------------------------------------------------------------------------
        saved_step = step if resumed_from is not None else None
        valid_step, valid_metrics = None, {}
        window = torch.zeros(len(SUMS), dtype=torch.float64, device=device)
        norms: list[float] = []
        window_start = time.perf_counter()
        optim_lr = cfg.optim.lr_at(step)
        wrapped.train()
        while step < cfg.optim.total_steps:
            optim_lr = cfg.optim.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = optim_lr
            optimizer.zero_grad(set_to_none=True)
            for micro in range(cfg.grad_accum):
                batch = train_stream.next_batch()
                if hooks.on_batch:
                    hooks.on_batch(step, batch)
                tokens = batch.tokens.to(device, non_blocking=True)  # (B, L)
                # gradients are reduced across ranks once per optimizer step, on the last micro-batch
                with _gradient_sync(wrapped, micro == cfg.grad_accum - 1, world, use_fsdp):
                    with autocast():
                        out = forward(tokens, generator)
                    (out["loss"] / cfg.grad_accum).backward()
                window += _sums(out, batch.residues, device)
                seen += batch.residues * world
            max_norm = cfg.optim.clip_norm or math.inf  # inf measures the norm without clipping
            grad_norm = nn.utils.clip_grad_norm_(objective.parameters(), max_norm)
            if use_fsdp:
                grad_norm = grad_norm.full_tensor()  # a sharded (DTensor) norm -> the global value
            # the norm is taken after the gradient all-reduce, so every rank reaches the same verdict
            if not torch.isfinite(grad_norm):
                last = latest_checkpoint(out_dir)
                raise TrainingDiverged(
                    f"non-finite loss or gradient at step {step + 1} (loss {float(out['loss'].detach()):.4g}); "
                    f"stopped without saving; last good checkpoint: {last or 'none'}"
                )
            optimizer.step()
            step += 1
            norms.append(float(grad_norm))
            if hooks.after_step:
                hooks.after_step(step, model)
            if progress is not None:  # loss: mean since the last metrics row, read only when a line is due
                progress.update(step, loss=lambda: float(window[0] / window[-1]), lr=optim_lr, tokens=seen)

            if step % cfg.log_every == 0 or step == cfg.optim.total_steps:
                if world > 1:
                    dist.all_reduce(window)
                if log is not None:
                    elapsed = time.perf_counter() - window_start
                    metrics = _summarise(window.tolist())
                    metrics["grad_norm"] = sum(norms) / len(norms)
                    metrics["residues_per_s"] = metrics["residues"] / max(elapsed, 1e-9)
                    log.write("train", step, train_stream.epoch, optim_lr, metrics)
                window.zero_()
                norms.clear()
                window_start = time.perf_counter()
            if cfg.eval_every and step % cfg.eval_every == 0:
                valid_step, valid_metrics = validate()
                wrapped.train()

            stopping = _agree(stop["signal"] is not None, device, world)
            if (cfg.save_every and step % cfg.save_every == 0) or stopping:
                save(step)
                saved_step = step
            if stopping:
                if is_main:
                    name = signal.Signals(stop["signal"]).name if stop["signal"] else "a stop signal on another rank"
                    print(f"pmlm pretrain: {name} received; saved checkpoint at step {step}; "
                          f"exiting with {REQUEUE_EXIT_CODE} so the job can be requeued", file=sys.stderr)
                return REQUEUE_EXIT_CODE

        # -- finish: checkpoint, final validation, declared outputs ------------------------------------
        if saved_step != step:
            save(step)
        if valid_step != step:
            valid_step, valid_metrics = validate()
        final_state, _ = gather_states(wrapped if use_fsdp else None, model, None)
        if is_main:
            scores = {"step": step, "split": "valid", "objective": cfg.objective.name, "model_preset": cfg.model.preset,
                      **{k: valid_metrics.get(k) for k in ("l_mlm", "l_pmlm", "acc_mlm", "acc_pmlm", "dacc",
                                                           "mlm_total", "pair_total")}}
            with atomic_output(scores_path) as tmp:
                Path(tmp).write_text(json.dumps(scores, indent=2) + "\n")
            if final_path is not None:
                info = {"model": model.cfg.to_dict(), "objective": dataclasses.asdict(cfg.objective), "step": step,
                        "train_config": cfg.to_dict(), "final_scores": scores, "versions": versions()}
                save_weights(final_path, final_state, info)
        return 0
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if progress is not None:
            progress.close()
        if log is not None:
            log.close()
        if train_stream is not None:
            train_stream.close()
        if own_group and dist.is_initialized():
            dist.destroy_process_group()


def _evaluate(
    module: nn.Module, stream: ShardStream, cfg: TrainConfig, device, autocast, rank: int, world: int
) -> dict:
    """Validation metrics over the first ``eval_batches`` batches of the fixed-seed valid stream.

    The masks come from a generator re-seeded every time, so each validation sees identical
    inputs; every rank runs the same number of batches (FSDP's forward is collective).
    """
    batches = list(islice(stream.epoch_batches(0), cfg.eval_batches))
    count = torch.tensor([len(batches)], device=device)
    if world > 1:
        dist.all_reduce(count, op=dist.ReduceOp.MIN)
    generator = torch.Generator(device).manual_seed(_derived_seed(cfg.seed, rank, _VALID_STREAM))
    sums = torch.zeros(len(SUMS), dtype=torch.float64, device=device)
    module.eval()
    with torch.no_grad():
        for batch in batches[: int(count)]:
            with autocast():
                out = module(batch.tokens.to(device, non_blocking=True), generator)
            sums += _sums(out, batch.residues, device)
    if world > 1:
        dist.all_reduce(sums)
    return _summarise(sums.tolist())


def _sums(out: dict, residues: int, device) -> torch.Tensor:
    """One micro-batch's contribution to SUMS, without a host sync."""
    loss = out["loss"].detach().double()
    return torch.stack([
        loss,
        out["l_mlm"].double() * out["mlm_total"],
        out["mlm_correct"].double(),
        out["mlm_total"].double(),
        out["l_pmlm"].double() * out["pair_total"],
        out["pair_correct"].double(),
        out["pair_total"].double(),
        torch.tensor(float(residues), dtype=torch.float64, device=device),
        torch.ones((), dtype=torch.float64, device=device),
    ])


def _summarise(values: list[float]) -> dict:
    """Means and accuracies from SUMS; None where nothing was counted (e.g. pair metrics under MLM)."""
    s = dict(zip(SUMS, values))
    acc_mlm = s["mlm_correct"] / s["mlm_total"] if s["mlm_total"] else None
    acc_pmlm = s["pair_correct"] / s["pair_total"] if s["pair_total"] else None
    return {
        "loss": s["loss"] / s["batches"] if s["batches"] else None,
        "l_mlm": s["l_mlm_x_n"] / s["mlm_total"] if s["mlm_total"] else None,
        "l_pmlm": s["l_pmlm_x_n"] / s["pair_total"] if s["pair_total"] else None,
        "acc_mlm": acc_mlm,
        "acc_pmlm": acc_pmlm,
        # paper: dAcc = Acc_pmlm - Acc_mlm^2, how far the pair head is from independent positions
        "dacc": acc_pmlm - acc_mlm**2 if acc_mlm is not None and acc_pmlm is not None else None,
        "residues": int(s["residues"]),
        "mlm_total": int(s["mlm_total"]),
        "pair_total": int(s["pair_total"]),
    }


class _MetricsLog:
    """metrics.csv (+ TensorBoard) on rank 0; a resumed run first drops rows past its checkpoint."""

    def __init__(self, out_dir: Path, start_step: int, tensorboard: bool):
        self.path = out_dir / METRICS_CSV
        self.started = time.perf_counter()
        if self.path.exists():
            with open(self.path, newline="") as fh:
                rows = csv.DictReader(fh)
                kept = [r for r in rows if r.get("step", "").isdigit() and int(r["step"]) <= start_step]
            with atomic_output(self.path) as tmp, open(tmp, "w", newline="") as fh:
                writer = csv.DictWriter(fh, CSV_FIELDS, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(kept)
        else:
            with open(self.path, "w", newline="") as fh:
                csv.DictWriter(fh, CSV_FIELDS).writeheader()
        self.fh = open(self.path, "a", newline="")
        self.csv = csv.DictWriter(self.fh, CSV_FIELDS, extrasaction="ignore")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out_dir / "tb"), purge_step=start_step + 1 if start_step else None)

    def write(self, split: str, step: int, epoch: int, lr: float, metrics: dict) -> None:
        row = {"split": split, "step": step, "epoch": epoch, "lr": f"{lr:.6g}",
               "elapsed_s": f"{time.perf_counter() - self.started:.1f}"}
        for key, value in metrics.items():
            row[key] = "" if value is None else (f"{value:.6g}" if isinstance(value, float) else value)
        self.csv.writerow(row)
        self.fh.flush()  # readable while the run goes on (and by the tests that interrupt it)
        if self.tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and key not in ("mlm_total", "pair_total"):
                    self.tb.add_scalar(f"{split}/{key}", value, step)
            if split == "train":
                self.tb.add_scalar("train/lr", lr, step)
            self.tb.flush()

    def close(self) -> None:
        self.fh.close()
        if self.tb is not None:
            self.tb.close()


def _gradient_sync(wrapped: nn.Module, enabled: bool, world: int, use_fsdp: bool):
    """Context for one micro-batch's forward/backward: skip the cross-rank reduction unless ``enabled``."""
    if world == 1:
        return nullcontext()
    if use_fsdp:
        wrapped.set_requires_gradient_sync(enabled)
        return nullcontext()
    return nullcontext() if enabled else wrapped.no_sync()


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was requested but no CUDA device is visible; use device: auto or cpu")
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def install_stop_handlers(stop: dict) -> dict:
    """SIGTERM / SIGUSR1 only set a flag; the loop acts on it at the next step boundary."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        stop["signal"] = signum

    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def _agree(flag: bool, device, world: int) -> bool:
    """True on every rank if it is true on any (so all ranks save and stop together)."""
    if world == 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _derived_seed(seed: int, rank: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed, rank, stream]).generate_state(1)[0])


def _clean_name(name: str) -> str:
    """Parameter name without DDP / compile wrapper prefixes."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name.removeprefix("module.")


def _check_compatible(saved: dict, cfg: TrainConfig, path: Path) -> None:
    """Weights and optimizer state only fit the same model and objective; other changes are allowed."""
    now = cfg.to_dict()
    for section in ("model", "objective"):
        if saved.get(section) != now[section]:
            raise ConfigError(
                f"{path}: written for {section} {saved.get(section)} but the config asks for {now[section]}; "
                "use a new --out folder or restore the old settings"
            )
    changed = sorted(k for k in now if saved.get(k) != now[k])
    if changed and int(os.environ.get("RANK", 0)) == 0:
        print(f"pmlm pretrain: resuming with changed settings: {', '.join(changed)}", file=sys.stderr)
