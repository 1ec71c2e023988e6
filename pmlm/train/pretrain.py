"""Pre-training's entry: ``train`` reads the recipe in one place (the device and the model on it, the run's record, the
process group and the step layout, the shard streams, the objective wrapped in DDP / FSDP, AdamW) and hands the
engine's loop (``train.engine.fit``) this module's ``PretrainRun``; ARCHITECTURE.md, "How a step flows", follows a step.

Runs as a single process or under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK from the environment; gloo on CPU,
NCCL on CUDA). Resumes from the newest checkpoint of this run in ``out_dir`` by itself, and on SIGTERM / SIGUSR1
saves at the next step boundary and exits with ``REQUEUE_EXIT_CODE`` so a scheduler can requeue the job.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from pmlm.artefacts import manifest_digest
from pmlm.config.pretraining import NOT_IN_FINGERPRINT, TrainConfig
from pmlm.errors import ConfigError
from pmlm.files import run_record
from pmlm.model.objective import ObjectiveOutputs
from pmlm.model.objectives import mask_batch, objective_outputs, sample_sizes
from pmlm.model.step_inputs import StepInputs
from pmlm.pretrained import build_model, device_for
from pmlm.tokens import trimmed_width
from pmlm.train.budget import Arithmetic, Parameters
from pmlm.train.checkpoint import Checkpoint, capture_rng, gather_states, load_states, restore_rng
from pmlm.train.engine import TrainingRun, fit
from pmlm.train.loader import Batch, ShardStream, count_residues
from pmlm.train.reporting import CSV_FIELDS, TrainWindow, log_row, step_sums, validation_metrics
from pmlm.train.run_folder import INDUCTOR_CACHE, SCORES_JSON, TENSORBOARD_DIR, publish_metrics, write_outputs
from pmlm.train.runtime import DTYPES, StopSignals, derived_seed
from pmlm.train.runtime import autocast as precision_context
from pmlm.train.step_layout import (
    StepLayout,
    card_memory,
    choose_layout,
    clean_name,
    gradient_sync,
    is_communication_failure,
    join_process_group,
    lost_ranks,
    part_outputs,
    replicate,
    step_parts,
    to_device,
)

# independent random streams derived from (seed, rank, stream); 2 is the validation masks' (train.reporting). The
# masks' stream is the same on every rank (rank 0's): each rank masks the whole step's batch
_DROPOUT_STREAM, _MASK_STREAM = 0, 1


@dataclass
class TrainHooks:
    """Optional callbacks, for tests and monitoring; they must not change the run's state."""

    on_batch: Callable[[int, Batch], None] | None = None  # every micro-batch on every rank: (step, its rows)
    after_backward: Callable[[int, nn.Module], None] | None = None  # a step's reduced gradients: (step, model)
    after_step: Callable[[int, nn.Module], None] | None = None  # after each optimizer step: (steps done, model)


class PretrainingObjective(nn.Module):
    """Model plus objective as one module, the unit that DDP / FSDP wrap (their hooks run in forward)."""

    def __init__(self, model: nn.Module, objective):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, inputs: StepInputs, sizes: torch.Tensor) -> ObjectiveOutputs:
        """A micro-batch's outputs, its loss divided by the step's sample sizes ``sizes`` (``objective_outputs``)."""
        return objective_outputs(self.model, inputs, self.objective, sizes)


