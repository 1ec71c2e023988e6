"""What a fine-tuning recipe costs on one GPU, before any data are fetched: ``pmlm plan --finetune``. Each recipe is
priced three ways side by side, the encoder frozen (the head trains), adapted (LoRA adapters and the head train:
``pmlm.adapters``) and fully fine-tuned, with

* **trainable parameters**, exact: the encoder (built on the meta device: no memory, no time), the task's head and
  the adapters are built as ``pmlm finetune`` builds them, and their parameters that take gradients are counted;
* **peak memory per GPU** of the recipe's largest micro-batch (``data.batch_size`` proteins cropped to
  ``data.crop``), from the pre-training budget's terms (``pmlm.train.budget``): fp32 weights; AdamW's state and (with
  ``grad_accum`` > 1) the gradients of the trainable parameters only (the optimizer step's gradients and
  temporaries where they outgrow the activations the backward frees as it makes them); autocast's bf16 copies of the trainable Linear
  weights (autocast caches casts of weights that take gradients only); the encoder's kept activations
  (``budget.encoder_bytes``) when gradients flow through it (adapted and full; a frozen encoder runs without autograd
  and keeps one layer's transients), each adapter's own kept tensors, the head's kept tensors and the backward's
  working set. Head activations are counted by shape (per protein, per residue, per pair), an approximation;
  ``tests/test_finetune_cost.py`` checks the whole count against the CPU allocator's measured peak of real steps;
* **time per epoch** at the model-FLOP rate of the encoder's preset as measured in ``config/throughput.yaml`` (a
  pre-training rate: marked ``~``), else the paper's own V100 rate (``pmlm.train.rates.paper_rate``, marked ``*``).
  FLOPs per protein of n tokens: the encoder's forward 2 x layers x (4 C^2 + 2 C F) x n + 4 x layers x C x n^2,
  times 1 (frozen: forward only), 2 (adapted: the backward computes input gradients, not the frozen weights'), or 3
  (full); plus the pair features' first block (M+) and a ResNet head's convolutions on every pair, times 3 (both
  train).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pmlm.adapters import attach, resolve_targets, trunk_of
from pmlm.artefacts import read_encoder_info
from pmlm.choices import Choice, Device
from pmlm.config.finetuning import AdapterConfig, FinetuneConfig
from pmlm.errors import ConfigError
from pmlm.model.config import ModelConfig, model_config
from pmlm.model.objectives import ObjectiveConfig
from pmlm.model.task_heads import HeadKind, TaskModel, resolve_features
from pmlm.pretrained import build_model, encoder_configs, encoder_weights, is_esm
from pmlm.tasks.registry import task_named
from pmlm.tasks.task import PAIR, PROTEIN
from pmlm.tokens import max_residues
from pmlm.train.budget import ADAM_STATE, BF16, FP32, Arithmetic, MicroBatch, encoder_bytes, flops_per_token
from pmlm.train.jobs import recipe_job
from pmlm.train.rates import paper_rate
from pmlm.train.throughput import ANY_OBJECTIVE, MeasuredRate
from pmlm.vocabulary import FEATURES_M_PLUS


class FinetuneMode(Choice):
    """What a fine-tuning run trains: the head alone, adapters inside the encoder too, or all of the encoder."""

    FROZEN = "frozen"
    ADAPTER = "adapter"
    FULL = "full"


# forward-pass equivalents of one training step's encoder work
PASSES = {FinetuneMode.FROZEN: 1, FinetuneMode.ADAPTER: 2, FinetuneMode.FULL: 3}


@dataclass(frozen=True)
class EncoderSpec:
    """The encoder a recipe is priced on: its label, dims (for the activation terms) and objective."""

    label: str
    model: ModelConfig
    objective: str
    preset: str | None = None

    def build(self) -> nn.Module:
        """The encoder model, on the current default device (the meta device when pricing)."""
        return build_model(self.model, ObjectiveConfig(name=self.objective))


def encoder_spec(encoder: str | Path | None = None, preset: str | None = None, objective: str = "pmlm") -> EncoderSpec:
    """An encoder artefact's dims (``encoder``: MODEL as every command reads it; pmlm encoders only), or a preset's
    (config/train/<preset>.yaml's model section joined with the objective's layers)."""
    if encoder is not None:
        weights = encoder_weights(encoder)
        info = read_encoder_info(weights)
        if is_esm(info):
            raise ConfigError(f"{weights}: an ESM encoder; price its shape with --preset (e.g. xl for ESM-2 650M)")
        model_cfg, objective_cfg = encoder_configs(info, weights)
        return EncoderSpec(str(encoder), model_cfg, objective_cfg.name)
    return EncoderSpec(f"{objective}-{preset}", model_config(preset, objective), objective, preset)


def with_mode(cfg: FinetuneConfig, mode: FinetuneMode) -> FinetuneConfig:
    """``cfg`` as a frozen, adapted (the recipe's adapter, else the default LoRA) or fully fine-tuned run."""
    mode = FinetuneMode(mode)
    adapter = (cfg.adapter or AdapterConfig()) if mode is FinetuneMode.ADAPTER else None
    return dataclasses.replace(cfg, freeze_encoder=mode is FinetuneMode.FROZEN, adapter=adapter)


def mode_of(cfg: FinetuneConfig) -> FinetuneMode:
    if cfg.freeze_encoder:
        return FinetuneMode.FROZEN
    return FinetuneMode.FULL if cfg.adapter is None else FinetuneMode.ADAPTER


def task_model(cfg: FinetuneConfig, spec: EncoderSpec) -> TaskModel:
    """The run's model as ``pmlm finetune`` builds it, on the meta device."""
    task = task_named(cfg.task)
    with torch.device("meta"):
        encoder = spec.build()
        features = resolve_features(cfg.head.features, task.reads_pairs, encoder)
        cfg = dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, features=features))
        head = task.build_head(cfg, spec.model.hidden)
        adapter = attach(encoder, cfg.adapter) if cfg.adapter is not None else None
        return TaskModel(encoder, head, cfg.task, features, cfg.freeze_encoder, adapter)


