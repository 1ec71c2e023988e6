"""The model-FLOP count behind every MFU figure (``pmlm.train.budget.model_flops``, docs/gpu.md "Model FLOPs") against
torch's own FLOP counter (``torch.utils.flop_counter.FlopCounterMode``) over a whole training micro-batch, forward and
backward, on a CPU: the two agree exactly, so the formula leaves out no matmul the step runs."""

from __future__ import annotations

import pytest
import torch
from tiny_models import mixed_batch
from torch.utils.flop_counter import FlopCounterMode

from pmlm.alphabet import IGNORE_INDEX
from pmlm.model import ObjectiveConfig, model_config
from pmlm.model.layout import Layout
from pmlm.model.objectives import mask_batch, objective_outputs, sample_sizes
from pmlm.pretrained import build_model
from pmlm.train import budget

DIMS = {"num_layers": 2, "hidden": 32, "ffn": 96, "heads": 4, "max_len": 64}
TOKENS = [40, 30, 58]  # 128 tokens: a whole number of the packed layout's row multiple, so no filler rows


@pytest.mark.parametrize("objective", ["mlm", "pmlm"])
def test_the_model_flop_count_is_torchs_count_of_a_micro_batch(objective):
    torch.manual_seed(0)
    cfg = ObjectiveConfig(name=objective, mask_prob=0.3)
    model = build_model(model_config("tiny", objective=objective, **DIMS), cfg).train()
    tokens = mixed_batch([n - 2 for n in TOKENS], width=max(TOKENS), seed=1)
    masked = mask_batch(tokens, cfg, torch.Generator().manual_seed(2))
    inputs = masked.step_inputs(cfg, Layout.PACKED, model.cfg.pair_vocab)
    assert inputs.encoder.rows == sum(TOKENS)
    with FlopCounterMode(display=False) as counter:
        objective_outputs(model, inputs, cfg, sample_sizes(masked, cfg)).loss.backward()
    per_sequence = masked.targets.ne(IGNORE_INDEX).sum(1).tolist()
    assert min(per_sequence) >= 2  # every masked residue has a partner: the formula's U is all of them
    # (on a GPU the fused output layer pads its 400 classes to 448 for the matmuls: work, not model FLOPs)
    expected = budget.model_flops(DIMS["num_layers"], DIMS["hidden"], DIMS["ffn"], cfg.kind, TOKENS, per_sequence)
    assert counter.get_total_flops() == expected
