"""Self-attention over packed (unpadded) sequences: one op, ``pmlm::varlen_attention``, with dropout.

Packed, the T real tokens of a batch are rows of one (T, C) tensor and each sequence a run of rows between two of
the ``cu_seqlens`` offsets (the layout of FlashAttention's variable-length kernels): the encoder's projections and
feed-forward blocks skip the pads, and no query ever sees a key of another sequence. The offsets, the positions and a
bound on the longest run are decided where the batch is built, on the host (``pmlm.model.layout``), so the op never
reads a tensor back.

The op is a ``torch.library.custom_op`` with a fake implementation and its own backward op, so ``torch.compile``
traces it without a graph break and ``torch.utils.flop_counter`` counts it (docs/gpu.md, "The step on a GPU"): on
CUDA, for bf16 / fp16 with head dims a multiple of 8 up to 256 on Ampere or later, FlashAttention 2's
variable-length kernel **with** dropout; anywhere else the reference, per sequence: the CPU's fused kernel without
dropout, or the softmax written out with dropout, whose mask is a function of one seed (drawn from torch's default
generator, so ``manual_seed`` and a checkpoint's RNG state fix it) and is drawn again in the backward instead of
being kept. On a CUDA device the reference is a slow fallback (a Python loop over sequences that reads the offsets
back) and says so once on stderr; on a CPU it is the designed kernel.

Both compute ``softmax(q k^T / sqrt(D)) * keep / (1 - p) @ v`` per sequence, ``keep ~ Bernoulli(1 - p)`` per score;
the reference is what the fused kernel is tested against.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

HALF_DTYPES = (torch.bfloat16, torch.float16)
MAX_FLASH_HEAD_DIM = 256  # FlashAttention 2 kernels exist for head dims up to 256, in steps of 8
MIN_FLASH_CAPABILITY = (8, 0)  # Ampere and later
SEED_BOUND = 2**62  # the reference's dropout seeds lie in [0, SEED_BOUND)


@dataclass(frozen=True)
class Packing:
    """The sequences of packed (T, ...) rows: offsets and a bound on their length, as the op takes them."""

    cu_seqlens: Tensor  # (S + 1,) int32 offset of each sequence's first row; the last is T
    max_len: int  # no sequence has more rows than this (a bound: FlashAttention sizes its grid by it)


@functools.cache
def _capability_ok(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= MIN_FLASH_CAPABILITY


def flash_usable(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether FlashAttention's variable-length kernel takes these inputs (CUDA, half dtypes, head dims)."""
    return (
        device.type == "cuda"
        and dtype in HALF_DTYPES
        and head_dim % 8 == 0
        and head_dim <= MAX_FLASH_HEAD_DIM
        and hasattr(torch.ops.aten, "_flash_attention_forward")
        and _capability_ok(device.index if device.index is not None else torch.cuda.current_device())
    )


def packed_attention(q: Tensor, k: Tensor, v: Tensor, packing: Packing, dropout_p: float = 0.0) -> Tensor:
    """Softmax attention of each packed sequence over itself, with dropout ``dropout_p``: q, k, v (T, H, D) ->
    (T, H, D)."""
    return torch.ops.pmlm.varlen_attention(q, k, v, packing.cu_seqlens, packing.max_len, dropout_p)[0]


# --- the op ----------------------------------------------------------------------------------------------------------


