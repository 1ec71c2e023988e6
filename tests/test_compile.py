"""The encoder compiled whole: one graph, no graph break, on the packed path with attention dropout (the packed
attention is an op), over 50 micro-batches of changing sizes from the loader's length buckets, with at most one
recompile (the second shape makes the rows dynamic); its outputs and gradients equal the eager encoder's.

``aot_eager`` traces forward and backward as Inductor would (fake tensors, the op's fake implementation and its
registered backward) without generating kernels, so the check costs seconds on a CPU; graph breaks and recompiles
are decided before the backend."""

from __future__ import annotations

import pytest
import torch
from tiny_models import mixed_batch, random_lengths

from pmlm.model import ObjectiveConfig, model_config
from pmlm.model.layout import Layout
from pmlm.model.objectives import mask_batch, objective_outputs, sample_sizes
from pmlm.pretrained import build_model

DIMS = {"num_layers": 2, "hidden": 32, "ffn": 64, "heads": 4, "max_len": 128}


def bucketed_batches(count: int, seed: int) -> list[torch.Tensor]:
    """``count`` batches of a token budget, each of similar lengths (a length bucket), widths rounded to 8."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        longest = int(torch.randint(20, DIMS["max_len"] - 1, (), generator=g))
        rows = max(1, 1024 // (longest + 2))
        lengths = [max(1, longest - int(d)) for d in torch.randint(0, 6, (rows,), generator=g)]
        width = -(-(longest + 2) // 8) * 8
        batches.append(mixed_batch(lengths, width, seed=int(torch.randint(1 << 30, (), generator=g))))
    return batches


def counters():
    from torch._dynamo.utils import counters

    return counters


@pytest.mark.parametrize("objective", ["pmlm", "mlm"])
def test_the_whole_encoder_compiles_to_one_graph_on_the_packed_path(objective):
    torch._dynamo.reset()
    counters().clear()
    torch.manual_seed(0)
    cfg = ObjectiveConfig(name=objective)
    model = build_model(model_config("tiny", objective=objective, **DIMS), cfg).train()  # attention dropout 0.1
    model.encoder.compile_encoder(backend="aot_eager")
    generator = torch.Generator().manual_seed(1)
    for tokens in bucketed_batches(50, seed=2):
        masked = mask_batch(tokens, cfg, generator)
        inputs = masked.step_inputs(cfg, Layout.PACKED, model.cfg.pair_vocab)
        out = objective_outputs(model, inputs, cfg, sample_sizes(masked, cfg))
        out.loss.backward()
    breaks = dict(counters()["graph_break"])
    graphs = counters()["stats"]["unique_graphs"]
    assert breaks == {}, breaks
    assert graphs <= 2, f"{graphs} graphs for 50 micro-batches: more than the first shape and the dynamic one"


def test_the_compiled_encoder_computes_what_the_eager_one_does():
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ObjectiveConfig(name="pmlm")
    model = build_model(model_config("tiny", objective="pmlm", dropout=0.0, attention_dropout=0.0, **DIMS), cfg)
    tokens = mixed_batch(random_lengths(3, rows=5, most=100), width=104, seed=3)
    masked = mask_batch(tokens, cfg, torch.Generator().manual_seed(4))
    sizes = sample_sizes(masked, cfg)
    results = []
    for compiled in (False, True):
        if compiled:
            model.encoder.compile_encoder(backend="aot_eager")
        model.zero_grad(set_to_none=True)
        for layout in (Layout.PACKED, Layout.PADDED):
            inputs = masked.step_inputs(cfg, layout, model.cfg.pair_vocab)
            out = objective_outputs(model, inputs, cfg, sizes)
            out.loss.backward()
            results.append((out.loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    # aot_eager runs the same aten ops in the same order: equal bits
    for (loss, grads), (loss_c, grads_c) in zip(results[:2], results[2:]):
        assert torch.equal(loss, loss_c)
        assert all(torch.equal(a, b) for a, b in zip(grads, grads_c))


def test_cuda_graphs_pack_every_micro_batch_to_one_shape_and_compile_once():
    """``cuda_graphs``: the static packing gives every micro-batch of a budget the same tensors' shapes, the encoder
    compiled static sees one graph for all of them, and the loss is the dynamic packing's (only the filler differs)."""
    from pmlm.config.pretraining import TrainConfig
    from pmlm.train.step_layout import StepLayout, step_parts

    torch._dynamo.reset()
    counters().clear()
    sets = ["objective.name=pmlm", "compile=true", "cuda_graphs=true", "data.max_len=128", "tokens_per_step=2048"]
    sets += [f"model.overrides.{k}={v}" for k, v in {**DIMS, "dropout": 0.0, "attention_dropout": 0.0}.items()]
    cfg = TrainConfig.from_yaml("config/train/tiny.yaml", sets)
    torch.manual_seed(0)
    model = build_model(cfg.model_config(), cfg.objective).train()
    model.encoder.attention = "packed"
    layout = StepLayout(2048, 1024, 1, 2)
    eager = build_model(cfg.model_config(), cfg.objective).train()
    eager.load_state_dict(model.state_dict())
    eager.encoder.attention = "packed"
    model.encoder.compile_encoder(static=True, backend="aot_eager")
    generator, shapes = torch.Generator().manual_seed(1), set()
    for tokens in bucketed_batches(25, seed=5):
        masked = mask_batch(tokens, cfg.objective, generator)
        sizes = sample_sizes(masked, cfg.objective)
        parts = layout.rank_parts(tokens.shape[0], 0)
        static = step_parts(masked, parts, cfg, model, torch.device("cpu"), torch.float32, True, 1024)
        cfg_dynamic = TrainConfig.from_dict({**cfg.to_dict(), "cuda_graphs": False})
        dynamic = step_parts(masked, parts, cfg_dynamic, eager, torch.device("cpu"), torch.float32, True, 1024)
        for (inputs, _), (reference, _) in zip(static, dynamic):
            enc = inputs.encoder
            shapes.add((enc.tokens.shape, enc.cu_seqlens.shape, enc.max_len))
            ours = objective_outputs(model, inputs, cfg.objective, sizes).loss
            theirs = objective_outputs(eager, reference, cfg.objective, sizes).loss
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
            ours.backward()
    assert len(shapes) == 1, shapes  # 50 micro-batches, one shape
    assert dict(counters()["graph_break"]) == {} and counters()["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize(
    "sets, message",
    [
        (["cuda_graphs=true"], "cuda_graphs needs compile: true"),
        (["cuda_graphs=true", "compile=true", "attention=padded"], "needs the packed layout"),
    ],
)
def test_cuda_graphs_settings_are_checked_in_one_line(sets, message):
    from pmlm.config.pretraining import TrainConfig
    from pmlm.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_yaml("config/train/tiny.yaml", sets)
