"""What the equal-compute learning curves of ``pmlm coevolution curves`` compute: the family groups drawn per seed,
the encoders trained on them (arms: an objective and recipe overrides, one shared recipe), the budgets at which
every read-out runs, and the classical baselines (``config/coevolution_curves*.yaml``; every key below)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pmlm.config.tree import YamlConfig, build_dataclass, require
from pmlm.errors import ConfigError
from pmlm.vocabulary import MLM, OBJECTIVES, PMLM, TMLM

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")  # family group names become family-name prefixes
_ARM = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
TOKEN_CONTACTS = ("jacobian", "masked")


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

    def __post_init__(self) -> None:
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
        require(self.objective != TMLM, "objective", "tmlm is read out by pmlm coevolution, not here", self.objective)

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
    """The pseudo-likelihood Potts fit of each family's training sequences (``pmlm.coevolution.pseudolikelihood``)."""

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
    same recipe, batch and steps, read out at every budget in ``steps``."""

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