@torch.library.custom_op("pmlm::varlen_attention", mutates_args=())
def varlen_attention(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_len: int, dropout_p: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out (T, H, D), logsumexp (H, T), dropout seed (2,) uint64, offset () uint64): the reference; CUDA's kernel
    below takes its place where FlashAttention runs."""
    return _reference_forward(q, k, v, cu_seqlens, dropout_p)


@varlen_attention.register_kernel("cuda")
def _varlen_attention_cuda(q, k, v, cu_seqlens, max_len, dropout_p):
    if not flash_usable(q.device, q.dtype, q.shape[-1]):
        _say_once(f"packed attention: no FlashAttention kernel for {q.dtype} with head dim {q.shape[-1]} on this GPU")
        return _reference_forward(q, k, v, cu_seqlens, dropout_p)
    out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, dropout_p, False, False
    )
    return out, lse, seed, offset


@varlen_attention.register_fake
def _varlen_attention_fake(q, k, v, cu_seqlens, max_len, dropout_p):
    T, H, D = q.shape
    return (
        q.new_empty(T, H, D),
        q.new_empty(H, T, dtype=_lse_dtype(q.dtype)),
        q.new_empty(2, dtype=torch.uint64),
        q.new_empty((), dtype=torch.uint64),
    )


@torch.library.custom_op("pmlm::varlen_attention_backward", mutates_args=())
def varlen_attention_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens: Tensor,
    max_len: int,
    dropout_p: float,
    seed: Tensor,
    offset: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``varlen_attention``: the reference's backward, or CUDA's kernel below."""
    return _reference_backward(grad, q, k, v, out, lse, cu_seqlens, dropout_p, seed)


@varlen_attention_backward.register_kernel("cuda")
def _varlen_attention_backward_cuda(grad, q, k, v, out, lse, cu_seqlens, max_len, dropout_p, seed, offset):
    if not flash_usable(q.device, q.dtype, q.shape[-1]):
        return _reference_backward(grad, q, k, v, out, lse, cu_seqlens, dropout_p, seed)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        grad.contiguous(), q, k, v, out, lse, cu_seqlens, cu_seqlens, max_len, max_len, dropout_p, False, seed, offset
    )
    return dq, dk, dv


@varlen_attention_backward.register_fake
def _varlen_attention_backward_fake(grad, q, k, v, out, lse, cu_seqlens, max_len, dropout_p, seed, offset):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_len, dropout_p = inputs
    out, lse, seed, offset = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, seed, offset)
    ctx.max_len, ctx.dropout_p = max_len, dropout_p


def _backward(ctx, grad_out, _grad_lse, _grad_seed, _grad_offset):
    q, k, v, out, lse, cu_seqlens, seed, offset = ctx.saved_tensors
    dq, dk, dv = torch.ops.pmlm.varlen_attention_backward(
        grad_out, q, k, v, out, lse, cu_seqlens, ctx.max_len, ctx.dropout_p, seed, offset
    )
    return dq, dk, dv, None, None, None


varlen_attention.register_autograd(_backward, setup_context=_setup_context)


def _attention_flops(cu_seqlens: Tensor, heads: int, head_dim: int) -> int:
    """Multiply-adds x 2 of Q K^T and P V over every sequence: 4 H D sum(n^2)."""
    lengths = cu_seqlens.diff().tolist()
    return 4 * heads * head_dim * sum(n * n for n in lengths)


@register_flop_formula(torch.ops.pmlm.varlen_attention, get_raw=True)
def _forward_flops(q, k, v, cu_seqlens, max_len, dropout_p, *args, out_val=None, **kwargs) -> int:
    return _attention_flops(cu_seqlens, q.shape[1], q.shape[2])


@register_flop_formula(torch.ops.pmlm.varlen_attention_backward, get_raw=True)
def _backward_flops(grad, q, k, v, out, lse, cu_seqlens, *args, out_val=None, **kwargs) -> int:
    # dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: twice the forward (a kernel's recomputation of the scores is
    # not a model FLOP)
    return 2 * _attention_flops(cu_seqlens, q.shape[1], q.shape[2])


# --- the reference ---------------------------------------------------------------------------------------------------


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _segments(cu_seqlens: Tensor) -> list[tuple[int, int]]:
    """(start, end) of every non-empty sequence."""
    return [(s, e) for s, e in itertools.pairwise(cu_seqlens.tolist()) if e > s]


def _heads_first(t: Tensor, start: int, end: int, dtype: torch.dtype) -> Tensor:
    return t[start:end].transpose(0, 1).to(dtype)  # (n, H, D) rows -> (H, n, D)


def _keep(generator: torch.Generator, shape: tuple[int, ...], dropout_p: float, device) -> Tensor:
    """One sequence's (H, n, n) keep mask, the next draws of ``generator``."""
    return torch.rand(shape, generator=generator, device=generator.device).to(device) >= dropout_p


