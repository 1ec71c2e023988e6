"""The training loop on CPU: smoke run, other objectives, compiled layers, bad configs (how a run stops and resumes:
tests/test_training_stops.py)."""

from __future__ import annotations

import itertools
import json
import math
import os

import pytest
import torch
import yaml
from conftest import make_sequences, metrics_rows, write_shards
from safetensors.torch import load_file
from tiny_models import pretrain_recipe

from pmlm.choices import Precision
from pmlm.cli import main
from pmlm.config.pretraining import TrainConfig
from pmlm.pretrained import build_model
from pmlm.train.budget import GIB, Arithmetic, Parameters, count_parameters, peak_memory
from pmlm.train.checkpoint import list_checkpoints
from pmlm.train.pretrain import train
from pmlm.train.step_layout import choose_layout

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


def test_smoke_loss_falls_outputs_and_idempotent_rerun(tmp_path):
    # fixed, learnable data: two families, high learning rate
    shards = write_shards(
        tmp_path / "s",
        {"train": make_sequences(64, seed=5, families=2), "valid": make_sequences(16, seed=6, families=2)},
        rows_per_group=8,
    )
    cfg = TrainConfig.from_dict(pretrain_recipe(optim__lr=1e-2, optim__warmup_steps=1, tensorboard=True))
    final = tmp_path / "results" / "model.safetensors"
    assert train(cfg, shards, tmp_path / "run", final_path=final) == 0

    losses = [float(r["loss"]) for r in metrics_rows(tmp_path / "run")]
    print("train losses", [round(x, 3) for x in losses])
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2
    scores = json.loads((tmp_path / "run" / "final_scores.json").read_text())
    assert scores["step"] == 10 and scores["mlm_total"] > 0 and scores["pair_total"] > 0
    assert math.isclose(scores["dacc"], scores["acc_pmlm"] - scores["acc_mlm"] ** 2)
    info = json.loads(final.with_suffix(".json").read_text())
    assert info["model"]["hidden"] == 32 and info["objective"]["name"] == "pmlm" and info["step"] == 10
    assert any((tmp_path / "run" / "tb").iterdir())
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [5, 10]

    # rerunning a finished run trains nothing and rewrites identical outputs (validation is fixed-seed)
    weights = load_file(final)
    final.unlink()
    assert train(cfg, shards, tmp_path / "run", final_path=final) == 0
    assert json.loads((tmp_path / "run" / "final_scores.json").read_text()) == scores
    assert all(torch.equal(weights[k], v) for k, v in load_file(final).items())


@pytest.mark.parametrize("objective", ["mlm", "pmlm_pair_only", "tmlm"])
def test_other_objectives_run_and_report_their_metrics(tmp_path, shard_dir, objective):
    cfg = TrainConfig.from_dict(pretrain_recipe(objective__name=objective, optim__total_steps=2, save_every=0))
    assert train(cfg, shard_dir, tmp_path / "run") == 0
    scores = json.loads((tmp_path / "run" / "final_scores.json").read_text())
    assert scores["objective"] == objective and scores["acc_mlm"] is not None
    if objective == "mlm":
        assert scores["l_pmlm"] is None and scores["dacc"] is None
    else:
        assert scores["l_pmlm"] > 0 and scores["dacc"] is not None
    if objective == "tmlm":  # the triple head's loss and accuracy, near log(8000) after two steps
        assert 0 < scores["l_tmlm"] < 2 * math.log(8000) and scores["triple_total"] > 0
        rows = metrics_rows(tmp_path / "run")
        assert all(float(r["l_tmlm"]) > 0 for r in rows)


