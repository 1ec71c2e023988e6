"""Fine-tuning with LoRA adapters (pmlm.adapters, through peft) and the best validation's head
(pmlm.finetune.selection).

* A LoRA run saves the head and the adapters only; the encoder's own weights do not move; what evaluate, embed,
  score and contacts read is the adapted encoder, and ``pmlm export --adapter`` merges the adapters into a plain
  encoder that transformers loads and that computes the same outputs (fp32: the merged weight W + s B A rounds once
  per entry, so outputs agree to a few roundings of their size, far inside 1e-5 at these dims).
* The head kept is the best validation's: the metrics log's validation rows say which step, and head.json says it.
  A validation set whose labels are the training labels negated makes the best an early step, never the last.
  Patience stops the run; an interrupted run resumed keeps the same best and the same weights.
* Bad settings are one line before any work. An imported ESM-2 takes adapters on its attention projections.
"""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file
from tiny_models import random_letters, tiny_encoder, write_fasta

from pmlm import alphabet
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.config.tree import apply_override
from pmlm.finetune.finetune import FinetuneHooks, finetune
from pmlm.pretrained import load_encoder, load_head
from pmlm.tokens import batch_tokens

pytestmark = pytest.mark.usefixtures("single_thread")

CHARGE = {"K": 1, "R": 1, "D": -1, "E": -1}


def net_charge(sequence: str) -> int:
    return sum(CHARGE.get(c, 0) for c in sequence)


def write_table(path: Path, n: int, seed: int, sign: int = 1) -> Path:
    """A CSV of n random sequences of 12-29 residues, labelled by net charge (times ``sign``)."""
    rows = [("id", "sequence", "label")]
    for i in range(n):
        sequence = random_letters(12 + (i * 7) % 18, seed * 1000 + i)
        rows.append((f"p{seed}_{i}", sequence, str(sign * net_charge(sequence))))
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return path


def recipe(path: Path, **changes) -> Path:
    """A LoRA regression recipe of a few CPU seconds; ``changes`` as dotted keys ('adapter.rank': 2)."""
    cfg = {
        "task": "sequence_regression",
        "freeze_encoder": False,
        "adapter": {"kind": "lora", "rank": 4, "alpha": 8, "dropout": 0.0},
        "head": {"kind": "mlp", "mlp_hidden": 32, "dropout": 0.0},
        "optim": {"lr": 1e-2, "head_lr": 1e-2, "warmup_steps": 2, "total_steps": 24},
        "data": {"batch_size": 16, "crop": None},
        "log_every": 4,
        "eval_every": 4,
        "save_every": 4,
        "keep_last_checkpoints": 10,
        "device": "cpu",
    }
    for key, value in changes.items():
        apply_override(cfg, f"{key}={json.dumps(value)}")  # as --set applies it (JSON is YAML)
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "root": root,
        "encoder": tiny_encoder(root / "encoder" / "model.safetensors", "pmlm", max_len=34, num_layers=2),
        "other": tiny_encoder(root / "other" / "model.safetensors", "pmlm", max_len=34, num_layers=2, seed=5),
        "train": write_table(root / "train.csv", 96, 1),
        "valid": write_table(root / "valid.csv", 32, 2),
        # labels negated: as the model learns the training labels, this set's Spearman falls
        "anti": write_table(root / "anti.csv", 32, 2, sign=-1),
        "fasta": write_fasta(root / "q.fasta", {"q1": random_letters(26, 7), "q2": random_letters(15, 8)}),
    }


def run_finetune(data: dict, name: str, valid: str = "valid", **changes) -> tuple[int, Path]:
    root = data["root"] / name
    root.mkdir()
    config = recipe(root / "recipe.yaml", **changes)
    head = root / "head" / "head.safetensors"
    args = ["finetune", "--config", str(config), "--encoder", str(data["encoder"]), "--train", str(data["train"])]
    args += ["--valid", str(data[valid]), "--out", str(root / "run"), "--final", str(head)]
    return main(args), head


@pytest.fixture(scope="module")
def lora(data) -> Path:
    code, head = run_finetune(data, "lora")
    assert code == 0
    return head


def reps(model, sequences: list[str]) -> torch.Tensor:
    tokens = torch.from_numpy(batch_tokens([alphabet.encode(s) for s in sequences]).tokens).long()
    with torch.no_grad():
        return model.encoder(tokens)


