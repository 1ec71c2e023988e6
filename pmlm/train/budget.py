"""What one pre-training step costs, worked out before any GPU is asked for: model FLOPs per batch and the peak
memory per GPU of a recipe's largest micro-batch (weights, gradients, AdamW state, the tensors autograd keeps, the
backward's working set), under bf16 autocast or fp32, with DDP or FSDP.

The memory count follows the model's own code tensor by tensor (``pmlm.model.encoder``, ``heads``, ``fused_ce``,
``objectives``): every tensor autograd saves for the backward of one micro-batch, in the dtype it is saved in.
Under bf16 autocast a Linear saves the bf16 cast of its weight and its bf16 input, and the residual stream, the
LayerNorms' inputs and outputs are bf16 (``encoder.LayerNorm``); CUDA's dropout saves a bool mask, CPU's a mask of
its input's dtype; fused attention (FlashAttention, CPU SDPA without dropout) keeps q, k, v, the output and the row
log-sum-exp (the CPU dropout kernel of ``pmlm.model.dropout_attention`` is not modelled). The pair head keeps, per
unordered pair of masked residues, the two gathered rows, their product, both orders' activations and LayerNorm
input, and the gradient its fused output layer computed in the forward (``fused_ce``: no logits are kept). The peak
comes at the end of the forward or the start of the backward: all of that, plus the encoder's output and the
largest transient tensors (``backward_working_set``).
tests/test_plan.py checks the kept tensors against the CPU allocator's live bytes after a forward, and the whole
count against the measured peak of real training steps (``measured_bytes``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from pmlm.choices import Device, Precision
from pmlm.config.pretraining import TrainConfig
from pmlm.errors import ConfigError
from pmlm.model.config import ModelConfig
from pmlm.model.fused_ce import CHUNK_BYTES, CLASS_MULTIPLE
from pmlm.model.objective import Objective
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model
from pmlm.tokens import max_residues, round_up

FP32, BF16, INT64 = Precision.FP32.bytes, Precision.BF16.bytes, 8
NORM_STATS = 2 * FP32  # LayerNorm keeps a mean and a reciprocal std per row
ADAM_STATE = 2 * FP32  # exp_avg and exp_avg_sq per parameter
GIB = 2**30


@dataclass(frozen=True)
class MicroBatch:
    """A batch of ``rows`` sequences of ``residues`` residues each (plus <cls> and <eos>), padded to ``width``,
    with ``masked`` masked standard residues per row."""

    rows: int
    width: int
    residues: int
    masked: int

    @property
    def tokens(self) -> int:
        """Non-pad tokens."""
        return self.rows * (self.residues + 2)

    @property
    def pairs(self) -> int:
        """Unordered pairs of masked residues within a row, summed over rows."""
        return self.rows * (self.masked * (self.masked - 1) // 2)


def largest_micro_batch(cfg: TrainConfig, world_size: int = 1, accumulation: int = 1) -> MicroBatch:
    """The micro-batch that needs most memory under ``cfg`` when each step's batch is split into ``world_size x
    accumulation`` parts (``train.step_layout``): rows of the full crop length fill the step's budget (the most
    masked pairs a budget can hold), a part takes up to ``ceil(rows / parts)`` of them, each with the most masked
    residues the masking can draw."""
    width = round_up(cfg.max_len, cfg.data.pad_to_multiple)
    rows = max(1, -(-(cfg.tokens_per_step // width) // (world_size * accumulation)))
    residues = max_residues(cfg.max_len)
    # mask_tokens draws floor(mask_prob * n + u), u in [0, 1): at most ceil(mask_prob * n)
    return MicroBatch(rows, width, residues, min(residues, math.ceil(cfg.objective.mask_prob * residues)))


@dataclass(frozen=True)
class Arithmetic:
    """How a step computes: bf16 autocast or fp32, on CUDA or on CPU (their autocast and dropout differ)."""

    precision: Precision  # resolved: fp32 or bf16
    device: str = Device.CUDA  # a torch device type

    @property
    def act(self) -> int:
        """Bytes per element of matmul inputs and outputs, and of the residual stream (LayerNorms' outputs)."""
        return self.precision.bytes

    @property
    def bf16(self) -> bool:
        return self.precision is Precision.BF16

    @property
    def cuda(self) -> bool:
        return self.device == Device.CUDA

    def dropout_mask(self, input_bytes: int) -> int:
        """Bytes per element of the mask a dropout keeps: CUDA's is bool, CPU's has its input's dtype."""
        return 1 if self.cuda else input_bytes

    def processed(self, batch: MicroBatch) -> int:
        """Tokens each encoder layer processes: a padded batch is packed to its real tokens on CUDA under bf16
        (``attention: auto``), elsewhere every position is computed."""
        return batch.tokens if self.bf16 and self.cuda else batch.rows * batch.width


@dataclass(frozen=True)
class Parameters:
    total: int  # every parameter
    linear: int  # weights and biases of Linear layers (autocast keeps a bf16 copy of these)
    per_layer: int  # one encoder layer (FSDP gathers one at a time)

    @classmethod
    def of(cls, model: nn.Module) -> Parameters:
        """The exact counts of ``model`` (a run's own, or one built on the meta device: ``count_parameters``)."""
        linear = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters())
        per_layer = sum(p.numel() for p in model.encoder.layers[0].parameters()) if model.encoder.layers else 0
        return cls(sum(p.numel() for p in model.parameters()), linear, per_layer)