def _reference_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, dropout_p: float):
    T, H, D = q.shape
    work = _lse_dtype(q.dtype)  # half inputs are computed in fp32
    out = q.new_zeros(T, H, D)
    lse = q.new_zeros(H, T, dtype=work)
    seed = int(torch.randint(SEED_BOUND, ())) if dropout_p > 0 else 0
    generator = torch.Generator().manual_seed(seed)  # the draws, in sequence order, replayed by the backward
    for start, end in _segments(cu_seqlens):
        qs, ks, vs = (_heads_first(t, start, end, work) for t in (q, k, v))  # (H, n, D)
        if dropout_p == 0 and q.device.type == "cpu":
            o, m = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qs[None], ks[None], vs[None])
            o, m = o[0], m[0]
        else:
            scores = torch.bmm(qs, ks.transpose(1, 2)) * (1.0 / math.sqrt(D))  # (H, n, n)
            m = scores.logsumexp(-1)  # (H, n)
            probs = (scores - m[..., None]).exp()
            if dropout_p > 0:
                probs = probs * _keep(generator, probs.shape, dropout_p, q.device) * (1.0 / (1.0 - dropout_p))
            o = torch.bmm(probs, vs)  # (H, n, D)
        out[start:end] = o.transpose(0, 1).to(q.dtype)
        lse[:, start:end] = m
    return out, lse, torch.tensor([seed, 0], dtype=torch.uint64, device=q.device), q.new_zeros((), dtype=torch.uint64)


def _reference_backward(grad, q, k, v, out, lse, cu_seqlens, dropout_p: float, seed: Tensor):
    D = q.shape[-1]
    work = _lse_dtype(q.dtype)
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    generator = torch.Generator().manual_seed(int(seed[0]))
    scale = 1.0 / math.sqrt(D)
    for start, end in _segments(cu_seqlens):
        qs, ks, vs, os, gs = (_heads_first(t, start, end, work) for t in (q, k, v, out, grad))  # (H, n, D)
        m = lse[:, start:end].to(work)  # (H, n)
        if dropout_p == 0 and q.device.type == "cpu":
            parts = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                gs[None], qs[None], ks[None], vs[None], os[None], m[None], 0.0, False
            )
            gq, gk, gv = (p[0] for p in parts)
        else:
            probs = (torch.bmm(qs, ks.transpose(1, 2)) * scale - m[..., None]).exp()  # (H, n, n), recomputed
            kept = probs
            if dropout_p > 0:
                kept = probs * _keep(generator, probs.shape, dropout_p, q.device) * (1.0 / (1.0 - dropout_p))
            gv = torch.bmm(kept.transpose(1, 2), gs)  # dV = Pk^T dO
            # dS = P * (dP - rowsum(dO * O)), dP = (dO V^T) * keep / (1 - p); with kept = P * keep / (1 - p)
            row = (gs * os).sum(-1, keepdim=True)  # (H, n, 1)
            dscores = kept * torch.bmm(gs, vs.transpose(1, 2)) - probs * row
            gq = torch.bmm(dscores, ks) * scale
            gk = torch.bmm(dscores.transpose(1, 2), qs) * scale
        for target, part in ((dq, gq), (dk, gk), (dv, gv)):
            target[start:end] = part.transpose(0, 1).to(target.dtype)
    return dq, dk, dv


def reference_varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, dropout_p: float = 0.0) -> Tensor:
    """Per-sequence attention written out, differentiable by autograd (no op, no recomputation): the numerical
    reference of the op's kernels, on any device."""
    parts = []
    for start, end in _segments(cu_seqlens):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (H, n, D)
        scores = torch.bmm(qs, ks.transpose(1, 2)) / math.sqrt(q.shape[-1])
        probs = scores.softmax(-1)
        if dropout_p > 0:
            probs = torch.nn.functional.dropout(probs, dropout_p)
        parts.append(torch.bmm(probs, vs).transpose(0, 1))
    # every packed row belongs to exactly one sequence, in order, so the parts tile (T, H, D)
    return torch.cat(parts) if parts else torch.empty_like(q)


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(f"{message}: the per-sequence reference runs instead (slow)", file=sys.stderr)
