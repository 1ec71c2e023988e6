"""The Gibbs sampler of ``pmlm synth``: independent chains over a Potts model (``pmlm.synth.potts``), sites of one
colour of a greedy graph colouring updated at once, with burn-in and thinning, and the chains' mixing diagnostics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pmlm.alphabet import NUM_RESIDUES
from pmlm.errors import ConfigError


class PottsLike(Protocol):
    """What the sampler reads of a Potts model (``pmlm.synth.potts.PottsModel``, whose module imports this one to
    draw its families, or any object with these fields): sites, fields (L, 20), pair couplings (E, 20, 20) on edges
    (E, 2), three-body tables (T, 20, 20, 20) on triplets (T, 3), and the unnormalised log-probability of
    sequences."""

    length: int
    fields: np.ndarray
    edges: np.ndarray
    couplings: np.ndarray
    triplets: np.ndarray
    triple_couplings: np.ndarray

    def log_weight(self, sequences: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class SampleStats:
    """Mixing diagnostics of one Gibbs run: thinning is adequate when consecutive samples of a
    chain are hardly more alike than samples of different chains."""

    identity_consecutive: float  # mean fraction of identical residues, sample t vs t+1 of a chain
    identity_between_chains: float  # same, between different chains at the same step
    mean_log_weight: float  # of the kept samples


def _colour_groups(length: int, edges: np.ndarray, triplets: np.ndarray | None = None) -> list[np.ndarray]:
    """Greedy graph colouring: sites of one colour share no edge (nor triplet), so Gibbs updates them at once."""
    neighbours: list[set[int]] = [set() for _ in range(length)]
    for i, j in edges:
        neighbours[int(i)].add(int(j))
        neighbours[int(j)].add(int(i))
    for sites in [] if triplets is None else triplets:
        for s in sites:
            neighbours[int(s)].update(int(o) for o in sites if o != s)
    colour = np.full(length, -1, dtype=np.int64)
    for site in sorted(range(length), key=lambda s: -len(neighbours[s])):
        used = {int(colour[n]) for n in neighbours[site]}
        colour[site] = next(c for c in range(length) if c not in used)
    return [np.flatnonzero(colour == c) for c in range(int(colour.max()) + 1)]


class _GroupUpdate:
    """Precomputed tables for the Gibbs update of one colour group of sites.

    Each site's couplings are padded to the group's largest degree K with all-zero tables, so
    the conditional logits are one gather and one sum over K.
    """

    def __init__(self, model: PottsLike, sites: np.ndarray):
        self.sites = sites  # (S,)
        local = {int(s): k for k, s in enumerate(sites)}
        per_site: list[list[tuple[np.ndarray, int]]] = [[] for _ in sites]
        for e, (i, j) in enumerate(model.edges):
            if int(i) in local:  # table[x_j, a] = J(a, x_j)
                per_site[local[int(i)]].append((model.couplings[e].T, int(j)))
            if int(j) in local:  # table[x_i, b] = J(x_i, b)
                per_site[local[int(j)]].append((model.couplings[e], int(i)))
        degree = max((len(p) for p in per_site), default=0)
        self.fields = model.fields[sites]  # (S, 20)
        tables = np.zeros((degree, len(sites), NUM_RESIDUES, NUM_RESIDUES))  # (K, S, 20 other, 20 own)
        others = np.zeros((degree, len(sites)), dtype=np.int64)  # (K, S); padding points at site 0
        for s, entries in enumerate(per_site):
            for k, (table, other) in enumerate(entries):
                tables[k, s] = table
                others[k, s] = other
        self.others = others
        # row (k, s, x_other) of the flattened tables is found at base + x_other
        self.rows = tables.reshape(-1, NUM_RESIDUES)  # (K * S * 20, 20)
        self.base = np.arange(degree * len(sites)).reshape(degree, len(sites)) * NUM_RESIDUES  # (K, S)
        self._triple_tables(model, local)

    def _triple_tables(self, model: PottsLike, local: dict[int, int]) -> None:
        """The same for three-body terms: per site, tables [x_other1, x_other2, own] padded to the largest
        triplet degree D, gathered at row base + 20 * x_other1 + x_other2."""
        per_site: list[list[tuple[np.ndarray, int, int]]] = [[] for _ in local]
        for t, (i, j, k) in enumerate(model.triplets):
            table = model.triple_couplings[t]  # [a, b, c]
            for own, axes, o1, o2 in ((i, (1, 2, 0), j, k), (j, (0, 2, 1), i, k), (k, (0, 1, 2), i, j)):
                if int(own) in local:
                    per_site[local[int(own)]].append((table.transpose(axes), int(o1), int(o2)))
        degree = max((len(p) for p in per_site), default=0)
        q = NUM_RESIDUES
        tables = np.zeros((degree, len(local), q, q, q))  # (D, S, 20 other1, 20 other2, 20 own)
        self.triple_others = np.zeros((2, degree, len(local)), dtype=np.int64)  # (2, D, S); padding -> site 0
        for s, entries in enumerate(per_site):
            for d, (table, o1, o2) in enumerate(entries):
                tables[d, s] = table
                self.triple_others[:, d, s] = (o1, o2)
        self.triple_rows = tables.reshape(-1, q)  # (D * S * 400, 20)
        self.triple_base = np.arange(degree * len(local)).reshape(degree, len(local)) * q * q  # (D, S)

    def __call__(self, state: np.ndarray, rng: np.random.Generator) -> None:
        logits = self.fields  # (S, 20), broadcast against chains below
        if len(self.others):
            contrib = np.take(self.rows, self.base + state[:, self.others], axis=0)  # (C, K, S, 20)
            logits = logits + contrib.sum(axis=1)  # (C, S, 20)
        if self.triple_others.shape[1]:
            first, second = state[:, self.triple_others[0]], state[:, self.triple_others[1]]  # (C, D, S) each
            rows = self.triple_base + first * NUM_RESIDUES + second
            logits = logits + np.take(self.triple_rows, rows, axis=0).sum(axis=1)  # (C, S, 20)
        if logits.ndim == 2:  # no couplings at these sites
            logits = np.broadcast_to(logits, (state.shape[0], *logits.shape))
        state[:, self.sites] = _sample_categorical(logits, rng)


_UPPER_ONES = np.triu(np.ones((NUM_RESIDUES, NUM_RESIDUES)))  # (20, 20)


def _sample_categorical(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row of (..., 20) logits by inverse CDF (one uniform per draw)."""
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    cdf = weights @ _UPPER_ONES  # running sum over the last axis; a BLAS product beats np.cumsum on rows of 20
    u = rng.random((*logits.shape[:-1], 1)) * cdf[..., -1:]
    return np.minimum((cdf < u).sum(axis=-1), logits.shape[-1] - 1)


