"""What ``pmlm synth`` generates: how many families, their seed and naming, and the Potts model of each."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pmlm.errors import ConfigError
from pmlm.synth.potts import PottsConfig

_NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")


@dataclass
class SynthConfig:
    """A set of synthetic families: how many, their seed and naming, and the model of each."""

    families: int = 8  # number of families, each from its own Potts model
    seed: int = 0  # master seed; family k uses SeedSequence(seed, spawn_key=(k,))
    prefix: str = "synth"  # family names are prefix + zero-padded index
    validation_min_separation: int = 6  # |i-j| range of the MI+APC check written to params.json
    validation_pseudocount: float = 0.01  # pseudocount of that check
    potts: PottsConfig = field(default_factory=PottsConfig)

    def __post_init__(self) -> None:
        if self.families < 1:
            raise ConfigError(f"families (--families) must be >= 1 (got {self.families})")
        if self.seed < 0:
            raise ConfigError(f"seed (--seed) must be >= 0 (got {self.seed})")
        if self.validation_min_separation < 1:
            raise ConfigError(f"validation_min_separation must be >= 1 (got {self.validation_min_separation})")
        if not 0.0 <= self.validation_pseudocount <= 1.0:
            raise ConfigError(f"validation_pseudocount must be in [0, 1] (got {self.validation_pseudocount})")
        if not _NAME_PATTERN.match(self.prefix):
            raise ConfigError(
                "prefix (--prefix) must start with a letter and hold only letters, digits and '-' "
                f"(got {self.prefix!r})"
            )

    def family_names(self) -> list[str]:
        width = max(3, len(str(self.families - 1)))
        return [f"{self.prefix}{k:0{width}d}" for k in range(self.families)]
