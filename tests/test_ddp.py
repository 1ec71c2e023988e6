"""Two CPU ranks under torchrun (gloo), with DDP, FSDP and FSDP over the packed encoder layout:
synchronised weights, each step's batch split between the ranks, coordinated stop and bit-identical resume; FSDP
on one process. (tests/test_step_invariance.py: the same update on any number of ranks.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import make_sequences, write_shards
from safetensors.torch import load_file

from pmlm.alphabet import EOS_ID
from pmlm.config.pretraining import TrainConfig
from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.loader import ShardStream
from pmlm.train.step_layout import StepLayout

STEPS = 6
MICRO = 256  # tokens per micro-batch: 2 ranks x GRAD_ACCUM of them make a step
GRAD_ACCUM = 2

# Runs on every rank: train() with hooks that record what each rank saw and its final weights.
DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys
    from safetensors.torch import save_file
    from pmlm.config.pretraining import TrainConfig
    from pmlm.train.pretrain import TrainHooks, train

    cfg_path, shards, out, stop_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    cfg = TrainConfig.from_yaml(cfg_path)
    rank = int(os.environ["RANK"])
    seen, sharded = [], None

    def on_batch(step, batch):
        seen.append({"step": step, "epoch": batch.epoch, "tokens": batch.tokens.tolist()})

    def after_step(step, model):
        if step == stop_at and rank == 1:  # a stop signal that reaches one rank only
            os.kill(os.getpid(), signal.SIGTERM)
        if step == cfg.optim.total_steps:
            global sharded
            sharded = any(hasattr(v, "full_tensor") for v in model.state_dict().values())
            # under FSDP each rank holds shards (DTensors): gather them (collective) to compare whole tensors
            state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).contiguous()
                     for k, v in model.state_dict().items()}
            save_file(state, f"{out}/rank{rank}.safetensors")

    code = train(cfg, shards, out, final_path=f"{out}/final/model.safetensors",
                 hooks=TrainHooks(on_batch=on_batch, after_step=after_step))
    with open(f"{out}/rank{rank}-{stop_at}.json", "w") as fh:
        json.dump({"code": code, "seen": seen, "sharded": sharded}, fh)
    """
)


def _config(fsdp: bool = False, attention: str = "auto") -> dict:
    return {
        "fsdp": fsdp,
        "attention": attention,
        "model": {"preset": "tiny", "overrides": {"num_layers": 1, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64}},
        "optim": {"lr": 3e-3, "warmup_steps": 1, "total_steps": STEPS},
        "tokens_per_step": 2 * GRAD_ACCUM * MICRO,
        "data": {"tokens_per_batch": MICRO, "buffer_rows": 32, "num_workers": 0},
        "log_every": 1,
        "eval_every": 3,
        "eval_batches": 2,
        "save_every": 100,
        "tensorboard": False,
        "device": "cpu",
    }


