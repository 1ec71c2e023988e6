"""How a training run stops, for pre-training and fine-tuning alike (one engine, pmlm.train.engine): SIGTERM saves,
exits for the requeue and the rerun resumes bit-identical; SIGKILL resumes from the last periodic checkpoint; a
non-finite loss stops with one line and keeps the last good checkpoint. The runs that are signalled run as
`python -m pmlm` in a subprocess; the references run in this process (the same single-threaded CPU arithmetic)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_sequences, metrics_rows, write_shards
from safetensors.torch import load_file
from tiny_models import make_encoder, pretrain_recipe, recipe, write_structures

from pmlm.config.finetuning import FinetuneConfig
from pmlm.config.pretraining import TrainConfig
from pmlm.finetune.finetune import FinetuneHooks, finetune
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


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"run ended (code {proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _steps_logged(out: Path) -> int:
    try:
        return max((int(r["step"]) for r in metrics_rows(out)), default=0)
    except (OSError, ValueError, KeyError):
        return 0


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"{key} differs"


# -- pre-training ----------------------------------------------------------------------------------------------------


def _pretrain_cli(shards: Path, out: Path, cfg_path: Path) -> list[str]:
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


@pytest.fixture(scope="module")
def resume_case(tmp_path_factory):
    """Shards, a config file and an uninterrupted reference run of RESUME_STEPS steps."""
    root = tmp_path_factory.mktemp("resume")
    shards = write_shards(root / "shards", {"train": make_sequences(256, seed=1), "valid": make_sequences(64, seed=2)})
    cfg_path = root / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(pretrain_recipe(optim__total_steps=RESUME_STEPS, save_every=20, eval_every=25)))
    ref = root / "reference"
    done = subprocess.run(
        _pretrain_cli(shards, ref, cfg_path), capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV
    )
    assert done.returncode == 0, done.stderr
    return shards, cfg_path, ref


def _sigterm_then_resume(command: list[str], out: Path, at: int, total: int) -> int:
    """Run ``command``, send it SIGTERM once ``at`` steps are logged, check that it saved a checkpoint and asked for
    a requeue, then run it again to the end and check that it resumed from that checkpoint; its step is returned."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV)
    _wait_for(lambda: _steps_logged(out) >= at, proc, f"step {at}")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    assert "SIGTERM received" in err
    stopped = load_checkpoint(latest_checkpoint(out)).step
    assert at <= stopped < total
    assert not (out / "final").exists()

    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr
    assert f"resuming from {out / 'checkpoints' / f'step-{stopped}'}" in done.stderr
    return stopped


def test_pretraining_sigterm_saves_exits_for_requeue_and_resumes_bit_identical(tmp_path, resume_case):
    shards, cfg_path, ref = resume_case
    out = tmp_path / "run"
    _sigterm_then_resume(_pretrain_cli(shards, out, cfg_path), out, at=8, total=RESUME_STEPS)
    _assert_same_weights(ref / "final" / "model.safetensors", out / "final" / "model.safetensors")
    # the log reads as one run: each step once, identical losses
    assert [r["step"] for r in metrics_rows(out)] == [str(s) for s in range(1, RESUME_STEPS + 1)]
    assert [r["loss"] for r in metrics_rows(out)] == [r["loss"] for r in metrics_rows(ref)]
    assert json.loads((out / "final_scores.json").read_text()) == json.loads((ref / "final_scores.json").read_text())


def test_pretraining_kill_resumes_from_the_last_periodic_checkpoint_bit_identical(tmp_path, resume_case):
    shards, cfg_path, ref = resume_case
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _pretrain_cli(shards, out, cfg_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
    )
    _wait_for(lambda: _steps_logged(out) >= 23, proc, "step 23")
    proc.kill()  # SIGKILL: no chance to save; the periodic checkpoint at step 20 is all there is
    proc.communicate(timeout=60)
    assert latest_checkpoint(out).name in ("step-20", "step-40", "step-60")
    logged_before = _steps_logged(out)

    done = subprocess.run(
        _pretrain_cli(shards, out, cfg_path), capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV
    )
    assert done.returncode == 0, done.stderr
    assert "resuming from" in done.stderr and logged_before > 20
    _assert_same_weights(ref / "final" / "model.safetensors", out / "final" / "model.safetensors")
    assert [r["loss"] for r in metrics_rows(out)] == [r["loss"] for r in metrics_rows(ref)]


