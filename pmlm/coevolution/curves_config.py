"""The co-evolution study's one configuration format (``pmlm coevolution curves --config`` and the workflow's
``coevolution:`` section): the family groups drawn per seed, the encoders trained on them (arms: an objective and
recipe overrides, one shared recipe), the budgets at which every read-out runs (one budget: read out at the end of
training only), and the classical baselines (``config/coevolution*.yaml``; every key below)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from pmlm.config.tree import YamlConfig, build_dataclass, require
from pmlm.errors import ConfigError
from pmlm.vocabulary import MLM, OBJECTIVES, PMLM

RESULTS_TSV = "curves.tsv"  # a study's rows (pmlm.coevolution.curves)
SEQUENCES_TSV = "sequences.tsv"  # the held-out sequence ids every read-out of a family used
BASELINE_ARM = "baseline"  # the arm column of the baselines' rows (step 0)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")  # family group names become family-name prefixes
_ARM = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
TOKEN_CONTACTS = ("jacobian", "masked")


@dataclass(frozen=True)
class Unit:
    """What one process (one workflow job) runs: one arm of one encoder of one seed, or a seed's baselines."""

    seed: int
    encoder: str | None  # None: the seed's baselines
    arm: str | None

    @property
    def name(self) -> str:
        return f"seed{self.seed}-{self.encoder}-{self.arm}" if self.arm else f"seed{self.seed}-{BASELINE_ARM}"


@dataclass
class FamilyGroup:
    """One kind of family: each seed draws ``families`` of them with ``pmlm synth``'s sampler."""

    length: int = 40  # residues per sequence
    coupling_strength: float = 2.0  # J bonus (nats) of each favoured residue pair of a planted edge
    edges: int | None = None  # planted edges per family; None: one per residue
    families: int = 1  # families of this group per seed
    # groups naming the same encoder train one encoder per arm and seed together (their shards mixed); the
    # supervised contact head is fitted on half of an encoder's families and scores the other half
    encoder: str = "all"
    triplets: int = 0  # planted three-body terms per family (pmlm synth --triplets): the triple read-outs
    triplet_strength: float = 2.0  # K bonus (nats) of each favoured residue triple

    def __post_init__(self) -> None:
        require(self.triplets >= 0, "triplets", "must be >= 0", self.triplets)
        require(self.length > 24, "length", "must be > 24 (long-range pairs |i-j| >= 24 must exist)", self.length)
        require(self.coupling_strength > 0, "coupling_strength", "must be > 0", self.coupling_strength)
        require(self.families >= 1, "families", "must be >= 1", self.families)
        require(
            bool(_NAME.match(self.encoder)), "encoder", "must start with a letter (letters, digits, -)", self.encoder
        )


@dataclass
class Arm:
    """One encoder per seed: a pre-training objective and overrides of the shared recipe (``--set`` keys)."""

    objective: str = PMLM
    set: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(self.objective in OBJECTIVES, "objective", f"must be one of {', '.join(OBJECTIVES)}", self.objective)

    def overrides(self) -> list[str]:
        return [f"objective.name={self.objective}"] + [f"{k}={v}" for k, v in self.set.items()]


@dataclass
class CurveEvaluation:
    """How each budget point is read out (the same held-out sequences for every read-out, model and point)."""

    sequences: int = 8  # held-out sequences per family, the first ones in file order
    min_separation: int = 6  # pairs |i-j| below this are neither scored nor counted
    long_separation: int = 24  # the long range, reported separately
    k_divisor: int = 5  # P@L/k
    # jacobian: the token heads' all-pairs epistasis from the unmasked categorical Jacobian (L x 20 forwards per
    # sequence); masked: from the exact masked substitution at every pair (40 forwards per pair), which also gives
    # the chain-rule joint's MI at every pair (GPU-sized)
    token_contacts: str = "jacobian"
    head_steps: int = 200  # full-batch Adam steps of the supervised linear contact head
    head_lr: float = 1e-2
    head_dropout: float = 0.0  # on the head's pair features
    batch_rows: int = 1024  # encoder rows per forward pass (bounds memory)

    def __post_init__(self) -> None:
        for name in ("sequences", "min_separation", "k_divisor", "head_steps", "batch_rows"):
            require(getattr(self, name) >= 1, f"evaluate.{name}", "must be >= 1", getattr(self, name))
        require(
            self.long_separation > self.min_separation,
            "evaluate.long_separation",
            f"must exceed min_separation ({self.min_separation})",
            self.long_separation,
        )
        require(self.head_lr > 0, "evaluate.head_lr", "must be > 0", self.head_lr)
        require(0 <= self.head_dropout < 1, "evaluate.head_dropout", "must be in [0, 1)", self.head_dropout)
        require(
            self.token_contacts in TOKEN_CONTACTS,
            "evaluate.token_contacts",
            f"must be one of {', '.join(TOKEN_CONTACTS)}",
            self.token_contacts,
        )


