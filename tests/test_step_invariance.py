"""The recipe's batch is the update, whatever the hardware: the gradient of one optimizer step is the same whether
its tokens come as one batch, 1 rank x 4 micro-batches, 2 x 2, 4 x 1 (DDP and FSDP over gloo) or 3 ranks, which do not
divide the step (DDP), for MLM, PMLM and
the Triple MLM, on batches whose micro-batches hold very unequal numbers of masked residues and pairs; and the same
recipe trained a few steps on 1, 2, 3 and 4 ranks ends with the same weights.

The bound: every layout's fp32 gradient is compared with the gradient of the same update computed in fp64 (the
one-batch formula, ``pretraining_losses`` on the whole step). A layout only reorders the sums the one-batch
computation makes (over rows, micro-batches and ranks), and fp32 summation in any order errs by at most
``n * u * sum|terms|`` (u = 2^-24); the one-batch fp32 computation's own distance from fp64 is that error for one
order, so each layout must lie within ``ORDER_MARGIN`` times it (plus ``u`` of the tensor's scale, for tensors the
one-batch order happens to round exactly). The old normalisation (each micro-batch's mean, averaged) is computed
beside it and must fail the same bound by far: the test tells the two apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import make_sequences, write_shards
from safetensors.torch import load_file

from pmlm.config.pretraining import TrainConfig
from pmlm.model.objectives import mask_batch, objective_outputs, pretraining_losses, sample_sizes
from pmlm.pretrained import build_model
from pmlm.train.loader import ShardStream
from pmlm.train.pretrain import TrainHooks, mask_generator, train
from pmlm.train.step_layout import StepLayout

OBJECTIVES = ("mlm", "pmlm", "tmlm")
TOKENS_PER_STEP = 1024
MICRO = TOKENS_PER_STEP // 4  # four micro-batches per step over all ranks
THIRD = -(-TOKENS_PER_STEP // 3)  # three ranks do not divide the step: its rows split as evenly as they go
STEPS = 3
U = 2.0**-24  # fp32 unit roundoff
ORDER_MARGIN = 8
TINY = {
    "num_layers": 1,
    "hidden": 32,
    "ffn": 64,
    "heads": 2,
    "max_len": 64,
}  # another order of the same sums: same error bound, a different draw within it

# Runs once per layout (alone, or on every rank under torchrun): each objective under each wrapper, STEPS steps,
# saving the first step's reduced gradients (rank 0) and the final weights.
DRIVER = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    from safetensors.torch import save_file
    from pmlm.config.pretraining import TrainConfig
    from pmlm.train.pretrain import TrainHooks, train

    config, shards, out, modes = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    rank = int(os.environ.get("RANK", 0))
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")  # one group for every run below; train() leaves a caller's group alone
    for objective in ("mlm", "pmlm", "tmlm"):
        for mode in modes:
            cfg = TrainConfig.from_dict({**config, "objective": {"name": objective}, "fsdp": mode == "fsdp"})
            grads, parts = {}, []

            def after_backward(step, model):
                if step == 0:
                    for name, p in model.named_parameters():
                        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # collective
                        grads[name] = g.detach().clone().contiguous()

            def on_batch(step, batch):
                if step == 0:
                    parts.append(batch.residues)

            run = f"{out}/{objective}-{mode}"
            hooks = TrainHooks(on_batch=on_batch, after_backward=after_backward)
            assert train(cfg, shards, run, final_path=f"{run}/final/model.safetensors", hooks=hooks) == 0
            if rank == 0:
                save_file(grads, f"{run}/grad.safetensors")
            with open(f"{run}/parts-{rank}.json", "w") as fh:
                json.dump(parts, fh)
    if dist.is_initialized():
        dist.destroy_process_group()
    """
)


