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

The ranks themselves: the process group (NCCL on CUDA, gloo on CPU) with a bounded wait in every collective, the
DDP / FSDP wrappers that reduce the gradients once per step (on its last micro-batch), every rank's agreement on a
stop, and one line when a rank is lost.
"""

from __future__ import annotations

import inspect
import os
import re
import socket
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from pmlm.config.pretraining import AUTO, TrainConfig
from pmlm.errors import ConfigError, PmlmError
from pmlm.model.layout import StaticShape
from pmlm.model.objective import ObjectiveOutputs
from pmlm.model.objectives import MaskedBatch
from pmlm.model.step_inputs import StepInputs
from pmlm.tokens import round_up
from pmlm.train import COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S
from pmlm.train.budget import GIB, Arithmetic, peak_memory
from pmlm.train.checkpoint import latest_checkpoint

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
    cfg: TrainConfig, world: int, card_bytes: int | None = None, precision: Arithmetic | None = None, params=None
) -> StepLayout:
    """The step layout of ``cfg`` on ``world`` ranks. An explicit ``data.tokens_per_batch`` is checked; ``auto``
    takes the fewest micro-batches per rank whose estimated peak (``budget.peak_memory`` of the model's ``params``,
    needed with a card, at ``precision``) fits ``card_bytes`` with CARD_HEADROOM to spare, or one micro-batch per
    rank without a card (CPU) or where the estimate does not model the recipe (the layout's ``note`` says so)."""
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
            peak = peak_memory(cfg, params, world, precision, accumulation)["total_bytes"]
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
    static = static_shape(cfg, micro_tokens) if cfg.cuda_graphs and layout.packs else None
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
) -> tuple[ObjectiveOutputs, torch.Tensor]:
    """One micro-batch (``step_parts``): (its outputs, the loss to backward).

    The loss is the micro-batch's share of the step's loss (``sizes``: the step's sample sizes) times ``world``: DDP
    and FSDP average the ranks' gradients, and the step's gradient is their sum. A part without rows runs with
    weight 0 and counts nothing, so that every rank takes part in every collective."""
    with autocast():
        out = module(inputs, sizes)
    if not live:
        return out.scaled(0), out.loss * 0
    return out, out.loss * world


# the only buffer (sinusoidal positions) is identical everywhere, so no per-forward broadcast
# (the keyword was renamed in torch 2.13)
_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)


def join_process_group(device: torch.device) -> bool:
    """Start this process's group (NCCL on CUDA, gloo on CPU) unless the caller has one; True if started here."""
    if dist.is_initialized():
        return False  # a caller's own process group is left alone
    backend, device_id = ("nccl", device) if device.type == "cuda" else ("gloo", None)
    # a bounded wait in every collective: a rank that hangs or vanishes fails the job instead of holding it
    dist.init_process_group(backend, device_id=device_id, timeout=collective_timeout())
    return True


def replicate(objective: nn.Module, layers: nn.ModuleList, device: torch.device, rank: int, world: int, fsdp: bool):
    """The module the loop calls: ``objective`` FSDP-sharded (per layer of ``layers``, then whole), DDP-wrapped
    (world > 1) or itself."""
    if fsdp:
        if rank == 0:
            print(
                f"pmlm pretrain: sharding parameters and optimizer state with FSDP over {world} rank(s)",
                file=sys.stderr,
            )
        # per-layer units bound the gathered memory to about one layer; the root holds embeddings and heads
        for layer in layers:
            fully_shard(layer)
        return fully_shard(objective)
    if world > 1:
        wrapped = nn.parallel.DistributedDataParallel(
            objective, device_ids=[device.index] if device.type == "cuda" else None, **_NO_BUFFER_SYNC
        )
        if device.type == "cpu":
            wrapped.register_comm_hook(None, _allreduce_by_parameter)
        return wrapped
    return objective


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


def gradient_sync(wrapped: nn.Module, enabled: bool, world: int, use_fsdp: bool):
    """Context for one micro-batch's forward/backward: skip the cross-rank reduction unless ``enabled``."""
    if world == 1:
        return nullcontext()
    if use_fsdp:
        wrapped.set_requires_gradient_sync(enabled)
        return nullcontext()
    return nullcontext() if enabled else wrapped.no_sync()


def clean_name(name: str) -> str:
    """Parameter name without DDP / compile wrapper prefixes."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name.removeprefix("module.")


def agree(flag: bool, device: torch.device, world: int) -> bool:
    """True on every rank if it is true on any (so all ranks save and stop together)."""
    if world == 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class LostRanks(PmlmError):
    """A collective failed: another rank died, hung past the collective timeout, or became unreachable. The process
    ends as soon as it has said so (``exit_at_once``): torch's teardown of a process group whose peer is gone can
    deadlock (DDP's reducer destroys the gloo group, which joins its loop thread while that thread waits for the
    interpreter lock the destructor holds), and nothing is left to save."""

    exit_at_once = True


def collective_timeout() -> timedelta:
    """How long one collective waits for the other ranks (COLLECTIVE_TIMEOUT_ENV, set by ``pmlm launch``)."""
    value = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
    if not value:
        return timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT_S)
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{COLLECTIVE_TIMEOUT_ENV} must be a whole number of seconds (at least 1), got {value!r}")
    return timedelta(seconds=int(value))


def is_communication_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed on the network side (gloo and NCCL raise RuntimeError, newer
    torch DistError), rather than a bug in the computation."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        mark in text
        for mark in (
            "gloo/transport",
            "Connection reset by peer",
            "Connection closed by peer",
            "Timed out waiting",
            "timeout caused pair closure",
            "Socket Timeout",
            "NCCL communicator was aborted",
            "Watchdog caught collective operation timeout",
        )
    )


def lost_ranks(exc: BaseException, step: int, out_dir: Path) -> LostRanks:
    """One line for the log: this rank, its host, the step, the collective's own first line, the checkpoint."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    first = re.sub(r"^\[[^\]]*/third_party/", "[", first)  # the source path of torch's build machine
    last = latest_checkpoint(out_dir)
    return LostRanks(
        f"rank {os.environ.get('RANK', '0')} on {socket.gethostname()} lost the other ranks at step {step + 1} "
        f"({first[:300]}); last checkpoint: {last or 'none'}{', rerun to resume from it' if last else ''}"
    )
