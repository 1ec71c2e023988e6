"""``pmlm plan --finetune`` (pmlm.finetune.cost): a recipe priced frozen, adapted and fully fine-tuned.

* Trainable parameters are exact: the counts of the models ``pmlm finetune`` trains, read off real runs' heads.
* Peak memory against the CPU allocator's measured peak of real fine-tuning steps (``pmlm finetune`` itself, fp32,
  one thread: the profiler sees the calling thread's allocations only), in each mode, with and without gradient
  accumulation; and where the gradients outgrow the activations (a short batch on a wider encoder: CASES). As in the pre-training estimate (tests/test_plan.py), when the step peaks beside the kept tensors
  depends on the order in which the backward frees them, so the working-set term is known to half its size; 1 %
  covers the batch, indices and the loader's tensors.
* The plan's time follows the FLOP count: adapted costs twice the frozen encoder's work, full three times.
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import random_letters

from pmlm.adapters import attach
from pmlm.artefacts import write_encoder
from pmlm.choices import Precision
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.finetune.cost import encoder_spec, peak_memory, with_mode
from pmlm.finetune.finetune import finetune
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.model.task_heads import TaskModel
from pmlm.pretrained import build_model, load_encoder, load_head
from pmlm.tasks.registry import task_named
from pmlm.train.budget import Arithmetic, measured_bytes

RESIDUES = 128


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("cost")
    encoders = {}
    for name, hidden in (("narrow", 64), ("wide", 256)):
        torch.manual_seed(0)
        # no attention dropout: CPU training would take the blockwise dropout kernel, which the estimate does not model
        model_cfg = ModelConfig(
            num_layers=2, hidden=hidden, ffn=4 * hidden, heads=4, max_len=RESIDUES + 2, attention_dropout=0.0
        )
        model = build_model(model_cfg, ObjectiveConfig(name="pmlm"))
        encoders[name] = root / name / "model.safetensors"
        info = {"model": model.cfg.to_dict(), "objective": {"name": "pmlm"}}
        write_encoder(encoders[name], model.state_dict(), info)
    train = root / "train.csv"
    rows = [("id", "sequence", "label")] + [(f"p{i}", random_letters(RESIDUES, i), f"{i % 5}") for i in range(64)]
    with open(train, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return {"root": root, "encoder": encoders["narrow"], **encoders, "train": train}


def recipe(grad_accum: int = 1, batch: tuple[int, int] = (16, RESIDUES), **changes) -> FinetuneConfig:
    values = {
        "task": "sequence_regression",
        "head": {"kind": "mlp", "mlp_hidden": 128},
        "optim": {"warmup_steps": 1, "total_steps": 2},
        "data": {"batch_size": batch[0], "crop": batch[1]},
        "grad_accum": grad_accum,
        "save_every": 0,
        "device": "cpu",
        **changes,
    }
    return FinetuneConfig.from_dict(values)


# (mode, encoder, (proteins, residues) per micro-batch, what runs): activations far above the gradients, through `pmlm
# finetune` itself; then far below (one protein of 8 residues on a wider encoder, 8.6 MB of weights: the full run's
# step peaks at the optimizer step), the model built and stepped as pmlm finetune does, without its loop's own
# tensors (the batch, the checkpoint's checks: under 1 MB, not modelled, which would hide a 3 % error here). Frozen
# runs have the head's gradients only, nothing of the second regime.
CASES = [
    *[(mode, "narrow", (16, RESIDUES), "finetune") for mode in ("frozen", "adapter", "full")],
    *[(mode, "wide", (1, 8), "model") for mode in ("adapter", "full")],
]


def model_steps(cfg: FinetuneConfig, encoder, residues: int) -> None:
    """Two optimizer steps of the model pmlm finetune builds (encoder, head, adapters; AdamW on what trains)."""
    model_encoder, _, _ = load_encoder(encoder)
    task = task_named(cfg.task)
    adapter = attach(model_encoder, cfg.adapter) if cfg.adapter is not None else None
    model = TaskModel(
        model_encoder, task.build_head(cfg, model_encoder.cfg.hidden), cfg.task, "M", cfg.freeze_encoder, adapter
    ).train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained)
    tokens = torch.randint(4, 24, (cfg.data.batch_size, residues + 2))
    mask = torch.ones(cfg.data.batch_size, residues, dtype=torch.bool)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        for _ in range(cfg.grad_accum):
            model(tokens, mask).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()


@pytest.mark.parametrize(("mode", "encoder", "batch", "runs"), CASES)
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_the_estimate_is_the_measured_peak_of_fine_tuning_steps(
    setup, single_thread, tmp_path, mode, grad_accum, encoder, batch, runs
):
    cfg = with_mode(recipe(grad_accum, batch), mode)
    out = tmp_path / "run"

    def steps():
        if runs == "model":
            model_steps(cfg, setup[encoder], batch[1])
            return
        shutil.rmtree(out, ignore_errors=True)
        assert finetune(cfg, setup[encoder], setup["train"], out) == 0

    measured, _ = measured_bytes(steps, torch.device("cpu"))
    estimate = peak_memory(cfg, encoder_spec(setup[encoder]), batch[1], Arithmetic(Precision.FP32, "cpu"))
    working = estimate["bytes"]["backward_working_set"]
    assert abs(estimate["total_bytes"] - measured) <= working / 2 + 0.01 * measured, (estimate, measured)


def test_trainable_parameters_are_those_of_the_runs(setup, tmp_path, capsys):
    counts = {}
    for mode in ("frozen", "adapter", "full"):
        cfg = with_mode(recipe(), mode)
        head = tmp_path / mode / "head.safetensors"
        assert finetune(cfg, setup["encoder"], setup["train"], tmp_path / f"{mode}-run", head) == 0
        model = load_head(head).model  # the run's model, built as the run built it
        counts[mode] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if mode != "full":  # what trained is what the run saved, with the head's buffers (full: the heads too)
            saved = sum(t.numel() for t in load_file(head).values())
            assert saved - sum(b.numel() for b in model.head.buffers()) == counts[mode]
    (tmp_path / "r.yaml").write_text(json.dumps(recipe().to_dict()))
    args = ["plan", "--finetune", str(tmp_path / "r.yaml"), "--encoder", str(setup["encoder"])]
    capsys.readouterr()
    assert main([*args, "--train", str(setup["train"]), "--json"]) == 0
    modes = json.loads(capsys.readouterr().out)["modes"]
    rows = {r["mode"]: r for r in modes}
    assert [r["mode"] for r in modes] == ["frozen", "adapter", "full"]  # the recipe's own (frozen) first
    for mode, count in counts.items():
        assert rows[mode]["parameters"]["trainable"] == count, mode
    assert counts["frozen"] < counts["adapter"] < counts["full"]
    # FLOPs: frozen the forward, adapted forward + input gradients, full three passes (heads: per protein, none)
    flops = {m: rows[m]["epoch_flops"] for m in rows}
    assert flops["adapter"] == 2 * flops["frozen"] and flops["full"] == 3 * flops["frozen"]
    assert rows["full"]["steps_per_epoch"] == 4 and rows["full"]["epochs"] == 0.5  # 64 proteins / 16; 2 steps


def test_the_table_names_each_mode_and_its_rate(setup, capsys):
    assert main(["plan", "--finetune", "config/finetune/fluorescence.yaml", "--preset", "xl", "--proteins", "21446",
                 "--mean-length", "237"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "Fine-tuning fluorescence on pmlm-xl (36 layers x 1280), 21,446 training proteins" in out
    assert "| full (recipe) |" in out and "| frozen |" in out and "| adapter (rank 8) |" in out
    assert "the paper's own V100 rate" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--proteins", "10", "--mean-length", "100"], "give --encoder MODEL or --preset PRESET"),
        (["--preset", "base"], "--train FILE, or --proteins N with --mean-length L"),
        (["--preset", "base", "--proteins", "10"], "--train FILE, or --proteins N with --mean-length L"),
    ],
)
def test_missing_inputs_are_one_line(args, message, capsys):
    assert main(["plan", "--finetune", "config/finetune/fluorescence.yaml", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