@dataclass
class Baselines:
    """The pseudo-likelihood Potts fit of each family's training sequences (``pmlm.synth.pseudolikelihood``)."""

    plm_iterations: int = 100  # L-BFGS iterations
    plm_lambda_fields: float = 0.01
    plm_lambda_couplings: float = 0.01

    def __post_init__(self) -> None:
        require(self.plm_iterations >= 1, "baselines.plm_iterations", "must be >= 1", self.plm_iterations)
        for name in ("plm_lambda_fields", "plm_lambda_couplings"):
            require(getattr(self, name) >= 0, f"baselines.{name}", "must be >= 0", getattr(self, name))


@dataclass
class CurvesConfig(YamlConfig):
    """The whole study: per seed, the families of every group, one encoder per arm trained on all of them with the
    same recipe, batch and steps, read out at every budget in ``steps``. A file is the study itself or a workflow
    config whose ``coevolution:`` section is (``snakemake coevolution --configfile F`` and ``pmlm coevolution curves
    --config F`` read the same file)."""

    section: ClassVar[str] = "coevolution"

    seeds: list = field(default_factory=lambda: [1, 2, 3])  # family draws and training seeds
    groups: dict = field(default_factory=lambda: {"L40": {}})  # name -> FamilyGroup keys
    sequences: int = 4000  # sampled per family
    valid_fraction: float = 0.1  # share of each family's sequences held out (per-sequence hash draw)
    split_seed: int = 0
    recipe: str = "config/train/coevolution_tiny.yaml"  # relative paths: against the current folder
    set: dict = field(default_factory=dict)  # recipe overrides for every arm (dotted keys)
    arms: dict = field(default_factory=lambda: {MLM: {"objective": MLM}, PMLM: {"objective": PMLM}})
    steps: list = field(default_factory=lambda: [500, 1500])  # budgets; the last is every run's total_steps
    evaluate: CurveEvaluation = field(default_factory=CurveEvaluation)
    baselines: Baselines = field(default_factory=Baselines)
    jobs: int = 2  # units (a seed's baselines, one arm of one seed) run at once, each in its own process
    threads: int = 1  # torch threads per unit

    def __post_init__(self) -> None:
        seeds_ok = (
            isinstance(self.seeds, list) and self.seeds and all(isinstance(s, int) and s >= 0 for s in self.seeds)
        )
        require(
            bool(seeds_ok) and len(set(self.seeds)) == len(self.seeds),
            "seeds",
            "must be distinct ints >= 0",
            self.seeds,
        )
        steps_ok = (
            isinstance(self.steps, list) and self.steps and all(isinstance(s, int) and s >= 1 for s in self.steps)
        )
        require(
            bool(steps_ok) and self.steps == sorted(set(self.steps)),
            "steps",
            "must be increasing ints >= 1",
            self.steps,
        )
        require(self.sequences >= 20, "sequences", "must be >= 20", self.sequences)
        require(0.0 < self.valid_fraction < 1.0, "valid_fraction", "must be in (0, 1)", self.valid_fraction)
        require(self.jobs >= 1 and self.threads >= 1, "jobs and threads", "must be >= 1", (self.jobs, self.threads))
        require(
            isinstance(self.groups, dict) and bool(self.groups), "groups", "must name at least one group", self.groups
        )
        require(isinstance(self.arms, dict) and bool(self.arms), "arms", "must name at least one arm", self.arms)
        for name in self.groups:
            require(bool(_NAME.match(str(name))), "groups", "names must start with a letter (letters, digits, -)", name)
        for name in self.arms:
            require(bool(_ARM.match(str(name))), "arms", "names must start with a letter (letters, digits, _)", name)
        self.groups = {
            name: build_dataclass(FamilyGroup, v or {}, f"groups.{name}.") for name, v in self.groups.items()
        }
        self.arms = {name: build_dataclass(Arm, v or {}, f"arms.{name}.") for name, v in self.arms.items()}
        if not any(arm.objective == MLM for arm in self.arms.values()):
            raise ConfigError("arms: the study compares with an MLM; name one arm with objective mlm")

    @property
    def total_steps(self) -> int:
        return int(self.steps[-1])

    def encoders(self) -> dict[str, list[str]]:
        """Encoder name -> the groups whose families it trains on, in the config's order."""
        out: dict[str, list[str]] = {}
        for name, group in self.groups.items():
            out.setdefault(group.encoder, []).append(name)
        return out

    def units(self) -> list[Unit]:
        """Every unit in the order they start and their rows are reported: the longest first (every arm of every
        seed), then the baselines."""
        units = [Unit(seed, e, arm) for arm in self.arms for seed in self.seeds for e in self.encoders()]
        return units + [Unit(seed, None, None) for seed in self.seeds]

    def unit(self, name: str) -> Unit:
        """The unit called ``name`` (``seed1-L40-pmlm``, ``seed1-baseline``)."""
        units = {u.name: u for u in self.units()}
        if name not in units:
            raise ConfigError(f"unit {name!r} is not one of this study's: {', '.join(units)}")
        return units[name]
