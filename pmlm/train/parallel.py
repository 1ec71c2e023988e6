"""What a run on several ranks needs beyond one process: the process group and its bounded collectives, the DDP /
FSDP wrappers and their gradient reduction, the agreement of every rank on a stop, and one line when a rank is
lost. Pre-training uses it (``train.pretrain``), and the engine through ``agree``."""

from __future__ import annotations

import inspect
import os
import re
import socket
import sys
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from pmlm.errors import ConfigError, PmlmError
from pmlm.train import COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S
from pmlm.train.checkpoint import latest_checkpoint

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
