"""Synthetic protein families from Potts models with planted couplings (sampled by ``pmlm.synth.gibbs``), and the
reader of their planted-contact lists (the MSA statistics that check them live in ``pmlm.evaluation.unsupervised``).

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
from pmlm.synth.gibbs import SampleStats, gibbs_sample

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
