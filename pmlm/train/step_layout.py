"""How one optimizer step's batch meets the hardware: the recipe states the batch (``tokens_per_step``), the hardware
sets the micro-batch (``data.tokens_per_batch``, ``auto``: the largest the card holds by the memory estimate), and
the accumulation follows: the micro-batches each rank needs for its share of tokens_per_step (the ranks need not
divide it; the micro-batches of a rank share its tokens evenly).

Every rank reads the same stream and cuts each step's batch from its length-bucketed buffer with the budget
``tokens_per_step`` (``train.loader``). The batch's rows, shortest first, are split into ``ranks x accumulation``
contiguous parts as even as rows allow (the first ``rows mod parts`` get one row more); rank r takes parts
``r * accumulation`` to ``(r + 1) * accumulation - 1``, one per micro-batch, each cut to its own longest row. Masks
are drawn for the whole batch and the loss is divided by the whole step's sample sizes (``model.objectives``), so
the sequences, masks and loss of a step do not depend on the number of ranks or the micro-batch: the same recipe
trains the same model on 1, 4 or 8 GPUs, up to the order of floating-point sums and the dropout draws, which are
each rank's own. A part holds at most ``ceil(rows / parts)`` rows, so a micro-batch may exceed its budget by up to
one row; the memory estimate counts that row (``budget.largest_micro_batch``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pmlm.config.pretraining import AUTO, TrainConfig
from pmlm.errors import ConfigError
from pmlm.model.layout import Layout, StaticShape
from pmlm.model.objectives import MaskedBatch
from pmlm.model.step_inputs import StepInputs
from pmlm.tokens import round_up
from pmlm.train.budget import GIB, Precision, peak_memory

# a card holds a micro-batch when the estimated peak leaves this share free for the CUDA context, cuBLAS / NCCL
# workspaces and the caching allocator's fragmentation, none of which the estimate counts
CARD_HEADROOM = 0.1


@dataclass(frozen=True)
class StepLayout:
    """One optimizer step on ``world`` ranks: ``accumulation`` micro-batches of ``micro_tokens`` each per rank."""

    tokens_per_step: int
    micro_tokens: int
    world: int
    accumulation: int
    note: str = ""  # why ``auto`` could not size the micro-batch by the memory estimate, if it could not

    @property
    def parts(self) -> int:
        """Micro-batches of one step over all ranks."""
        return self.world * self.accumulation

    def rank_parts(self, rows: int, rank: int) -> list[tuple[int, int]]:
        """Row ranges ``(start, stop)`` of ``rank``'s micro-batches of a step batch of ``rows`` rows (a range is
        empty when the batch has fewer rows than parts)."""
        per_part, extra = divmod(rows, self.parts)

        def start(p: int) -> int:
            return p * per_part + min(p, extra)

        first = rank * self.accumulation
        return [(start(p), start(p + 1)) for p in range(first, first + self.accumulation)]


def row_tokens(cfg: TrainConfig) -> int:
    """Tokens of one full-length row: the smallest micro-batch that can hold every sequence."""
    return round_up(cfg.max_len, cfg.data.pad_to_multiple)


def tokens_per_rank(cfg: TrainConfig, world: int) -> int:
    """The most tokens of a step any rank computes: the step's rows are split over the ranks as evenly as they go,
    so ``world`` need not divide ``tokens_per_step`` (24 GPUs run the paper's 262,144-token step: 10,923 each at
    most). The loss is divided by the whole step's sample sizes wherever its rows are computed."""
    return -(-cfg.tokens_per_step // world)


def layout_for(cfg: TrainConfig, world: int, micro_tokens: int) -> StepLayout:
    """The layout of an explicit micro-batch (the most tokens a rank computes at once): as many micro-batches per
    rank as its share needs, split as evenly as rows allow; a one-line error if it cannot hold a full-length row."""
    row, per_rank = row_tokens(cfg), tokens_per_rank(cfg, world)
    if micro_tokens < row:
        raise ConfigError(
            f"data.tokens_per_batch {micro_tokens:,} must hold one sequence of max_len {cfg.max_len} padded to a "
            f"multiple of {cfg.data.pad_to_multiple} ({row:,} tokens)"
        )
    return _even(cfg, world, -(-per_rank // micro_tokens))


def _even(cfg: TrainConfig, world: int, accumulation: int, note: str = "") -> StepLayout:
    """``accumulation`` micro-batches per rank, each an even share of the rank's tokens."""
    micro = -(-tokens_per_rank(cfg, world) // accumulation)
    return StepLayout(cfg.tokens_per_step, micro, world, accumulation, note)


def choose_layout(
    cfg: TrainConfig, world: int, card_bytes: int | None = None, precision: Precision | None = None
) -> StepLayout:
    """The step layout of ``cfg`` on ``world`` ranks. An explicit ``data.tokens_per_batch`` is checked; ``auto``
    takes the fewest micro-batches per rank whose estimated peak (``budget.peak_memory`` at ``precision``) fits
    ``card_bytes`` with CARD_HEADROOM to spare, or one micro-batch per rank without a card (CPU) or where the estimate
    does not model the recipe (the layout's ``note`` says so)."""
    if cfg.data.tokens_per_batch != AUTO:
        return layout_for(cfg, world, int(cfg.data.tokens_per_batch))
    if card_bytes is None:
        return _even(cfg, world, 1)
    usable = card_bytes * (1 - CARD_HEADROOM)
    peak = None
    per_rank, row = tokens_per_rank(cfg, world), row_tokens(cfg)
    accumulation = 1
    while -(-per_rank // accumulation) >= row:
        layout = _even(cfg, world, accumulation)
        try:
            peak = peak_memory(cfg, world, precision, accumulation)["total_bytes"]
        except ConfigError as exc:
            note = f"{exc}: one micro-batch per rank; set data.tokens_per_batch if it does not fit the card"
            return _even(cfg, world, 1, note)
        if peak <= usable:
            return layout
        # the next count that shrinks the micro-batch's rows (the estimate counts rows, ceil(rows / parts))
        accumulation += 1
    smallest = f"; its smallest micro-batch needs {peak / GIB:.1f} GiB" if peak is not None else ""
    raise ConfigError(
        f"no micro-batch of tokens_per_step {cfg.tokens_per_step:,} over {world} ranks fits a card of "
        f"{card_bytes / GIB:.0f} GiB{smallest}: use more GPUs, FSDP (fsdp: true) or a shorter max_len"
    )


def card_memory(device: torch.device) -> int | None:
    """Bytes of the GPU a rank trains on; None on CPU, where ``auto`` takes one micro-batch per rank."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def step_parts(
    batch: MaskedBatch,
    parts: list[tuple[int, int]],
    cfg: TrainConfig,
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    grad: bool,
    micro_tokens: int = 0,
) -> list[tuple[StepInputs, bool]]:
    """The micro-batches ``parts`` (row ranges) of a step's masked ``batch`` as the device takes them, each with
    whether it holds rows: built on the host in the layout the encoder picks for ``dtype`` and ``grad``, then moved
    together, without waiting for the copies (``pmlm.model.step_inputs``). A range without rows (a step batch with
    fewer rows than micro-batches) carries the batch's first row, which ``part_outputs`` weighs 0. With
    ``cfg.cuda_graphs`` every packed micro-batch takes the one shape of ``micro_tokens`` (``static_shape``)."""
    layout = model.encoder.layout(device, dtype, grad=grad)
    static = static_shape(cfg, micro_tokens) if cfg.cuda_graphs and layout == Layout.PACKED else None
    out = []
    pad = cfg.data.pad_to_multiple
    for start, stop in parts:
        live = stop > start
        rows = batch.rows(start, stop, pad) if live else batch.rows(0, 1, pad)
        out.append((to_device(rows.step_inputs(cfg.objective, layout, model.cfg.pair_vocab, static), device), live))
    return out


def static_shape(cfg: TrainConfig, micro_tokens: int) -> StaticShape:
    """The one packed shape of every micro-batch of ``micro_tokens`` under ``cfg`` (``cuda_graphs``)."""
    return StaticShape.of_micro_batch(micro_tokens, cfg.max_len, cfg.data.pad_to_multiple)


def to_device(host, device: torch.device):
    """A host tensor (or ``StepInputs``) on ``device`` without waiting for the copy: a copy from page-locked memory
    is asynchronous, one from ordinary memory may wait for the device's queue."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def part_outputs(
    module: nn.Module, inputs: StepInputs, live: bool, sizes: torch.Tensor, world: int, autocast: Callable
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One micro-batch (``step_parts``): (its outputs, the loss to backward).

    The loss is the micro-batch's share of the step's loss (``sizes``: the step's sample sizes) times ``world``: DDP
    and FSDP average the ranks' gradients, and the step's gradient is their sum. A part without rows runs with
    weight 0 and counts nothing, so that every rank takes part in every collective."""
    with autocast():
        out = module(inputs, sizes)
    if not live:
        return {k: v * 0 for k, v in out.items()}, out["loss"] * 0
    return out, out["loss"] * world
