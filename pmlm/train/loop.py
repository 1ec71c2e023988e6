"""The pre-training loop: one function from process-group set-up to the final weights.

Runs as a single process or under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK from the
environment; gloo on CPU, NCCL on CUDA). Resumes from the newest complete checkpoint in
``out_dir`` by itself, and on SIGTERM / SIGUSR1 saves at the next step boundary and exits
with ``REQUEUE_EXIT_CODE`` so a scheduler can requeue the job. The scaffolding it shares with
fine-tuning (device, precision, signals, divergence stop, metrics log) is in ``train.runtime``.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import json
import math
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from pmlm.artefacts import write_encoder
from pmlm.config.pretraining import TrainConfig
from pmlm.errors import ConfigError
from pmlm.model.objectives import pretraining_losses
from pmlm.pretrained import build_model, pick_device
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
from pmlm.train.loader import Batch, ShardStream
from pmlm.train.reporting import CSV_FIELDS, TrainWindow, log_row, step_sums, validation_metrics
from pmlm.train.runtime import (
    METRICS_CSV,
    MetricsLog,
    StopSignals,
    agree,
    autocast_factory,
    check_compatible,
    collective_timeout,
    derived_seed,
    is_communication_failure,
    lost_ranks,
    requeue_exit,
    stop_if_diverged,
)
from pmlm.utils import atomic_output, versions

SCORES_JSON = "final_scores.json"
# the only buffer (sinusoidal positions) is identical everywhere, so no per-forward broadcast
# (the keyword was renamed in torch 2.13)
_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)
# independent random streams derived from (seed, rank, stream); 2 is the validation masks' (train.metrics)
_DROPOUT_STREAM, _MASK_STREAM = 0, 1


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
    device = pick_device(cfg.device, int(os.environ.get("LOCAL_RANK", 0)), option="device:")
    # FSDP also runs at world size 1 under torchrun (MASTER_ADDR set), so its code path runs on one GPU
    distributed = world > 1 or (cfg.fsdp and "MASTER_ADDR" in os.environ)
    own_group = distributed and _join_process_group(device)
    stop = StopSignals().install()
    train_stream = log = progress = wrapped = fsdp_module = None
    step = 0
    try:
        autocast = autocast_factory(device, cfg.bf16)
        if device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        is_main = rank == 0
        if is_main:
            out_dir.mkdir(parents=True, exist_ok=True)

        # -- data ------------------------------------------------------------------------------------
        train_stream, valid_stream = _streams(cfg, shards_dir, rank, world)

        # -- model: identical initial weights on every rank, then DDP / FSDP; AdamW ------------------
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model_config(), cfg.objective).to(device)
        model.encoder.attention = cfg.attention
        objective = PretrainingObjective(model, cfg.objective)
        use_fsdp = cfg.fsdp and distributed
        wrapped, optimizer = _wrap(objective, cfg, device, rank, world, use_fsdp)
        fsdp_module = wrapped if use_fsdp else None
        generator = torch.Generator(device).manual_seed(derived_seed(cfg.seed, rank, _MASK_STREAM))
        torch.manual_seed(derived_seed(cfg.seed, rank, _DROPOUT_STREAM))  # dropout differs across ranks

        # -- resume from the newest complete checkpoint, if any ---------------------------------------
        resumed_from = latest_checkpoint(out_dir)
        step = (
            0
            if resumed_from is None
            else _resume(resumed_from, cfg, fsdp_module, model, optimizer, generator, train_stream, rank, world)
        )

        log, progress = _reporting(cfg, out_dir, step) if is_main else (None, None)
        seen = 0

        def save(at_step: int) -> None:
            _save(out_dir, at_step, cfg, fsdp_module, model, optimizer, generator, train_stream, world, is_main)

        def validate() -> tuple[int, dict]:
            # plain module: FSDP's own hooks gather the shards, DDP's hooks are not needed
            metrics = validation_metrics(objective, valid_stream, cfg, device, autocast, rank, world)
            if log is not None:
                log.write(*log_row("valid", step, train_stream.epoch, optim_lr, metrics))
            return step, metrics

        # -- the loop ----------------------------------------------------------------------------------
        saved_step = step if resumed_from is not None else None
        valid_step, valid_metrics = None, {}
        window = TrainWindow(device)
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
                        out = wrapped(tokens, generator)
                    (out["loss"] / cfg.grad_accum).backward()
                window.sums += step_sums(out, batch.residues, device)
                seen += batch.residues * world
            grad_norm = _clip(objective, cfg.optim.clip_norm, use_fsdp)
            # the norm is taken after the gradient all-reduce, so every rank reaches the same verdict
            stop_if_diverged(bool(torch.isfinite(grad_norm)), step, out["loss"].detach(), out_dir)
            optimizer.step()
            step += 1
            window.norms.append(float(grad_norm))
            if hooks.after_step:
                hooks.after_step(step, model)
            if progress is not None:  # loss: mean since the last metrics row, read only when a line is due
                progress.update(step, loss=window.mean_loss, lr=optim_lr, tokens=seen)

            if step % cfg.log_every == 0 or step == cfg.optim.total_steps:
                window.flush(log, step, train_stream.epoch, optim_lr, world)
            if cfg.eval_every and step % cfg.eval_every == 0:
                valid_step, valid_metrics = validate()
                wrapped.train()

            stopping = agree(stop.received is not None, device, world)
            if (cfg.save_every and step % cfg.save_every == 0) or stopping:
                save(step)
                saved_step = step
            if stopping:
                return requeue_exit("pretrain", stop.received, step, announce=is_main)

        # -- finish: checkpoint, final validation, declared outputs ------------------------------------
        if saved_step != step:
            save(step)
        if valid_step != step:
            valid_step, valid_metrics = validate()
        final_state, _ = gather_states(fsdp_module, model, None)
        if is_main:
            _write_outputs(cfg, model, step, valid_metrics, final_state, scores_path, final_path)
        return 0
    except RuntimeError as exc:
        if distributed and is_communication_failure(exc):
            # another rank died, hung past the collective timeout or became unreachable: one line, not a traceback
            raise lost_ranks(exc, step, out_dir) from None
        raise
    finally:
        stop.restore()
        for part in (progress, log, train_stream):
            if part is not None:
                part.close()
        if own_group and dist.is_initialized():
            # The DDP / FSDP wrapper goes first. Its reducer holds the process group, and a gloo group destroyed
            # from there (with the GIL held) joins its worker threads while one of them may be waiting for the
            # GIL to free the last collective's tensors: a rank then hangs at exit for good. Released by
            # destroy_process_group instead, the group is destroyed without the GIL.
            wrapped = fsdp_module = None
            gc.collect()
            dist.destroy_process_group()


def _join_process_group(device: torch.device) -> bool:
    """Start this process's group (NCCL on CUDA, gloo on CPU) unless the caller has one; True if started here."""
    if dist.is_initialized():
        return False  # a caller's own process group is left alone
    backend, device_id = ("nccl", device) if device.type == "cuda" else ("gloo", None)
    # a bounded wait in every collective: a rank that hangs or vanishes fails the job instead of holding it
    dist.init_process_group(backend, device_id=device_id, timeout=collective_timeout())
    return True


