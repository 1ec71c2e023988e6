"""`pmlm evaluate`: TSV columns and values on hand-checked cases, too-long proteins, TAPE C-alpha contacts,
the unsupervised pair-head read-out, and one-line refusals."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import make_encoder, recipe, write_structures

from pmlm.cli import main
from pmlm.config.finetuning import FinetuneConfig
from pmlm.evaluation.pair_readout import unsupervised_contact_scores
from pmlm.files import file_digest
from pmlm.finetune.finetune import finetune
from pmlm.finetune.head_scoring import TSV_COLUMNS, canonical_sha256

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def encoders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("encoders")
    return {
        # window of 22 residues: the 30-residue protein below is "too long"
        "pmlm": make_encoder(root / "pmlm" / "model.safetensors", max_len=24),
        "mlm": make_encoder(root / "mlm" / "model.safetensors", objective="mlm", max_len=24),
    }


def _constant_head(tmp_path: Path, encoder: Path, task: str, train: Path, bias: list[float]) -> Path:
    """A head fine-tuned for one step, then set to output ``bias`` everywhere (zero weights)."""
    head_cfg = {"features": "M"} if task == "contact" else {"mlp_hidden": 8}
    cfg = FinetuneConfig.from_dict(
        recipe(task=task, head=head_cfg, optim__total_steps=1, optim__warmup_steps=0, save_every=0, data__crop=16)
    )
    final = tmp_path / f"{task}.safetensors"
    assert finetune(cfg, encoder, train, tmp_path / f"run_{task}", final) == 0
    weights = load_file(final)
    last = "head.out" if task == "contact" else "head.mlp.3"
    weights[f"{last}.weight"] = torch.zeros_like(weights[f"{last}.weight"])
    weights[f"{last}.bias"] = torch.tensor(bias)
    save_file(weights, str(final))
    return final


def _contact_set(folder: Path, with_long: bool = False) -> Path:
    folder.mkdir()
    a = np.zeros((20, 20), dtype=np.int64)
    for i, j in [(0, 12), (0, 14), (1, 14)]:
        a[i, j] = a[j, i] = 1
    a[0, 13] = a[13, 0] = -1  # unknown distance: not a candidate
    b = np.zeros((10, 10), dtype=np.int64)
    b[0, 6] = b[6, 0] = 1
    np.savez(folder / "a.npz", seq=np.array("ACDEFGHIKLMNPQRSTVWY"), contacts=a)
    np.savez(folder / "b.npz", seq=np.array("ACDEFGHIKL"), contacts=b)
    if with_long:
        np.savez(folder / "c.npz", seq=np.array("ACDEFGHIKL" * 3), contacts=np.ones((30, 30), dtype=np.int64))
    return folder


def _read_tsv(path: Path) -> tuple[list[str], dict[tuple[str, str], dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t")
        rows = list(reader)
    return reader.fieldnames, {(r["test_set"], r["metric"]): r for r in rows}


def test_contact_tsv_matches_a_hand_checked_case(tmp_path, encoders):
    train = write_structures(tmp_path / "train.jsonl", 4, seed=1, lengths=(12, 20))
    head = _constant_head(tmp_path, encoders["pmlm"], "contact", train, [0.0])
    tests = _contact_set(tmp_path / "hand")
    out = tmp_path / "contact.tsv"
    assert main(["evaluate", "--head", str(head), "--test", f"hand={tests}", "--out", str(out), "--model", "tiny"]) == 0
    columns, rows = _read_tsv(out)
    assert tuple(columns) == TSV_COLUMNS

    # Constant scores rank candidates by (i, j). Protein A (L = 20), s >= 12, (0, 13) unknown:
    # (0,12)+ (0,14)+ (0,15) (0,16) | (0,17) (0,18) (0,19) (1,13) (1,14)+ (1,15) | (1,16..19) (2,14..19)
    #   top L/5 = 4: 2 hits -> 0.5;   top L/2 = 10: 3 hits -> 0.3;   top L = 20: 3 hits -> 0.15.
    # Protein B (L = 10) has no pair with s >= 12: 0 of floor(L/k) -> 0 at every k.
    # Short range (6 <= s < 12): A has no short contact (0); B's top 2 are (0,6)+ (0,7) -> 0.5 at L/5.
    # TAPE's s >= 6: A's top 4 are (0,6..9), no contact; B as for short -> (0 + 0.5) / 2.
    expected = {
        "P@L/5_medium_long": 0.25,
        "P@L/5_medium_long_pooled": 2 / 6,
        "P@L/2_medium_long": 0.15,
        "P@L/2_medium_long_pooled": 3 / 15,
        "P@L_medium_long": 0.075,
        "P@L_medium_long_pooled": 3 / 30,
        "P@L/5_short": 0.25,
        "P@L/5_long": 0.0,
        "P@L/5_tape_s6": (0 + 1 / 2) / 2,
        "n_too_long": 0,
    }
    for metric, value in expected.items():
        assert float(rows[("hand", metric)]["value"]) == pytest.approx(value), metric
        assert rows[("hand", metric)]["n_proteins"] == "2"
    assert len(rows) == 5 * 3 * 2 + 1  # ranges x L/k x (mean, pooled) + n_too_long
    row = rows[("hand", "P@L/5_medium_long")]
    info = json.loads(head.with_suffix(".json").read_text())
    assert (row["model"], row["task"], row["head"], row["features"]) == ("tiny", "contact", "linear", "M")
    assert row["config_sha256"] == canonical_sha256(info["config"])
    assert row["encoder_sha256"] == hashlib.sha256(encoders["pmlm"].read_bytes()).hexdigest()
    assert row["torch_version"] == torch.__version__ and row["pmlm_version"]

    # a protein longer than the encoder's window (22 residues): left out and counted under --too-long skip
    out_skip = tmp_path / "skip.tsv"
    with_long = _contact_set(tmp_path / "long", with_long=True)
    assert (
        main(
            [
                "evaluate",
                "--head",
                str(head),
                "--test",
                f"hand={with_long}",
                "--out",
                str(out_skip),
                "--too-long",
                "skip",
            ]
        )
        == 0
    )
    _, skipped = _read_tsv(out_skip)
    assert skipped[("hand", "n_too_long")]["value"] == "1" and skipped[("hand", "n_too_long")]["n_proteins"] == "3"
    assert skipped[("hand", "P@L/5_medium_long")]["value"] == rows[("hand", "P@L/5_medium_long")]["value"]
    assert skipped[("hand", "P@L/5_medium_long")]["model"] == "pmlm"  # default label: the encoder's folder
    # by default it is read as two windows and scored at L = 30, for a head and for the pair-head read-out
    for head_arg in (str(head), "pair-mi"):
        out_windows = tmp_path / "windows.tsv"
        assert (
            main(
                [
                    "evaluate",
                    "--head",
                    head_arg,
                    "--encoder",
                    str(encoders["pmlm"]),
                    "--test",
                    f"hand={with_long}",
                    "--out",
                    str(out_windows),
                ]
            )
            == 0
        )
        _, windowed = _read_tsv(out_windows)
        assert windowed[("hand", "n_too_long")]["value"] == "1" and windowed[("hand", "P@L_long")]["n_proteins"] == "3"
        if head_arg != "pair-mi":
            # C (every pair a contact, L = 30): constant scores, its s >= 24 pairs (i < 6, j >= 24) lie in no window
            # of 22, so none is a candidate: P@L_long = 0 for C; A and B have no long pair either
            assert float(windowed[("hand", "P@L_long")]["value"]) == 0.0
            # medium + long for C: the top 6 (L/5) held pairs with s >= 12 are all contacts
            assert float(windowed[("hand", "P@L/5_medium_long")]["value"]) == pytest.approx((0.5 + 0 + 1) / 3)


def test_ss3_tsv_matches_a_hand_checked_case(tmp_path, encoders):
    train = write_structures(tmp_path / "train.jsonl", 4, seed=1, lengths=(12, 20))
    head = _constant_head(tmp_path, encoders["pmlm"], "ss3", train, [0.0, 0.0, 1.0])  # always "C"
    test = write_structures(tmp_path / "test.jsonl", 3, seed=5, lengths=(8, 20))
    out = tmp_path / "ss3.tsv"
    assert main(["evaluate", "--head", str(head), "--test", f"cb513={test}", "--out", str(out)]) == 0
    _, rows = _read_tsv(out)
    dssp = [json.loads(line)["dssp"] for line in test.read_text().splitlines()]
    pooled = sum(s.count("C") for s in dssp) / sum(len(s) for s in dssp)
    per_protein = np.mean([s.count("C") / len(s) for s in dssp])
    assert float(rows[("cb513", "Q3")]["value"]) == pytest.approx(pooled)
    assert float(rows[("cb513", "Q3_per_protein")]["value"]) == pytest.approx(per_protein)
    assert pooled != pytest.approx(per_protein)  # the two averages really differ here
    assert rows[("cb513", "Q3")]["head"] == "mlp" and rows[("cb513", "Q3")]["n_proteins"] == "3"


def test_unsupervised_readout_runs_on_a_pmlm_model(tmp_path, encoders):
    test = write_structures(tmp_path / "test.jsonl", 3, seed=5, lengths=(14, 20))
    for head, extra in (("pair-kl", []), ("pair-mi", []), ("pair-kl", ["--mask-pairs", "--pair-batch", "64"])):
        out = tmp_path / f"{head}{len(extra)}.tsv"
        assert (
            main(
                [
                    "evaluate",
                    "--head",
                    head,
                    "--encoder",
                    str(encoders["pmlm"]),
                    "--test",
                    f"synthetic={test}",
                    "--out",
                    str(out),
                    *extra,
                ]
            )
            == 0
        )
        _, rows = _read_tsv(out)
        row = rows[("synthetic", "P@L_tape_s6")]
        assert (row["head"], row["features"], row["n_proteins"]) == (head, "pair joint", "3")
        assert 0.0 <= float(row["value"]) <= 1.0
        assert row["encoder_sha256"] == file_digest(encoders["pmlm"])

    from pmlm.pretrained import load_encoder

    model, *_ = load_encoder(encoders["pmlm"])
    residues = np.frombuffer(b"\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f", dtype=np.uint8)
    for mask_pairs in (False, True):
        scores = unsupervised_contact_scores(model, residues, "kl", mask_pairs=mask_pairs, pair_batch=7)
        assert scores.shape == (12, 12) and np.isfinite(scores).all()
        assert np.array_equal(scores, scores.T) and not np.diag(scores).any()
        assert np.abs(scores).max() > 0
    # chunking the pairs changes nothing
    small, large = (unsupervised_contact_scores(model, residues, "mi", pair_batch=n) for n in (5, 1000))
    np.testing.assert_allclose(small, large, rtol=1e-4, atol=1e-7)


def test_unsupervised_readout_refuses_an_mlm_model(tmp_path, encoders, capsys):
    test = write_structures(tmp_path / "test.jsonl", 2, seed=5, lengths=(14, 20))
    out = tmp_path / "x.tsv"
    code = main(
        ["evaluate", "--head", "pair-kl", "--encoder", str(encoders["mlm"]), "--test", f"t={test}", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "has no pair head (objective mlm)" in err, err
    assert not out.exists()


def test_head_on_a_different_encoder_is_refused(tmp_path, encoders, capsys):
    train = write_structures(tmp_path / "train.jsonl", 4, seed=1, lengths=(12, 20))
    head = _constant_head(tmp_path, encoders["pmlm"], "contact", train, [0.0])
    other = make_encoder(tmp_path / "other" / "model.safetensors", max_len=24, seed=3)
    capsys.readouterr()  # the fine-tuning above reported its progress; what follows is evaluate's alone
    code = main(
        [
            "evaluate",
            "--head",
            str(head),
            "--encoder",
            str(other),
            "--test",
            f"t={train}",
            "--out",
            str(tmp_path / "x.tsv"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "fine-tuned on an encoder with sha256" in err, err
    code = main(["evaluate", "--head", str(head), "--test", "no-equals-sign", "--out", str(tmp_path / "x.tsv")])
    err = capsys.readouterr().err
    assert code == 2 and "--test expects NAME=PATH" in err and err.count("\n") == 1


def test_tape_proteinnet_uses_c_alpha_and_refuses_c_beta(tmp_path, encoders, capsys):
    # alpha-helix-like C-alpha trace: 3.8 A between neighbours, so the unit check accepts it
    records = []
    for k, length in enumerate((18, 22, 30)):
        t = np.arange(length)
        ca = np.stack([2.3 * np.cos(np.radians(100 * t)), 2.3 * np.sin(np.radians(100 * t)), 1.5 * t], 1)
        records.append(
            {
                "id": f"casp{k}",
                "primary": ("ACDEFGHIKLMNPQRSTVWY" * 2)[:length],
                "tertiary": ca.flatten().tolist(),
                "valid_mask": [1] * length,
            }
        )
    path = tmp_path / "proteinnet_test.json"
    path.write_text(json.dumps(records))
    out = tmp_path / "pn.tsv"
    assert (
        main(
            [
                "evaluate",
                "--head",
                "pair-mi",
                "--encoder",
                str(encoders["pmlm"]),
                "--test",
                f"casp12={path}",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "contacts by CA" in capsys.readouterr().err
    _, rows = _read_tsv(out)
    assert rows[("casp12", "n_too_long")]["value"] == "1" and rows[("casp12", "P@L_short")]["n_proteins"] == "3"
    code = main(
        [
            "evaluate",
            "--head",
            "pair-mi",
            "--encoder",
            str(encoders["pmlm"]),
            "--test",
            f"casp12={path}",
            "--out",
            str(out),
            "--contact-atom",
            "CB",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "tape data defines contacts by CA only" in err, err


def test_a_protein_longer_than_the_window_is_scored_at_its_true_length(tmp_path, encoders):
    """Window 22, protein of 30: windows [0, 22) and [8, 30) (pmlm.tokens.window_starts), outputs averaged over
    the overlap by a hand-written mean, precision with k = floor(30 / divisor); pairs no window holds are no
    candidates."""
    from pmlm.evaluation.metrics import contact_precision, q3_accuracy
    from pmlm.finetune.data import evaluation_plan
    from pmlm.finetune.head_scoring import score_task
    from pmlm.pretrained import load_head
    from pmlm.tasks.registry import read_task_data
    from pmlm.tokens import batch_tokens

    train = write_structures(tmp_path / "train.jsonl", 4, seed=1, lengths=(12, 20))
    test = write_structures(tmp_path / "test.jsonl", 2, seed=7, lengths=(30, 30))
    for task, head_cfg in (("contact", {"features": "M"}), ("ss3", {"kind": "conv", "conv_hidden": 8})):
        cfg = FinetuneConfig.from_dict(
            recipe(task=task, head=head_cfg, optim__total_steps=3, save_every=0, data__crop=16)
        )
        final = tmp_path / f"{task}.safetensors"
        assert finetune(cfg, encoders["pmlm"], train, tmp_path / f"run_{task}", final) == 0
        model = load_head(final).model
        data = read_task_data(test, task)
        metrics, n_long = score_task(model, data, batch_size=3, window=22, too_long="windows", device="cpu")
        assert n_long == 2
        plan = evaluation_plan(data.examples, 3, 22, "windows")
        assert plan.windows == [2, 2] and [[r[1:] for r in rows] for rows in plan.batches] == [
            [(0, 22), (8, 30), (0, 22)],
            [(8, 30)],
        ]  # a protein's windows in consecutive rows, across batches
        expected, labels = [], []
        for ex in sorted(data.examples, key=len):
            assert len(ex) == 30
            pairs = task == "contact"
            total = np.zeros((30, 30) if pairs else (30, 3))
            count = np.zeros((30, 30) if pairs else (30, 1))
            for start in (0, 8):
                rows = batch_tokens([ex.residues[start : start + 22]])
                with torch.no_grad():
                    out = model(torch.from_numpy(rows.tokens), torch.from_numpy(rows.residue_mask()))[0].double()
                window = slice(start, start + 22)
                if pairs:
                    total[window, window] += out.numpy()
                    count[window, window] += 1
                else:
                    total[window] += out.numpy()
                    count[window] += 1
            if pairs:
                held = count > 0
                assert not held[0, 29] and held[8, 29] and held[0, 21]  # (0, 29): no window holds both
                contacts, valid = ex.contact_window(0, 30, 8.0)
                scores = np.where(held, total / np.maximum(count, 1), 0.0)
                expected.append(contact_precision(scores, contacts, valid & held, min_sep=12, k_divisor=5))
            else:
                expected.append((total / count).argmax(-1))
                labels.append(ex.labels)
        if task == "contact":
            assert metrics["P@L/5_medium_long"][0] == pytest.approx(np.mean(expected))
            # pooled over both proteins: hits / (6 + 6) picks, k = floor(30 / 5) each (cropped: floor(22 / 5) = 4)
            pooled = metrics["P@L/5_medium_long_pooled"][0] * 12
            assert abs(pooled - round(pooled)) < 1e-9
        else:
            acc = q3_accuracy(expected, labels)
            assert metrics["Q3"][0] == pytest.approx(acc.pooled)
            assert sum(int((lab >= 0).sum()) for lab in labels) == 60  # all 30 residues of both proteins scored
