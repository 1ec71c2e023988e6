"""The fine-tuning loop on CPU: contacts that can be learned are learned, frozen vs full fine-tuning, bad configs,
deterministic batches (how a run stops and resumes: tests/test_training_stops.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import metrics_rows
from safetensors.torch import load_file
from tiny_models import make_encoder, recipe, write_structures

from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.finetune.data import TaskLoader
from pmlm.finetune.finetune import FinetuneHooks, finetune
from pmlm.pretrained import load_head
from pmlm.tasks.contact_task import CONTACT
from pmlm.tasks.registry import read_task_data

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("finetune")
    return {
        "encoder": make_encoder(root / "pmlm" / "model.safetensors"),
        "train": write_structures(root / "train.jsonl", 48, seed=1),
        "test": write_structures(root / "test.jsonl", 12, seed=2),
    }


def test_learnable_contacts_are_learned_above_chance(tmp_path, case):
    cfg = FinetuneConfig.from_dict(recipe(optim__total_steps=40, save_every=0))
    final = tmp_path / "head.safetensors"
    assert finetune(cfg, case["encoder"], case["train"], tmp_path / "run", final, valid_path=case["test"]) == 0
    info = json.loads(final.with_suffix(".json").read_text())
    scores = info["valid"]["scores"]
    # chance: the contact density among scored pairs (s >= 6) of the validation proteins
    data = read_task_data(case["test"], "contact")
    hits = total = 0
    for ex in data.examples:
        contacts, valid = ex.contact_window(0, len(ex), 8.0)
        upper = np.triu(valid, k=6)
        hits += int(contacts[upper].sum())
        total += int(upper.sum())
    chance = hits / total
    assert 0.05 < chance < 0.3
    assert scores["P@L_tape_s6"] > chance + 0.3, (scores["P@L_tape_s6"], chance)
    losses = [float(r["loss"]) for r in metrics_rows(tmp_path / "run")]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert info["features"] == "M" and info["train"]["contact_atom"] == "CB" and info["step"] == 40
    assert metrics_rows(tmp_path / "run", "valid")[-1]["metric"] == "P@L/5_medium_long"


@pytest.mark.parametrize("freeze", [True, False])
def test_frozen_encoder_is_untouched_and_full_finetuning_updates_it(tmp_path, case, freeze):
    pretrained = load_file(case["encoder"])
    seen = {}

    def after_step(step, model):
        seen["encoder"] = {k: v.clone() for k, v in model.encoder.state_dict().items()}

    cfg = FinetuneConfig.from_dict(
        recipe(freeze_encoder=freeze, head__features="M+", optim__total_steps=3, save_every=0)
    )
    final = tmp_path / "head.safetensors"
    assert (
        finetune(
            cfg, case["encoder"], case["train"], tmp_path / "run", final, hooks=FinetuneHooks(after_step=after_step)
        )
        == 0
    )
    saved = load_file(final)
    changed = [k for k in pretrained if not torch.equal(pretrained[k], seen["encoder"][k])]
    if freeze:
        assert changed == []
        assert all(k.startswith("head.") for k in saved)
    else:
        assert "encoder.layers.0.attn.qkv.weight" in changed and "pair_head.dense.weight" in changed
        assert "pair_head.out.weight" not in changed and "token_head.out.weight" not in changed
        assert torch.equal(
            saved["encoder.encoder.layers.0.attn.qkv.weight"], seen["encoder"]["encoder.layers.0.attn.qkv.weight"]
        )
    assert json.loads(final.with_suffix(".json").read_text())["encoder_trained"] is (not freeze)


def test_ss3_and_remote_homology_run_from_their_formats(tmp_path, case):
    cfg = FinetuneConfig.from_dict(
        recipe(task="ss3", head={"mlp_hidden": 16, "dropout": 0.1}, optim__total_steps=30, save_every=0)
    )
    assert cfg.head.kind == "mlp" and cfg.head.features == "auto"
    final = tmp_path / "ss3.safetensors"
    assert finetune(cfg, case["encoder"], case["train"], tmp_path / "ss3", final, valid_path=case["test"]) == 0
    scores = json.loads(final.with_suffix(".json").read_text())["valid"]["scores"]
    assert scores["Q3"] > 0.6  # the state is a function of the residue: well above the ~0.33 of guessing

    # TAPE's convolutional head: builds, trains a step (its batch statistics and weight-norm gains included),
    # and its artefact loads back as that head
    cfg = FinetuneConfig.from_dict(
        recipe(
            task="ss3",
            head={"kind": "conv", "conv_hidden": 16, "dropout": 0.0},
            optim__total_steps=1,
            optim__warmup_steps=0,
            save_every=0,
        )
    )
    final = tmp_path / "ss3_conv.safetensors"
    assert finetune(cfg, case["encoder"], case["train"], tmp_path / "ss3_conv", final) == 0
    weights = load_file(final)
    assert weights["head.norm.running_mean"].abs().sum() > 0  # one training step moved the statistics
    assert {"head.conv1.parametrizations.weight.original0", "head.conv2.parametrizations.weight.original1"} <= set(
        weights
    )
    model, loaded, *_ = load_head(final)
    assert loaded.head.kind == "conv" and type(model.head).__name__ == "TapeConvHead"

    # three folds with distinct compositions: separable after mean-pooling
    records = [
        {"id": f"r{k}", "primary": ("ACD", "EFG", "HIK")[k % 3] * (3 + k % 4), "fold_label": k % 3} for k in range(12)
    ]
    tape = tmp_path / "remote_homology_train.json"
    tape.write_text(json.dumps(records))
    cfg = FinetuneConfig.from_dict(
        recipe(
            task="remote_homology",
            head={"mlp_hidden": 16, "dropout": 0.0, "num_classes": 3},
            optim__total_steps=30,
            save_every=0,
        )
    )
    final = tmp_path / "remote.safetensors"
    assert finetune(cfg, case["encoder"], tape, tmp_path / "remote", final, valid_path=tape) == 0
    assert json.loads(final.with_suffix(".json").read_text())["valid"]["scores"]["top1"] == 1.0


@pytest.mark.parametrize("task", ["contact", "ss3"])
def test_one_update_is_the_same_however_its_proteins_are_micro_batched(tmp_path, case, task):
    """Four proteins of 24 to 48 residues as one batch, 2 x 2 or 4 x 1 micro-batches: the loss is the mean over the
    step's pairs (contact) or labelled residues (ss3), so the step's gradient is the same. The micro-batches hold
    unequal counts (a mean of their means would weigh a short protein's terms more). Bound: the same fp32 sums in
    another order, a few hundred roundings of the gradient's scale at most (2^-16 of its largest element)."""
    head = {"kind": "linear", "features": "M", "dropout": 0.0} if task == "contact" else {"dropout": 0.0}
    # no dropout anywhere (full fine-tuning trains the encoder): its draws follow the batch's shape
    encoder = make_encoder(tmp_path / "encoder" / "model.safetensors", attention_dropout=0.0)
    grads = {}
    for batch_size, accumulation in ((4, 1), (2, 2), (1, 4)):
        got = {}

        def after_backward(step, model, got=got):
            got.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

        changes = {"data__batch_size": batch_size, "grad_accum": accumulation, "freeze_encoder": False}
        cfg = FinetuneConfig.from_dict(
            recipe(task=task, head=head, optim__total_steps=1, optim__warmup_steps=0, save_every=0, **changes)
        )
        hooks = FinetuneHooks(after_backward=after_backward)
        assert finetune(cfg, encoder, case["train"], tmp_path / f"{batch_size}x{accumulation}", hooks=hooks) == 0
        grads[batch_size] = got
    whole = grads[4]
    assert whole and any("encoder" in name for name in whole)
    for batch_size in (2, 1):
        assert grads[batch_size].keys() == whole.keys()
        for name, g in whole.items():
            bound = 2.0**-16 * float(g.abs().max())
            assert float((grads[batch_size][name] - g).abs().max()) <= bound, (batch_size, name)


def test_batches_are_a_function_of_seed_and_epoch(case):
    data = read_task_data(case["train"], "contact")
    first, second = (TaskLoader(data.examples, CONTACT, 4, 20, seed=3) for _ in range(2))
    plan = first.epoch_plan(0)
    assert sorted(i for batch in plan for i, _ in batch) == list(range(len(data.examples)))
    assert plan == second.epoch_plan(0) and plan != first.epoch_plan(1)
    for _ in range(len(plan) + 3):  # into the second epoch
        batch = first.next_batch()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    a, b = first.next_batch(), second.next_batch()
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets) and a.ids == b.ids
    assert batch.tokens.shape[1] <= 20 + 2 and batch.targets.shape[1:] == batch.valid.shape[1:]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"head": {"kindd": "linear"}}, "unknown key(s) head.kindd"),
        ({"task": "ss3", "head": {"kind": "resnet"}}, "head.kind must be mlp or conv for task ss3"),
        ({"optim": {"head_lr": 0}}, "optim.head_lr must be > 0"),
        ({"data": {"crop": 500}}, "data.crop must be <= the encoder's window of 64 residues"),
        ({"head": {"features": "M+"}}, "head.features M+ needs an encoder with a pair head"),
    ],
)
def test_bad_config_is_one_line_exit_2(tmp_path, case, capsys, change, message):
    cfg = recipe()
    for section, values in change.items():
        if isinstance(values, dict):
            cfg[section].update(values)
        else:
            cfg[section] = values
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    encoder = case["encoder"]
    if "pair head" in message:
        encoder = make_encoder(tmp_path / "mlm" / "model.safetensors", objective="mlm")
    code = main(
        [
            "finetune",
            "--config",
            str(path),
            "--encoder",
            str(encoder),
            "--train",
            str(case["train"]),
            "--out",
            str(tmp_path / "o"),
            "--final",
            str(tmp_path / "h.safetensors"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("pmlm finetune: error: ") and message in err, err
    assert not (tmp_path / "h.safetensors").exists()


def test_bad_training_record_names_file_and_line(tmp_path, case, capsys):
    bad = tmp_path / "bad.jsonl"
    lines = case["train"].read_text().splitlines()[:3]
    lines[1] = lines[1].replace('"seq": "', '"seq": "1')
    bad.write_text("\n".join(lines) + "\n")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(recipe()))
    code = main(
        [
            "finetune",
            "--config",
            str(path),
            "--encoder",
            str(case["encoder"]),
            "--train",
            str(bad),
            "--out",
            str(tmp_path / "o"),
            "--final",
            str(tmp_path / "h.safetensors"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{bad}:2:" in err, err


def test_shipped_recipes_load():
    recipes = sorted((Path(__file__).resolve().parents[1] / "config" / "finetune").glob("*.yaml"))
    names = {p.stem for p in recipes}
    assert {
        "contact_linear_tiny",
        "contact_resnet_tiny",
        "ss3_tiny",
        "contact_linear",
        "contact_resnet",
        "ss3",
        "remote_homology",
    } <= names
    for path in recipes:
        cfg = FinetuneConfig.from_yaml(path)
        assert FinetuneConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg, path.name
    assert FinetuneConfig.from_yaml(recipes[0].parent / "contact_resnet.yaml").head.resnet_blocks == 8


@pytest.mark.parametrize("form", ["weights", "folder", "model.json"])
def test_the_encoder_is_its_weights_its_folder_or_its_model_json(case, tmp_path, form, capsys):
    """One reading of MODEL in every command that takes an encoder (pmlm.pretrained.encoder_weights): pmlm finetune
    --encoder trains from any of the three forms and records the same weights; a head where the encoder goes names
    the encoder, in one line, before any work."""
    weights = case["encoder"]
    given = {"weights": weights, "folder": weights.parent, "model.json": weights.with_suffix(".json")}[form]
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(recipe(optim__total_steps=2, save_every=0)))
    final = tmp_path / "out" / "final" / "head.safetensors"
    args = ["finetune", "--config", str(cfg_path), "--encoder", str(given), "--train", str(case["train"])]
    assert main([*args, "--out", str(tmp_path / "out"), "--final", str(final)]) == 0, capsys.readouterr().err
    recorded = json.loads(final.with_suffix(".json").read_text())["encoder"]
    assert recorded["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert os.path.normpath(final.parent / recorded["path"]) == os.path.normpath(weights)
    if form == "folder":
        capsys.readouterr()
        again = [
            *args[:4],
            str(final.parent),
            *args[5:],
            "--out",
            str(tmp_path / "second"),
            "--final",
            str(tmp_path / "h.safetensors"),
        ]
        assert main(again) == 2
        err = capsys.readouterr().err
        assert "a fine-tuned head (head.safetensors), not an encoder" in err and str(weights.parent) in err
        assert len(err.splitlines()) == 1 and not (tmp_path / "second").exists()
