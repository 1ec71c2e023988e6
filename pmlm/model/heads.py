"""Prediction heads: the 20-class masked-token head and the masked-pair head.

The pair head is the paper's two-layer MLP on ``concat(h_i * h_j, h_i - h_j)``::

    Linear(2C, 2C) -> act -> LayerNorm(2C)    = M+ (the pair representation for fine-tuning)
    -> Linear(2C, K)                          K = 400 (standard) or 729 (full, pmlm.alphabet)

``act`` is the encoder's activation (``model.activation``): the released code's heads use
``args.activation_fn`` too (relu for its PMLM, Mu-Protein pmlm.py:267-277, 308).

It is evaluated only for the requested pair rows, never for all L^2 positions, and without
building the 2C-wide concatenation. Splitting the first weight ``W = [W_prod | W_diff]``::

    W [h_i * h_j ; h_i - h_j] + b = W_prod (h_i * h_j) + (W_diff h_i - W_diff h_j) + b

the difference term is a per-position projection (computed once per distinct position and
gathered), and the product term is symmetric in (i, j). ``mirror=True`` uses that symmetry:
one product matmul serves both orders, ``S + D`` for (i, j) and ``S - D`` for (j, i), which
halves the head's dominant cost when all ordered pairs of a set are needed.

Training names its pairs by rows of the masked positions' gathered representations (``from_rows``, ``loss``),
decided on the host, so the head needs no ``unique`` and never reads a tensor back; its loss fuses the output layer
with the cross-entropy (``pmlm.model.fused_ce``), so the (2P, K) logits never exist at once.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pmlm.alphabet import NUM_RESIDUES
from pmlm.model.encoder import ACTIVATIONS, LayerNorm
from pmlm.model.fused_ce import linear_cross_entropy


class TokenHead(nn.Module):
    """Linear(C, C) -> act -> LayerNorm -> Linear(C, 20): residue-class logits."""

    def __init__(self, hidden: int, activation: str = "gelu"):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.dense = nn.Linear(hidden, hidden)
        self.norm = LayerNorm(hidden)
        self.out = nn.Linear(hidden, NUM_RESIDUES)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.act(self.dense(h))))  # (..., 20)


class PairHead(nn.Module):
    """Masked-pair head evaluated on selected pairs of positions, in chunks."""

    def __init__(self, hidden: int, num_classes: int, chunk_size: int, activation: str = "gelu", unary: bool = False):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.hidden = hidden
        self.chunk_size = chunk_size
        self.dense = nn.Linear(2 * hidden, 2 * hidden)
        self.norm = LayerNorm(2 * hidden)
        self.out = nn.Linear(2 * hidden, num_classes)
        # unary: logits(a, b) = out(M+)[a, b] + u_1(M+)[a] + u_2(M+)[b], the same linear map of M+ written with
        # shared per-residue terms (pmlm.model.config, pair_unary)
        self.side = math.isqrt(num_classes)
        self.unary = nn.Linear(2 * hidden, 2 * self.side) if unary else None
        self._base = None  # a TokenHead whose log-probabilities at i and j are added (set_product_base)

    def set_product_base(self, token_head: TokenHead) -> None:
        """Predict the joint as the product of ``token_head``'s marginals at i and j times exp(this head's output):
        logits(a, b) = log P(x_i = a) + log P(x_j = b) + out(M+)[a, b] (standard vocabulary). The token head is
        referenced, not registered, so its weights stay where they are in the state dict."""
        if self.side != NUM_RESIDUES:
            raise ValueError("a product base needs the standard 400-class pair vocabulary")
        object.__setattr__(self, "_base", token_head)

    @property
    def plain(self) -> bool:
        """Whether the logits are the output layer alone (no unary terms, no product base): the fused loss applies."""
        return self.unary is None and self._base is None

    def forward(
        self,
        reps: torch.Tensor,
        pair_index: torch.Tensor,
        mirror: bool = False,
        return_repr: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pair logits for the rows of ``pair_index`` (P, 3) = (b, i, j) over ``reps`` (B, L, C).

        Returns ``(logits, m_plus)``: logits (P, K) and, if ``return_repr``, M+ (P, 2C).
        With ``mirror=True`` the outputs have 2P rows: the P given orders (b, i, j) followed
        by the P swapped orders (b, j, i). For any pairs a caller names (inference, read-outs): the distinct
        positions are found with ``unique``, a host synchronisation; training names its pairs by
        ``from_rows``' indices instead.
        """
        if pair_index.dim() != 2 or pair_index.shape[1] != 3:
            raise ValueError(f"pair_index must have shape (P, 3), got {tuple(pair_index.shape)}")
        B, L, C = reps.shape
        P = pair_index.shape[0]
        rows_i = pair_index[:, 0] * L + pair_index[:, 1]  # (P,)
        rows_j = pair_index[:, 0] * L + pair_index[:, 2]  # (P,)
        # each distinct position is projected once; pairs then gather from U << P rows
        used, inverse = torch.unique(torch.cat([rows_i, rows_j]), return_inverse=True)
        h_used = F.embedding(used, reps.reshape(B * L, C))  # (U, C)
        return self.from_rows(h_used, inverse.view(2, P).T, mirror=mirror, return_repr=return_repr)

    def from_rows(
        self, h: torch.Tensor, pairs: torch.Tensor, mirror: bool = False, return_repr: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (and M+) of the pairs (P, 2) of rows of ``h`` (N, C): as ``forward``, with the positions gathered
        already (each row of ``h`` is projected once)."""
        base = self._base_rows(h)
        logits_parts, repr_parts = [], []
        for m_plus, ci, cj in self._chunks(h, pairs, mirror):
            logits_parts.append(self._logits(m_plus, ci, cj, base))  # (blocks, p, K)
            if return_repr:
                repr_parts.append(m_plus)
        # rows ordered block-major: all given orders first, then all swapped orders
        logits = _join(logits_parts).flatten(0, 1)  # (blocks * P, K)
        m_plus_all = _join(repr_parts).flatten(0, 1) if return_repr else None  # (blocks * P, 2C)
        return logits, m_plus_all

    def loss(self, h: torch.Tensor, pairs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(CE sum, correct) over both orders of the pairs (P, 2) of rows of ``h`` (N, C); ``labels`` (2P,) in the
        mirrored order (the P given orders, then the P swapped ones), IGNORE_INDEX where a row counts nothing.

        With plain logits the output layer and the cross-entropy are one fused, chunked op (``fused_ce``): no
        (2P, K) logits tensor is ever held, the class dimension is padded for the matmuls, the accuracy comes from
        the same pass. Otherwise each chunk's logits go through cross_entropy and argmax."""
        P = pairs.shape[0]
        ce = h.new_zeros((), dtype=torch.float64 if h.dtype == torch.float64 else torch.float32)
        correct = torch.zeros((), dtype=torch.long, device=h.device)
        base = self._base_rows(h)
        start = 0
        for m_plus, ci, cj in self._chunks(h, pairs, mirror=True):
            p = ci.shape[0]
            chunk_labels = torch.cat([labels[start : start + p], labels[P + start : P + start + p]])  # (2p,)
            start += p
            if self.plain:
                part_ce, part_correct = linear_cross_entropy(
                    m_plus.flatten(0, 1), self.out.weight, self.out.bias, chunk_labels
                )
            else:
                logits = self._logits(m_plus, ci, cj, base).flatten(0, 1)  # (2p, K)
                part_ce = F.cross_entropy(loss_precision(logits), chunk_labels, reduction="sum")
                part_correct = (logits.argmax(dim=-1) == chunk_labels).sum()
            ce, correct = ce + part_ce, correct + part_correct
        return ce, correct

    def _chunks(self, h: torch.Tensor, pairs: torch.Tensor, mirror: bool):
        """(M+ (blocks, p, 2C), i rows (p,), j rows (p,)) of successive chunks of ``pairs`` (P, 2) over ``h``."""
        C = h.shape[-1]
        # split (not slicing): its backward concatenates the two gradients instead of zero-filling two full copies
        w_prod, w_diff = self.dense.weight.split(C, dim=1)  # (2C, C) each
        d = F.linear(h, w_diff)  # (N, 2C): the difference term is a per-position projection
        # +1 / -1 per output block of a mirrored chunk: (i, j) rows get S + D, swapped rows S - D (made on the device:
        # no copy from the host)
        signs = torch.arange(1, -2, -2, dtype=d.dtype, device=d.device).view(2, 1, 1)
        # an empty chunk when there are no pairs: empty outputs that still depend on the weights
        for start in range(0, max(pairs.shape[0], 1), self.chunk_size):
            # gathers go through F.embedding: its backward is a fast dedicated kernel, whereas
            # advanced indexing backpropagates through a slow accumulating index_put on CPU
            ci = pairs[start : start + self.chunk_size, 0]
            cj = pairs[start : start + self.chunk_size, 1]
            sym = F.linear(F.embedding(ci, h) * F.embedding(cj, h), w_prod, self.dense.bias)  # (p, 2C)
            diff = F.embedding(ci, d) - F.embedding(cj, d)  # (p, 2C)
            # both orders in one fused op, so the activation, LayerNorm and the output matmul run once on 2p rows
            pre = torch.addcmul(sym, signs, diff) if mirror else (sym + diff)[None]  # (blocks, p, 2C)
            yield self.norm(self.act(pre)), ci, cj

    def _base_rows(self, h: torch.Tensor) -> torch.Tensor | None:
        """(N, 20) log-probabilities of the product base's token head at the rows of ``h``, or None."""
        if self._base is None:
            return None
        return torch.log_softmax(self._base(h).float(), dim=-1).to(h.dtype)

    def _logits(
        self, m_plus: torch.Tensor, ci: torch.Tensor, cj: torch.Tensor, base: torch.Tensor | None
    ) -> torch.Tensor:
        """(blocks, p, K) logits of one chunk's M+ (blocks, p, 2C), the product base ``base`` (N, 20) added."""
        logits = self.logits(m_plus)
        if base is None:
            return logits
        blocks = m_plus.shape[0]
        bi, bj = F.embedding(ci, base), F.embedding(cj, base)  # (p, 20) each
        first = torch.stack([bi, bj])[:blocks]  # the row's first residue: i for given rows, j for swapped
        second = torch.stack([bj, bi])[:blocks]
        return (logits.view(blocks, -1, self.side, self.side) + first[..., :, None] + second[..., None, :]).flatten(-2)

    def logits(self, m_plus: torch.Tensor) -> torch.Tensor:
        """The output layer on M+ (..., 2C) -> (..., K)."""
        out = self.out(m_plus)
        if self.unary is None:
            return out
        u = self.unary(m_plus).unflatten(-1, (2, self.side))  # (..., 2, side)
        joint = out.unflatten(-1, (self.side, self.side)) + u[..., 0, :, None] + u[..., 1, None, :]
        return joint.flatten(-2)

    def first_block_grid(self, reps: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """M+ of every pair (i, j), i in [start, stop), all j of ``reps`` (B, L, C): (B, stop - start, L, 2C).

        The dense grid fine-tuning feeds its contact heads, with the same W_prod / W_diff split as
        ``forward`` (the difference half a per-residue projection, no 2C-wide concatenation).
        """
        w_prod, w_diff = self.dense.weight.split(reps.shape[-1], dim=1)  # (2C, C) each
        d = F.linear(reps, w_diff)  # (B, L, 2C)
        f_i = reps[:, start:stop, None, :]  # (B, r, 1, C)
        f_j = reps[:, None, :, :]  # (B, 1, L, C)
        pre = F.linear(f_i * f_j, w_prod, self.dense.bias) + d[:, start:stop, None, :] - d[:, None, :, :]
        return self.norm(self.act(pre))  # (B, r, L, 2C)


def _join(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate chunk outputs (blocks, p, X) along the pair axis; a single chunk is not copied."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def loss_precision(logits: torch.Tensor) -> torch.Tensor:
    """Logits as the losses take them: fp32 at least (bf16 autocast logits are cast up; an fp64 model, as the tests'
    reference runs, stays fp64)."""
    return logits if logits.dtype == torch.float64 else logits.float()
