"""Exact conditionals and epistasis of a Potts model (``pmlm.synth.potts``): the ground truth the co-evolution
study compares encoders with.

With a set S of sites masked and every other residue fixed to a background x, the energy of an assignment of S
splits exactly (a Möbius expansion around the background's own residues x_S) into one term per subset of S:

    E(x_S <- y) - E(x) = sum_(s in S) d_s(y_s) + sum_(s < t in S) e_st(y_s, y_t) + [e_ijk(y_i, y_j, y_k) if |S| = 3]

* ``d_s(a) = F_s(a) - F_s(x_s)``, ``F_s(a)`` the energy of every term holding s with x_s = a and the rest at x
  (``local_fields``): the single-site conditional, log P(x_s = a | x_-s) = F_s(a) - logsumexp F_s;
* ``e_ij(a, b)``, the **double-mutant epistasis** of (i:a, j:b) on background x: the double difference
  ``T(a, b) - T(a, x_j) - T(x_i, b) + T(x_i, x_j)`` of every term T holding both i and j, the other sites of a
  three-body term at x. For a pair coupling that is ``J_ij(a,b) - J_ij(a,x_j) - J_ij(x_i,b) + J_ij(x_i,x_j)``;
  fields and every other coupling cancel, and it is zero for a pair no term joins;
* ``e_ijk(a, b, c)``, the **third-order epistasis**: the alternating sum over the 8 corners
  ``sum_(U subset of {i,j,k}) (-1)^(3-|U|) E(sites U mutated, the others wild type)``. Pair couplings cancel
  from it; for a three-body term K it is the same alternating sum of K, so it is zero in a pairwise model.

So ``log P(x_i=a, x_j=b | x_-ij) = F_i(a) + F_j(b) + e_ij(a, b) - log Z``, and the score of a double mutant
minus the two single scores (each site masked alone, the other at wild type) is exactly ``e_ij``, the quantity
``pmlm score`` reports as epistasis. The same holds with three sites and ``e_ijk``.

Sequences are residue classes 0..q-1, shape (N, L); everything is vectorised over the N backgrounds.
"""

from __future__ import annotations

import numpy as np

from pmlm.synth.potts import PottsModel


def _rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    return x[None] if x.ndim == 1 else x


def local_fields(model: PottsModel, x: np.ndarray) -> np.ndarray:
    """F[n, s, a]: the energy of every term holding site s, with x_s = a and the other sites at x[n], (N, L, q)."""
    x = _rows(x)
    out = np.repeat(model.fields[None], len(x), axis=0)  # (N, L, q)
    for e, (i, j) in enumerate(model.edges):
        out[:, i] += model.couplings[e][:, x[:, j]].T  # J(a, x_j): (N, q)
        out[:, j] += model.couplings[e][x[:, i], :]  # J(x_i, b)
    for t, (i, j, k) in enumerate(model.triplets):
        table = model.triple_couplings[t]
        out[:, i] += table[:, x[:, j], x[:, k]].T
        out[:, j] += table[x[:, i], :, x[:, k]]
        out[:, k] += table[x[:, i], x[:, j], :]
    return out


def double_difference(table: np.ndarray, wi: np.ndarray, wj: np.ndarray) -> np.ndarray:
    """``T(a,b) - T(a,w_j) - T(w_i,b) + T(w_i,w_j)`` of tables (N, q, q) around the backgrounds' residues (N,)."""
    n = np.arange(len(table))
    return table - table[n, :, wj][:, :, None] - table[n, wi, :][:, None, :] + table[n, wi, wj][:, None, None]


def triple_difference(table: np.ndarray, wi: np.ndarray, wj: np.ndarray, wk: np.ndarray) -> np.ndarray:
    """The alternating sum over the 8 corners of tables (N, q, q, q) around (w_i, w_j, w_k), (N, q, q, q)."""
    n = np.arange(len(table))
    t = table
    return (
        t
        - t[n, :, :, wk][:, :, :, None]
        - t[n, :, wj, :][:, :, None, :]
        - t[n, wi, :, :][:, None, :, :]
        + t[n, :, wj, wk][:, :, None, None]
        + t[n, wi, :, wk][:, None, :, None]
        + t[n, wi, wj, :][:, None, None, :]
        - t[n, wi, wj, wk][:, None, None, None]
    )


