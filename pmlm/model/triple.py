"""The Triple MLM's head and loss: the joint P(x_i, x_j, x_k | X_/M) of sampled triples of masked residues.

The paper's Discussion proposes a Triple Masked Language Model and names its obstacle: storage and computation
cubic in the masked tokens (|M|^3 triples) times 20^3 = 8,000 classes. Two choices keep it well below that:

* **sampled triples**: per sequence, ``ceil(triples_per_masked * n)`` triples (i < j < k) of its n masked
  standard residues, drawn uniformly with replacement (``sample_triples``), not all ``n(n-1)(n-2)/6``;
* **a factorised output**: the head's 8,000 logits of a triple are built from ``3 * 20`` unary, ``3 * 400``
  pairwise and ``3 * R * 20`` rank-R three-way factors instead of an 8,000-wide output layer::

      logit(a, b, c) = u_i(a) + u_j(b) + u_k(c) + p_ij(a, b) + p_ik(a, c) + p_jk(b, c)
                       + sum_r A_r(a) B_r(b) C_r(c)

  the log-linear form of a three-site Potts conditional (fields, pair couplings, a three-body term of CP rank R),
  so a planted three-body term of R favoured residue triples is representable exactly.

The head's hidden layer is the pair head's, one site more: role-wise projections of h_i, h_j, h_k (each computed
once per distinct position and gathered) plus a projection of the three-way product, then act and LayerNorm::

    z = LayerNorm(act(W_1 h_i + W_2 h_j + W_3 h_k + W_p (h_i * h_j * h_k) + b))     (width W)

The class of (x_i, x_j, x_k) = (a, b, c) is ``400 a + 20 b + c`` over residue classes, i < j < k in the sequence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pmlm.alphabet import NUM_RESIDUES
from pmlm.model.encoder import ACTIVATIONS
from pmlm.model.heads import loss_precision

Q = NUM_RESIDUES
NUM_TRIPLE_CLASSES = Q**3


class TripleHead(nn.Module):
    """Factorised triple-joint head evaluated on selected rows (b, i, j, k), in chunks."""

    def __init__(self, hidden: int, width: int, rank: int, chunk_size: int, activation: str = "gelu"):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.width, self.rank, self.chunk_size = width, rank, chunk_size
        self.project = nn.Linear(hidden, 3 * width, bias=False)  # W_1, W_2, W_3 stacked
        self.product = nn.Linear(hidden, width)  # W_p and the bias
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, 3 * Q + 3 * Q * Q + 3 * rank * Q)
        self._base = None  # a TokenHead whose log-probabilities at i, j, k are added (model.product_base)

    def set_product_base(self, token_head: nn.Module) -> None:
        """Predict the joint as the product of ``token_head``'s marginals at i, j, k times exp(this head's output);
        the token head is referenced, not registered (its weights stay where they are in the state dict)."""
        object.__setattr__(self, "_base", token_head)

    def forward(self, reps: Tensor, triple_index: Tensor) -> Tensor:
        """Logits (T, 8000) for the rows of ``triple_index`` (T, 4) = (b, i, j, k) over ``reps`` (B, L, C); the
        distinct positions are found with ``unique`` (a host synchronisation: training uses ``from_rows``)."""
        if triple_index.dim() != 2 or triple_index.shape[1] != 4:
            raise ValueError(f"triple_index must have shape (T, 4), got {tuple(triple_index.shape)}")
        B, L, C = reps.shape
        T = triple_index.shape[0]
        rows = triple_index[:, :1] * L + triple_index[:, 1:]  # (T, 3) rows of the flattened reps
        used, inverse = torch.unique(rows.flatten(), return_inverse=True)
        return self.from_rows(F.embedding(used, reps.reshape(B * L, C)), inverse.view(T, 3))

    def from_rows(self, h: Tensor, triples: Tensor) -> Tensor:
        """Logits (T, 8000) of the triples (T, 3) of rows of ``h`` (N, C), each row of ``h`` projected once."""
        proj = self.project(h).view(-1, 3, self.width)  # (N, role, W)
        base = torch.log_softmax(self._base(h).float(), dim=-1).to(proj.dtype) if self._base else None  # (N, Q)
        parts = []
        for start in range(0, max(triples.shape[0], 1), self.chunk_size):
            idx = triples[start : start + self.chunk_size]  # (t, 3)
            rows = [F.embedding(idx[:, r], h) for r in range(3)]  # (t, C) each
            pre = self.product(rows[0] * rows[1] * rows[2])
            for role in range(3):
                pre = pre + proj[idx[:, role], role]
            logits = self.logits(self.out(self.norm(self.act(pre))))
            if base is not None:
                bi, bj, bk = (F.embedding(idx[:, r], base) for r in range(3))  # (t, Q) each
                product = bi[:, :, None, None] + bj[:, None, :, None] + bk[:, None, None, :]
                logits = logits + product.flatten(1)
            parts.append(logits)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def logits(self, factors: Tensor) -> Tensor:
        """(t, 3Q + 3Q^2 + 3RQ) factors -> (t, Q^3) logits, class 400 a + 20 b + c."""
        t = factors.shape[0]
        unary, pairs, cp = factors.split([3 * Q, 3 * Q * Q, 3 * self.rank * Q], dim=1)
        u = unary.view(t, 3, Q)
        p = pairs.view(t, 3, Q, Q)
        a, b, c = cp.view(t, 3, self.rank, Q).unbind(1)  # (t, R, Q) each
        three_way = torch.bmm((a[:, :, :, None] * b[:, :, None, :]).flatten(2).transpose(1, 2), c)  # (t, Q*Q, Q)
        out = (
            three_way.view(t, Q, Q, Q)
            + (u[:, 0, :, None] + p[:, 0])[:, :, :, None]  # u_i(a) + p_ij(a, b)
            + (u[:, 1, None, :, None] + u[:, 2, None, None, :])  # u_j(b) + u_k(c)
            + p[:, 1][:, :, None, :]
            + p[:, 2][:, None, :, :]
        )  # p_ik(a, c) + p_jk(b, c)
        return out.reshape(t, Q**3)


def triples_per_sequence(masked: int, per_masked: float) -> int:
    """How many triples ``sample_triples`` draws for a sequence with ``masked`` masked standard residues."""
    return math.ceil(per_masked * masked) if masked >= 3 else 0


def sample_triples(valid: Tensor, per_masked: float, generator: torch.Generator) -> Tensor:
    """(T, 4) rows (b, i, j, k), i < j < k, of flagged positions (``valid`` (B, L) bool): ``ceil(per_masked * n_b)``
    triples for every row with n_b >= 3 flagged positions, each uniform over that row's triples (with replacement).
    Sorted by row; fixed draw shapes (one key per row, triple slot and position), so seeded draws repeat."""
    B, L = valid.shape
    wanted = torch.tensor(
        [triples_per_sequence(n, per_masked) for n in valid.sum(dim=1).tolist()], dtype=torch.long, device=valid.device
    )  # (B,)
    slots = int(wanted.max()) if B else 0
    if slots == 0:
        return torch.zeros((0, 4), dtype=torch.long, device=valid.device)
    keys = torch.rand(B, slots, L, generator=generator, device=generator.device).to(valid.device)
    keys = keys.masked_fill(~valid[:, None, :], 2.0)  # positions that are not flagged never come first
    chosen = keys.topk(3, dim=2, largest=False).indices.sort(dim=2).values  # (B, slots, 3) distinct positions
    keep = torch.arange(slots, device=valid.device)[None, :] < wanted[:, None]  # (B, slots)
    rows = torch.arange(B, device=valid.device)[:, None].expand(B, slots)
    return torch.cat([rows[keep][:, None], chosen[keep]], dim=1)


def triple_labels(triple_index: Tensor, targets: Tensor) -> Tensor:
    """Class ``400 x_i + 20 x_j + x_k`` of each row (b, i, j, k) from residue-class targets (B, L)."""
    b = triple_index[:, 0]
    ti, tj, tk = (targets[b, triple_index[:, s]] for s in (1, 2, 3))
    return (ti * Q + tj) * Q + tk


def triple_loss(triple_logits: Tensor, labels: Tensor) -> tuple[Tensor, int, Tensor]:
    """``(ce_sum, n_triples, n_correct)`` of (T, 8000) logits."""
    ce_sum = F.cross_entropy(loss_precision(triple_logits), labels, reduction="sum")
    return ce_sum, labels.numel(), (triple_logits.argmax(dim=-1) == labels).sum()


def naive_triple_count(masked: int) -> int:
    """Ordered triples of distinct masked positions, the |M|^3 formulation's row count."""
    return masked * (masked - 1) * (masked - 2)