def test_a_lora_run_saves_the_head_and_the_adapters_only(data, lora):
    before = load_file(data["encoder"])
    tensors = load_file(lora)
    info = json.loads(lora.with_suffix(".json").read_text())
    adapters = {k: v for k, v in tensors.items() if k.startswith("adapter.")}
    assert set(tensors) == set(adapters) | {k for k in tensors if k.startswith("head.")}
    # rank-4 A and B on qkv (16 -> 48) and proj (16 -> 16) of each of the two layers
    assert sorted(adapters) == sorted(
        f"adapter.layers/{i}/attn/{name}.lora_{ab}.default.weight"
        for i in range(2)
        for name in ("qkv", "proj")
        for ab in "AB"
    )
    assert adapters["adapter.layers/0/attn/qkv.lora_A.default.weight"].shape == (4, 16)
    assert adapters["adapter.layers/0/attn/qkv.lora_B.default.weight"].shape == (48, 4)
    parameters = sum(v.numel() for v in adapters.values())
    assert info["adapter"] == {
        "kind": "lora", "rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": ["qkv", "proj"], "parameters": parameters
    }  # fmt: skip
    assert info["encoder_trained"] is False
    assert sum(v.numel() * v.element_size() for v in adapters.values()) <= 0.05 * data["encoder"].stat().st_size
    # B starts at zero: trained adapters are not; the encoder file is untouched
    assert all(v.abs().max() > 0 for k, v in adapters.items() if "lora_B" in k)
    after = load_file(data["encoder"])
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_evaluate_embed_score_and_contacts_read_the_adapted_encoder(data, lora, tmp_path):
    sequences = [random_letters(26, 7), random_letters(15, 8)]
    fine_tuned = load_head(lora)
    adapted, _, _ = load_encoder(data["encoder"], adapter=lora)
    plain, _, _ = load_encoder(data["encoder"])
    ours = reps(adapted, sequences)
    torch.testing.assert_close(reps(fine_tuned.model.encoder, sequences), ours, rtol=0, atol=0)
    assert (ours - reps(plain, sequences)).abs().max() > 1e-3  # the adapters change the representations

    import pmlm

    api = pmlm.load(data["encoder"], adapter=lora)  # the Python API as the commands
    np.testing.assert_allclose(api.embed(sequences[0]), ours[0, 1:27].numpy(), rtol=0, atol=1e-5)
    out = tmp_path / "e.parquet"
    assert main(["embed", str(data["encoder"]), str(data["fasta"]), "-o", str(out), "--adapter", str(lora.parent)]) == 0
    rows = pd.read_parquet(out)
    first = np.stack(rows[rows["id"] == "q1"]["embedding"].to_numpy())
    np.testing.assert_allclose(first, ours[0, 1:27].numpy(), rtol=0, atol=1e-5)
    import pyarrow.parquet as pq

    settings = json.loads(pq.read_schema(out).metadata[b"pmlm"])
    assert settings["adapter"] == str(lora) and len(settings["adapter_sha256"]) == 64

    score = tmp_path / "s.tsv"
    args = ["score", str(data["encoder"]), "--sequence", str(data["fasta"]), "--saturation", "-o", str(score)]
    assert main([*args, "--adapter", str(lora)]) == 0
    assert main([*args[:-1], str(tmp_path / "s0.tsv")]) == 0
    adapted_scores = pd.read_csv(score, sep="\t", comment="#")
    plain_scores = pd.read_csv(tmp_path / "s0.tsv", sep="\t", comment="#")
    assert len(adapted_scores) == len(plain_scores) and not adapted_scores.equals(plain_scores)
    contacts = ["contacts", str(data["encoder"]), str(data["fasta"]), "-o", str(tmp_path / "maps")]
    assert main([*contacts, "--adapter", str(lora)]) == 0

    table = tmp_path / "eval.tsv"
    assert main(["evaluate", "--head", str(lora), "--test", f"v={data['valid']}", "--out", str(table)]) == 0
    rows = pd.read_csv(table, sep="\t")
    spearman = rows[rows["metric"] == "spearman"]["value"].item()
    selected = json.loads(lora.with_suffix(".json").read_text())["selected"]
    assert spearman == pytest.approx(selected["value"], abs=1e-6)  # the kept head is the best validation's


