"""Synthetic protein families from Potts models with planted couplings, and the reader of their
planted-contact lists (the MSA statistics that check them live in ``pmlm.evaluation.unsupervised``).

Sequences are arrays of residue classes 0..19 (``token_id - FIRST_RESIDUE_ID`` of
:mod:`pmlm.alphabet`); positions and edges are 0-based. The model is
``P(x) ∝ exp(sum_i h_i(x_i) + sum_(i,j) in E J_ij(x_i, x_j) + sum_(i,j,k) in T K_ijk(x_i, x_j, x_k))`` over a
sparse edge set E and an optional set T of three-body terms (``triplets``; none by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pmlm.alphabet import NUM_RESIDUES, RESIDUES
from pmlm.errors import ConfigError, InputError

# UniProtKB/Swiss-Prot amino-acid composition (percent), the background the per-site
# fields are drawn around so that columns look like protein columns, not uniform noise.
SWISSPROT_COMPOSITION_PERCENT = {
    "A": 8.25, "C": 1.37, "D": 5.45, "E": 6.75, "F": 3.86, "G": 7.07, "H": 2.27,
    "I": 5.96, "K": 5.84, "L": 9.66, "M": 2.42, "N": 4.06, "P": 4.70, "Q": 3.93,
    "R": 5.53, "S": 6.56, "T": 5.34, "V": 6.87, "W": 1.08, "Y": 2.92,
}  # fmt: skip
BACKGROUND = np.array([SWISSPROT_COMPOSITION_PERCENT[a] for a in RESIDUES], dtype=np.float64)
BACKGROUND /= BACKGROUND.sum()  # (20,) in the order of RESIDUES


@dataclass
class PottsConfig:
    """Everything that defines one synthetic family except its random seed."""

    length: int = 96  # residues per sequence
    num_sequences: int = 2000  # sequences sampled per family
    edges: int | None = None  # planted couplings per family; None -> one per residue (= length)
    short_range_fraction: float = 0.15  # share of edges with min_separation <= |i-j| < medium_separation
    min_separation: int = 6  # no edge closer than this (contact metrics ignore |i-j| < 6)
    medium_separation: int = 12  # start of the medium/long range (the design's 12)
    max_degree: int = 4  # most couplings at one site, as a residue has few contacts
    coupling_strength: float = 2.0  # J bonus (nats) of each compatible residue pair of an edge
    compatible_pairs: int = 4  # residue pairs (a, b) an edge favours, drawn from the sites' likely residues
    coupling_noise: float = 0.1  # std (nats) of Gaussian noise on all 400 entries of J_ij
    field_concentration: float = 4.0  # total Dirichlet concentration of site profiles; lower -> more conserved
    background_mix: float = 0.05  # share of the background composition mixed into every site profile
    chains: int = 64  # independent Gibbs chains, run in parallel
    burn_in: int = 200  # sweeps discarded before the first sample of every chain
    thinning: int = 10  # sweeps between two kept samples of a chain
    triplets: int = 0  # planted three-body terms K_ijk per family (disjoint site triples); 0: pairwise Potts
    triplet_strength: float = 2.0  # K bonus (nats) of each compatible residue triple of a three-body term
    compatible_triples: int = 4  # residue triples (a, b, c) a three-body term favours

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        need(self.min_separation >= 1, f"min_separation must be >= 1 (got {self.min_separation})")
        need(
            self.medium_separation > self.min_separation,
            f"medium_separation must exceed min_separation={self.min_separation} (got {self.medium_separation})",
        )
        need(
            self.length > self.medium_separation,
            f"length (--length) must be > {self.medium_separation} so medium/long-range pairs exist "
            f"(got {self.length})",
        )
        need(self.num_sequences >= 1, f"num_sequences (--sequences) must be >= 1 (got {self.num_sequences})")
        if self.edges is None:
            self.edges = self.length
        need(self.edges >= 0, f"edges (--edges) must be >= 0 (got {self.edges})")
        need(
            0.0 <= self.short_range_fraction <= 1.0,
            f"short_range_fraction must be in [0, 1] (got {self.short_range_fraction})",
        )
        need(self.max_degree >= 1, f"max_degree must be >= 1 (got {self.max_degree})")
        need(
            self.edges <= self.length * self.max_degree // 2,
            f"edges (--edges) = {self.edges} exceeds what length {self.length} and max_degree "
            f"{self.max_degree} allow ({self.length * self.max_degree // 2}); lower --edges or raise --max-degree",
        )
        need(
            math.isfinite(self.coupling_strength) and self.coupling_strength >= 0,
            f"coupling_strength (--coupling-strength) must be a finite number >= 0 (got {self.coupling_strength})",
        )
        need(
            1 <= self.compatible_pairs <= NUM_RESIDUES,
            f"compatible_pairs must be in [1, {NUM_RESIDUES}] (got {self.compatible_pairs})",
        )
        need(
            math.isfinite(self.coupling_noise) and self.coupling_noise >= 0,
            f"coupling_noise must be a finite number >= 0 (got {self.coupling_noise})",
        )
        need(
            math.isfinite(self.field_concentration) and self.field_concentration > 0,
            f"field_concentration must be > 0 (got {self.field_concentration})",
        )
        need(0.0 < self.background_mix <= 1.0, f"background_mix must be in (0, 1] (got {self.background_mix})")
        need(self.chains >= 1, f"chains (--chains) must be >= 1 (got {self.chains})")
        need(self.burn_in >= 0, f"burn_in (--burn-in) must be >= 0 (got {self.burn_in})")
        need(self.thinning >= 1, f"thinning (--thinning) must be >= 1 (got {self.thinning})")
        need(self.triplets >= 0, f"triplets (--triplets) must be >= 0 (got {self.triplets})")
        need(
            3 * self.triplets <= self.length,
            f"triplets (--triplets) = {self.triplets} needs {3 * self.triplets} distinct sites; length is {self.length}",
        )
        need(
            math.isfinite(self.triplet_strength) and self.triplet_strength >= 0,
            f"triplet_strength (--triplet-strength) must be a finite number >= 0 (got {self.triplet_strength})",
        )
        need(
            1 <= self.compatible_triples <= NUM_RESIDUES,
            f"compatible_triples must be in [1, {NUM_RESIDUES}] (got {self.compatible_triples})",
        )

    @property
    def num_short_edges(self) -> int:
        return round(self.short_range_fraction * self.edges)


def _no_triplets() -> np.ndarray:
    return np.zeros((0, 3), dtype=np.int64)


def _no_triple_couplings() -> np.ndarray:
    return np.zeros((0, NUM_RESIDUES, NUM_RESIDUES, NUM_RESIDUES))


@dataclass(frozen=True)
class PottsModel:
    """Fields, sparse couplings and optional three-body terms; ``couplings[e, a, b]`` is J for x_i = a, x_j = b
    of edge (i, j), ``triple_couplings[t, a, b, c]`` is K for x_i = a, x_j = b, x_k = c of triplet (i, j, k).
    The number of states per site q is ``fields.shape[1]`` (20 residue classes; smaller in tests)."""

    fields: np.ndarray  # (L, q)
    edges: np.ndarray  # (E, 2) int64, i < j
    couplings: np.ndarray  # (E, q, q)
    triplets: np.ndarray = field(default_factory=_no_triplets)  # (T, 3) int64, i < j < k
    triple_couplings: np.ndarray = field(default_factory=_no_triple_couplings)  # (T, q, q, q)

    @property
    def length(self) -> int:
        return int(self.fields.shape[0])

    def contact_map(self) -> np.ndarray:
        """Planted edges as a symmetric (L, L) bool map."""
        out = np.zeros((self.length, self.length), dtype=bool)
        out[self.edges[:, 0], self.edges[:, 1]] = True
        out[self.edges[:, 1], self.edges[:, 0]] = True
        return out

    def coupling_norms(self) -> np.ndarray:
        """Frobenius norm of each J_ij in the zero-sum gauge (the usual DCA coupling strength), (E,)."""
        j = self.couplings
        centred = j - j.mean(axis=1, keepdims=True) - j.mean(axis=2, keepdims=True)
        centred = centred + j.mean(axis=(1, 2), keepdims=True)
        return np.sqrt((centred**2).sum(axis=(1, 2)))

    def log_weight(self, sequences: np.ndarray) -> np.ndarray:
        """Unnormalised log-probability sum h + sum J of each sequence, (N,)."""
        x = np.asarray(sequences, dtype=np.int64)  # (N, L)
        out = self.fields[np.arange(self.length), x].sum(axis=1)
        if len(self.edges):
            e = np.arange(len(self.edges))
            out = out + self.couplings[e, x[:, self.edges[:, 0]], x[:, self.edges[:, 1]]].sum(axis=1)
        if len(self.triplets):
            t, (i, j, k) = np.arange(len(self.triplets)), self.triplets.T
            out = out + self.triple_couplings[t, x[:, i], x[:, j], x[:, k]].sum(axis=1)
        return out


@dataclass(frozen=True)
class SampleStats:
    """Mixing diagnostics of one Gibbs run: thinning is adequate when consecutive samples of a
    chain are hardly more alike than samples of different chains."""

    identity_consecutive: float  # mean fraction of identical residues, sample t vs t+1 of a chain
    identity_between_chains: float  # same, between different chains at the same step
    mean_log_weight: float  # of the kept samples


def plant_edges(config: PottsConfig, rng: np.random.Generator) -> np.ndarray:
    """Contact-like edge set (E, 2), i < j, sorted.

    Edges are drawn uniformly among pairs of each separation class (short:
    ``min_separation <= |i-j| < medium_separation``, else medium/long), ``num_short_edges`` from
    the first class and the rest from the second, skipping pairs whose sites already carry
    ``max_degree`` edges.
    """
    length = config.length
    i, j = np.triu_indices(length, k=config.min_separation)
    sep = j - i
    degree = np.zeros(length, dtype=np.int64)
    chosen: list[tuple[int, int]] = []
    for in_class, want in (
        (sep < config.medium_separation, config.num_short_edges),
        (sep >= config.medium_separation, config.edges - config.num_short_edges),
    ):
        candidates = np.flatnonzero(in_class)
        placed = 0
        for c in rng.permutation(candidates):
            if placed == want:
                break
            a, b = int(i[c]), int(j[c])
            if degree[a] < config.max_degree and degree[b] < config.max_degree:
                degree[a] += 1
                degree[b] += 1
                chosen.append((a, b))
                placed += 1
        if placed < want:
            raise ConfigError(
                f"could place only {placed} of {want} edges in a separation class at length {length}; "
                "lower --edges, change --short-range-fraction or raise --max-degree"
            )
    edges = np.array(sorted(chosen), dtype=np.int64).reshape(-1, 2)
    return edges


def random_potts_model(config: PottsConfig, rng: np.random.Generator) -> PottsModel:
    """Draw site profiles, a contact-like edge set and couplings favouring a few residue pairs."""
    length = config.length
    # site profiles around the background composition; the mix keeps every residue possible
    profiles = rng.dirichlet(config.field_concentration * BACKGROUND, size=length)  # (L, 20)
    profiles = (1.0 - config.background_mix) * profiles + config.background_mix * BACKGROUND
    fields = np.log(profiles)
    edges = plant_edges(config, rng)
    couplings = config.coupling_noise * rng.standard_normal((len(edges), NUM_RESIDUES, NUM_RESIDUES))  # (E, 20, 20)
    for e, (i, j) in enumerate(edges):
        # compatible pairs among residues the two sites actually show, so the coupling is visible
        a = rng.choice(NUM_RESIDUES, size=config.compatible_pairs, replace=False, p=profiles[i])
        b = rng.choice(NUM_RESIDUES, size=config.compatible_pairs, replace=False, p=profiles[j])
        couplings[e, a, b] += config.coupling_strength
    if not config.triplets:  # a pairwise family draws nothing more: families without triplets are unchanged
        return PottsModel(fields=fields, edges=edges, couplings=couplings)
    triplets = plant_triplets(config, rng)
    q = NUM_RESIDUES
    triple_couplings = config.coupling_noise * rng.standard_normal((len(triplets), q, q, q))  # (T, 20, 20, 20)
    for t, sites in enumerate(triplets):
        # favoured residue triples among the residues the three sites show, as for the couplings
        a, b, c = (rng.choice(q, size=config.compatible_triples, replace=False, p=profiles[s]) for s in sites)
        triple_couplings[t, a, b, c] += config.triplet_strength
    return PottsModel(
        fields=fields, edges=edges, couplings=couplings, triplets=triplets, triple_couplings=triple_couplings
    )


def plant_triplets(config: PottsConfig, rng: np.random.Generator) -> np.ndarray:
    """``config.triplets`` disjoint site triples (T, 3), i < j < k, every two sites at least ``min_separation``
    apart, sorted; drawn by rejection from the sites not yet used."""
    free = list(range(config.length))
    chosen: list[tuple[int, int, int]] = []
    for _ in range(100 * max(config.triplets, 1)):
        if len(chosen) == config.triplets:
            break
        i, j, k = sorted(int(s) for s in rng.choice(free, size=3, replace=False))
        if j - i >= config.min_separation and k - j >= config.min_separation:
            chosen.append((i, j, k))
            free = [s for s in free if s not in (i, j, k)]
            if len(free) < 3 and len(chosen) < config.triplets:
                break
    if len(chosen) < config.triplets:
        raise ConfigError(
            f"could place only {len(chosen)} of {config.triplets} triplets with sites {config.min_separation} apart "
            f"at length {config.length}; lower --triplets or raise --length"
        )
    return np.array(sorted(chosen), dtype=np.int64).reshape(-1, 3)


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

    def __init__(self, model: PottsModel, sites: np.ndarray):
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

    def _triple_tables(self, model: PottsModel, local: dict[int, int]) -> None:
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
    model: PottsModel,
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


@dataclass(frozen=True)
class Family:
    """One synthetic family: its true model, its sampled sequences and the sampler's diagnostics."""

    name: str
    model: PottsModel
    sequences: np.ndarray  # (N, L) uint8 residue classes
    stats: SampleStats


