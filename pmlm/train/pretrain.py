"""Pre-training: process-group set-up, shard streams, the encoder and its objective wrapped in DDP / FSDP, AdamW;
the loop itself is the engine's (``train.engine``), handed this module's ``PretrainRun``.

Runs as a single process or under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK from the
environment; gloo on CPU, NCCL on CUDA). Resumes from the newest complete checkpoint in
``out_dir`` by itself, and on SIGTERM / SIGUSR1 saves at the next step boundary and exits
with ``REQUEUE_EXIT_CODE`` so a scheduler can requeue the job.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from pmlm.artefacts import manifest_digest, write_encoder
from pmlm.config.pretraining import NOT_IN_FINGERPRINT, TrainConfig
from pmlm.model.objectives import pretraining_losses
from pmlm.pretrained import build_model, pick_device
from pmlm.train.checkpoint import Checkpoint, capture_rng, gather_states, load_states, restore_rng
from pmlm.train.engine import TrainingRun, fit
from pmlm.train.loader import Batch, ShardStream
from pmlm.train.parallel import (
    clean_name,
    gradient_sync,
    is_communication_failure,
    join_process_group,
    lost_ranks,
    replicate,
)
from pmlm.train.reporting import CSV_FIELDS, TrainWindow, log_row, step_sums, validation_metrics
from pmlm.train.run_folder import run_record
from pmlm.train.runtime import StopSignals, autocast_factory, derived_seed, precision
from pmlm.utils import atomic_output, versions
from pmlm.vocabulary import TMLM

SCORES_JSON = "final_scores.json"
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


@dataclass(eq=False)
class PretrainRun(TrainingRun):
    """What pre-training hands the engine: shard batches, the objective's losses and sums, its state per rank."""

    cfg: TrainConfig
    objective: PretrainingObjective
    module: nn.Module  # what the loop calls: FSDP-sharded, DDP-wrapped or the objective itself
    optimizer: torch.optim.AdamW
    use_fsdp: bool
    generator: torch.Generator  # this rank's masks
    train_stream: ShardStream
    valid_stream: ShardStream
    device: torch.device
    autocast: Callable
    rank: int
    world: int
    hooks: TrainHooks
    window: TrainWindow = field(init=False)
    tokens: int = 0  # residues x ranks, as rank 0 counts them
    valid_metrics: dict = field(default_factory=dict)  # of the last validation
    command, counted, csv_fields = "pretrain", "tokens", CSV_FIELDS

    def __post_init__(self) -> None:
        self.window = TrainWindow(self.device)

    @property
    def fsdp_module(self) -> nn.Module | None:
        return self.module if self.use_fsdp else None

    def parameters(self):
        return self.objective.parameters()

    def learning_rates(self, step: int) -> dict[str, float]:
        lr = self.cfg.optim.lr_at(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return {"lr": lr}

    def micro_batch_loss(self, step: int) -> torch.Tensor:
        batch = self.train_stream.next_batch()
        if self.hooks.on_batch:
            self.hooks.on_batch(step, batch)
        tokens = batch.tokens.to(self.device, non_blocking=True)  # (B, L)
        with self.autocast():
            out = self.module(tokens, self.generator)
        self.window.sums += step_sums(out, batch.residues, self.device)
        self.tokens += batch.residues * self.world
        return out["loss"]

    def gradient_sync(self, enabled: bool):
        return gradient_sync(self.module, enabled, self.world, self.use_fsdp)

    def mean_loss(self) -> float:
        return self.window.mean_loss()

    def seen(self) -> int:
        return self.tokens

    def log_train(self, log, step: int, lrs: dict[str, float], grad_norm: float) -> None:
        self.window.flush(log, step, self.train_stream.epoch, lrs["lr"], self.world, grad_norm)

    def validate(self, log, step: int, lrs: dict[str, float]) -> None:
        # plain module: FSDP's own hooks gather the shards, DDP's hooks are not needed
        cfg = self.cfg
        self.valid_metrics = validation_metrics(
            self.objective, self.valid_stream, cfg, self.device, self.autocast, self.rank, self.world
        )
        if log is not None:
            log.write(*log_row("valid", step, self.train_stream.epoch, lrs["lr"], self.valid_metrics))

    def state(self, step: int) -> tuple[dict, dict] | None:
        """Every rank contributes its random streams and data position; rank 0 gets the whole state."""
        model_state, optim_state = gather_states(self.fsdp_module, self.objective.model, self.optimizer)
        mine = {"rng": capture_rng(), "generator": self.generator.get_state(), "loader": self.train_stream.state_dict()}
        ranks = [None] * self.world
        if self.world > 1:
            dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        if self.rank != 0:
            return None
        state = {
            "step": step,
            "optimizer": optim_state,
            "scheduler": {"last_step": step},
            "world_size": self.world,
            "ranks": ranks,
        }
        return model_state, state

    def restore(self, ckpt: Checkpoint) -> None:
        cfg, rank = self.cfg, self.rank
        load_states(self.fsdp_module, self.objective.model, self.optimizer, ckpt.model, ckpt.state["optimizer"])
        ranks = ckpt.state["ranks"]
        if len(ranks) == self.world:
            restore_rng(ranks[rank]["rng"])
            self.generator.set_state(ranks[rank]["generator"])
        else:  # extended onto another number of ranks: fresh per-rank streams (the old cannot be split or merged)
            self.generator.manual_seed(derived_seed(cfg.seed + ckpt.step, rank, _MASK_STREAM))
            torch.manual_seed(derived_seed(cfg.seed + ckpt.step, rank, _DROPOUT_STREAM))
        self.train_stream.load_state_dict(ranks[rank % len(ranks)]["loader"])


def train(
    cfg: TrainConfig,
    shards_dir: str | Path,
    out_dir: str | Path,
    final_path: str | Path | None = None,
    scores_path: str | Path | None = None,
    hooks: TrainHooks | None = None,
    extend: bool = False,
) -> int:
    """Pre-train per ``cfg``; returns 0 when done or REQUEUE_EXIT_CODE after a stop signal. ``extend``: continue
    the run's checkpoint under a changed ``optim.total_steps`` or number of ranks (``train.run_folder``)."""
    hooks = hooks or TrainHooks()
    out_dir = Path(out_dir)
    scores_path = Path(scores_path) if scores_path else out_dir / SCORES_JSON

    # -- init: processes, devices, precision, signals ------------------------------------------------
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(cfg.device, int(os.environ.get("LOCAL_RANK", 0)), option="device:")
    # FSDP also runs at world size 1 under torchrun (MASTER_ADDR set), so its code path runs on one GPU
    distributed = world > 1 or (cfg.fsdp and "MASTER_ADDR" in os.environ)
    own_group = distributed and join_process_group(device)
    stop = StopSignals().install()
    train_stream = wrapped = run = None
    try:
        autocast = autocast_factory(device, cfg.bf16)
        if device.type == "cuda":
            torch.set_float32_matmul_precision("high")

        # -- data ------------------------------------------------------------------------------------
        train_stream, valid_stream = _streams(cfg, shards_dir, rank, world)
        # what determines the result: the settings, the shards' content, the ranks (the batch), the precision
        shards, arithmetic = manifest_digest(shards_dir), precision(device, cfg.bf16)
        record = run_record(cfg.to_dict(), NOT_IN_FINGERPRINT, shards=shards, world_size=world, precision=arithmetic)

        # -- model: identical initial weights on every rank, then DDP / FSDP; AdamW ------------------
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model_config(), cfg.objective).to(device)
        model.encoder.attention = cfg.attention
        objective = PretrainingObjective(model, cfg.objective)
        use_fsdp = cfg.fsdp and distributed
        wrapped, optimizer = _wrap(objective, cfg, device, rank, world, use_fsdp)
        generator = torch.Generator(device).manual_seed(derived_seed(cfg.seed, rank, _MASK_STREAM))
        torch.manual_seed(derived_seed(cfg.seed, rank, _DROPOUT_STREAM))  # dropout differs across ranks

        # -- the loop: the engine's, from the newest checkpoint if any ---------------------------------
        run = PretrainRun(
            cfg, objective, wrapped, optimizer, use_fsdp, generator, train_stream, valid_stream, device, autocast,
            rank, world, hooks,
        )  # fmt: skip
        code = fit(
            run,
            cfg,
            out_dir,
            device,
            stop,
            record=record,
            extend=extend,
            rank=rank,
            world=world,
            after_step=(lambda step: hooks.after_step(step, model)) if hooks.after_step else None,
            tensorboard_dir=out_dir / "tb" if cfg.tensorboard else None,
        )
        if code != 0:
            return code

        # -- finish: the declared outputs --------------------------------------------------------------
        final_state, _ = gather_states(run.fsdp_module, model, None)
        if rank == 0:
            _write_outputs(cfg, model, run.step, run.valid_metrics, final_state, scores_path, final_path)
        return 0
    except RuntimeError as exc:
        if distributed and is_communication_failure(exc):
            # another rank died, hung past the collective timeout or became unreachable: one line, not a traceback
            raise lost_ranks(exc, run.step if run is not None else 0, out_dir) from None
        raise
    finally:
        stop.restore()
        if train_stream is not None:
            train_stream.close()
        if own_group and dist.is_initialized():
            # The DDP / FSDP wrapper goes first. Its reducer holds the process group, and a gloo group destroyed
            # from there (with the GIL held) joins its worker threads while one of them may be waiting for the
            # GIL to free the last collective's tensors: a rank then hangs at exit for good. Released by
            # destroy_process_group instead, the group is destroyed without the GIL.
            wrapped = run = None
            gc.collect()
            dist.destroy_process_group()


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
    wrapped = replicate(objective, model.encoder.layers, device, rank, world, use_fsdp)
    if cfg.compile:
        model.encoder.compile_layers()  # per layer: the objective's dynamic shapes stay out of the graphs
    return wrapped, _adamw(wrapped, decay, cfg, device)


def _adamw(wrapped: nn.Module, decay: set[str], cfg: TrainConfig, device) -> torch.optim.AdamW:
    """AdamW with decay on the ``decay`` parameters only; the learning rate is set by hand from the schedule."""
    named = [(clean_name(n), p) for n, p in wrapped.named_parameters() if p.requires_grad]
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
    if cfg.objective.name == TMLM:
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