def test_pretraining_nan_stops_cleanly_and_keeps_the_last_good_checkpoint(tmp_path, shard_dir):
    def poison(step, model):
        if step == 7:  # between the checkpoints at 5 and 10
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))

    cfg = TrainConfig.from_dict(pretrain_recipe(optim__total_steps=20))
    final = tmp_path / "final.safetensors"
    with pytest.raises(TrainingDiverged, match=r"non-finite loss or gradient at step 8 .*step-5"):
        train(cfg, shard_dir, tmp_path / "run", final_path=final, hooks=TrainHooks(after_step=poison))
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [5]
    weights = load_checkpoint(latest_checkpoint(tmp_path / "run")).model
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert not final.exists() and not (tmp_path / "run" / "final_scores.json").exists()


# -- fine-tuning -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finetune_case(tmp_path_factory) -> dict:
    """Encoders without and with dropout, and a training set of learnable contacts."""
    root = tmp_path_factory.mktemp("finetune")
    return {
        "encoder": make_encoder(root / "pmlm" / "model.safetensors"),
        "encoder_dropout": make_encoder(root / "pmlm_dropout" / "model.safetensors", dropout=0.1, seed=1),
        "train": write_structures(root / "train.jsonl", 48, seed=1),
    }


def _finetune_cli(case: dict, out: Path, cfg_path: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pmlm",
        "finetune",
        "--config",
        str(cfg_path),
        "--encoder",
        str(case["encoder_dropout"]),
        "--train",
        str(case["train"]),
        "--out",
        str(out),
        "--final",
        str(out / "final" / "head.safetensors"),
    ]


def test_finetuning_sigterm_saves_exits_for_requeue_and_resumes_bit_identical(tmp_path, finetune_case):
    """ResNet head with batch norm (running buffers), M+ features, full fine-tuning with encoder
    dropout: every piece of state that a resume must restore."""
    case = finetune_case
    total = 40
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            recipe(
                freeze_encoder=False,
                head__kind="resnet",
                head__features="M+",
                head__resnet_blocks=2,
                head__resnet_channels=8,
                head__resnet_norm="batch",
                head__dropout=0.1,
                optim__total_steps=total,
                save_every=10,
            )
        )
    )
    ref = tmp_path / "reference"  # uninterrupted, in this process (same single-threaded CPU arithmetic)
    assert (
        finetune(
            FinetuneConfig.from_yaml(cfg_path),
            case["encoder_dropout"],
            case["train"],
            ref,
            ref / "final" / "head.safetensors",
        )
        == 0
    )

    out = tmp_path / "run"
    _sigterm_then_resume(_finetune_cli(case, out, cfg_path), out, at=5, total=total)
    a, b = load_file(ref / "final" / "head.safetensors"), load_file(out / "final" / "head.safetensors")
    assert a.keys() == b.keys() and any(k.endswith("running_mean") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"
    assert [r["step"] for r in metrics_rows(out)] == [str(s) for s in range(1, total + 1)]
    assert [r["loss"] for r in metrics_rows(out)] == [r["loss"] for r in metrics_rows(ref)]


def test_finetuning_nan_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, finetune_case):
    def poison(step, model):
        if step == 7:
            with torch.no_grad():
                model.head.out.weight.fill_(float("nan"))

    cfg = FinetuneConfig.from_dict(recipe(optim__total_steps=12))
    final = tmp_path / "head.safetensors"
    case = finetune_case
    with pytest.raises(TrainingDiverged, match=r"non-finite loss or gradient at step 8 .*step-5"):
        finetune(cfg, case["encoder"], case["train"], tmp_path / "run", final, hooks=FinetuneHooks(after_step=poison))
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [5] and not final.exists()


def test_a_run_that_leaves_out_what_the_engine_calls_is_refused_when_built():
    """``TrainingRun`` is abstract: a run missing one of the methods the loop calls fails at construction, not
    mid-run."""
    from pmlm.train.engine import TrainingRun

    class Unfinished(TrainingRun):
        def parameters(self):
            return []

    with pytest.raises(TypeError, match="abstract"):
        Unfinished()