def test_a_merged_export_loads_in_transformers_and_equals_the_adapted_encoder(data, lora, tmp_path):
    folder = tmp_path / "merged"
    assert main(["export", str(data["encoder"]), "--adapter", str(lora), "-o", str(folder)]) == 0
    provenance = json.loads((folder / "config.json").read_text())["pmlm"]
    assert provenance["adapter"] == str(lora) and len(provenance["adapter_sha256"]) == 64
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
    sequences = [random_letters(26, 7), random_letters(15, 8)]
    tokens = torch.from_numpy(batch_tokens([alphabet.encode(s) for s in sequences]).tokens).long()
    adapted, _, _ = load_encoder(data["encoder"], adapter=lora)
    adapted.encoder.attention = "padded"
    with torch.no_grad():
        theirs = model(input_ids=tokens, attention_mask=tokens.ne(alphabet.PAD_ID), output_hidden_states=True)
        ours = adapted.encoder(tokens)
    real = tokens.ne(alphabet.PAD_ID)
    assert float((theirs.hidden_states[-1][real] - ours[real]).abs().max()) <= 1e-5
    # the merged weights are W + (alpha / r) B A
    merged = load_file(folder / "model.safetensors")
    assert not any("lora" in k for k in merged)


def validation_rows(run: Path) -> list[tuple[int, float]]:
    with open(run / "metrics.csv") as fh:
        return [(int(r["step"]), float(r["value"])) for r in csv.DictReader(fh) if r["split"] == "valid"]


def test_the_kept_head_is_the_best_validation_and_says_which_step(data, tmp_path):
    code, head = run_finetune(data, "anti", valid="anti", **{"optim.total_steps": 24})
    assert code == 0
    rows = validation_rows(head.parent.parent / "run")
    assert [s for s, _ in rows] == [4, 8, 12, 16, 20, 24]
    best_step, best_value = max(rows, key=lambda r: (r[1], -r[0]))  # the first of the highest
    assert best_step < 24  # the negated labels: the model learns away from them
    info = json.loads(head.with_suffix(".json").read_text())
    assert info["selected"] == {
        "step": best_step, "metric": "spearman", "value": pytest.approx(best_value, rel=1e-5), "validations": 6,  # the log: 6 digits
        "last_step": 24, "stopped_early": False, "patience": 0,
    }  # fmt: skip
    assert info["step"] == best_step and info["last_step"] == 24
    assert info["valid"]["scores"]["step"] == best_step
    table = tmp_path / "eval.tsv"
    assert main(["evaluate", "--head", str(head), "--test", f"v={data['anti']}", "--out", str(table)]) == 0
    evaluated = pd.read_csv(table, sep="\t").set_index("metric")["value"]["spearman"]
    assert evaluated == pytest.approx(info["selected"]["value"], abs=1e-6)


def test_patience_stops_the_run_after_validations_without_a_better_one(data, capsys):
    code, head = run_finetune(data, "patience", valid="anti", patience=2, **{"optim.total_steps": 200})
    assert code == 0
    info = json.loads(head.with_suffix(".json").read_text())
    selected = info["selected"]
    assert selected["stopped_early"] is True
    assert selected["last_step"] == selected["step"] + 2 * 4 < 200
    assert "stopped early at step" in capsys.readouterr().err


