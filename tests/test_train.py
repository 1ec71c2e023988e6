"""The training loop on CPU: smoke run, bit-identical resume after SIGTERM / SIGKILL, NaN stop, bad configs."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_sequences, write_shards
from safetensors.torch import load_file

from pmlm.cli import main
from pmlm.config.pretraining import TrainConfig
from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from pmlm.train.pretrain import TrainHooks, train
from pmlm.train.runtime import TrainingDiverged

RESUME_STEPS = 80
# one intra-op thread: a tiny model's ops are too small to share, and on a busy 2-core machine
# spinning OpenMP workers make every step many times slower
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


def _config(**changes) -> dict:
    """A model small enough for a CPU step in milliseconds; dropout on, so RNG restore matters."""
    cfg = {
        "model": {"preset": "tiny", "overrides": {"num_layers": 1, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64}},
        "optim": {"lr": 3e-3, "warmup_steps": 2, "total_steps": 10},
        "tokens_per_step": 512,
        "data": {"buffer_rows": 64, "num_workers": 1},
        "log_every": 1,
        "eval_every": 10,
        "eval_batches": 2,
        "save_every": 5,
        "keep_last_checkpoints": 20,
        "tensorboard": False,
        "device": "cpu",
    }
    for key, value in changes.items():
        section, _, leaf = key.rpartition("__")
        (cfg.setdefault(section, {}) if section else cfg)[leaf] = value
    return cfg


def _rows(out: Path, split: str = "train") -> list[dict]:
    with open(out / "metrics.csv", newline="") as fh:
        return [row for row in csv.DictReader(fh) if row["split"] == split]


def _cli(shards: Path, out: Path, cfg_path: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pmlm",
        "pretrain",
        "--config",
        str(cfg_path),
        "--shards",
        str(shards),
        "--out",
        str(out),
        "--final",
        str(out / "final" / "model.safetensors"),
    ]


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"run ended (code {proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _train_steps_logged(out: Path) -> int:
    try:
        return max((int(r["step"]) for r in _rows(out)), default=0)
    except (OSError, ValueError, KeyError):
        return 0


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"{key} differs"


@pytest.fixture(scope="module")
def resume_case(tmp_path_factory):
    """Shards, a config file and an uninterrupted reference run of RESUME_STEPS steps."""
    root = tmp_path_factory.mktemp("resume")
    shards = write_shards(root / "shards", {"train": make_sequences(256, seed=1), "valid": make_sequences(64, seed=2)})
    cfg_path = root / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(optim__total_steps=RESUME_STEPS, save_every=20, eval_every=25)))
    ref = root / "reference"
    done = subprocess.run(_cli(shards, ref, cfg_path), capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr
    return shards, cfg_path, ref


def test_smoke_loss_falls_outputs_and_idempotent_rerun(tmp_path):
    # fixed, learnable data: two families, high learning rate
    shards = write_shards(
        tmp_path / "s",
        {"train": make_sequences(64, seed=5, families=2), "valid": make_sequences(16, seed=6, families=2)},
        rows_per_group=8,
    )
    cfg = TrainConfig.from_dict(_config(optim__lr=1e-2, optim__warmup_steps=1, tensorboard=True))
    final = tmp_path / "results" / "model.safetensors"
    assert train(cfg, shards, tmp_path / "run", final_path=final) == 0

    losses = [float(r["loss"]) for r in _rows(tmp_path / "run")]
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
    cfg = TrainConfig.from_dict(_config(objective__name=objective, optim__total_steps=2, save_every=0))
    assert train(cfg, shard_dir, tmp_path / "run") == 0
    scores = json.loads((tmp_path / "run" / "final_scores.json").read_text())
    assert scores["objective"] == objective and scores["acc_mlm"] is not None
    if objective == "mlm":
        assert scores["l_pmlm"] is None and scores["dacc"] is None
    else:
        assert scores["l_pmlm"] > 0 and scores["dacc"] is not None
    if objective == "tmlm":  # the triple head's loss and accuracy, near log(8000) after two steps
        assert 0 < scores["l_tmlm"] < 2 * math.log(8000) and scores["triple_total"] > 0
        rows = _rows(tmp_path / "run")
        assert all(float(r["l_tmlm"]) > 0 for r in rows)


@pytest.mark.slow
def test_compiled_layers_train_like_eager_layers(tmp_path, shard_dir):
    """compile: true on CPU (inductor): the run trains, keeps the parameter names, and its first loss
    equals the eager run's up to fp32 rounding (inductor fuses and reorders the same sums)."""
    overrides = {"num_layers": 2, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64, "dropout": 0.0}  # no RNG
    runs = {}
    for compiled in (False, True):
        cfg = TrainConfig.from_dict(
            _config(model__overrides=overrides, compile=compiled, optim__total_steps=3, save_every=0, eval_every=0)
        )
        out = tmp_path / f"compile-{compiled}"
        assert train(cfg, shard_dir, out, final_path=out / "model.safetensors") == 0
        runs[compiled] = ([float(r["loss"]) for r in _rows(out)], load_file(out / "model.safetensors"))
    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = runs[False], runs[True]
    assert compiled_weights.keys() == eager_weights.keys()  # checkpoints stay interchangeable
    assert all(math.isfinite(x) for x in compiled_losses) and len(compiled_losses) == 3
    # reductions of length <= ffn + max_len per layer, relative bound K * eps each (metrics.csv keeps 6 digits)
    tol = max(2 * (64 + 64) * torch.finfo(torch.float32).eps, 1e-5)
    assert math.isclose(compiled_losses[0], eager_losses[0], rel_tol=tol)