def pair_terms(model: PottsModel, x: np.ndarray, i: int, j: int) -> np.ndarray:
    """T[n, a, b]: every term holding both i and j (i != j), as a function of (x_i, x_j) = (a, b) with the other
    sites at x[n]; zeros when no term joins them, (N, q, q)."""
    x = _rows(x)
    q = model.fields.shape[1]
    out = np.zeros((len(x), q, q))
    swap = i > j
    lo, hi = (j, i) if swap else (i, j)
    for e in np.flatnonzero((model.edges[:, 0] == lo) & (model.edges[:, 1] == hi)):
        out += model.couplings[e][None]
    for t, sites in enumerate(model.triplets):
        sites = [int(s) for s in sites]
        if lo in sites and hi in sites:
            table = model.triple_couplings[t]
            (third,) = [p for p, s in enumerate(sites) if s not in (lo, hi)]
            x3 = x[:, sites[third]]
            # move the third axis first, then index it per background: (N, q lo, q hi)
            out += np.moveaxis(table, third, 0)[x3]
    return out.transpose(0, 2, 1) if swap else out


def pair_epistasis(model: PottsModel, x: np.ndarray, i: int, j: int) -> np.ndarray:
    """e_ij(a, b) on each background, (N, q, q) indexed [x_i = a, x_j = b] (module docstring)."""
    x = _rows(x)
    return double_difference(pair_terms(model, x, i, j), x[:, i], x[:, j])


def triple_epistasis(model: PottsModel, x: np.ndarray, sites: tuple[int, int, int]) -> np.ndarray:
    """e_ijk(a, b, c) of three sites (in the order given) on each background, (N, q, q, q)."""
    x = _rows(x)
    q = model.fields.shape[1]
    key = sorted(sites)
    out = np.zeros((len(x), q, q, q))
    for t in np.flatnonzero((model.triplets == key).all(axis=1)):
        table = np.transpose(model.triple_couplings[t], [key.index(s) for s in sites])  # axes in the given order
        out += triple_difference(np.broadcast_to(table, (len(x), q, q, q)), *(x[:, s] for s in sites))
    return out


def pair_log_conditional(model: PottsModel, x: np.ndarray, i: int, j: int) -> np.ndarray:
    """log P(x_i = a, x_j = b | x_-ij), (N, q, q), the 400 (q^2) states enumerated with the rest fixed."""
    x = _rows(x)
    f = local_fields(model, x)
    energy = f[:, i, :, None] + f[:, j, None, :] + pair_epistasis(model, x, i, j)
    return energy - _logsumexp(energy.reshape(len(x), -1), axis=-1)[:, None, None]


def triple_log_conditional(model: PottsModel, x: np.ndarray, sites: tuple[int, int, int]) -> np.ndarray:
    """log P(x_i = a, x_j = b, x_k = c | the rest), (N, q, q, q), the q^3 states enumerated with the rest fixed."""
    x = _rows(x)
    i, j, k = sites
    f = local_fields(model, x)
    energy = (
        f[:, i, :, None, None]
        + f[:, j, None, :, None]
        + f[:, k, None, None, :]
        + pair_epistasis(model, x, i, j)[:, :, :, None]
        + pair_epistasis(model, x, i, k)[:, :, None, :]
        + pair_epistasis(model, x, j, k)[:, None, :, :]
        + triple_epistasis(model, x, sites)
    )
    return energy - _logsumexp(energy.reshape(len(x), -1), axis=-1)[:, None, None, None]


def coupled_pairs(model: PottsModel) -> set[tuple[int, int]]:
    """Pairs (i < j) some term joins: the planted edges and the pairs inside a triplet."""
    out = {(int(i), int(j)) for i, j in model.edges}
    for i, j, k in model.triplets:
        out |= {(int(i), int(j)), (int(i), int(k)), (int(j), int(k))}
    return out


def _logsumexp(values: np.ndarray, axis: int) -> np.ndarray:
    top = values.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(values - top).sum(axis=axis, keepdims=True))).squeeze(axis)