def test_an_interrupted_run_resumed_keeps_the_same_best_and_weights(data, tmp_path):
    cfg = FinetuneConfig.from_yaml(recipe(tmp_path / "r.yaml"))
    whole = tmp_path / "whole" / "head.safetensors"
    assert finetune(cfg, data["encoder"], data["train"], tmp_path / "w", whole, data["anti"]) == 0

    def stop_at_14(step, _model):  # past the best (anti labels) and between checkpoints 12 and 16
        if step == 14:
            os.kill(os.getpid(), signal.SIGTERM)

    halves = tmp_path / "halves" / "head.safetensors"
    hooks = FinetuneHooks(after_step=stop_at_14)
    assert finetune(cfg, data["encoder"], data["train"], tmp_path / "h", halves, data["anti"], hooks=hooks) != 0
    assert finetune(cfg, data["encoder"], data["train"], tmp_path / "h", halves, data["anti"]) == 0
    a, b = load_file(whole), load_file(halves)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    selected = [json.loads(p.with_suffix(".json").read_text())["selected"] for p in (whole, halves)]
    assert selected[0] == selected[1]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"adapter.rank": 0}, "adapter.rank must be >= 1, got 0"),
        ({"adapter.targets": ["query"]}, "adapter.targets: the encoder has no linear layer named 'query'"),
        ({"freeze_encoder": True}, "adapter: an adapter trains inside the encoder, and freeze_encoder: true"),
        ({"adapter.kind": "ia3"}, "adapter.kind must be one of lora, got 'ia3'"),
        ({"eval_every": 0, "patience": 3}, "patience counts validations: set eval_every > 0 too"),
    ],
)
def test_bad_adapter_settings_are_one_line_before_any_work(data, tmp_path, capsys, changes, message):
    config = recipe(tmp_path / "bad.yaml", **changes)
    args = ["finetune", "--config", str(config), "--encoder", str(data["encoder"]), "--train", str(data["train"])]
    assert main([*args, "--out", str(tmp_path / "run"), "--final", str(tmp_path / "h" / "head.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "h").exists()


def test_an_adapter_from_a_head_only_run_or_another_encoder_is_refused_in_one_line(data, lora, tmp_path, capsys):
    code, head_only = run_finetune(data, "frozen", freeze_encoder=True, adapter=None, eval_every=0)
    assert code == 0
    capsys.readouterr()
    for model, run, message in (
        (data["encoder"], head_only, "this run has no adapters (it trained the head only)"),
        (data["other"], lora, "the head was fine-tuned on an encoder with sha256"),
    ):
        out = tmp_path / "e.parquet"
        assert main(["embed", str(model), str(data["fasta"]), "-o", str(out), "--adapter", str(run)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
        assert not out.exists()
    args = ["contacts", str(data["encoder"]), str(data["fasta"]), "-o", str(tmp_path / "m"), "--head", str(lora)]
    assert main([*args, "--adapter", str(lora)]) == 2
    assert "--head brings its own run's adapters" in capsys.readouterr().err


def test_an_imported_esm2_takes_adapters_on_its_attention_projections(tmp_path, data):
    from tiny_models import make_esm2

    source = make_esm2(tmp_path / "esm2")
    assert main(["import", str(source), "-o", str(tmp_path / "encoder"), "--objective", "mlm"]) == 0
    encoder = tmp_path / "encoder" / "model.safetensors"
    config = recipe(tmp_path / "r.yaml", **{"optim.total_steps": 4, "adapter.targets": "auto"})
    head = tmp_path / "head" / "head.safetensors"
    args = ["finetune", "--config", str(config), "--encoder", str(encoder), "--train", str(data["train"])]
    assert main([*args, "--valid", str(data["valid"]), "--out", str(tmp_path / "run"), "--final", str(head)]) == 0
    info = json.loads(head.with_suffix(".json").read_text())
    assert info["adapter"]["targets"] == ["query", "key", "value", "attention.output.dense"]
    keys = load_file(head).keys()
    assert "adapter.esm/encoder/layer/1/attention/self/query.lora_A.default.weight" in keys
    assert not any(k.startswith("encoder.") for k in keys)
    out = tmp_path / "e.parquet"
    assert main(["embed", str(encoder), str(data["fasta"]), "-o", str(out), "--adapter", str(head)]) == 0
    # merged: ESM's own folder again, which transformers loads as EsmForMaskedLM and which computes the adapted trunk
    assert main(["export", str(encoder), "--adapter", str(head), "-o", str(tmp_path / "merged")]) == 0
    merged = transformers.EsmForMaskedLM.from_pretrained(tmp_path / "merged").eval()
    assert merged.config.pmlm["adapter_sha256"] and not any("lora" in n for n, _ in merged.named_parameters())
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "merged")
    sequences = [random_letters(26, 7), random_letters(15, 8)]
    batch = tokenizer(sequences, return_tensors="pt", padding=True)
    adapted, _, _ = load_encoder(encoder, adapter=head)
    tokens = torch.from_numpy(batch_tokens([alphabet.encode(s) for s in sequences]).tokens).long()
    with torch.no_grad():
        theirs = merged(**batch, output_hidden_states=True).hidden_states[-1]
        ours = adapted.encoder(tokens)
    real = batch["attention_mask"].bool()
    assert float((theirs[real] - ours[real]).abs().max()) <= 1e-5