@dataclass(eq=False)
class PretrainRun(TrainingRun):
    """What pre-training hands the engine: shard batches, the objective's losses and sums, its state per rank."""

    cfg: TrainConfig
    objective: PretrainingObjective
    module: nn.Module  # what the loop calls: FSDP-sharded, DDP-wrapped or the objective itself
    optimizer: torch.optim.AdamW
    use_fsdp: bool
    generator: torch.Generator  # the masks (on the host), the same stream on every rank
    train_stream: ShardStream
    valid_stream: ShardStream
    device: torch.device
    autocast: Callable
    rank: int
    world: int
    hooks: TrainHooks
    layout: StepLayout
    dtype: torch.dtype  # what the forward passes compute in (autocast's, else fp32): the attention layout follows it
    window: TrainWindow = field(init=False)
    tokens: int = 0  # residues of the steps so far
    valid_metrics: dict = field(default_factory=dict)  # of the last validation
    # the current step: its batch; the sample sizes of its loss terms; this rank's row ranges of it and their inputs
    batch: Batch | None = None
    sizes: torch.Tensor | None = None
    parts: list[tuple[int, int]] = field(default_factory=list)
    inputs: list[tuple[StepInputs, bool]] = field(default_factory=list)
    command, counted, csv_fields = "pretrain", "tokens", CSV_FIELDS

    def __post_init__(self) -> None:
        self.window = TrainWindow(self.device)
        self.accumulation = self.layout.accumulation

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

    def begin_step(self, step: int) -> None:
        # everything data-dependent is decided here, on the host, and moved once: the step never waits for Python
        self.batch = self.train_stream.next_batch()  # the whole step's, the same on every rank
        masked = mask_batch(self.batch.tokens, self.cfg.objective, self.generator)
        self.sizes = to_device(sample_sizes(masked, self.cfg.objective), self.device)  # (3,) all ranks'
        self.parts = self.layout.rank_parts(self.batch.tokens.shape[0], self.rank)
        model = self.objective.model
        micro = self.layout.micro_tokens
        self.inputs = step_parts(masked, self.parts, self.cfg, model, self.device, self.dtype, True, micro)
        self.window.count_step(self.batch.residues if self.rank == 0 else 0)
        self.tokens += self.batch.residues

    def micro_batch_loss(self, step: int, micro: int) -> torch.Tensor:
        rows = self.parts[micro]
        if self.hooks.on_batch and rows[1] > rows[0]:
            part = self.batch.tokens[rows[0] : rows[1]]
            part = part[:, : trimmed_width(part, self.cfg.data.pad_to_multiple)]
            self.hooks.on_batch(step, Batch(part, self.batch.epoch, count_residues(part)))
        inputs, live = self.inputs[micro]
        out, loss = part_outputs(self.module, inputs, live, self.sizes, self.world, self.autocast)
        self.window.sums += step_sums(out, loss, self.device)
        return loss

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
        self.valid_metrics = validation_metrics(
            self.objective, self.valid_stream, self.cfg, self.device, self.autocast, self.rank, self.layout, self.dtype
        )
        if log is not None:
            log.write(*log_row("valid", step, self.train_stream.epoch, lrs["lr"], self.valid_metrics))

    def state(self, step: int) -> tuple[dict, dict] | None:
        """Every rank contributes its random streams and data position (the stream and the masks' generator are
        the same on every rank, the dropout streams each rank's own); rank 0 gets the whole state."""
        model_state, optim_state = gather_states(self.fsdp_module, self.objective.model, self.optimizer)
        mine = {"rng": capture_rng(), "generator": self.generator.get_state(), "loader": self.train_stream.state_dict()}
        ranks = [mine] * self.world  # every rank's, once gathered
        if self.world > 1:
            dist.all_gather_object(ranks, mine)
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
        # the stream and the masks are every rank's alike: the run goes on with the same batches on any rank count
        try:
            self.generator.set_state(ranks[0]["generator"])
        except RuntimeError:  # a checkpoint of a version that drew the masks on the GPU: its stream cannot go on
            self.generator.manual_seed(derived_seed(cfg.seed + ckpt.step, 0, _MASK_STREAM))
            if rank == 0:
                print(
                    f"pmlm pretrain: step {ckpt.step} drew its masks on the GPU; resumed with a host stream of masks",
                    file=sys.stderr,
                )
        self.train_stream.load_state_dict(ranks[0]["loader"])
        if len(ranks) == self.world:
            restore_rng(ranks[rank]["rng"])
        else:  # resumed on another number of ranks: fresh dropout streams (the old cannot be split or merged)
            torch.manual_seed(derived_seed(cfg.seed + ckpt.step, rank, _DROPOUT_STREAM))
            if rank == 0:
                print(
                    f"pmlm pretrain: step {ckpt.step} was saved by {len(ranks)} rank(s), resumed on {self.world}: "
                    "the same batches and masks, new dropout streams",
                    file=sys.stderr,
                )