def count_parameters(model_cfg: ModelConfig, objective: Objective) -> Parameters:
    """The parameters of the model ``objective`` trains, built on the meta device (no memory, no time)."""
    with torch.device("meta"):
        return Parameters.of(build_model(model_cfg, ObjectiveConfig(name=objective.name)))


def unmodelled(model_cfg: ModelConfig, objective: Objective) -> str | None:
    """Why the memory count does not cover this model, or None."""
    if objective.triple_head:  # build_model leaves out a model.triple_head that the objective does not train
        return "the triple head"
    if model_cfg.product_base or model_cfg.pair_unary:
        return "model.product_base / model.pair_unary"
    if not model_cfg.pair_vocab.residue_pairs and objective.pair_head:
        return "pair_vocab full"
    return None


def _mlp_block(rows: int, width: int, first_input: int, activation: str, precision: Arithmetic) -> int:
    """Bytes kept by Linear -> activation -> LayerNorm -> (what keeps its output: a Linear's input, or the fused
    output layer's input gradient of the same size) on ``rows`` rows of ``width`` (both heads' shape),
    ``first_input`` bytes per element kept by the first Linear."""
    a = precision.act
    kept = first_input * width  # the first Linear's input
    kept += a * width  # relu keeps its output, gelu its input
    if activation == "gelu":
        kept += a * width  # gelu's output, which the LayerNorm keeps (relu's output is the same tensor)
    kept += NORM_STATS + a * width  # statistics; the output's keeper
    return rows * kept


def encoder_bytes(model_cfg: ModelConfig, batch: MicroBatch, precision: Arithmetic) -> dict[str, int]:
    """Bytes the encoder keeps for the backward: embeddings, every layer, the final LayerNorm."""
    a, C, F, H = precision.act, model_cfg.hidden, model_cfg.ffn, model_cfg.heads
    X = precision.processed(batch)
    drop = precision.dropout_mask(a) if model_cfg.dropout > 0 else 0
    # first Linear's input; q, k, v; the fused kernel's output and its log-sum-exp per row and head
    layer = a * C + 3 * a * C + a * C + FP32 * H
    layer += 2 * drop * C + 2 * (a * C + NORM_STATS)  # two dropouts; two LayerNorms on the residual stream
    layer += a * C  # the feed-forward's first Linear keeps its input
    layer += a * F * (2 if model_cfg.activation == "gelu" else 1)  # relu: its output; gelu: input and output
    if model_cfg.activation_dropout > 0:
        layer += a * F + precision.dropout_mask(a) * F
    embed = INT64  # token ids
    if model_cfg.embedding_norm:
        embed += a * C + NORM_STATS
    if model_cfg.dropout > 0:
        embed += precision.dropout_mask(a) * C  # the embeddings in the stream's dtype
    final = a * C + NORM_STATS if model_cfg.norm.final else 0
    return {"embeddings": X * embed, "layers": X * layer * model_cfg.num_layers, "final_norm": X * final}


def _padded_classes(classes: int, precision: Arithmetic) -> int:
    """The fused output layer's class dimension: padded on a GPU (``fused_ce``)."""
    return round_up(classes, CLASS_MULTIPLE) if precision.cuda else classes