def gibbs_sample(
    model: PottsLike,
    num_sequences: int,
    rng: np.random.Generator,
    *,
    chains: int,
    burn_in: int,
    thinning: int,
) -> tuple[np.ndarray, SampleStats]:
    """``num_sequences`` sequences (N, L) uint8 from ``chains`` independent Gibbs chains.

    Each chain starts from the independent-site distribution exp(h), runs ``burn_in`` sweeps,
    then keeps one sample every ``thinning`` sweeps; a sweep updates every site once, colour
    group by colour group. Output order is round-major (all chains' first samples first).
    """
    if num_sequences < 1 or chains < 1 or burn_in < 0 or thinning < 1:
        raise ConfigError(
            f"need num_sequences >= 1, chains >= 1, burn_in >= 0, thinning >= 1 "
            f"(got {num_sequences}, {chains}, {burn_in}, {thinning})"
        )
    updates = [_GroupUpdate(model, g) for g in _colour_groups(model.length, model.edges, model.triplets)]
    rounds = -(-num_sequences // chains)
    init = np.broadcast_to(model.fields, (chains, *model.fields.shape))
    state = _sample_categorical(init, rng).astype(np.int64)  # (C, L)

    def sweep(count: int) -> None:
        for _ in range(count):
            for update in updates:
                update(state, rng)

    sweep(burn_in)
    kept = np.empty((rounds, chains, model.length), dtype=np.uint8)  # (R, C, L)
    for r in range(rounds):
        sweep(thinning if r else 0)
        kept[r] = state
    sequences = kept.reshape(-1, model.length)[:num_sequences]
    stats = SampleStats(
        identity_consecutive=float((kept[1:] == kept[:-1]).mean()) if rounds > 1 else float("nan"),
        identity_between_chains=float((kept[:, 1:] == kept[:, :-1]).mean()) if chains > 1 else float("nan"),
        mean_log_weight=float(model.log_weight(sequences).mean()),
    )
    return sequences, stats