def train(
    cfg: TrainConfig,
    shards_dir: str | Path,
    out_dir: str | Path,
    final_path: str | Path | None = None,
    scores_path: str | Path | None = None,
    hooks: TrainHooks | None = None,
    extend: bool = False,
    metrics_path: str | Path | None = None,
) -> int:
    """Pre-train per ``cfg``; returns 0 when done or REQUEUE_EXIT_CODE after a stop signal. ``extend``: continue
    the run's checkpoint under a changed ``optim.total_steps`` (``train.run_folder``); a checkpoint resumes on any
    number of ranks by itself. ``metrics_path``: the finished run's log, copied (``run_folder.publish_metrics``)."""
    hooks = hooks or TrainHooks()
    out_dir = Path(out_dir)
    scores_path = Path(scores_path) if scores_path else out_dir / SCORES_JSON

    # -- init: the device, the model on it, the run's record, the processes, the signals ---------------
    # the caching allocator grows segments in place instead of retrying allocations of changing micro-batches; read
    # when CUDA first allocates, so it is set before (a user's own setting wins)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if cfg.compile:
        # Inductor's compiled kernels where a requeued or resumed job of this run finds them: only the first job of a
        # run pays the cold build
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(out_dir.resolve() / INDUCTOR_CACHE))
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = device_for(cfg.device, int(os.environ.get("LOCAL_RANK", 0)), option="device:")
    # identical initial weights on every rank; built before the step layout, which sizes the micro-batch for it
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model_config(), cfg.objective).to(device)
    arithmetic = cfg.precision.on(device.type)
    # what determines the result: the settings (the batch, not how it is split), the shards' content, the precision
    record = run_record(cfg.to_dict(), NOT_IN_FINGERPRINT, shards=manifest_digest(shards_dir), precision=arithmetic)
    model.encoder.attention = cfg.attention
    # FSDP also runs at world size 1 under torchrun (MASTER_ADDR set), so its code path runs on one GPU
    distributed = world > 1 or (cfg.fsdp and "MASTER_ADDR" in os.environ)
    own_group = distributed and join_process_group(device)
    stop = StopSignals().install()
    train_stream = wrapped = run = None
    try:
        autocast = precision_context(arithmetic, device)
        if device.type == "cuda":
            torch.set_float32_matmul_precision("high")

        # -- data: the step's batch from the recipe, its micro-batches from the hardware -------------------
        dtype = DTYPES[arithmetic]
        layout = choose_layout(
            cfg, world, card_memory(device), Arithmetic(arithmetic, device.type), Parameters.of(model)
        )
        train_stream, valid_stream = _streams(cfg, shards_dir)
        if rank == 0:
            print(_layout_line(layout), file=sys.stderr)

        # -- the objective around the model, DDP / FSDP; AdamW -------------------------------------------
        objective = PretrainingObjective(model, cfg.objective)
        use_fsdp = cfg.fsdp and distributed
        wrapped, optimizer = _wrap(objective, cfg, device, rank, world, use_fsdp)
        generator = mask_generator(cfg)
        torch.manual_seed(derived_seed(cfg.seed, rank, _DROPOUT_STREAM))  # dropout differs across ranks

        # -- the loop: the engine's, from the newest checkpoint if any ---------------------------------
        run = PretrainRun(
            cfg, objective, wrapped, optimizer, use_fsdp, generator, train_stream, valid_stream, device, autocast,
            rank, world, hooks, layout, dtype,
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
            after_backward=(lambda step: hooks.after_backward(step, model)) if hooks.after_backward else None,
            tensorboard_dir=out_dir / TENSORBOARD_DIR if cfg.tensorboard else None,
        )
        if code != 0:
            return code

        # -- finish: the declared outputs --------------------------------------------------------------
        final_state, _ = gather_states(run.fsdp_module, model, None)
        if rank == 0:
            outputs = (run.step, run.valid_metrics, final_state, arithmetic)
            write_outputs(cfg, model, *outputs, scores_path, final_path)
            if metrics_path is not None:
                publish_metrics(out_dir, metrics_path)
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


def mask_generator(cfg: TrainConfig) -> torch.Generator:
    """The generator of a run's masks at its start: one stream on the host (masks are drawn where batches are
    built), the same on every rank."""
    return torch.Generator().manual_seed(derived_seed(cfg.seed, 0, _MASK_STREAM))


def _layout_line(layout: StepLayout) -> str:
    return (
        f"pmlm pretrain: {layout.tokens_per_step:,} tokens per step = {layout.world} rank(s) x "
        f"{layout.accumulation} micro-batch(es) of {layout.micro_tokens:,} tokens"
        + (f" ({layout.note})" if layout.note else "")
    )


def _streams(cfg: TrainConfig, shards_dir: str | Path) -> tuple[ShardStream, ShardStream]:
    """The train and valid streams of whole steps, every rank's alike (``train.step_layout``)."""
    stream_args = {
        "tokens_per_batch": cfg.tokens_per_step,
        "max_len": cfg.max_len,
        "buffer_rows": cfg.data.buffer_rows,
        "pad_to_multiple": cfg.data.pad_to_multiple,
        "seed": cfg.seed,
    }
    train_stream = ShardStream(shards_dir, "train", num_workers=cfg.data.num_workers, **stream_args)
    return train_stream, ShardStream(shards_dir, "valid", **stream_args)


def _wrap(
    objective: PretrainingObjective, cfg: TrainConfig, device, rank: int, world: int, use_fsdp: bool
) -> tuple[nn.Module, torch.optim.AdamW]:
    """The module the loop calls (FSDP-sharded, DDP-wrapped or the objective itself) and its AdamW, with weight
    decay on matrices only; the learning rate is set by hand from the schedule."""
    model = objective.model
    decay = {name for name, p in objective.named_parameters() if p.dim() >= 2}  # matrices; not biases / norms
    wrapped = replicate(objective, model.encoder.layers, device, rank, world, use_fsdp)
    if cfg.compile:
        # whole (one graph); per layer under FSDP, whose parameter gathers run per layer; as CUDA graphs of the one
        # packed shape with cuda_graphs
        if cfg.cuda_graphs and device.type != "cuda":
            raise ConfigError(f"cuda_graphs needs a CUDA device, and this run trains on {device.type}")
        options = {"mode": "reduce-overhead"} if cfg.cuda_graphs else {}
        model.encoder.compile_encoder(per_layer=use_fsdp, static=cfg.cuda_graphs, **options)
    named = [(clean_name(n), p) for n, p in wrapped.named_parameters() if p.requires_grad]
    return wrapped, torch.optim.AdamW(
        [
            {"params": [p for n, p in named if n in decay], "weight_decay": cfg.optim.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ],
        lr=cfg.optim.lr,
        betas=cfg.optim.betas,
        eps=cfg.optim.eps,
        fused=device.type == "cuda",
    )