def test_sigterm_saves_exits_for_requeue_and_resumes_bit_identical(tmp_path, resume_case):
    shards, cfg_path, ref = resume_case
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _cli(shards, out, cfg_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV
    )
    _wait_for(lambda: _train_steps_logged(out) >= 8, proc, "step 8")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    assert "SIGTERM received" in err
    stopped = load_checkpoint(latest_checkpoint(out)).step
    assert 8 <= stopped < RESUME_STEPS
    assert not (out / "final").exists()

    done = subprocess.run(_cli(shards, out, cfg_path), capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr
    assert f"resuming from {out / 'checkpoints' / f'step-{stopped}'}" in done.stderr
    _assert_same_weights(ref / "final" / "model.safetensors", out / "final" / "model.safetensors")
    # the log reads as one run: each step once, identical losses
    assert [r["step"] for r in _rows(out)] == [str(s) for s in range(1, RESUME_STEPS + 1)]
    assert [r["loss"] for r in _rows(out)] == [r["loss"] for r in _rows(ref)]
    assert json.loads((out / "final_scores.json").read_text()) == json.loads((ref / "final_scores.json").read_text())


def test_kill_resumes_from_the_last_periodic_checkpoint_bit_identical(tmp_path, resume_case):
    shards, cfg_path, ref = resume_case
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _cli(shards, out, cfg_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV
    )
    _wait_for(lambda: _train_steps_logged(out) >= 23, proc, "step 23")
    proc.kill()  # SIGKILL: no chance to save; the periodic checkpoint at step 20 is all there is
    proc.communicate(timeout=60)
    assert latest_checkpoint(out).name in ("step-20", "step-40", "step-60")
    logged_before = _train_steps_logged(out)

    done = subprocess.run(_cli(shards, out, cfg_path), capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr
    assert "resuming from" in done.stderr and logged_before > 20
    _assert_same_weights(ref / "final" / "model.safetensors", out / "final" / "model.safetensors")
    assert [r["loss"] for r in _rows(out)] == [r["loss"] for r in _rows(ref)]


def test_nan_stops_cleanly_and_keeps_the_last_good_checkpoint(tmp_path, shard_dir):
    def poison(step, model):
        if step == 7:  # between the checkpoints at 5 and 10
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))

    cfg = TrainConfig.from_dict(_config(optim__total_steps=20))
    final = tmp_path / "final.safetensors"
    with pytest.raises(TrainingDiverged, match=r"non-finite loss or gradient at step 8 .*step-5"):
        train(cfg, shard_dir, tmp_path / "run", final_path=final, hooks=TrainHooks(after_step=poison))
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [5]
    weights = load_checkpoint(latest_checkpoint(tmp_path / "run")).model
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert not final.exists() and not (tmp_path / "run" / "final_scores.json").exists()


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
    cfg = _config()
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
    path.write_text(yaml.safe_dump(_config()))
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