def _reporting(cfg: TrainConfig, out_dir: Path, step: int) -> tuple[MetricsLog, Progress]:
    """Rank 0's metrics log and progress lines, from ``step`` on."""
    log = MetricsLog(out_dir / METRICS_CSV, CSV_FIELDS, step, out_dir / "tb" if cfg.tensorboard else None)
    # a line per tenth of the run (and per minute) in the rule's log; rank 0's residues x ranks as tokens
    progress = Progress(
        "pmlm pretrain", cfg.optim.total_steps, unit="steps", start=step, rates=("tokens",), each_tenth=True
    )
    return log, progress


def _streams(cfg: TrainConfig, shards_dir: str | Path, rank: int, world: int) -> tuple[ShardStream, ShardStream]:
    """This rank's train and valid streams."""
    stream_args = {
        "tokens_per_batch": cfg.data.tokens_per_batch,
        "max_len": cfg.max_len,
        "buffer_rows": cfg.data.buffer_rows,
        "pad_to_multiple": cfg.data.pad_to_multiple,
        "seed": cfg.seed,
        "rank": rank,
        "world_size": world,
    }
    train_stream = ShardStream(shards_dir, "train", num_workers=cfg.data.num_workers, **stream_args)
    return train_stream, ShardStream(shards_dir, "valid", **stream_args)