def _config(micro: int) -> dict:
    return {
        # no dropout: its draws are each rank's own, the one thing a rank count changes by design
        "model": {"preset": "tiny", "overrides": {**TINY, "dropout": 0.0, "attention_dropout": 0.0}},
        "optim": {"lr": 3e-3, "warmup_steps": 1, "total_steps": STEPS, "clip_norm": 0.0},
        "tokens_per_step": TOKENS_PER_STEP,
        "data": {"tokens_per_batch": micro, "buffer_rows": 24, "num_workers": 0},
        "log_every": 1,
        "eval_every": 0,
        "eval_batches": 1,
        "save_every": 0,
        "tensorboard": False,
        "device": "cpu",
    }


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    """Run folders of the four layouts; each holds ``<objective>-<mode>/`` runs."""
    root = tmp_path_factory.mktemp("invariance")
    # lengths from 4 to 62 residues; a small shuffle buffer, so each step's batch spans short and long rows and its
    # micro-batches (contiguous in length order) hold few or many masked residues, and far fewer or more pairs
    train = make_sequences(96, seed=21, min_len=4, max_len=62)
    shards = write_shards(root / "shards", {"train": train, "valid": make_sequences(16, seed=22)}, rows_per_group=8)
    (root / "driver.py").write_text(DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {"1x1": (1, TOKENS_PER_STEP, "plain"), "1x4": (1, MICRO, "plain"), "2x2": (2, MICRO, "ddp,fsdp"),
            "4x1": (4, MICRO, "ddp,fsdp"), "3x1": (3, THIRD, "ddp")}  # fmt: skip
    out = {}
    for name, (ranks, micro, modes) in runs.items():
        out[name] = root / name
        args = [json.dumps(_config(micro)), str(shards), str(out[name]), modes]
        launcher = [] if ranks == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        done = subprocess.run(
            [sys.executable, *launcher, str(root / "driver.py"), *args],
            capture_output=True, text=True, timeout=600, env=env, cwd=root,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    out["shards"] = shards
    return out


def _reference(shards: Path, objective: str, per_micro_batch: bool = False) -> dict[str, torch.Tensor]:
    """The first step's gradient in fp64: the step's batch and masks as training draws them, its loss by the one-batch
    formula; or, ``per_micro_batch``, the old normalisation: each of the four micro-batches' own mean, averaged."""
    cfg = TrainConfig.from_dict({**_config(MICRO), "objective": {"name": objective}})
    torch.manual_seed(cfg.seed)  # train()'s initial weights
    model = build_model(cfg.model_config(), cfg.objective).double()
    stream = ShardStream(
        shards, "train", tokens_per_batch=cfg.tokens_per_step, max_len=cfg.max_len, buffer_rows=cfg.data.buffer_rows,
        seed=cfg.seed, pad_to_multiple=cfg.data.pad_to_multiple,
    )  # fmt: skip
    tokens = stream.next_batch().tokens
    generator = mask_generator(cfg)
    if not per_micro_batch:
        pretraining_losses(model, tokens, cfg.objective, generator).loss.backward()
    else:
        batch = mask_batch(tokens, cfg.objective, generator)
        for start, stop in StepLayout(TOKENS_PER_STEP, MICRO, 1, 4).rank_parts(len(tokens), 0):
            part = batch.rows(start, stop)
            (objective_outputs(model, part, cfg.objective, sample_sizes(part, cfg.objective)).loss / 4).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def _errors(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float((grads[k].double() - reference[k]).abs().max()) for k in reference}


@pytest.mark.slow
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_one_update_has_one_gradient_however_it_is_split(layouts, objective):
    # the premise: the four micro-batches of the first step hold very different numbers of residues
    residues = json.loads((layouts["1x4"] / f"{objective}-plain" / "parts-0.json").read_text())
    assert len(residues) == 4 and max(residues) >= 2 * min(residues), residues

    exact = _reference(layouts["shards"], objective)
    one = load_file(layouts["1x1"] / f"{objective}-plain" / "grad.safetensors")
    own = _errors(one, exact)  # fp32's own rounding of the one-batch order
    scale = {k: float(v.abs().max()) for k, v in exact.items()}
    bound = {k: ORDER_MARGIN * own[k] + U * scale[k] for k in exact}

    runs = [("1x4", "plain"), ("2x2", "ddp"), ("2x2", "fsdp"), ("4x1", "ddp"), ("4x1", "fsdp"), ("3x1", "ddp")]
    for layout, mode in runs:
        grads = load_file(layouts[layout] / f"{objective}-{mode}" / "grad.safetensors")
        assert grads.keys() == exact.keys()
        errors = _errors(grads, exact)
        over = {k: (errors[k], bound[k]) for k in exact if errors[k] > bound[k]}
        assert not over, f"{layout} {mode}: {over}"

    # the old normalisation is another objective, and the bound sees it
    old = _errors(_reference(layouts["shards"], objective, per_micro_batch=True), exact)
    assert max(old[k] / bound[k] for k in exact) > 100


@pytest.mark.slow
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_a_recipe_trains_the_same_weights_on_1_2_3_and_4_ranks(layouts, objective):
    """A few AdamW steps of the same recipe on 1, 2 and 4 ranks (and as one batch). AdamW moves a weight by about lr
    per step whatever the gradient's scale, so a normalisation that weighed micro-batches otherwise (the old one
    changes these gradients by half their size, above) moves many weights by a sizeable share of lr; the gradients'
    rounding (a few parts in 10^7, above) moves one by lr x |dg| / (|g| + eps), a thousandth of lr only where
    |g| is within a thousand roundings of zero. Measured: at most 1.3e-4 lr over the three steps."""
    lr = _config(MICRO)["optim"]["lr"]
    final = "final/model.safetensors"
    reference = load_file(layouts["1x4"] / f"{objective}-plain" / final)
    layouts_ = [("1x1", "plain"), ("2x2", "ddp"), ("2x2", "fsdp"), ("4x1", "ddp"), ("4x1", "fsdp"), ("3x1", "ddp")]
    for layout, mode in layouts_:
        weights = load_file(layouts[layout] / f"{objective}-{mode}" / final)
        worst = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
        assert worst <= 1e-3 * lr * STEPS, f"{layout} {mode}: {worst:.3g}"


STOP_DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys
    from pmlm.config.pretraining import TrainConfig
    from pmlm.train.pretrain import TrainHooks, train

    cfg = TrainConfig.from_dict(json.loads(sys.argv[1]))

    def after_step(step, model):
        if step == 1 and os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGTERM)

    sys.exit(train(cfg, sys.argv[2], sys.argv[3], hooks=TrainHooks(after_step=after_step)))
    """
)


@pytest.mark.slow
def test_a_checkpoint_of_two_ranks_resumes_on_one(layouts, capsys):
    """The GPU count is not part of the run: a job stopped on 2 ranks and requeued where 1 GPU is free goes on with
    the same batches and masks, and ends where the 1-rank run ends."""
    root = layouts["shards"].parent
    (root / "stop_driver.py").write_text(STOP_DRIVER)
    config = {**_config(MICRO), "objective": {"name": "pmlm"}}
    out = root / "resumed"
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd = [
        sys.executable,
        *launcher,
        str(root / "stop_driver.py"),
        json.dumps(config),
        str(layouts["shards"]),
        str(out),
    ]
    subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1"]

    capsys.readouterr()
    final = out / "final" / "model.safetensors"
    assert train(TrainConfig.from_dict(config), layouts["shards"], out, final_path=final) == 0
    err = capsys.readouterr().err
    assert "resuming from" in err and "step 1 was saved by 2 rank(s), resumed on 1: the same batches and masks" in err
    reference = load_file(layouts["1x4"] / "pmlm-plain" / "final" / "model.safetensors")
    weights = load_file(final)
    lr = config["optim"]["lr"]
    assert max(float((weights[k] - reference[k]).abs().max()) for k in reference) <= 1e-3 * lr * STEPS


def test_a_step_with_fewer_rows_than_micro_batches(tmp_path):
    """Three sequences make the only batch of each step; four micro-batches: one is empty, runs the first row with
    weight 0 (every rank takes part in every collective) and counts nothing. The gradient is the one-batch one, within
    2^-16 of its scale (the same fp32 sums in another order; measured far below, as in the test above)."""
    shards = write_shards(tmp_path / "shards", {"train": make_sequences(3, seed=5, min_len=60, max_len=62),
                                                "valid": make_sequences(3, seed=6)}, files=1)  # fmt: skip
    grads, parts = {}, {}
    for micro in (256, 64):
        cfg = TrainConfig.from_dict({**_config(micro), "tokens_per_step": 256, "objective": {"name": "pmlm"}})
        got, seen = {}, []

        def after_backward(step, model, got=got):
            if step == 0:
                got.update({n: p.grad.clone() for n, p in model.named_parameters()})

        hooks = TrainHooks(after_backward=after_backward, on_batch=lambda step, batch, seen=seen: seen.append(step))
        assert train(cfg, shards, tmp_path / str(micro), hooks=hooks) == 0
        grads[micro], parts[micro] = got, seen
    assert parts[64].count(0) == 3 and parts[256].count(0) == 1  # three rows over four micro-batches
    scores = json.loads((tmp_path / "64" / "final_scores.json").read_text())
    assert scores["mlm_total"] == json.loads((tmp_path / "256" / "final_scores.json").read_text())["mlm_total"]
    for name, g in grads[256].items():
        assert float((grads[64][name] - g).abs().max()) <= 2.0**-16 * float(g.abs().max()), name


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["pmlm", "mlm"])
def test_over_many_steps_the_split_is_exact_and_only_rounding_differs(tmp_path, objective):
    """20 AdamW steps of the same recipe as one micro-batch and as four: in fp64 the final weights agree to fp64's
    rounding (relative 1e-13 measured, bound 1e-10), so the split of the objective is exact over many steps; in fp32
    they differ by fp32's (1e-7 to 1e-5 relative per tensor measured). Elementwise, a weight near zero can differ by a
    large share of itself in fp32: Adam moves a weight by about lr whatever its gradient's size, so a gradient within
    a few roundings of zero can change sign between the two orders of summation; that is rounding amplified, not a
    different objective."""
    shards = write_shards(
        tmp_path / "shards",
        {"train": make_sequences(400, seed=21, min_len=4, max_len=62), "valid": make_sequences(16, seed=22)},
        rows_per_group=8,
    )
    distance = {}
    for dtype in (torch.float64, torch.float32):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the model's weights, hence the whole fp32 / fp64 computation on CPU
        try:
            final = {}
            for micro in (TOKENS_PER_STEP, MICRO):
                config = {**_config(micro), "objective": {"name": objective}}
                config["optim"] = {**config["optim"], "total_steps": 20}
                out = tmp_path / f"{dtype}-{micro}"
                assert train(TrainConfig.from_dict(config), shards, out, final_path=out / "model.safetensors") == 0
                final[micro] = load_file(out / "model.safetensors")
        finally:
            torch.set_default_dtype(previous)
        distance[dtype] = max(
            float((final[TOKENS_PER_STEP][k].double() - final[MICRO][k].double()).norm())
            / float(final[TOKENS_PER_STEP][k].double().norm())
            for k in final[MICRO]
        )
    assert distance[torch.float64] <= 1e-10 < distance[torch.float32], distance
