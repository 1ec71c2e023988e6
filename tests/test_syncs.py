"""No host synchronisation inside a micro-batch's forward and backward: the step path built on the host
(``pmlm.model.step_inputs``) is counted op by op (``pmlm.model.syncs.SyncCounter``) for every objective and layout,
with the released dropouts, and the counter itself is shown to find and name a synchronisation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import mixed_batch

from pmlm.model import ObjectiveConfig, model_config
from pmlm.model.layout import Layout
from pmlm.model.objectives import mask_batch, objective_outputs, pretraining_losses, sample_sizes
from pmlm.model.syncs import SyncCounter
from pmlm.pretrained import build_model
from pmlm.train.pretrain import PretrainingObjective

DIMS = {"num_layers": 2, "hidden": 32, "ffn": 64, "heads": 4, "max_len": 64}


def step_batch(objective: str, seed: int = 0):
    cfg = ObjectiveConfig(name=objective, mask_prob=0.3)
    tokens = mixed_batch([40, 7, 0, 23, 61], width=64, seed=seed)  # an empty filler row and a full-width one
    masked = mask_batch(tokens, cfg, torch.Generator().manual_seed(seed))
    return cfg, masked, sample_sizes(masked, cfg)


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
@pytest.mark.parametrize("objective", ["mlm", "pmlm", "pmlm_pair_only", "tmlm"])
def test_a_micro_batch_forward_and_backward_never_synchronise(objective, layout):
    torch.manual_seed(0)
    cfg, masked, sizes = step_batch(objective)
    model = build_model(model_config("tiny", objective=objective, **DIMS), cfg).train()  # the released dropouts
    objective_module = PretrainingObjective(model, cfg)
    part = masked.rows(1, 5)
    inputs = part.step_inputs(cfg, layout, model.cfg.pair_vocab)  # on the host, as the training loop builds it
    with SyncCounter() as counter:
        out = objective_module(inputs, sizes)
        out.loss.backward()
    assert counter.events == [], f"{objective}, {layout.value}: synchronising ops\n{counter.summary()}"
    assert out.loss.isfinite() and int(out.mlm_total) > 0


def test_the_counter_finds_and_names_a_synchronisation():
    # the convenience path builds the step's inputs from tokens where they are: there, that is host work it counts
    torch.manual_seed(0)
    cfg, masked, _ = step_batch("pmlm")
    model = build_model(model_config("tiny", objective="pmlm", **DIMS), cfg).train()
    with SyncCounter() as counter:
        pretraining_losses(model, masked.inputs, cfg, torch.Generator().manual_seed(0)).loss.backward()
    ops = {op for op, _ in counter.events}
    assert {"nonzero", "_local_scalar_dense"} <= ops
    assert any("pmlm/model/step_inputs.py" in where for _, where in counter.events), counter.summary()
    with SyncCounter() as counter:
        torch.arange(5).tolist()
        bool(torch.ones(2).any())
    assert [op for op, _ in counter.events] == ["tolist", "_local_scalar_dense"]
    assert all(where.startswith("outside pmlm") for _, where in counter.events)


def test_objective_outputs_of_step_inputs_equal_those_of_the_masked_batch():
    # the same micro-batch, once from its masked rows (inputs built inside) and once from StepInputs built apart
    torch.manual_seed(0)
    cfg, masked, sizes = step_batch("tmlm")
    model = build_model(model_config("tiny", objective="tmlm", dropout=0.0, attention_dropout=0.0, **DIMS), cfg)
    part = masked.rows(0, 3)
    inputs = part.step_inputs(cfg, model.encoder.layout(torch.device("cpu")), model.cfg.pair_vocab)
    a = objective_outputs(model, part, cfg, sizes)
    b = objective_outputs(model, inputs, cfg, sizes)
    for field in dataclasses.fields(a):
        assert torch.equal(getattr(a, field.name), getattr(b, field.name)), field.name


# ------------------------------------------------------------------------------------------------
# CUDA: the whole step under CUDA's own synchronisation check, which raises at any call that waits

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("objective", ["mlm", "pmlm", "tmlm"])
def test_a_cuda_training_step_never_waits_for_the_host(objective):
    from pmlm.config.pretraining import TrainConfig
    from pmlm.train.step_layout import StepLayout, part_outputs, step_parts, to_device

    device = torch.device("cuda")
    sets = [f"objective.name={objective}", "model.preset=base", "model.overrides.num_layers=2", "data.max_len=512"]
    cfg = TrainConfig.from_yaml("config/train/tiny.yaml", sets)
    torch.manual_seed(0)
    model = build_model(cfg.model_config(), cfg.objective).to(device).train()
    module = PretrainingObjective(model, cfg.objective)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    layout = StepLayout(4096, 1024, 1, 4)
    tokens = mixed_batch([500, 300, 120, 37, 200, 0], width=512, seed=1)

    def step(seed: int) -> None:
        masked = mask_batch(tokens, cfg.objective, torch.Generator().manual_seed(seed))
        sizes = to_device(sample_sizes(masked, cfg.objective), device)
        parts = layout.rank_parts(tokens.shape[0], 0)
        optimizer.zero_grad(set_to_none=True)
        for inputs, live in step_parts(masked, parts, cfg, model, device, torch.bfloat16, grad=True):
            _, loss = part_outputs(module, inputs, live, sizes, 1, lambda: torch.autocast("cuda", torch.bfloat16))
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.found_inf = (~torch.isfinite(norm)).float()
        optimizer.step()

    assert model.encoder.layout(device, torch.bfloat16, grad=True) == Layout.PACKED
    step(0)  # the first step initialises cuBLAS, the allocator and the pinned-memory pool
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(torch.isfinite(p).all() for p in model.parameters())