def _wrap(
    objective: PretrainingObjective, cfg: TrainConfig, device, rank: int, world: int, use_fsdp: bool
) -> tuple[nn.Module, torch.optim.AdamW]:
    """The module the loop calls (FSDP-sharded, DDP-wrapped or the objective itself) and its AdamW."""
    model = objective.model
    decay = {name for name, p in objective.named_parameters() if p.dim() >= 2}  # matrices; not biases / norms
    if use_fsdp:
        if rank == 0:
            print(
                f"pmlm pretrain: sharding parameters and optimizer state with FSDP over {world} rank(s)",
                file=sys.stderr,
            )
        # per-layer units bound the gathered memory to about one layer; the root holds embeddings and heads
        for layer in model.encoder.layers:
            fully_shard(layer)
        wrapped = fully_shard(objective)
    elif world > 1:
        wrapped = nn.parallel.DistributedDataParallel(
            objective, device_ids=[device.index] if device.type == "cuda" else None, **_NO_BUFFER_SYNC
        )
        if device.type == "cpu":
            wrapped.register_comm_hook(None, _allreduce_by_parameter)
    else:
        wrapped = objective
    if cfg.compile:
        model.encoder.compile_layers()  # per layer: the objective's dynamic shapes stay out of the graphs
    return wrapped, _adamw(wrapped, decay, cfg, device)


def _allreduce_by_parameter(process_group, bucket):  # no annotations: DDP checks them, and these are strings
    """DDP's gradient reduction on CPU (gloo), one parameter at a time: each gradient averaged over the ranks on
    its own, so that the order in which gloo adds the ranks' values (its ring goes round in chunks of the tensor
    it reduces) depends on the parameter alone, not on where DDP's bucket holds it. DDP lays its buckets out
    anew after the first step of each process, so a resumed run's first step has another layout than the run
    it continues; with three or more ranks some sums would then be added in another order, and the resumed run
    would not end bit-identical to an uninterrupted one."""
    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    futures = []
    for grad in bucket.gradients():  # views into the bucket's buffer
        grad.div_(world)
        futures.append(dist.all_reduce(grad, group=group, async_op=True).get_future())

    def reduced(done):
        # a failed reduction raises here, in the backward pass, instead of going unnoticed; the first failure
        # is the cause (e.g. a timeout), the others its consequence (gloo closes the pair it timed out on)
        errors = []
        for future in done.value():
            try:
                future.wait()
            except RuntimeError as exc:
                errors.append(exc)
        if errors:
            raise next((e for e in errors if "pair closure" not in str(e)), errors[0])
        return bucket.buffer()

    return torch.futures.collect_all(futures).then(reduced)


def _adamw(wrapped: nn.Module, decay: set[str], cfg: TrainConfig, device) -> torch.optim.AdamW:
    """AdamW with decay on the ``decay`` parameters only; the learning rate is set by hand from the schedule."""
    named = [(_clean_name(n), p) for n, p in wrapped.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for n, p in named if n in decay], "weight_decay": cfg.optim.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ],
        lr=cfg.optim.lr,
        betas=cfg.optim.betas,
        eps=cfg.optim.eps,
        fused=device.type == "cuda",
    )


