"""The fine-tuning loop on CPU: contacts that can be learned are learned, frozen vs full fine-tuning,
bit-identical resume after SIGTERM, NaN stop, bad configs, deterministic batches."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from pmlm.alphabet import RESIDUES
from pmlm.artefacts import write_encoder
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.finetune.data import TaskLoader
from pmlm.finetune.finetune import FinetuneHooks, finetune
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model, load_head
from pmlm.tasks.contact_task import CONTACT
from pmlm.tasks.registry import read_task_data
from pmlm.train import REQUEUE_EXIT_CODE
from pmlm.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from pmlm.train.runtime import TrainingDiverged

SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
CLUSTER_SPACING = 20.0  # Angstrom between residue-type clusters: far beyond the 8 A contact threshold
CLUSTER_RADIUS = 2.5  # every C-beta lies this close to its type's centre, so same-type pairs are <= 5 A apart
SS_OF_TYPE = "HEC"  # residue type k gets DSSP state SS_OF_TYPE[k % 3]: learnable from the residue alone

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


def make_encoder(
    path: Path,
    objective: str = "pmlm",
    hidden: int = 32,
    max_len: int = 66,
    dropout: float = 0.0,
    seed: int = 0,
    attention_dropout: float = 0.1,
) -> Path:
    """A randomly initialised tiny encoder written like `pmlm pretrain` writes its final weights."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        num_layers=1, hidden=hidden, ffn=2 * hidden, heads=2, max_len=max_len, dropout=dropout,
        attention_dropout=attention_dropout,
    )  # fmt: skip
    objective_cfg = ObjectiveConfig(name=objective)
    model = build_model(cfg, objective_cfg)
    info = {"model": model.cfg.to_dict(), "objective": dataclasses.asdict(objective_cfg)}
    write_encoder(path, model.state_dict(), info)
    return path


def write_structures(path: Path, n: int, seed: int, lengths=(24, 48), types: int = 8) -> Path:
    """Structure JSONL whose contacts are exactly the pairs of identical residue types.

    Each residue type sits in its own cluster (C-beta within CLUSTER_RADIUS of the type's centre,
    centres CLUSTER_SPACING apart), so a pair is in contact iff both residues have the same type;
    the DSSP state is a function of the type too. Geometry is not protein-like, only learnable.
    """
    rng = np.random.default_rng(seed)
    alphabet = RESIDUES[:types]
    centres = np.arange(types)[:, None] * np.array([CLUSTER_SPACING, 0.0, 0.0])
    with open(path, "w") as fh:
        for k in range(n):
            length = int(rng.integers(lengths[0], lengths[1] + 1))
            kinds = rng.integers(types, size=length)
            direction = rng.normal(size=(length, 3))
            direction /= np.linalg.norm(direction, axis=1, keepdims=True)
            cb = centres[kinds] + direction * rng.uniform(0, CLUSTER_RADIUS, size=(length, 1))
            ca = cb + 1.5 * direction
            record = {
                "id": f"p{k}",
                "chain": "A",
                "start_resnum": 1,
                "seq": "".join(alphabet[t] for t in kinds),
                "dssp": "".join(SS_OF_TYPE[t % 3] for t in kinds),
                "ca": ca.round(3).tolist(),
                "cb": cb.round(3).tolist(),
            }
            fh.write(json.dumps(record) + "\n")
    return path


def recipe(**changes) -> dict:
    """A contact recipe small enough for CPU steps of a few milliseconds."""
    cfg = {
        "task": "contact",
        "head": {"kind": "linear", "features": "M", "dropout": 0.5},
        "optim": {"head_lr": 1e-2, "lr": 1e-3, "warmup_steps": 2, "total_steps": 10},
        "data": {"batch_size": 4, "crop": 32},
        "log_every": 1,
        "save_every": 5,
        "keep_last_checkpoints": 20,
        "device": "cpu",
    }
    for key, value in changes.items():
        *sections, leaf = key.split("__")
        node = cfg
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return cfg


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("finetune")
    return {
        "encoder": make_encoder(root / "pmlm" / "model.safetensors"),
        "encoder_dropout": make_encoder(root / "pmlm_dropout" / "model.safetensors", dropout=0.1, seed=1),
        "train": write_structures(root / "train.jsonl", 48, seed=1),
        "test": write_structures(root / "test.jsonl", 12, seed=2),
    }


def _rows(out: Path, split: str = "train") -> list[dict]:
    with open(out / "metrics.csv", newline="") as fh:
        return [row for row in csv.DictReader(fh) if row["split"] == split]


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
    losses = [float(r["loss"]) for r in _rows(tmp_path / "run")]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert info["features"] == "M" and info["train"]["contact_atom"] == "CB" and info["step"] == 40
    assert _rows(tmp_path / "run", "valid")[-1]["metric"] == "P@L/5_medium_long"


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


def _cli(case: dict, out: Path, cfg_path: Path) -> list[str]:
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


def _steps_logged(out: Path) -> int:
    try:
        return max((int(r["step"]) for r in _rows(out)), default=0)
    except (OSError, ValueError, KeyError):
        return 0


def test_sigterm_saves_exits_for_requeue_and_resumes_bit_identical(tmp_path, case):
    """ResNet head with batch norm (running buffers), M+ features, full fine-tuning with encoder
    dropout: every piece of state that a resume must restore."""
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
    proc = subprocess.Popen(
        _cli(case, out, cfg_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV
    )
    deadline = time.monotonic() + 120
    while _steps_logged(out) < 5:
        assert proc.poll() is None, f"run ended (code {proc.returncode}) before step 5: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "timed out waiting for step 5"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    assert "SIGTERM received" in err
    stopped = load_checkpoint(latest_checkpoint(out)).step
    assert 5 <= stopped < total
    assert not (out / "final").exists()

    done = subprocess.run(_cli(case, out, cfg_path), capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr
    assert f"resuming from {out / 'checkpoints' / f'step-{stopped}'}" in done.stderr
    a, b = load_file(ref / "final" / "head.safetensors"), load_file(out / "final" / "head.safetensors")
    assert a.keys() == b.keys() and any(k.endswith("running_mean") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"
    assert [r["step"] for r in _rows(out)] == [str(s) for s in range(1, total + 1)]
    assert [r["loss"] for r in _rows(out)] == [r["loss"] for r in _rows(ref)]


def test_nan_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, case):
    def poison(step, model):
        if step == 7:
            with torch.no_grad():
                model.head.out.weight.fill_(float("nan"))

    cfg = FinetuneConfig.from_dict(recipe(optim__total_steps=12))
    final = tmp_path / "head.safetensors"
    with pytest.raises(TrainingDiverged, match=r"non-finite loss or gradient at step 8 .*step-5"):
        finetune(cfg, case["encoder"], case["train"], tmp_path / "run", final, hooks=FinetuneHooks(after_step=poison))
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [5] and not final.exists()


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
    first, second = (TaskLoader(data.examples, CONTACT, 4, 20, seed=3, threshold=8.0) for _ in range(2))
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
