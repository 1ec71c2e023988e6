"""Self-attention over packed (unpadded) sequences: the packing of a padded batch and its kernels.

A padded batch (B, L) holds T <= B * L real tokens. Packed, the encoder runs its LayerNorms,
projections and feed-forward blocks on T rows instead of B * L, and attention runs per sequence
over ``cu_seqlens`` (the layout of FlashAttention's variable-length kernels), so no query sees a
``<pad>`` key and no boolean mask is built. Three kernels take the packed layout:

* ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention 2; torch >= 2.9, CUDA, bf16 / fp16,
  head dim a multiple of 8 up to 256, compute capability >= 8.0), without attention dropout: it
  has no dropout on the attention probabilities.
* ``jagged_attention``, with attention dropout on the same GPUs and dtypes:
  ``scaled_dot_product_attention`` on jagged nested tensors (one component per non-empty sequence,
  sharing the packed rows), which on CUDA runs FlashAttention's variable-length kernel with its
  dropout (``aten::_flash_attention_forward`` over the same offsets).
* ``reference_varlen_attention``: one attention call per sequence (``pmlm.model.dropout_attention``'s
  ``attention``). It runs anywhere (CPU, fp32), supports attention dropout and is the numerical
  reference the fused kernels are tested against; it is slow for batches of many short sequences.

Positions stay per sequence (``<cls>`` is position 0 of each row), so packing changes no result
beyond the order of floating-point sums.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pmlm.model.dropout_attention import attention

# torch >= 2.9 has ``varlen_attn``; the keyword-only extras changed between releases, the 7 positional arguments
# did not. Importing its module loads torch._dynamo, over a second of CPU in every process, most of which never
# run the kernel (CPU, fp32): the module is looked up here and imported when the kernel first runs.
if importlib.util.find_spec("torch.nn.attention.varlen") is None:  # pragma: no cover - older torch
    varlen_attn = None
else:

    def varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k):
        """``torch.nn.attention.varlen.varlen_attn`` (its 7 positional arguments), imported on the first call."""
        from torch.nn.attention.varlen import varlen_attn as kernel  # loads torch._dynamo: only where this runs

        return kernel(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k)


HALF_DTYPES = (torch.bfloat16, torch.float16)
MAX_FLASH_HEAD_DIM = 256  # FlashAttention 2 kernels exist for head dims up to 256, in steps of 8
MIN_FLASH_CAPABILITY = (8, 0)  # Ampere and later


@dataclass
class Packing:
    """Where the T real tokens of a padded (B, L) batch sit, and their sequence boundaries."""

    index: torch.Tensor  # (T,) int64 positions in the row-major (B * L) flattening, row by row
    positions: torch.Tensor  # (T,) int64 position of each token in its own sequence (<cls> = 0)
    cu_seqlens: torch.Tensor  # (B + 1,) int32 offsets of each sequence's first packed row; last = T
    max_len: int  # tokens in the longest sequence
    batch: int  # B
    width: int  # L

    @property
    def tokens(self) -> int:
        return int(self.index.numel())

    @functools.cached_property
    def segments(self) -> tuple[torch.Tensor, int]:
        """(S + 1,) int64 offsets of the S non-empty sequences and the shortest one's tokens: a jagged
        tensor's components (an all-<pad> row owns no packed rows and is left out)."""
        lengths = self.cu_seqlens.diff()  # (B,)
        lengths = lengths[lengths > 0]  # one host sync, once per batch (the property is cached)
        return F.pad(lengths.cumsum(0), (1, 0)), int(lengths.min()) if lengths.numel() else 0


def pack(keep: torch.Tensor) -> Packing:
    """Packing of the ``keep`` (B, L) bool tokens; rows may be empty (an all-<pad> filler row)."""
    B, L = keep.shape
    lengths = keep.sum(dim=1)  # (B,)
    index = keep.reshape(-1).nonzero().squeeze(1)  # (T,) one host sync: T sizes every later tensor
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # (B + 1,)
    return Packing(
        index=index,
        positions=index % L,
        cu_seqlens=cu_seqlens,
        max_len=int(lengths.max()) if B else 0,
        batch=B,
        width=L,
    )