@pytest.mark.slow
def test_compiled_layers_train_like_eager_layers(tmp_path, shard_dir):
    """compile: true on CPU (inductor): the run trains, keeps the parameter names, and its first loss
    equals the eager run's up to fp32 rounding (inductor fuses and reorders the same sums)."""
    overrides = {"num_layers": 2, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64, "dropout": 0.0}  # no RNG
    runs = {}
    for compiled in (False, True):
        recipe = pretrain_recipe(
            model__overrides=overrides, compile=compiled, optim__total_steps=3, save_every=0, eval_every=0
        )
        cfg = TrainConfig.from_dict(recipe)
        out = tmp_path / f"compile-{compiled}"
        assert train(cfg, shard_dir, out, final_path=out / "model.safetensors") == 0
        runs[compiled] = ([float(r["loss"]) for r in metrics_rows(out)], load_file(out / "model.safetensors"))
    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = runs[False], runs[True]
    assert compiled_weights.keys() == eager_weights.keys()  # checkpoints stay interchangeable
    assert all(math.isfinite(x) for x in compiled_losses) and len(compiled_losses) == 3
    # reductions of length <= ffn + max_len per layer, relative bound K * eps each (metrics.csv keeps 6 digits)
    tol = max(2 * (64 + 64) * torch.finfo(torch.float32).eps, 1e-5)
    assert math.isclose(compiled_losses[0], eager_losses[0], rel_tol=tol)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"optim": {"lrr": 1e-3}}, "unknown key(s) optim.lrr"),
        ({"optim": {"lr": -1}}, "optim.lr must be > 0"),
        ({"model": {"preset": "huge"}}, "model.preset must be one of tiny, base, large, xl"),
        ({"data": {"max_len": 4096}}, "data.max_len must be <= the model's max_len"),
    ],
)
def test_bad_config_is_one_line_exit_2(tmp_path, shard_dir, capsys, change, message):
    cfg = pretrain_recipe()
    for section, values in change.items():
        cfg[section].update(values)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = main(
        [
            "pretrain",
            "--config",
            str(path),
            "--shards",
            str(shard_dir),
            "--out",
            str(tmp_path / "o"),
            "--final",
            str(tmp_path / "m.safetensors"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("pmlm pretrain: error: ") and message in err
    assert not (tmp_path / "o").exists()


def test_set_overrides_and_yaml_number_strings(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("optim:\n  lr: 3e-4\n")  # YAML 1.1 reads 3e-4 as a string; it is accepted as a number
    sets = ["optim.total_steps=7", "optim.warmup_steps=2", "model.overrides.dropout=0.0", "bf16=false"]
    cfg = TrainConfig.from_yaml(path, sets)
    assert cfg.optim.lr == 3e-4 and cfg.optim.total_steps == 7 and cfg.bf16 is False
    assert cfg.model.build().dropout == 0.0
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_schedule_warms_up_then_decays_linearly():
    cfg = TrainConfig.from_dict({"optim": {"lr": 1.0, "end_lr": 0.1, "warmup_steps": 4, "total_steps": 10}})
    lrs = [cfg.optim.lr_at(s) for s in range(10)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(math.isclose(a - b, 0.15) for a, b in itertools.pairwise(lrs[3:]))
    assert math.isclose(lrs[-1], 0.1)


def test_missing_shards_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(pretrain_recipe()))
    code = main(
        [
            "pretrain",
            "--config",
            str(path),
            "--shards",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "o"),
            "--final",
            str(tmp_path / "m.safetensors"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "manifest.json: manifest not found" in err
    assert os.environ.get("RANK") is None  # the loop never leaves torchrun variables behind


def test_the_step_layout_sizes_the_model_the_run_trains():
    """``train`` builds its model first and hands its parameters to the step layout: the counts of the model built
    are those ``pmlm plan`` takes from a model built on the meta device, and so is the micro-batch."""
    cfg = TrainConfig.from_yaml("config/train/tiny.yaml", ["tokens_per_step=65536"])
    model, bf16 = build_model(cfg.model_config(), cfg.objective), Arithmetic(Precision.BF16)
    params = Parameters.of(model)
    assert params == count_parameters(cfg.model_config(), cfg.objective.kind)
    assert peak_memory(cfg, params, 2, bf16, 3)["parameters"] == params.total
    assert choose_layout(cfg, 2, GIB // 4, bf16, params).accumulation == 6