def head_bytes(
    model_cfg: ModelConfig, objective: Objective, batch: MicroBatch, precision: Arithmetic
) -> dict[str, int]:
    """Bytes the token and pair heads and their losses keep: the masked residues' rows gathered once, the token head
    on them and its fp32 log-probabilities, the pair head on their pairs (both orders) and its fused loss's
    gradients; pmlm_pair_only's diagonal through the pair head's logits."""
    a, C, K = precision.act, model_cfg.hidden, model_cfg.pair_classes
    N = batch.rows * batch.masked  # masked residues
    out: dict[str, int] = {}
    gathered = N * INT64  # the gather's index (the masked residues' rows)
    if objective.token_head:
        token = _mlp_block(N, C, a, model_cfg.activation, precision)  # the gathered rows are its first input
        token += N * (FP32 * 20 + INT64)  # log-probabilities, targets
        out["token_head"] = token + gathered
    if not objective.pair_head:
        return out
    P = batch.pairs
    pair = 2 * P * INT64  # both indices of every pair
    if not objective.token_head:
        pair += gathered + N * a * C  # the gathered rows, kept by the difference projection
    pair += P * 3 * a * C  # h_i, h_j and their product (the product projection's input)
    pair += _mlp_block(2 * P, 2 * C, 0, model_cfg.activation, precision)  # both orders' block after the product
    pair += FP32 * (2 * C + 1) * _padded_classes(K, precision)  # the fused output layer's weight and bias gradients
    weight_casts = 1 + -(-max(P, 1) // model_cfg.pair_chunk_size)
    if objective.diagonal:
        # the diagonal (i, i), one order: the same block, its logits' fp32 log-probabilities and labels (the
        # marginal it reports is not part of the loss: nothing of it is kept)
        pair += N * INT64 + N * 3 * a * C + _mlp_block(N, 2 * C, 0, model_cfg.activation, precision)
        pair += N * (FP32 * K + INT64)
        weight_casts += 2
    if precision.bf16:  # weight casts the pair head makes per chunk (its split first weight is not a leaf)
        pair += BF16 * (2 * C * C) * weight_casts
    out["pair_head"] = pair
    return out


def backward_working_set(model_cfg: ModelConfig, objective: Objective, batch: MicroBatch, precision: Arithmetic) -> int:
    """What is allocated beside the kept tensors when the step peaks: the encoder's output, which the heads read,
    and the largest transient tensors. With a pair head: one chunk of the fused loss (its fp32 logits,
    probabilities and their gradient, ``fused_ce.CHUNK_BYTES`` each at most) or, at the start of the backward, the
    pair block's gradients (three of 2P x 2C); without, one fp32 gradient of the widest activation (tokens x
    ffn)."""
    X = precision.processed(batch)
    working = X * model_cfg.hidden * precision.act
    if not objective.pair_head:
        return working + X * model_cfg.ffn * FP32
    rows = 2 * batch.pairs
    chunk = min(rows, max(1, CHUNK_BYTES // (FP32 * _padded_classes(model_cfg.pair_classes, precision))))
    fused = 3 * chunk * _padded_classes(model_cfg.pair_classes, precision) * FP32
    backward = 3 * rows * 2 * model_cfg.hidden * precision.act
    return working + max(fused, backward)


def peak_memory(
    cfg: TrainConfig, params: Parameters, world_size: int = 1, precision: Arithmetic | None = None, accumulation=1
) -> dict:
    """Peak bytes per GPU of one training step of ``cfg`` on its largest micro-batch (``world_size x accumulation``
    micro-batches per step), by component.

    ``params``: the model's (``Parameters.of`` the run's own, ``count_parameters`` without one). ``precision``
    defaults to what the recipe runs on a GPU (bf16 autocast unless ``bf16: false``). Parameters, gradients and
    AdamW state are sharded over ``world_size`` under FSDP (then the gathered layers are added); under DDP every
    rank holds them whole, plus DDP's gradient buckets."""
    precision = precision or Arithmetic(cfg.precision.on(Device.CUDA))
    model_cfg, objective = cfg.model_config(), cfg.objective.kind
    why = unmodelled(model_cfg, objective)
    if why is None and not precision.cuda and not precision.bf16 and model_cfg.attention_dropout > 0:
        # pmlm.model.dropout_attention keeps every block's probabilities and NumPy masks until the graph is freed
        why = "attention dropout on CPU (its blockwise kernel)"
    if why is not None:
        raise ConfigError(f"the memory estimate does not model {why}")
    batch = largest_micro_batch(cfg, world_size, accumulation)
    shards = world_size if cfg.fsdp else 1
    static = {
        "weights": FP32 * params.total // shards,
        # gradients persist between the micro-batches of an accumulation (set to None between steps)
        "gradients": FP32 * params.total // shards if accumulation > 1 else 0,
        "adamw_state": ADAM_STATE * params.total // shards,
        "bf16_weight_copies": BF16 * params.linear if precision.bf16 else 0,
    }
    if cfg.fsdp:  # one layer gathered and the next prefetched, and a layer's full gradient before its reduce-scatter
        static["fsdp_gathered"] = 3 * FP32 * params.per_layer
    elif world_size > 1:
        static["ddp_buckets"] = FP32 * params.total
    kept = {**encoder_bytes(model_cfg, batch, precision), **head_bytes(model_cfg, objective, batch, precision)}
    working = {"backward_working_set": backward_working_set(model_cfg, objective, batch, precision)}
    parts = {**static, **kept, **working}
    return {
        "micro_batch": dataclasses.asdict(batch),
        "precision": precision.precision,
        "device": precision.device,
        "world_size": world_size,
        "accumulation": accumulation,
        "sharded": bool(cfg.fsdp),
        "parameters": params.total,
        "bytes": parts,
        "total_bytes": sum(parts.values()),
    }


def model_flops(
    num_layers: int,
    hidden: int,
    ffn: int,
    objective: Objective,
    seq_tokens: list[int],
    masked: list[int],
    classes: int = 400,
) -> int:
    """Forward + backward model FLOPs of one batch, counted on non-pad tokens only (bench/README.md, "On a GPU")::

        6 x layers x (4 C^2 + 2 C F) x T  +  12 x layers x C x sum_s n_s^2  +  6 x (C^2 + 20 C) x M
        + 6 x (2 C^2 (U + P) + 2 C K x 2 P)      (pair head)

    T tokens in sequences of n_s tokens, M masked residues (``masked`` per sequence), U masked positions with a
    partner, P unordered pairs (with the diagonal for pmlm_pair_only), K pair classes; embeddings, norms and
    softmax are not counted."""
    C, F = hidden, ffn
    T = sum(seq_tokens)
    flops = 6 * num_layers * (4 * C * C + 2 * C * F) * T + 12 * num_layers * C * sum(n * n for n in seq_tokens)
    if objective.token_head:
        flops += 6 * (C * C + 20 * C) * sum(masked)
    if objective.pair_head:
        diagonal = objective.diagonal
        U = sum(m for m in masked if m >= 2 or diagonal)
        P = sum(m * (m - 1) // 2 + (m if diagonal else 0) for m in masked)
        flops += 6 * (2 * C * C * (U + P) + 2 * C * classes * 2 * P)
    return flops


def flops_per_token(cfg: TrainConfig) -> float:
    """Model FLOPs per token of ``cfg``'s largest micro-batch (rows of the full crop length)."""
    batch = largest_micro_batch(cfg)
    m = cfg.model_config()
    per_row, masked = [batch.residues + 2] * batch.rows, [batch.masked] * batch.rows
    flops = model_flops(m.num_layers, m.hidden, m.ffn, cfg.objective.kind, per_row, masked, m.pair_classes)
    return flops / batch.tokens


def measured_bytes(run: Callable[[], object], device: torch.device) -> tuple[int, int]:
    """(peak, still allocated at the end) in bytes the allocator hands out while ``run()`` runs, above what was
    allocated before it.

    CUDA: ``torch.cuda.max_memory_allocated`` and ``memory_allocated``. CPU: the profiler's allocation and free
    events of torch's CPU allocator, summed in time order. The profiler records the calling thread's allocations
    only, so run it with one torch thread (``torch.set_num_threads(1)``) and no loader threads."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base, torch.cuda.memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    cpu = torch.autograd.DeviceType.CPU
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == cpu]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak, live
