"""Evaluation, scoring and embedding at the precision a run records: fine-tuning writes it into head.json; `pmlm
evaluate`, `embed`, `score`, `contacts` and `pmlm.load` read a head or encoder in it (bf16 recorded falls back to
fp32 off CUDA and says so once; asked for there it is a one-line error); every output says which; the result tables
carry it per row."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from tiny_models import make_encoder, random_letters, recipe, write_fasta, write_structures

import pmlm
from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.errors import ConfigError
from pmlm.finetune.finetune import finetune
from pmlm.finetune.head_scoring import TSV_COLUMNS
from pmlm.reports.results import write_all
from pmlm.reports.run_summary import summary_text

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")

FALLBACK = "was trained in bf16, which runs on CUDA only: computing in fp32 on cpu"
REFUSAL = "--precision bf16 needs a CUDA device, and this runs on cpu"


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    """A PMLM encoder, a contact head fine-tuned on it on the CPU, a test set, and copies of both recorded as bf16."""
    root = tmp_path_factory.mktemp("precision")
    encoder = make_encoder(root / "encoder" / "model.safetensors", max_len=24)
    train = write_structures(root / "train.jsonl", 4, seed=1, lengths=(12, 20))
    cfg = FinetuneConfig.from_dict(recipe(optim__total_steps=2, optim__warmup_steps=0, save_every=0, data__crop=16))
    head = root / "head" / "head.safetensors"
    assert finetune(cfg, encoder, train, root / "run", head) == 0
    return {
        "encoder": encoder,
        "head": head,
        "encoder_bf16": _recorded_as(encoder, root / "encoder_bf16", "bf16"),
        "head_bf16": _recorded_as(head, root / "head_bf16", "bf16"),
        "test": write_structures(root / "test.jsonl", 3, seed=5, lengths=(14, 20)),
        "root": root,
    }


def _recorded_as(weights: Path, folder: Path, precision: str) -> Path:
    """A copy of an artefact (weights + sidecar) in ``folder`` whose sidecar records ``precision``; a head's copy
    still finds its encoder."""
    folder.mkdir()
    copy = folder / weights.name
    shutil.copy(weights, copy)
    info = json.loads(weights.with_suffix(".json").read_text())
    info["precision"] = precision
    if "path" in info.get("encoder", {}):
        info["encoder"]["path"] = str((weights.parent / info["encoder"]["path"]).resolve())
    copy.with_suffix(".json").write_text(json.dumps(info))
    return copy


def _tsv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _evaluate(head: str, test: Path, out: Path, *extra: str) -> int:
    return main(["evaluate", "--head", head, "--test", f"t={test}", "--out", str(out), "--device", "cpu", *extra])


def test_fine_tuning_records_its_precision_and_evaluation_reads_the_head_in_it(tmp_path, case, capsys):
    assert json.loads(case["head"].with_suffix(".json").read_text())["precision"] == "fp32"  # trained on the CPU
    out = tmp_path / "fp32.tsv"
    assert _evaluate(str(case["head"]), case["test"], out) == 0
    assert FALLBACK not in capsys.readouterr().err
    rows = _tsv(out)
    assert tuple(rows[0]) == TSV_COLUMNS and "precision" in TSV_COLUMNS
    assert {r["precision"] for r in rows} == {"fp32"}

    # a head its run recorded as bf16 (fine-tuned on a GPU), evaluated on the CPU: fp32, said once, same numbers
    fallback = tmp_path / "fallback.tsv"
    assert _evaluate(str(case["head_bf16"]), case["test"], fallback) == 0
    err = capsys.readouterr().err
    assert err.count(FALLBACK) == 1 and "pmlm evaluate: the head " + FALLBACK in err, err
    assert [(r["metric"], r["value"], r["precision"]) for r in _tsv(fallback)] == [
        (r["metric"], r["value"], r["precision"]) for r in rows
    ]
    # asked for explicitly, fp32 is simply used, without a note
    assert _evaluate(str(case["head_bf16"]), case["test"], tmp_path / "asked.tsv", "--precision", "fp32") == 0
    assert FALLBACK not in capsys.readouterr().err

    # bf16 asked for on the CPU: one line, exit 2, no table
    refused = tmp_path / "refused.tsv"
    assert _evaluate(str(case["head"]), case["test"], refused, "--precision", "bf16") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pmlm evaluate: error: ") and REFUSAL in err, err
    assert not refused.exists()


def test_an_unsupervised_readout_follows_the_encoders_record(tmp_path, case, capsys):
    out = tmp_path / "readout.tsv"
    args = ["--encoder", str(case["encoder_bf16"])]
    assert _evaluate("pair-kl", case["test"], out, *args) == 0
    assert "pmlm evaluate: the encoder " + FALLBACK in capsys.readouterr().err
    assert {r["precision"] for r in _tsv(out)} == {"fp32"}
    assert _evaluate("pair-kl", case["test"], tmp_path / "x.tsv", *args, "--precision", "bf16") == 2
    assert REFUSAL in capsys.readouterr().err


def test_inference_outputs_record_their_precision(tmp_path, case, capsys):
    encoder, recorded_bf16 = str(case["encoder"]), str(case["encoder_bf16"])
    letters = random_letters(30, seed=2)  # longer than the window of 22: windows averaged
    wild = write_fasta(tmp_path / "wt.fasta", {"wt": letters})
    mutants = tmp_path / "m.csv"
    mutants.write_text(f"mutant\n{letters[2]}3A\n{letters[2]}3A:{letters[9]}10G\n")

    def embed(model: str, name: str, *extra: str) -> tuple[int, Path]:
        out = tmp_path / name
        return main(["embed", model, str(wild), "-o", str(out), "--device", "cpu", *extra]), out

    def score(model: str, name: str, *extra: str) -> tuple[int, Path]:
        out = tmp_path / name
        argv = ["score", model, "--sequence", str(wild), "--mutations", str(mutants), "-o", str(out)]
        return main([*argv, "--device", "cpu", *extra]), out

    def contacts(model: str, name: str, *extra: str) -> tuple[int, Path]:
        out = tmp_path / name
        return main(["contacts", model, str(wild), "-o", str(out), "--device", "cpu", *extra]), out

    def embedded(out: Path) -> tuple[str, list]:
        settings = json.loads(pq.read_schema(out).metadata[b"pmlm"])
        per_sequence = json.loads(pq.read_schema(out.with_suffix(".per_sequence.parquet")).metadata[b"pmlm"])
        assert settings["precision"] == per_sequence["precision"]
        return settings["precision"], pq.read_table(out).column("embedding").to_pylist()

    code, plain = embed(encoder, "plain.parquet")
    assert code == 0 and embedded(plain)[0] == "fp32" and FALLBACK not in capsys.readouterr().err
    code, fallback = embed(recorded_bf16, "fallback.parquet")
    assert code == 0 and capsys.readouterr().err.count("pmlm embed: the encoder " + FALLBACK) == 1
    assert embedded(fallback) == embedded(plain)

    code, out = score(recorded_bf16, "fallback.tsv")
    assert code == 0 and "pmlm score: the encoder " + FALLBACK in capsys.readouterr().err
    rows = _tsv(out)
    assert list(rows[0])[-1] == "precision" and [r["precision"] for r in rows] == ["fp32", "fp32"]
    assert [r["score"] for r in rows] == [r["score"] for r in _tsv(score(encoder, "plain.tsv")[1])]

    head = ["--head", str(case["head_bf16"])]
    for model, extra, trained in ((recorded_bf16, [], "the encoder"), (encoder, head, "the head")):
        code, out = contacts(model, f"maps-{trained[4:]}", *extra)
        assert code == 0 and f"pmlm contacts: {trained} " + FALLBACK in capsys.readouterr().err
        assert str(np.load(out / "wt.npz")["precision"]) == "fp32"

    for command, name in ((embed, "refused.parquet"), (score, "refused.tsv"), (contacts, "refused")):
        code, out = command(encoder, name, "--precision", "bf16")
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and REFUSAL in err and not out.exists(), err


def test_a_recorded_precision_other_than_fp32_or_bf16_is_refused(tmp_path, case, capsys):
    odd = _recorded_as(case["encoder"], tmp_path / "odd", "fp16")
    fasta = write_fasta(tmp_path / "s.fasta", {"s": random_letters(10, seed=3)})
    assert main(["embed", str(odd), str(fasta), "-o", str(tmp_path / "e.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.json: precision 'fp16' is neither fp32 nor bf16" in err, err


def test_the_python_api_reads_the_record_too(tmp_path, case, capsys):
    model = pmlm.load(case["encoder_bf16"])
    assert model.precision == "fp32" and "pmlm.load: the encoder " + FALLBACK in capsys.readouterr().err
    assert pmlm.load(case["head"].parent).precision == "fp32"
    with pytest.raises(ConfigError, match=REFUSAL):
        pmlm.load(case["encoder"], precision="bf16")
    with pytest.raises(ConfigError, match="--precision must be one of auto, fp32, bf16, got 'fp16'"):
        pmlm.load(case["encoder"], precision="fp16")


def test_tables_say_which_precision_each_row_was_evaluated_in(tmp_path):
    header = "model\ttask\thead\tfeatures\ttest_set\tmetric\tvalue\tn_proteins"
    new = tmp_path / "new.tsv"
    new.write_text(f"{header}\tprecision\nPMLM-tiny@d\tss3\tmlp\tM\tcb513\tQ3\t0.5\t3\tbf16\n")
    old = tmp_path / "old.tsv"  # written before evaluation recorded its precision
    old.write_text(f"{header}\nMLM-tiny@d\tss3\tmlp\tM\tcb513\tQ3\t0.4\t3\n")
    contact = tmp_path / "contact.tsv"
    contact.write_text(f"{header}\tprecision\nPMLM-tiny@d\tcontact\tlinear\tM\tt\tP@L/5_medium_long\t0.25\t3\tfp32\n")
    tables = tmp_path / "results" / "tables"
    kinds = [("secondary_structure", str(new)), ("secondary_structure", str(old)), ("tape_contact", str(contact))]
    write_all(kinds, tables)
    with open(tables / "secondary_structure.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    ours = {r["model"]: r for r in rows if r["source"] == "ours"}
    assert (ours["PMLM-tiny"]["precision"], ours["MLM-tiny"]["precision"]) == ("bf16", "–")
    assert {r["precision"] for r in rows if r["source"] == "paper"} == {""}
    assert (
        "| ours | PMLM-tiny | d | linear | M | t | 25.0 | – | – | 3 | fp32 |"
        in (tables / "tape_contact.md").read_text()
    )
    # the last screen takes every column of the secondary-structure table but the leading ones and the precision
    # for a test set: with no value of ours it lists the paper's test sets only
    nan = tmp_path / "nan.tsv"
    nan.write_text(f"{header}\tprecision\nPMLM-tiny@d\tss3\tmlp\tM\tcb513\tQ3\tnan\t3\tbf16\n")
    write_all([("secondary_structure", str(nan))], tmp_path / "nan" / "tables")
    screen = summary_text(tmp_path / "nan").splitlines()
    ss3 = next(line for line in screen if line.startswith("  secondary_structure"))
    assert (
        " ".join(ss3.split()) == "secondary_structure Q3 cb513 / casp12 / ts115: paper rows only, no values of this run"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_bf16_head_is_evaluated_under_autocast(tmp_path, case):
    """A head recorded as bf16 runs its forward passes in bf16 (what its Linear layers return says so, and the TSV);
    asked for fp32, the same head runs in fp32. An encoder recorded as bf16 embeds in bf16, one without a record in
    fp32 (through pmlm.load: the commands read FASTA with Biopython, which GPU images may lack)."""
    seen: set[torch.dtype] = set()

    def record(module, inputs, output):
        if isinstance(module, torch.nn.Linear):
            seen.add(output.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        for extra, precision, dtype in (([], "bf16", torch.bfloat16), (["--precision", "fp32"], "fp32", torch.float32)):
            seen.clear()
            out = tmp_path / f"{precision}.tsv"
            argv = ["evaluate", "--head", str(case["head_bf16"]), "--test", f"t={case['test']}", "--out", str(out)]
            assert main([*argv, "--device", "cuda", *extra]) == 0
            assert seen == {dtype} and {r["precision"] for r in _tsv(out)} == {precision}
        letters = random_letters(30, seed=2)
        for encoder, precision, dtype in (("encoder_bf16", "bf16", torch.bfloat16), ("encoder", "fp32", torch.float32)):
            seen.clear()
            model = pmlm.load(case[encoder], "cuda")
            embedding = model.embed(letters)
            assert model.precision == precision and seen == {dtype}
            assert embedding.dtype == np.float32 and embedding.shape == (30, 32)
    finally:
        hook.remove()
