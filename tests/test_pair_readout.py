"""The pair read-out computes only the dependence measures asked for, and each equals, bit for bit, the same measure
computed beside the other (the unsupervised contact scores ask for one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pmlm.alphabet import FIRST_RESIDUE_ID
from pmlm.evaluation.pair_readout import MEASURES, all_pairs, joint_dependence, pair_dependence
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model
from pmlm.vocabulary import PMLM, PMLM_PAIR_ONLY


def _model(objective: str):
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=1, hidden=16, ffn=32, heads=2, max_len=24, dropout=0.0)
    return build_model(cfg, ObjectiveConfig(name=objective)).eval()


@pytest.mark.parametrize("objective", [PMLM, PMLM_PAIR_ONLY])
@pytest.mark.parametrize("mask_pairs", [True, False])
def test_one_measure_is_the_same_as_both(objective, mask_pairs):
    model = _model(objective)
    residues = (np.random.default_rng(3).integers(20, size=12) + FIRST_RESIDUE_ID).astype(np.uint8)
    pairs = all_pairs(12)
    kwargs = {"mask_pairs": mask_pairs, "mirror": True, "batch_pairs": 17}
    both = pair_dependence(model, residues, pairs, **kwargs)
    assert set(both) == set(MEASURES)
    assert not torch.equal(both["kl"], both["mi"])  # two different measures, so the comparison below can fail
    for measure in MEASURES:
        alone = pair_dependence(model, residues, pairs, measures=(measure,), **kwargs)
        assert list(alone) == [measure]
        assert torch.equal(alone[measure], both[measure])


def test_an_unknown_measure_is_refused():
    joint = torch.full((1, 20, 20), 1 / 400)
    with pytest.raises(ValueError, match="unknown dependence measure"):
        joint_dependence(joint, None, None, ("kl", "entropy"))