def parameters(model: TaskModel) -> dict[str, int]:
    """Counts of the model's parameters: all of the encoder, the head, the adapters, and those that train."""
    adapter = {id(p) for p in model.adapter.parameters()} if model.adapter is not None else set()
    encoder = [p for p in model.encoder.parameters() if id(p) not in adapter]
    return {
        "encoder": sum(p.numel() for p in encoder),
        "head": sum(p.numel() for p in model.head.parameters()),
        "adapter": sum(p.numel() for p in model.adapter.parameters()) if model.adapter is not None else 0,
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def _trained_linear(model: TaskModel) -> int:
    """Parameters of Linear layers (and adapters) that take gradients: autocast keeps a bf16 copy of each."""
    return sum(
        p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters() if p.requires_grad
    )


def _adapter_kept(model: TaskModel, cfg: AdapterConfig, X: int, precision: Arithmetic) -> int:
    """Bytes each adapted layer keeps beside its base layer's: the dropout's output, which A keeps (without dropout
    A keeps the input the base Linear keeps already), and A's output, which B keeps. The dropout's mask is kept only
    where the input takes gradients, and is a bool on CUDA: not counted."""
    a, total = precision.act, 0
    for module in trunk_of(model.encoder).modules():
        lora_a = getattr(module, "lora_A", None)
        if not isinstance(lora_a, nn.ModuleDict) or not lora_a:
            continue
        inputs = next(iter(lora_a.values())).in_features
        if cfg.dropout > 0:
            total += X * inputs * a
        total += X * cfg.rank * a
    return total


def _head_kept(cfg: FinetuneConfig, spec: EncoderSpec, rows: int, residues: int, precision: Arithmetic) -> int:
    """Bytes the head keeps for its backward, by the task's level (an approximation by shape)."""
    a, C, h = precision.act, spec.model.hidden, cfg.head
    level = task_named(cfg.task).level
    if level == PROTEIN:
        return rows * (C + 3 * h.mlp_hidden) * a
    if level != PAIR:
        return rows * residues * 3 * max(h.mlp_hidden, h.conv_hidden) * a
    pairs = rows * residues * residues
    features = 2 * C * a if pairs * 2 * C <= h.pair_chunk_elements else 0  # recomputed in the backward if chunked
    kept = pairs * (features + 3 * FP32)  # one chunk's features; logits, targets and mask
    return kept + pairs * HeadKind.pair_blocks(h)[0] * a


def peak_memory(cfg: FinetuneConfig, spec: EncoderSpec, residues: int, precision: Arithmetic) -> dict:
    """Peak bytes of one training step of ``cfg``'s largest micro-batch (``residues`` per protein), by component."""
    model = task_model(cfg, spec)
    counts = parameters(model)
    rows = cfg.data.batch_size
    batch = MicroBatch(rows, residues + 2, residues, 0)
    X = precision.processed(batch)
    m = spec.model
    trained = counts["trainable"]
    static = {
        "weights": FP32 * (counts["encoder"] + counts["head"] + counts["adapter"]),
        "position_table": FP32 * m.max_len * m.hidden,  # a buffer, computed at load (pmlm.model.encoder)
        "gradients": FP32 * trained if cfg.grad_accum > 1 else 0,  # kept between the micro-batches of a step
        "adamw_state": ADAM_STATE * trained,
        "bf16_weight_copies": BF16 * _trained_linear(model) if precision.bf16 else 0,
    }
    if cfg.freeze_encoder:  # no autograd in the encoder: one layer's transients (the stream, its residual, the
        # feed-forward's hidden layer before and after the activation)
        kept = {"encoder": 0}
        working = X * (2 * m.hidden + 2 * m.ffn) * precision.act
    else:
        kept = {"encoder": sum(encoder_bytes(m, batch, precision).values())}
        if cfg.adapter is not None:
            kept["adapters"] = _adapter_kept(model, cfg.adapter, X, precision)
        working = X * m.hidden * precision.act + X * m.ffn * FP32  # the output; the widest fp32 gradient
    kept["head"] = _head_kept(cfg, spec, rows, residues, precision)
    parts = {**static, **kept, "backward_working_set": working}
    # the backward frees the activations as it makes the gradients; the optimizer step then holds the gradients and,
    # off CUDA (AdamW's loop over tensors; CUDA's fused kernel makes none), two temporaries of the largest trained
    # tensor. The step peaks at the larger of the two: on a large encoder with a short batch, the optimizer step
    # (2.7 GB of gradients for 670M parameters beside 0.3 GB of activations)
    largest = max((p.numel() for p in model.parameters() if p.requires_grad), default=0)
    optimizer_step = FP32 * trained + (0 if precision.cuda else 2 * FP32 * largest)
    backward = sum(kept.values()) + working + static["gradients"]
    parts["optimizer_step_beyond_backward"] = max(0, optimizer_step - backward)
    # loading computes the position table in float64 (the angles, their sines and cosines, both halves joined), 16
    # bytes per entry beside the weights before training allocates anything: the peak of a step that needs less
    training = sum(parts.values()) - static["weights"] - static["position_table"]
    parts["load_transient_beyond_training"] = max(0, 16 * m.max_len * m.hidden - training)
    return {"parameters": counts, "bytes": parts, "total_bytes": sum(parts.values())}


def protein_flops(cfg: FinetuneConfig, spec: EncoderSpec, residues: int) -> float:
    """Model FLOPs of one training pass over a protein cropped to ``residues`` (module docstring)."""
    m, n = spec.model, residues + 2
    forward = 2 * m.num_layers * (4 * m.hidden**2 + 2 * m.hidden * m.ffn) * n + 4 * m.num_layers * m.hidden * n * n
    flops = PASSES[mode_of(cfg)] * forward
    if task_named(cfg.task).level == PAIR:
        pairs, h = residues * residues, cfg.head
        head = 2 * 2 * m.hidden * (m.hidden if cfg.head.features == FEATURES_M_PLUS else 1)
        flops += 3 * pairs * (head + HeadKind.pair_blocks(h)[1])
    return flops


def plan_finetune(
    cfg: FinetuneConfig,
    spec: EncoderSpec,
    lengths: list[int],
    flop_rate: float,
    rate_note: str,
    precision: Arithmetic | None = None,
) -> list[dict]:
    """One row per mode (the recipe's own first): trainable parameters, peak memory, time per epoch and for the
    recipe's steps, for the training set's protein ``lengths``."""
    if not lengths:
        raise ConfigError("no training proteins to price (give --train or --proteins with --mean-length)")
    precision = precision or Arithmetic(cfg.precision.on(Device.CUDA))
    window = max_residues(spec.model.max_len)
    crop = min(cfg.data.crop or window, window)
    own = mode_of(cfg)
    rows = []
    for mode in sorted(FinetuneMode, key=lambda m: m is not own):
        run = with_mode(cfg, mode)
        if run.adapter is not None:
            with torch.device("meta"):
                targets = resolve_targets(run.adapter, spec.build())  # checked against the encoder
            run = dataclasses.replace(run, adapter=dataclasses.replace(run.adapter, targets=targets))
        memory = peak_memory(run, spec, min(crop, max(lengths)), precision)
        epoch = sum(protein_flops(run, spec, min(n, crop)) for n in lengths)
        steps_per_epoch = math.ceil(len(lengths) / (run.data.batch_size * run.grad_accum))
        rows.append(
            {
                "mode": mode,
                "recipe": mode is own,
                "adapter": None if run.adapter is None else {"rank": run.adapter.rank, "targets": list(targets)},
                "parameters": memory["parameters"],
                "peak_bytes": memory["total_bytes"],
                "bytes": memory["bytes"],
                "epoch_flops": epoch,
                "epoch_hours": epoch / flop_rate / 3600,
                "steps_per_epoch": steps_per_epoch,
                "epochs": run.optim.total_steps / steps_per_epoch,
                "run_hours": epoch / flop_rate / 3600 * run.optim.total_steps / steps_per_epoch,
                "rate": rate_note,
                "precision": precision.precision,
            }
        )
    return rows


def flop_rate(
    spec: EncoderSpec, rates: dict[str, dict[str, MeasuredRate]], root: str | Path = "."
) -> tuple[float, str]:
    """(model FLOP/s per GPU, what the table says of it): the encoder preset's measured pre-training rate in model
    FLOP/s (its own objective's, else any measured for the preset), else the paper's own V100 rate."""
    measured = rates.get(spec.preset or "", {})
    recipe = Path(root) / "config" / "train" / f"{spec.preset}.yaml"
    for key in (spec.objective, ANY_OBJECTIVE, *measured):
        if key in measured and recipe.exists():
            rate = measured[key]
            objective = spec.objective if key == ANY_OBJECTIVE else key
            flops = rate.tokens_per_second * flops_per_token(recipe_job(recipe, objective).config)
            return flops, f"~ {flops / 1e12:.1f} TFLOP/s, {spec.preset} {objective} pre-training {rate.describe()}"
    flops = paper_rate(root)
    return flops, (
        f"* {flops / 1e12:.1f} TFLOP/s assumed: the paper's own V100 rate (no measured rate for "
        f"{spec.preset or spec.label} in config/throughput.yaml); fine-tuning's small batches may run slower"
    )


def render(rows: list[dict], spec: EncoderSpec, task: str, proteins: int) -> str:
    """The rows as a table, with the rate's note."""
    head = (
        f"Fine-tuning {task} on {spec.label} ({spec.model.num_layers} layers x {spec.model.hidden}), {proteins:,} "
        f"training proteins, one GPU, {rows[0]['precision']}\n"
    )
    lines = [
        "| mode | trainable parameters | share of encoder | peak memory / GPU | time / epoch | epochs | run |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        p = r["parameters"]
        name = f"{r['mode']} (rank {r['adapter']['rank']})" if r["adapter"] else r["mode"]
        lines.append(
            f"| {name}{' (recipe)' if r['recipe'] else ''} | {p['trainable']:,} | {p['trainable'] / p['encoder']:.2%} "
            f"| {_bytes(r['peak_bytes'])} | {_hours(r['epoch_hours'])} | {r['epochs']:.1f} "
            f"| {_hours(r['run_hours'])} |"
        )
    return head + "\n".join(lines) + f"\n\nRate: {rows[0]['rate']}.\n"


def _hours(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.2g} s"
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.1f} h"


def _bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