def family_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of family ``index``: a spawned child of ``seed``, so a family does not
    change when more families are requested."""
    if seed < 0 or index < 0:
        raise ConfigError(f"seed (--seed) and family index must be >= 0 (got seed={seed}, index={index})")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(index,))))


def generate_family(name: str, config: PottsConfig, rng: np.random.Generator) -> Family:
    """Draw a Potts model and sample ``config.num_sequences`` sequences from it."""
    model = random_potts_model(config, rng)
    sequences, stats = gibbs_sample(
        model, config.num_sequences, rng, chains=config.chains, burn_in=config.burn_in, thinning=config.thinning
    )
    return Family(name=name, model=model, sequences=sequences, stats=stats)


def read_contacts(path, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read a ``i<TAB>j<TAB>strength`` edge list (header line, 0-based positions).

    Returns edges (E, 2) int64 and strengths (E,); raises InputError naming the line of any
    malformed row, a position outside [0, length), or i >= j.
    """
    edges, strengths = [], []
    with open(path, encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n")
        if header.split("\t") != ["i", "j", "strength"]:
            raise InputError(path, f"expected header 'i<TAB>j<TAB>strength', got {header!r}", line=1)
        for line_no, line in enumerate(handle, start=2):
            fields = line.rstrip("\n").split("\t")
            try:
                if len(fields) != 3:
                    raise ValueError
                i, j, s = int(fields[0]), int(fields[1]), float(fields[2])
            except ValueError:
                message = f"expected 'i<TAB>j<TAB>strength', got {line.rstrip()!r}"
                raise InputError(path, message, line=line_no) from None
            if not 0 <= i < j or (length is not None and j >= length):
                bound = f" < {length}" if length is not None else ""
                raise InputError(path, f"need 0 <= i < j{bound}, got i={i} j={j}", line=line_no)
            edges.append((i, j))
            strengths.append(s)
    return np.array(edges, dtype=np.int64).reshape(-1, 2), np.array(strengths, dtype=np.float64)
