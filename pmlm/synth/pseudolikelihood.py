"""A Potts model fitted to a family's sequences by pseudo-likelihood (plmDCA's symmetric estimator, GREMLIN's
objective), written with torch: the co-evolution study's classical baseline, beside the sampler and the exact
conditionals of ``pmlm.synth``.

Minimises ``(1/N) sum_n sum_i -log P(x_i^n | x_-i^n) + lambda_h ||h||^2 + lambda_J ||J||^2`` over fields h (L, q)
and couplings J (L, q, L, q), J symmetric (J_ij(a, b) = J_ji(b, a)) with zero blocks on the diagonal, by L-BFGS
on the full batch; the conditional of site i is ``softmax_a(h_i(a) + sum_(j != i) J_ij(a, x_j))``. The sum over
j is a sum of L gathered rows of J (``embedding_bag``), not a product with the one-hot sequences: L x fewer
operations. No sequence reweighting: the families' sequences are independent draws of their Potts model, not a
phylogeny. Contact scores are the Frobenius norms of the couplings in the zero-sum gauge, then APC (the usual
DCA score); the fitted model's epistasis and pair conditionals are read like the exact model's
(``pmlm.synth.exact``), so the baseline has a value on every exact read-out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pmlm.alphabet import NUM_RESIDUES
from pmlm.errors import ConfigError
from pmlm.evaluation.unsupervised import apc
from pmlm.synth.exact import double_difference


@dataclass(frozen=True)
class FittedPotts:
    """A dense Potts model from a pseudo-likelihood fit: fields (L, q) and couplings (L, L, q, q) indexed
    [i, j, a, b], symmetric, zero for i = j."""

    fields: np.ndarray
    couplings: np.ndarray
    loss: float  # the final objective (nats per sequence, penalties included)
    iterations: int  # L-BFGS iterations run

    @property
    def length(self) -> int:
        return int(self.fields.shape[0])

    def coupling_norms(self) -> np.ndarray:
        """Frobenius norm of each J_ij in the zero-sum gauge, (L, L), zero diagonal."""
        j = self.couplings
        centred = j - j.mean(axis=2, keepdims=True) - j.mean(axis=3, keepdims=True) + j.mean(axis=(2, 3), keepdims=True)
        return np.sqrt((centred**2).sum(axis=(2, 3)))

    def contact_scores(self) -> np.ndarray:
        """Frobenius norms with APC, (L, L): the DCA contact score."""
        return apc(self.coupling_norms())

    def pair_epistasis(self, rows: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """e_ij(a, b) of the fitted model on each background, (n, P, q, q): the double difference of J_ij."""
        rows = np.asarray(rows, dtype=np.int64)
        shape = (len(rows), *self.couplings.shape[2:])
        eps = [
            double_difference(np.broadcast_to(self.couplings[i, j], shape), rows[:, i], rows[:, j]) for i, j in pairs
        ]
        return np.stack(eps, axis=1)

    def pair_log_conditional(self, rows: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """log P(x_i = a, x_j = b | x_-ij) of the fitted model, (n, P, q, q)."""
        rows = np.asarray(rows, dtype=np.int64)
        n, length = rows.shape
        q = self.fields.shape[1]
        one_hot = np.zeros((n, length * q))
        one_hot[np.arange(n)[:, None], np.arange(length) * q + rows] = 1.0
        table = self.couplings.transpose(1, 3, 0, 2).reshape(length * q, length * q)  # [j b, i a]
        local = self.fields[None] + (one_hot @ table).reshape(n, length, q)  # h_i(a) + sum_j J_ij(a, x_j)
        out = []
        for i, j in pairs:
            fi = local[:, i] - self.couplings[i, j][:, rows[:, j]].T  # (n, q): without the term of j
            fj = local[:, j] - self.couplings[j, i][:, rows[:, i]].T
            energy = fi[:, :, None] + fj[:, None, :] + self.couplings[i, j][None]
            flat = energy.reshape(n, -1)
            top = flat.max(axis=1, keepdims=True)
            out.append((flat - top - np.log(np.exp(flat - top).sum(axis=1, keepdims=True))).reshape(energy.shape))
        return np.stack(out, axis=1)


def _objective(x: torch.Tensor, fields: torch.Tensor, w: torch.Tensor, lambdas: tuple[float, float]) -> torch.Tensor:
    """The penalised negative pseudo-log-likelihood per sequence; w is (L q [j, b], L q [i, a]), symmetric."""
    n, length = x.shape
    q = fields.shape[1]
    bag = x + torch.arange(length) * q  # (N, L): row j * q + x_j of the coupling table
    logits = F.embedding_bag(bag, w, mode="sum").view(n, length, q) + fields  # (N, L, q)
    nll = F.cross_entropy(logits.reshape(-1, q), x.reshape(-1), reduction="sum") / n
    return nll + lambdas[0] * fields.square().sum() + lambdas[1] * w.square().sum()


def fit_pseudolikelihood(
    sequences: np.ndarray,
    *,
    lambda_fields: float = 0.01,
    lambda_couplings: float = 0.01,
    iterations: int = 100,
    q: int = NUM_RESIDUES,
) -> FittedPotts:
    """Fit fields and couplings to ``sequences`` (N, L) of residue classes 0..q-1 (module docstring). The objective
    is convex; float64 throughout."""
    x = torch.as_tensor(np.asarray(sequences, dtype=np.int64))
    if x.ndim != 2 or len(x) < 2:
        raise ConfigError(f"a pseudo-likelihood fit needs (N >= 2, L) sequences, got shape {tuple(x.shape)}")
    if iterations < 1 or lambda_fields < 0 or lambda_couplings < 0:
        raise ConfigError(
            f"need iterations >= 1 and penalties >= 0 (got {iterations}, {lambda_fields}, {lambda_couplings})"
        )
    length = x.shape[1]
    not_self = (1.0 - torch.eye(length, dtype=torch.float64)).repeat_interleave(q, 0).repeat_interleave(q, 1)
    fields = torch.zeros(length, q, dtype=torch.float64, requires_grad=True)
    raw = torch.zeros(length * q, length * q, dtype=torch.float64, requires_grad=True)
    lambdas = (lambda_fields, lambda_couplings)

    def couplings() -> torch.Tensor:  # (L q [j, b], L q [i, a]), symmetric, zero self blocks
        return 0.5 * (raw + raw.T) * not_self

    optimizer = torch.optim.LBFGS(
        [fields, raw], lr=1.0, max_iter=iterations, history_size=20, line_search_fn="strong_wolfe",
        tolerance_grad=1e-9, tolerance_change=1e-12,
    )  # fmt: skip

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = _objective(x, fields, couplings(), lambdas)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    with torch.no_grad():
        final = float(_objective(x, fields, couplings(), lambdas))
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    table = couplings().detach().view(length, q, length, q).permute(2, 0, 3, 1)  # [i, j, a, b] = w[j b, i a]
    return FittedPotts(
        fields=fields.detach().numpy().copy(),
        couplings=table.contiguous().numpy().copy(),
        loss=final,
        iterations=int(state.get("n_iter", iterations)),
    )
