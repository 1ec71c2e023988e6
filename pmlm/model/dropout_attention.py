"""Self-attention with dropout on the attention probabilities, on CPU, computed block by block.

torch's CPU flash kernel for ``scaled_dot_product_attention`` has no dropout, so with ``dropout_p > 0``
SDPA takes its math path: full (B, H, L, L) scores, probabilities, a float dropout mask drawn with
``bernoulli_`` and the dropped probabilities, three of them kept for the backward (12 bytes per score),
every pass streaming through main memory. On CPU that made attention 2-4x slower than the same attention
without dropout. ``dropout_attention`` computes what SDPA's math path computes,
``softmax(q k^T / sqrt(D) + mask) * keep / (1 - p) @ v`` with ``keep ~ Bernoulli(1 - p)`` per score, in
blocks of heads x query rows (about ``BLOCK_ELEMENTS`` scores each) that stay in cache from the scores to
the block's output. For the backward each block keeps its probabilities and its mask (5 bytes per score);
the backward reads them once, with the closed form ``dscores = P * keep * dPk - P * rowsum(dout * out)``.

* **Draws.** One seed per call comes from torch's default generator (so ``torch.manual_seed`` and the
  RNG state a checkpoint saves fix every mask); each group of blocks draws 16-bit integers from its own
  NumPy ``SFC64`` stream seeded with ``(seed, group)`` (far cheaper per score than ``bernoulli_``),
  and a score is dropped where its integer falls below ``round(p * 2^16)``: the dropout probability is
  rounded to a multiple of 2^-16 (0.1 becomes 0.1000061) and ``1 / (1 - p)`` uses the rounded value, so
  the expectation stays exact. The mask of a call is a function of its seed and shapes alone: group g holds the
  matrices (batch x head) ``[g G, (g + 1) G)``, its blocks are runs of R query rows (G, R: ``block_shape``), and
  each block in row order takes the next ``ceil(n / 4)`` 64-bit words of the group's stream, read as n signed
  16-bit draws in (matrix, row, key) order, n the block's number of scores.
* **Threads.** The groups run on the calling thread and a pool of ``torch.get_num_threads() - 1`` more
  Python threads, each op single-threaded (torch and NumPy release the GIL inside ops). A group's
  arithmetic is the same whatever the thread count, so results are bit-identical with 1, 2 or 4 threads,
  and the many small ops never wait on each other at OpenMP barriers (on a loaded machine those cost more
  than the ops).
* **Keys.** Trailing key columns that are ``<pad>`` in every row of the batch are cut before the blocks
  are formed (their probabilities are exactly 0); other ``<pad>`` keys get -inf scores as in SDPA.

Evaluation and ``dropout_p = 0`` never come here: ``attention`` passes them to
``scaled_dot_product_attention`` unchanged (the fused CPU kernel), and so do other devices and dtypes
(CUDA's kernels take dropout themselves).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from pmlm.model.syncs import host_kernel

BLOCK_ELEMENTS = 1 << 17  # scores per block (512 KiB in fp32): few enough ops per layer, small enough for cache
DRAW_BITS = 16  # a score's dropout draw: one 16-bit integer
SEED_BOUND = 2**62  # seeds drawn from torch's generator lie in [0, SEED_BOUND)
NUMPY_DTYPES = (torch.float32, torch.float64)  # the dropout mask is applied through NumPy views

_pool_lock = threading.Lock()
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (process id, workers, executor)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """``scaled_dot_product_attention`` over (B, H, L, D) with a (B, 1, 1, L) key mask (True = may attend) or
    None; on CPU with dropout, ``dropout_attention``."""
    if dropout_p > 0.0 and q.device.type == "cpu" and q.dtype in NUMPY_DTYPES:
        with host_kernel():  # a CPU-only kernel: it reads its seed and masks on the host by design
            return dropout_attention(q, k, v, key_mask, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p)


# threads and NumPy draws: run eagerly, never traced. torch.compiler.disable's lazy form: the decorator itself would
# import torch._dynamo (over a second of CPU) in every process that imports the model, compiled or not
@torch._disable_dynamo
def dropout_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    dropout_p: float,
    seed: int | None = None,
) -> torch.Tensor:
    """Attention with dropout on the probabilities (module docstring): q, k, v (B, H, L, D) -> (B, H, L, D).

    ``seed`` None draws one from torch's default generator; a given seed gives the same mask (module docstring).
    """
    B, H, L, D = q.shape
    if seed is None:
        seed = int(torch.randint(SEED_BOUND, ()))
    width, bias = key_layout(key_mask, L, q.dtype)
    if bias is not None:
        bias = bias.repeat_interleave(H, dim=0)  # (B * H, 1, width): one row per head
    flat = [t.reshape(B * H, t.shape[2], D) for t in (q, k[:, :, :width], v[:, :, :width])]
    out = _BlockDropoutAttention.apply(*flat, bias, rounded_probability(dropout_p), seed)
    return out.view(B, H, L, D)


def key_layout(key_mask: torch.Tensor | None, length: int, dtype: torch.dtype) -> tuple[int, torch.Tensor | None]:
    """Keys kept (the leading ``width`` columns) and the additive (B, 1, width) score bias, None if no key is masked."""
    if key_mask is None:
        return length, None
    keep = key_mask.reshape(key_mask.shape[0], -1)  # (B, L)
    width = int(keep.any(0).nonzero().max()) + 1  # one host sync; position 0 is always kept
    keep = keep[:, :width]
    if bool(keep.all()):
        return width, None
    bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))
    return width, bias[:, None, :]


def rounded_probability(dropout_p: float) -> float:
    """The dropout probability the 16-bit draws realise: ``dropout_p`` rounded to a multiple of 2^-16."""
    return round(dropout_p * 2**DRAW_BITS) / 2**DRAW_BITS


def block_shape(matrices: int, rows: int, width: int) -> tuple[int, int]:
    """(matrices per group, query rows per block): a block holds about ``BLOCK_ELEMENTS`` scores."""
    block_rows = max(1, min(rows, BLOCK_ELEMENTS // width))
    return max(1, min(matrices, BLOCK_ELEMENTS // (block_rows * width))), block_rows


class _Draws:
    """The dropout draws of one block group: successive blocks take successive integers of its stream."""

    def __init__(self, seed: int, group: int, dropout_p: float):
        self.bits = np.random.SFC64([seed, group])
        # a score is dropped where its signed 16-bit draw is below this: probability round(p * 2^16) / 2^16
        self.threshold = round(dropout_p * 2**DRAW_BITS) - 2 ** (DRAW_BITS - 1)

    def keep(self, shape: tuple[int, ...]) -> np.ndarray:
        n = math.prod(shape)
        words = self.bits.random_raw(-(-n * DRAW_BITS // 64))  # uint64 words, four draws each
        return (words.view(np.int16)[:n] >= self.threshold).reshape(shape)


def _run(tasks: list) -> None:
    """Run the tasks (callables) with single-threaded ops and no autograd: in this thread and, when torch has
    more threads and there is more than one task, on ``torch.get_num_threads() - 1`` pool threads beside it."""
    global _pool
    threads = torch.get_num_threads()
    helpers = min(threads, len(tasks)) - 1
    pending = iter(tasks)  # shared: each thread takes the next task until none is left

    def drain() -> None:
        with torch.no_grad():  # grad mode is per thread
            for task in pending:
                task()

    if threads == 1:
        drain()
        return
    if helpers > 0:
        with _pool_lock:
            if _pool is None or _pool[:2] != (os.getpid(), threads):  # a forked child starts its own threads
                _pool = (os.getpid(), threads, ThreadPoolExecutor(threads - 1, thread_name_prefix="pmlm-attention"))
            executor = _pool[2]
    # torch's thread count is global: every op runs single-threaded until it is restored
    torch.set_num_threads(1)
    try:
        futures = [executor.submit(drain) for _ in range(helpers)] if helpers > 0 else []
        drain()
        for future in futures:
            future.result()
    finally:
        torch.set_num_threads(threads)


def _scores(qs, kt, bias, heads, rows):
    """(group, block rows, width) scores of one block: q k^T / sqrt(D), plus the key bias."""
    if bias is None:
        return torch.bmm(qs[heads, rows], kt[heads])
    return torch.baddbmm(bias[heads], qs[heads, rows], kt[heads])


def _dropped(probs: torch.Tensor, keep: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
    """probs * keep (0 where dropped), into ``out`` (default: in place)."""
    out = probs if out is None else out
    np.multiply(probs.numpy(), keep, out=out.numpy())  # NumPy's bool x float loop is vectorised; torch's is not
    return out


class _BlockDropoutAttention(torch.autograd.Function):
    """q (N, L, D), k and v (N, W, D), bias (N, 1, W) or None -> (N, L, D); N = batch x heads."""

    @staticmethod
    def forward(ctx, q, k, v, bias, dropout_p, seed):
        N, L, D = q.shape
        qs = q * (1.0 / math.sqrt(D))  # (N, L, D)
        kt = k.transpose(1, 2)  # (N, D, W)
        out = torch.empty_like(qs)
        group_size, block_rows = block_shape(N, L, k.shape[1])
        training = any(ctx.needs_input_grad[:3])
        saved: dict[tuple[int, int], tuple[torch.Tensor, np.ndarray]] = {}

        def group(index: int) -> None:
            draws = _Draws(seed, index, dropout_p)
            heads = slice(index * group_size, min(N, (index + 1) * group_size))
            for r in range(0, L, block_rows):
                rows = slice(r, r + block_rows)
                probs = torch.softmax(_scores(qs, kt, bias, heads, rows), dim=-1)  # (G, R, W)
                keep = draws.keep(tuple(probs.shape))
                if training:  # the backward needs the probabilities and the mask, not the scores
                    saved[index, r] = (probs, keep)
                    probs = torch.empty_like(probs)
                    _dropped(saved[index, r][0], keep, out=probs)
                else:
                    _dropped(probs, keep)
                torch.bmm(probs, v[heads], out=out[heads, rows])

        _run([functools.partial(group, i) for i in range(-(-N // group_size))])
        out.mul_(1.0 / (1.0 - dropout_p))
        ctx.save_for_backward(qs, k, v, out)
        ctx.blocks, ctx.dropout_p = saved, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with host_kernel():  # the masks are NumPy arrays on the host, by design
            return _BlockDropoutAttention._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        qs, k, v, out = ctx.saved_tensors
        blocks, dropout_p = ctx.blocks, ctx.dropout_p
        N, L, D = qs.shape
        vt = v.transpose(1, 2)
        # out = (P * keep / (1 - p)) @ v, so with Pk = P * keep and dPk = grad_out / (1 - p) @ v^T:
        # dv = Pk^T @ grad_out / (1 - p), dscores = Pk * dPk - P * rowsum(grad_out * out)
        scaled = grad_out * (1.0 / (1.0 - dropout_p))  # (N, L, D)
        row_dot = (grad_out * out).sum(-1, keepdim=True)  # (N, L, 1)
        dq = torch.empty_like(qs)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        group_size, block_rows = block_shape(N, L, k.shape[1])

        def group(index: int) -> None:
            heads = slice(index * group_size, min(N, (index + 1) * group_size))
            for r in range(0, L, block_rows):
                rows = slice(r, r + block_rows)
                probs, keep = blocks[index, r]  # (G, R, W); left intact, so a retained graph can run backward again
                kept = _dropped(probs, keep, out=torch.empty_like(probs))
                dv[heads].baddbmm_(kept.transpose(1, 2), scaled[heads, rows])
                dscores = torch.bmm(scaled[heads, rows], vt[heads]).mul_(kept).sub_(probs * row_dot[heads, rows])
                torch.bmm(dscores, k[heads], out=dq[heads, rows])
                dk[heads].baddbmm_(dscores.transpose(1, 2), qs[heads, rows])

        _run([functools.partial(group, i) for i in range(-(-N // group_size))])
        dq.mul_(1.0 / math.sqrt(D))
        return dq, dk, dv, None, None, None