@pytest.fixture(scope="module")
def shard_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    # two leading residues spell the row number, so every row is unique and names its record
    train = [
        np.concatenate([[4 + i % 20, 4 + i // 20], s]).astype(np.uint8)
        for i, s in enumerate(make_sequences(192, seed=3, max_len=50))
    ]
    valid = make_sequences(48, seed=4)
    shards = write_shards(root / "shards", {"train": train, "valid": valid}, files=2, rows_per_group=8)
    (root / "driver.py").write_text(DRIVER)
    return root, shards


@pytest.fixture(scope="module", params=["ddp", "fsdp", "fsdp-packed"])
def ddp_case(request, shard_case):
    """(run folder of this mode, shards, config path); the run itself is made by the first test.

    "fsdp-packed" runs the encoder's packed layout (the one a GPU takes under bf16) through its CPU
    kernel, so the sharded, per-layer wrapped model is exercised with (T, C) activations too."""
    root, shards = shard_case
    cfg_path = root / f"{request.param}.yaml"
    attention = "packed" if request.param.endswith("packed") else "auto"
    cfg_path.write_text(yaml.safe_dump(_config(fsdp=request.param.startswith("fsdp"), attention=attention)))
    return root / request.param, shards, cfg_path


def _torchrun(
    cfg_path: Path, shards: Path, out: Path, stop_at: int = -1, ranks: int = 2
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(ranks),
        str(cfg_path.parent / "driver.py"),
        str(cfg_path),
        str(shards),
        str(out),
        str(stop_at),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cfg_path.parent)


def _rows(tokens: list[list[int]]) -> list[tuple[int, ...]]:
    return [tuple(row[1 : row.index(EOS_ID)]) for row in tokens]


def test_two_ranks_share_weights_and_split_the_data(ddp_case):
    out, shards, cfg_path = ddp_case
    done = _torchrun(cfg_path, shards, out)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((out / f"rank{r}--1.json").read_text()) for r in (0, 1)]
    assert [r["code"] for r in reports] == [0, 0]

    # gradients were all-reduced: both ranks end with the same weights, which are the declared output
    w0, w1 = load_file(out / "rank0.safetensors"), load_file(out / "rank1.safetensors")
    final = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(w0[k], w1[k]) and torch.equal(w0[k], final[k]) for k in w0)

    # each step's batch is the one stream's, the same on both ranks; each rank took its own rows of it, GRAD_ACCUM
    # micro-batches per step, and the two ranks' rows are the batch's, each once
    cfg = TrainConfig.from_dict(_config())
    expected = ShardStream(
        shards,
        "train",
        tokens_per_batch=cfg.tokens_per_step,
        max_len=cfg.max_len,
        buffer_rows=cfg.data.buffer_rows,
        seed=cfg.seed,
        pad_to_multiple=cfg.data.pad_to_multiple,
    )
    layout = StepLayout(cfg.tokens_per_step, MICRO, 2, GRAD_ACCUM)
    for step in range(STEPS):
        batch = expected.next_batch().tokens.tolist()
        for rank, report in enumerate(reports):
            seen = [_rows(b["tokens"]) for b in report["seen"] if b["step"] == step]
            parts = [_rows(batch[a:b]) for a, b in layout.rank_parts(len(batch), rank)]
            assert seen == parts and len(seen) == GRAD_ACCUM
        both = [row for report in reports for b in report["seen"] if b["step"] == step for row in _rows(b["tokens"])]
        assert sorted(both) == sorted(_rows(batch))
    assert all(b["epoch"] == 0 for r in reports for b in r["seen"])
    rows0 = {row for b in reports[0]["seen"] for row in _rows(b["tokens"])}
    rows1 = {row for b in reports[1]["seen"] for row in _rows(b["tokens"])}
    assert rows0 and rows1 and not rows0 & rows1

    # one metrics row per step, written once (rank 0 only), with validation aggregated over both ranks
    lines = (out / "metrics.csv").read_text().splitlines()
    assert sum(line.startswith("train,") for line in lines) == STEPS
    assert sum(line.startswith("valid,") for line in lines) == 2
    scores = json.loads((out / "final_scores.json").read_text())
    assert scores["step"] == STEPS and scores["mlm_total"] > 0


def test_a_stop_on_one_rank_stops_both_and_the_resumed_run_matches(ddp_case):
    reference, shards, cfg_path = ddp_case
    if not (reference / "final" / "model.safetensors").exists():
        pytest.skip("needs the uninterrupted run of the previous test")
    out = reference.with_name(reference.name + "-stopped")
    _torchrun(cfg_path, shards, out, stop_at=2)  # torchrun reports the non-zero worker exit as its own failure
    codes = [json.loads((out / f"rank{r}-2.json").read_text())["code"] for r in (0, 1)]
    assert codes == [REQUEUE_EXIT_CODE, REQUEUE_EXIT_CODE]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]
    assert not (out / "final").exists()

    done = _torchrun(cfg_path, shards, out)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads((out / "rank0--1.json").read_text())
    assert resumed["seen"][0]["step"] == 2  # picked up at the checkpoint, not from scratch
    a, b = load_file(reference / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_four_ranks_resume_bit_identical(shard_case):
    """With two ranks every gradient sum has one order; with four, gloo adds the ranks' values in an order set by
    where the gradient sits in the buffer it reduces. DDP lays its buckets out anew after each process's first
    step, so the resumed run's first step has another layout than the uninterrupted run's at that step: the
    gradients are reduced parameter by parameter so that this changes nothing."""
    root, shards = shard_case
    cfg_path = root / "ddp4.yaml"
    cfg_path.write_text(yaml.safe_dump(_config()))
    reference, out = root / "ddp4", root / "ddp4-stopped"
    done = _torchrun(cfg_path, shards, reference, ranks=4)
    assert done.returncode == 0, done.stderr[-3000:]
    _torchrun(cfg_path, shards, out, stop_at=3, ranks=4)
    assert [json.loads((out / f"rank{r}-3.json").read_text())["code"] for r in range(4)] == [REQUEUE_EXIT_CODE] * 4
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3"]
    done = _torchrun(cfg_path, shards, out, ranks=4)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = load_file(reference / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), max(float((a[k] - b[k]).abs().max()) for k in a)


def test_fsdp_and_ddp_train_the_same_model(shard_case):
    root, _ = shard_case
    runs = {mode: root / mode / "final" / "model.safetensors" for mode in ("ddp", "fsdp")}
    if not all(p.exists() for p in runs.values()):
        pytest.skip("needs the DDP and FSDP runs of the tests above")
    a, b = load_file(runs["ddp"]), load_file(runs["fsdp"])
    assert a.keys() == b.keys()
    # same data, masks and initial weights; only the order of floating-point reductions may differ
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_fsdp_runs_on_a_single_process_under_torchrun(shard_case):
    """One GPU's case: `torchrun --nproc_per_node 1` with fsdp: true shards (trivially) and trains the
    model a plain single-process run trains."""
    root, shards = shard_case
    cfg_path = root / "fsdp-single.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(fsdp=True)))
    sharded_out, plain_out = root / "fsdp-single", root / "plain-single"
    done = _torchrun(cfg_path, shards, sharded_out, ranks=1)
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "0"}  # no MASTER_ADDR: no process group, no FSDP
    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    cmd = [sys.executable, str(root / "driver.py"), str(cfg_path), str(shards), str(plain_out), "-1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = json.loads((sharded_out / "rank0--1.json").read_text())
    plain = json.loads((plain_out / "rank0--1.json").read_text())
    assert sharded["sharded"] is True and plain["sharded"] is False
    assert [b["tokens"] for b in sharded["seen"]] == [b["tokens"] for b in plain["seen"]]
    assert sorted(p.name for p in (sharded_out / "checkpoints").iterdir()) == [f"step-{STEPS}"]
    a, b = load_file(sharded_out / "final" / "model.safetensors"), load_file(plain_out / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:  # same data, masks, dropout and weights; only reduction order may differ
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