def unpack(x: torch.Tensor, packing: Packing) -> torch.Tensor:
    """(T, C) packed rows -> (B, L, C), zeros at <pad>; differentiable (the backward is a gather)."""
    C = x.shape[-1]
    out = x.new_zeros(packing.batch * packing.width, C).index_copy(0, packing.index, x)
    return out.view(packing.batch, packing.width, C)


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
        and _capability_ok(device.index if device.index is not None else torch.cuda.current_device())
    )


def varlen_kernel_usable(device: torch.device, dtype: torch.dtype, head_dim: int, dropout_p: float) -> bool:
    """Whether ``varlen_attn`` can compute attention for these inputs (it has no dropout)."""
    return varlen_attn is not None and dropout_p == 0.0 and flash_usable(device, dtype, head_dim)


def packed_kernel_usable(device: torch.device, dtype: torch.dtype, head_dim: int, dropout_p: float) -> bool:
    """Whether the packed layout runs a fused kernel here: ``varlen_attn``, or ``jagged_attention`` with dropout."""
    return varlen_kernel_usable(device, dtype, head_dim, dropout_p) or (
        dropout_p > 0.0 and flash_usable(device, dtype, head_dim)
    )


def packed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, dropout_p: float = 0.0
) -> torch.Tensor:
    """Softmax attention of each packed sequence over itself: q, k, v (T, H, D) -> (T, H, D)."""
    if varlen_kernel_usable(q.device, q.dtype, q.shape[-1], dropout_p):
        cu = packing.cu_seqlens
        return varlen_attn(q, k, v, cu, cu, packing.max_len, packing.max_len)
    if dropout_p > 0.0 and flash_usable(q.device, q.dtype, q.shape[-1]):
        return jagged_attention(q, k, v, packing, dropout_p)
    return reference_varlen_attention(q, k, v, packing.cu_seqlens, dropout_p)


# nested tensors are built from data-dependent offsets: run eagerly (torch.compiler.disable's lazy form, which
# imports torch._dynamo on the first call instead of at import)
@torch._disable_dynamo
def jagged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, dropout_p: float = 0.0
) -> torch.Tensor:
    """``scaled_dot_product_attention`` over jagged nested tensors: q, k, v (T, H, D) -> (T, H, D).

    On CUDA under bf16 / fp16 this is FlashAttention's variable-length kernel, dropout included; on other
    devices SDPA's math path per sequence (what the tests run on CPU).
    """
    if packing.tokens == 0:
        return torch.empty_like(q)
    offsets, shortest = packing.segments
    offsets = offsets.to(q.device)

    def nested(t: torch.Tensor) -> torch.Tensor:  # (T, H, D) -> (S, H, j, D) over the packed rows
        # contiguous rows: q, k and v are strided views of one projection, which SDPA's math path refuses
        jagged = torch.nested.nested_tensor_from_jagged(
            t.contiguous(), offsets, min_seqlen=shortest, max_seqlen=packing.max_len
        )
        return jagged.transpose(1, 2)

    # the three share one offsets tensor, hence one ragged dimension, as SDPA requires
    out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), dropout_p=dropout_p)  # (S, H, j, D)
    return out.transpose(1, 2).values()


@torch._disable_dynamo  # a Python loop over data-dependent offsets: run eagerly, never traced (lazy form, as above)
def reference_varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, dropout_p: float = 0.0
) -> torch.Tensor:
    """Per-sequence attention (SDPA; with dropout on CPU, ``dropout_attention``): the semantics of
    ``varlen_attn``, on any device."""
    bounds = cu_seqlens.tolist()
    parts = []
    for start, end in itertools.pairwise(bounds):
        if end > start:  # an empty (all-<pad>) row owns no packed rows
            qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1, H, n, D)
            parts.append(attention(qs, ks, vs, None, dropout_p)[0].transpose(0, 1))
    # every packed row belongs to exactly one sequence, in order, so the parts tile (T, H, D)
    return torch.cat(parts) if parts else torch.empty_like(q)
