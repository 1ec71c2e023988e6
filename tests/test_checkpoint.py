"""Checkpoint folders: round trip, atomicity, pruning, pickle-free loading, RNG capture."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from pmlm.errors import InputError
from pmlm.train.checkpoint import (
    capture_rng,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"encoder.w": torch.randn(4, 3, generator=g), "head.b": torch.randn(5, generator=g)}


def _state(step: int) -> dict:
    # the shapes of a real state: optimizer tensors keyed by name, ints, floats, lists, byte tensors
    return {
        "step": step,
        "optimizer": {
            "state": {"encoder.w": {"step": torch.tensor(float(step)), "exp_avg": torch.ones(4, 3)}},
            "param_groups": [{"lr": 1e-3, "betas": [0.9, 0.98], "params": ["encoder.w"]}],
        },
        "ranks": [{"generator": torch.Generator().manual_seed(step).get_state(), "loader": {"epoch": 1, "batch": 3}}],
    }


def test_round_trip(tmp_path):
    w, s = _weights(0), _state(7)
    path = save_checkpoint(tmp_path, 7, w, s, {"seed": 1}, keep_last=3)
    assert path == tmp_path / "checkpoints" / "step-7"
    ckpt = load_checkpoint(path)
    assert ckpt.step == 7 and ckpt.config == {"seed": 1}
    assert all(torch.equal(ckpt.model[k], w[k]) for k in w)
    assert torch.equal(ckpt.state["optimizer"]["state"]["encoder.w"]["exp_avg"], torch.ones(4, 3))
    assert ckpt.state["optimizer"]["param_groups"][0]["betas"] == [0.9, 0.98]
    assert torch.equal(ckpt.state["ranks"][0]["generator"], s["ranks"][0]["generator"])
    versions = json.loads((path / "versions.json").read_text())
    assert versions["torch"] == torch.__version__ and "git_commit" in versions and "pmlm" in versions


def test_keep_last_and_latest(tmp_path):
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, step, _weights(step), _state(step), {}, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [15, 20]
    assert latest_checkpoint(tmp_path).name == "step-20"


def test_incomplete_and_temporary_folders_are_ignored_and_cleaned(tmp_path):
    save_checkpoint(tmp_path, 5, _weights(5), _state(5), {}, keep_last=3)
    root = tmp_path / "checkpoints"
    (root / "step-9.tmp").mkdir()  # a save killed half-way
    (root / "step-9.tmp" / "model.safetensors").write_bytes(b"partial")
    (root / "step-8").mkdir()  # a folder missing its files is not a checkpoint
    assert latest_checkpoint(tmp_path).name == "step-5"
    save_checkpoint(tmp_path, 10, _weights(10), _state(10), {}, keep_last=3)
    assert not (root / "step-9.tmp").exists()
    assert latest_checkpoint(tmp_path).name == "step-10"


def test_loading_never_runs_pickled_code(tmp_path):
    path = save_checkpoint(tmp_path, 1, _weights(1), _state(1), {}, keep_last=1)
    # a state file carrying an arbitrary object (pickled code path) must be refused, not executed
    torch.save({"step": 1, "payload": random.Random(0)}, path / "state.pt")
    with pytest.raises(InputError, match=r"state.pt: unreadable training state") as refused:
        load_checkpoint(path)
    # one line naming the refused type, not torch's advice to load it with weights_only=False
    assert "\n" not in str(refused.value) and "pickled random.Random object" in str(refused.value)
    assert "weights_only" not in str(refused.value)


def test_damaged_weights_are_reported(tmp_path):
    path = save_checkpoint(tmp_path, 1, _weights(1), _state(1), {}, keep_last=1)
    (path / "model.safetensors").write_bytes(b"\x00" * 12)
    with pytest.raises(InputError, match=r"model.safetensors: unreadable weights"):
        load_checkpoint(path)


def test_rng_capture_and_restore(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = capture_rng()
    torch.save(state, tmp_path / "rng.pt")  # must survive the weights_only round trip
    state = torch.load(tmp_path / "rng.pt", weights_only=True)
    first = (random.random(), np.random.rand(), torch.rand(3), np.random.randn())
    restore_rng(state)
    again = (random.random(), np.random.rand(), torch.rand(3), np.random.randn())
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2]) and first[3] == again[3]
