"""Synthetic protein families with known couplings, to test that the pair head learns co-evolution."""

from pmlm.synth.gibbs import SampleStats, gibbs_sample
from pmlm.synth.potts import (
    Family,
    PottsConfig,
    PottsModel,
    family_rng,
    generate_family,
    plant_edges,
    random_potts_model,
    read_contacts,
)

__all__ = [
    "Family",
    "PottsConfig",
    "PottsModel",
    "SampleStats",
    "family_rng",
    "generate_family",
    "gibbs_sample",
    "plant_edges",
    "random_potts_model",
    "read_contacts",
]