def _resume(
    path: Path, cfg: TrainConfig, fsdp_module, model, optimizer, generator, train_stream, rank: int, world: int
) -> int:
    """Load a checkpoint into the run's state; returns its step."""
    ckpt = load_checkpoint(path)
    check_compatible(ckpt.config, cfg.to_dict(), ("model", "objective"), path, "pretrain", announce=rank == 0)
    expected = set(model.state_dict())
    if set(ckpt.model) != expected:
        # same recipe, other layers: a checkpoint written before model.norm existed holds a pre-LN encoder
        odd = sorted(set(ckpt.model) ^ expected)
        raise ConfigError(
            f"{path}: the checkpoint's weights do not fit this model ({', '.join(odd[:3])} ...); "
            "checkpoints of older pmlm versions are pre-LN: resume with model.overrides "
            "{norm: pre, activation: gelu, embedding_norm: false, attention_dropout: 0.0} or use a new --out"
        )
    load_states(fsdp_module, model, optimizer, ckpt.model, ckpt.state["optimizer"])
    # the saved groups carry the old hyper-parameters; the current config's are the ones announced
    for group, decay_rate in zip(optimizer.param_groups, (cfg.optim.weight_decay, 0.0)):
        group.update(betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=decay_rate)
    ranks = ckpt.state["ranks"]
    if len(ranks) == world:
        restore_rng(ranks[rank]["rng"])
        generator.set_state(ranks[rank]["generator"])
    else:  # fresh per-rank streams: the old ones cannot be split or merged faithfully
        generator.manual_seed(derived_seed(cfg.seed + ckpt.step, rank, _MASK_STREAM))
        torch.manual_seed(derived_seed(cfg.seed + ckpt.step, rank, _DROPOUT_STREAM))
    train_stream.load_state_dict(ranks[rank % len(ranks)]["loader"])
    if rank == 0:
        print(f"pmlm pretrain: resuming from {path} (step {ckpt.step})", file=sys.stderr)
    return ckpt.step


def _save(
    out_dir: Path,
    at_step: int,
    cfg: TrainConfig,
    fsdp_module,
    model,
    optimizer,
    generator,
    train_stream,
    world: int,
    is_main: bool,
) -> None:
    """Every rank contributes its state; rank 0 writes the folder."""
    model_state, optim_state = gather_states(fsdp_module, model, optimizer)
    mine = {"rng": capture_rng(), "generator": generator.get_state(), "loader": train_stream.state_dict()}
    ranks = [None] * world
    if world > 1:
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    if is_main:
        state = {
            "step": at_step,
            "optimizer": optim_state,
            "scheduler": {"last_step": at_step},
            "world_size": world,
            "ranks": ranks,
        }
        save_checkpoint(out_dir, at_step, model_state, state, cfg.to_dict(), cfg.keep_last_checkpoints)
    if world > 1:
        dist.barrier()


def _write_outputs(
    cfg: TrainConfig,
    model,
    step: int,
    valid_metrics: dict,
    final_state: dict,
    scores_path: Path,
    final_path: str | Path | None,
) -> None:
    """The declared outputs (rank 0): the final validation scores and the encoder artefact."""
    scores = {
        "step": step,
        "split": "valid",
        "objective": cfg.objective.name,
        "model_preset": cfg.model.preset,
        **{
            k: valid_metrics.get(k)
            for k in ("l_mlm", "l_pmlm", "acc_mlm", "acc_pmlm", "dacc", "mlm_total", "pair_total")
        },
    }
    if cfg.objective.name == "tmlm":
        scores.update({k: valid_metrics.get(k) for k in ("l_tmlm", "acc_tmlm", "triple_total")})
    with atomic_output(scores_path) as tmp:
        Path(tmp).write_text(json.dumps(scores, indent=2) + "\n")
    if final_path is not None:
        info = {
            "model": model.cfg.to_dict(),
            "objective": dataclasses.asdict(cfg.objective),
            "step": step,
            "train_config": cfg.to_dict(),
            "final_scores": scores,
            "versions": versions(),
        }
        write_encoder(final_path, final_state, info)


def _clip(objective: nn.Module, clip_norm: float, use_fsdp: bool) -> torch.Tensor:
    """Clip the gradients to ``clip_norm`` (0: measure only); the global norm before clipping."""
    grad_norm = nn.utils.clip_grad_norm_(objective.parameters(), clip_norm or math.inf)
    return grad_norm.full_tensor() if use_fsdp else grad_norm  # a sharded (DTensor) norm -> the global value


def _gradient_sync(wrapped: nn.Module, enabled: bool, world: int, use_fsdp: bool):
    """Context for one micro-batch's forward/backward: skip the cross-rank reduction unless ``enabled``."""
    if world == 1:
        return nullcontext()
    if use_fsdp:
        wrapped.set_requires_gradient_sync(enabled)
        return nullcontext()
    return nullcontext() if enabled else wrapped.no_sync()


def _clean_name(name: str) -> str:
    """Parameter name without DDP / compile wrapper prefixes."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name.removeprefix("module.")
