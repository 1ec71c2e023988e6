"""ProteinGym zero-shot benchmark: the metrics on hand-computed cases, ProteinGym's aggregation worked by hand,
assays read as published (bad input: one line naming file and line, nothing written), every score equal to
`pmlm score`'s engine (singles, pair-joint doubles, windows) or the sum of its singles (mutants wider than the
window), the Potts fixture's scores exact, and the whole rule chain on the Potts assay served over loopback HTTP,
scored by a tiny PMLM trained on that family."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, job_counts, snakemake
from loopback_servers import static_http_server
from tiny_models import (
    PROTEINGYM_FOLDER,
    assay_text,
    mutated,
    random_letters,
    tiny_encoder,
    write_reference,
    write_zip,
)

from pmlm import alphabet
from pmlm.cli import main
from pmlm.evaluation import fitness
from pmlm.inference.mutations import parse_mutant, score_mutants
from pmlm.pretrained import load_encoder
from pmlm.proteingym.summary import aggregate
from pmlm.synth.potts import PottsModel

FIXTURE = REPO / "tests" / "data" / "proteingym"
POTTS_ID = "POTTS1_SYNTH_Potts"
RECIPE = REPO / "config" / "train" / "coevolution_tiny.yaml"
# log-probabilities are fp32 softmaxes of logits of size ~10-100: differences agree to a few fp32 ulps of them
ATOL = 1e-4

pytestmark = pytest.mark.usefixtures("single_thread")


# --- the metrics, by hand ------------------------------------------------------------------------------------


def test_average_ranks_and_spearman_by_hand():
    assert fitness.average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    # no ties: 1 - 6 * sum d^2 / (n (n^2 - 1)) = 1 - 6 * 2 / 60
    assert fitness.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8, abs=1e-15)
    # ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4), centred: 4.5 / sqrt(4.5 * 5)
    assert fitness.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(3 / math.sqrt(10), abs=1e-15)
    assert fitness.spearman([4, 3, 2, 1], [1, 2, 3, 4]) == pytest.approx(-1.0, abs=1e-15)
    assert math.isnan(fitness.spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError):
        fitness.spearman([1, float("nan")], [1, 2])


def test_auc_and_mcc_by_hand():
    # scikit-learn's documented example: one of the four positive-negative pairs is ordered wrongly
    assert fitness.roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75, abs=1e-15)
    assert fitness.roc_auc([0, 1], [1.0, 1.0]) == 0.5  # a tie counts one half
    assert math.isnan(fitness.roc_auc([1, 1, 1], [1, 2, 3]))
    # median 2.5: predictions (0, 0, 1, 1) against (0, 1, 1, 1): tp 2, tn 1, fp 0, fn 1 -> 2 / sqrt(2 * 3 * 1 * 2)
    assert fitness.mcc_at_median([0, 1, 1, 1], [1, 2, 3, 4]) == pytest.approx(1 / math.sqrt(3), abs=1e-15)
    # median 2 and score >= median: predictions (0, 1, 1, 1), labels (1, 0, 1, 1): tp 2, tn 0, fp 1, fn 1
    assert fitness.mcc_at_median([1, 0, 1, 1], [1, 2, 2, 3]) == pytest.approx(-1 / 3, abs=1e-15)
    assert fitness.mcc_at_median([1, 1, 1, 1], [1, 2, 3, 4]) == 0.0  # no negatives: an empty margin
    with pytest.raises(ValueError):
        fitness.roc_auc([0, 2], [1, 2])


def test_ndcg_by_hand():
    true = np.arange(20.0)  # gains i / 19; the top 10 %: k = 2
    score = np.zeros(20)
    score[19], score[0] = 2.0, 1.0  # the fittest first, the least fit (gain 0) second
    ideal = 1 + (18 / 19) / math.log2(3)
    assert fitness.ndcg(true, score) == pytest.approx(1 / ideal, abs=1e-15)
    assert fitness.ndcg(true, true) == pytest.approx(1.0, abs=1e-15)
    least_fit = np.r_[0.0, 0.0, np.arange(1.0, 19.0)]
    assert fitness.ndcg(least_fit, -least_fit) == 0.0  # only zero gains among the two best-scored
    assert fitness.ndcg(np.arange(9.0), np.arange(9.0)) == 0.0  # k = floor(0.9) = 0
    assert math.isnan(fitness.ndcg([2.0, 2.0, 2.0], [1, 2, 3]))
    # tied scores keep input order: of the two tied best-scored, the first listed (gain 0.5 / 0.9) takes the one
    # place of the top 10 % (k = 1), where the ideal ranking puts the fittest (gain 1)
    true = np.array([0.5, 0.9, 0, 0, 0, 0, 0, 0, 0, 0.1])
    assert fitness.ndcg(true, np.r_[1.0, 1.0, np.zeros(8)]) == pytest.approx(0.5 / 0.9, abs=1e-15)


def test_permutation_p_value_by_hand():
    x = np.arange(8.0)
    # no shuffle of 8 values reaches the identity's rho except the identity itself (probability 1/40320)
    assert fitness.spearman_permutation_p(x, x, permutations=99, seed=3) == pytest.approx(0.01)
    assert fitness.spearman_permutation_p(x, -x, permutations=99, seed=3) == 1.0  # every shuffle reaches rho = -1
    assert math.isnan(fitness.spearman_permutation_p(x, x, permutations=0))
    # several scorers on the same shuffles: each gets its own count
    both = fitness.spearman_permutation_p(x, np.stack([x, -x], axis=1), permutations=99, seed=3)
    assert both.tolist() == [pytest.approx(0.01), 1.0]


def test_proteingym_aggregation_by_hand():
    """Per UniProt ID, then per (UniProt ID, category) group, then over categories: not the mean over assays."""
    rows = [
        ("A1", "P1", "Stability", 0.2, 10),
        ("A2", "P1", "Stability", 0.4, 30),
        ("A3", "P2", "Activity", 0.9, 5),
        ("A4", "P3", "Stability", 0.6, 7),
        ("A5", "P3", "Stability", float("nan"), 4),
    ]
    frame = pd.DataFrame(
        [
            {
                "encoder": "E",
                "key": a,
                "uniprot": u,
                "category": c,
                "scorer": "additive",
                "subset": subset,
                "metric": "spearman",
                "value": v,
                "n_mutants": n,
            }
            for a, u, c, v, n in rows
            for subset in ("all", "depth1")
        ]
    )
    out = aggregate(frame)

    def at(level, key, subset="all"):
        sel = out[(out["level"] == level) & (out["key"] == key) & (out["subset"] == subset)]
        assert len(sel) == 1, (level, key, subset)
        return sel.iloc[0]

    assert at("uniprot", "P1")["value"] == pytest.approx(0.3) and at("uniprot", "P1")["n_assays"] == 2
    assert at("uniprot", "P3")["value"] == pytest.approx(0.6)  # A5's undefined value is left out
    stability = at("category", "Stability")
    assert stability["value"] == pytest.approx((0.3 + 0.6) / 2)
    assert (stability["n_assays"], stability["n_proteins"], stability["n_mutants"]) == (3, 2, 47)
    overall = at("overall", "overall")
    assert overall["value"] == pytest.approx((0.45 + 0.9) / 2)  # over categories; the assay mean would be 0.525
    assert (overall["n_assays"], overall["n_proteins"], overall["n_mutants"]) == (4, 3, 52)
    # subsets by depth: the mean over (UniProt ID, category) groups, as ProteinGym's Depth_k columns
    assert at("overall", "overall", "depth1")["value"] == pytest.approx((0.3 + 0.9 + 0.6) / 3)
    assert at("assay", "A4")["value"] == 0.6 and "A5" not in set(out["key"])


# --- assays as published, and bad input ---------------------------------------------------------------------


def other(letter: str) -> str:
    return "A" if letter != "A" else "G"


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """Tiny random encoders (window 16 residues) and a 40-residue target: sites farther apart than the window,
    singles near both ends (windows clamped to the sequence)."""
    root = tmp_path_factory.mktemp("proteingym")
    target = random_letters(40, seed=11)
    s = lambda pos: f"{target[pos - 1]}{pos}{other(target[pos - 1])}"  # noqa: E731
    mutants = [
        s(1),
        s(3),
        s(10),
        s(20),
        s(35),
        s(40),
        f"{s(3)}:{s(10)}",
        f"{s(10)}:{s(20)}",
        f"{s(2)}:{s(35)}",
        f"{s(1)}:{s(20)}:{s(40)}",
    ]
    return {
        "root": root,
        "target": target,
        "mutants": mutants,
        "pmlm": tiny_encoder(root / "pmlm" / "model.safetensors"),
        "mlm": tiny_encoder(root / "mlm" / "model.safetensors", objective="mlm", seed=2),
    }


def select_and_score(
    tmp: Path, case, files: dict[str, str], *, encoder="pmlm", extra=(), reference_rows=None, truncate=False
):
    """`pmlm proteingym select` then `score` of assay ONE_TEST_2020 (exit codes, and the output prefix); with
    ``truncate`` the archive is cut to its first half, as an interrupted download would leave it."""
    target = case["target"]
    reference = write_reference(
        tmp / "ref.csv",
        reference_rows
        or [
            {
                "DMS_id": "ONE_TEST_2020",
                "UniProt_ID": "ONE_TEST",
                "target_seq": target,
                "coarse_selection_type": "Stability",
            }
        ],
    )
    archive = write_zip(tmp / "assays.zip", files)
    if truncate:
        data = archive.read_bytes()
        archive.write_bytes(data[: len(data) // 2])
    selection = tmp / "sel" / "assays.tsv"
    rc = main(["proteingym", "select", "--reference", str(reference), "--archive", str(archive), "-o", str(selection)])
    if rc:
        return rc, None
    prefix = tmp / "scores" / "ONE_TEST_2020"
    rc = main(
        [
            "proteingym",
            "score",
            str(case[encoder]),
            "--archive",
            str(archive),
            "--assays",
            str(selection),
            "--assay",
            "ONE_TEST_2020",
            "--out-prefix",
            str(prefix),
            "--permutations",
            "50",
            "--device",
            "cpu",
            *extra,
        ]
    )
    return rc, prefix


def test_scores_are_the_score_engines_and_sums_of_singles(tmp_path, case):
    """Singles and in-window doubles equal `pmlm score`'s engine (itself checked against brute force); a double
    and a triple wider than the window get the sum of the singles' masked marginals (test_score.py checks that
    in-window triples and 4+ site mutants follow `pmlm score`'s rule too)."""
    target, mutants = case["target"], case["mutants"]
    rc, prefix = select_and_score(tmp_path, case, {"ONE_TEST_2020.csv": assay_text(target, mutants)})
    assert rc == 0
    rows = list(csv.DictReader(open(f"{prefix}.tsv"), delimiter="\t"))
    assert [r["mutant"] for r in rows] == mutants
    model, _, _ = load_encoder(case["pmlm"])
    every_single = sorted({p for m in mutants for p in m.split(":")})
    engine_input = [parse_mutant(m, target, "x", 1) for m in every_single + mutants[6:8]]  # in-window doubles
    reference = {r["mutant"]: r for r in score_mutants(model, alphabet.encode(target), engine_input)}
    singles = {m: float(r["score"]) for m, r in reference.items() if r["kind"] == "single"}
    for row in rows:
        m, depth = row["mutant"], int(row["depth"])
        parts = m.split(":")
        assert depth == len(parts)
        additive = sum(singles[p] for p in parts)
        assert float(row["additive"]) == pytest.approx(additive, abs=3 * ATOL)
        if m in reference:
            assert float(row["score"]) == pytest.approx(reference[m]["score"], abs=ATOL)
            assert float(row["additive"]) == pytest.approx(reference[m]["additive"], abs=ATOL)
            assert row["double_from"] == ("pair_joint" if depth == 2 else "")
        else:  # the far double (sites 2 and 35, 33 apart > 16) and the triple
            assert row["double_from"] == ("additive" if depth == 2 else "")
            assert float(row["score"]) == float(row["additive"])
    summary = json.loads(Path(f"{prefix}.json").read_text())
    # rows of the forward passes: one per distinct site (1, 2, 3, 10, 20, 35, 40) and per in-window pair (2)
    assert summary["cost"]["forward_rows"] == {"sites": 7, "pairs": 2, "triples": 0}
    assert summary["counts"]["doubles_from"] == {"pair_joint": 2, "additive": 1}
    assert set(summary["metrics"]) == {"pair_joint", "additive"}
    assert summary["metrics"]["pair_joint"]["depth2"]["n"] == 3 and summary["metrics"]["additive"]["depth3+"]["n"] == 1
    assert summary["counts"]["depth"] == {"1": 6, "2": 3, "3": 1}


def test_an_mlm_encoder_scores_every_double_additively(tmp_path, case):
    target, mutants = case["target"], case["mutants"]
    rc, prefix = select_and_score(tmp_path, case, {"ONE_TEST_2020.csv": assay_text(target, mutants)}, encoder="mlm")
    assert rc == 0
    summary = json.loads(Path(f"{prefix}.json").read_text())
    assert set(summary["metrics"]) == {"additive"} and summary["counts"]["doubles_from"] == {"additive": 3}
    rows = list(csv.DictReader(open(f"{prefix}.tsv"), delimiter="\t"))
    assert all(r["score"] == r["additive"] for r in rows)


@pytest.mark.parametrize(
    "problem",
    [
        "wild_type",
        "outside",
        "malformed",
        "missing_file",
        "empty",
        "header_only",
        "bad_score",
        "bad_bin",
        "unknown_assay",
        "truncated_zip",
        "mlm_pair",
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, capsys, problem):
    target = case["target"]
    good = [f"{target[0]}1{other(target[0])}", f"{target[4]}5{other(target[4])}"]
    files = {"ONE_TEST_2020.csv": assay_text(target, good)}
    extra, reference_rows = [], None
    as_wild = lambda m: mutated(target, m) if m in good else target  # noqa: E731  (no sequence for the bad one)
    member = f"{tmp_path / 'assays.zip'}/{PROTEINGYM_FOLDER}/ONE_TEST_2020.csv"
    if problem == "wild_type":
        wrong = "C" if target[6] != "C" else "D"
        files = {"ONE_TEST_2020.csv": assay_text(target, [*good, f"{wrong}7A"], seq_of=as_wild)}
        extra = ["--mismatch", "error"]
        expected = f"{member}:4: mutant '{wrong}7A': a wild type disagrees with target_seq"
    elif problem == "outside":
        files = {"ONE_TEST_2020.csv": assay_text(target, [*good, "A41G"], seq_of=as_wild)}
        expected = f"{member}:4: mutant 'A41G': position 41 is outside target_seq (1..40)"
    elif problem == "malformed":
        files = {"ONE_TEST_2020.csv": assay_text(target, [good[0], f"{good[1]}-A7G"], seq_of=as_wild)}
        expected = f"{member}:3: malformed mutant '{good[1]}-A7G'"
    elif problem == "missing_file":
        files = {"OTHER_TEST_2021.csv": assay_text(target, good)}
        expected = (
            f"{tmp_path / 'assays.zip'}: archive has no file 'ONE_TEST_2020.csv'; closest names: OTHER_TEST_2021.csv"
        )
    elif problem == "empty":
        files = {"ONE_TEST_2020.csv": ""}
        expected = f"{member}:1: empty file (no header row)"
    elif problem == "header_only":
        files = {"ONE_TEST_2020.csv": "mutant,mutated_sequence,DMS_score,DMS_score_bin\n"}
        expected = f"{member}: empty assay: no mutants after the header"
    elif problem == "bad_score":
        files = {"ONE_TEST_2020.csv": assay_text(target, good).replace(",-0.90,", ",n/a,")}
        expected = f"{member}:3: DMS_score 'n/a' is not a finite number"
    elif problem == "bad_bin":
        files = {"ONE_TEST_2020.csv": assay_text(target, good).rstrip("\n")[:-1] + "2\n"}
        expected = f"{member}:3: DMS_score_bin '2' is not 0 or 1"
    elif problem == "unknown_assay":
        reference_rows = [
            {
                "DMS_id": "ONE_TEST_2020",
                "UniProt_ID": "ONE_TEST",
                "target_seq": target + "Z",
                "coarse_selection_type": "Stability",
            }
        ]
        expected = f"{tmp_path / 'ref.csv'}:2: ONE_TEST_2020: target_seq holds 'Z', not one of the 20 residues"
    elif problem == "truncated_zip":
        expected = f"{tmp_path / 'assays.zip'}: not a readable zip archive"
    else:
        files = {"ONE_TEST_2020.csv": assay_text(target, [*good, f"{good[0]}:{good[1]}"])}
        extra = ["--double", "pair"]
        expected = "--double pair needs an encoder with a pair head (PMLM); this one has none (MLM)"
    rc, _ = select_and_score(
        tmp_path,
        case,
        files,
        encoder="mlm" if problem == "mlm_pair" else "pmlm",
        extra=extra,
        reference_rows=reference_rows,
        truncate=problem == "truncated_zip",
    )
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if "error" in line]
    assert len(errors) == 1 and errors[0] == err[-1], err  # the last line, and the only one that reports an error
    assert errors[0].startswith("pmlm proteingym: error: " + expected), errors[0]
    assert not (tmp_path / "scores").exists() or not any((tmp_path / "scores").iterdir())
    if problem in ("missing_file", "unknown_assay", "truncated_zip"):
        assert not (tmp_path / "sel").exists() or not any((tmp_path / "sel").iterdir())


def test_a_mismatch_is_skipped_counted_and_reported(tmp_path, case, capsys):
    target = case["target"]
    good = [f"{target[0]}1{other(target[0])}", f"{target[4]}5{other(target[4])}", f"{target[9]}10{other(target[9])}"]
    wrong = "C" if target[6] != "C" else "D"
    text = assay_text(
        target, [*good, f"{wrong}7A", good[2]], seq_of=lambda m: target if m.startswith(wrong) else mutated(target, m)
    )
    lines = text.splitlines()
    lines[-1] = lines[-1].replace(mutated(target, good[2]), target)  # line 6: mutated_sequence is the wild type
    rc, prefix = select_and_score(tmp_path, case, {"ONE_TEST_2020.csv": "\n".join(lines) + "\n"})
    assert rc == 0
    summary = json.loads(Path(f"{prefix}.json").read_text())
    assert summary["counts"]["rows"] == 5 and summary["counts"]["scored"] == 3
    assert summary["counts"]["skipped"] == {"wild_type_disagrees_with_target_seq": 1, "mutated_sequence_disagrees": 1}
    assert summary["counts"]["first_skipped"]["wild_type_disagrees_with_target_seq"] == f"line 5: {wrong}7A"
    err = capsys.readouterr().err
    assert "skipped 2 of 5 mutants: mutated_sequence_disagrees 1 (first at line 6: " in err
    assert "wild_type_disagrees_with_target_seq 1 (first at line 5: " in err


def test_selection_by_list_and_length(tmp_path, case, capsys):
    target = case["target"]
    rows = [
        {
            "DMS_id": f"P{k}_TEST_2020",
            "UniProt_ID": f"P{k}",
            "target_seq": target[: 10 * (k + 1)],
            "coarse_selection_type": "Binding",
        }
        for k in range(3)
    ]
    reference = write_reference(tmp_path / "ref.csv", rows)
    archive = write_zip(tmp_path / "a.zip", {f"P{k}_TEST_2020.csv": "x" for k in range(3)})
    out = tmp_path / "sel.tsv"

    def select(*args):
        return main(
            ["proteingym", "select", "--reference", str(reference), "--archive", str(archive), "-o", str(out), *args]
        )

    assert select("--assays", "P2_TEST_2020,P0_TEST_2020") == 0
    assert pd.read_csv(out, sep="\t")["DMS_id"].tolist() == ["P2_TEST_2020", "P0_TEST_2020"]
    assert select("--max-length", "20") == 0
    assert pd.read_csv(out, sep="\t")["DMS_id"].tolist() == ["P0_TEST_2020", "P1_TEST_2020"]
    assert select("--assays", "P1_TEST_2021") == 2
    assert "P1_TEST_2021 not in the reference file (closest: P1_TEST_2020" in capsys.readouterr().err


# --- the Potts assay: exact truth, and the whole rule chain --------------------------------------------------


def read_fixture_assay() -> pd.DataFrame:
    return pd.read_csv(FIXTURE / f"{POTTS_ID}.csv")


def test_potts_fixture_scores_are_exact_log_probability_ratios():
    truth = np.load(FIXTURE / "potts_model.npz")
    model = PottsModel(fields=truth["fields"], edges=truth["edges"], couplings=truth["couplings"])
    wild = truth["wild_type"]
    assay = read_fixture_assay()
    reference = pd.read_csv(FIXTURE / "DMS_substitutions.csv")
    assert reference.loc[0, "target_seq"] == "".join(alphabet.RESIDUES[k] for k in wild)
    assert list(assay.columns) == ["mutant", "mutated_sequence", "DMS_score", "DMS_score_bin"]
    variants = np.array([[alphabet.RESIDUES.index(c) for c in s] for s in assay["mutated_sequence"]])
    exact = model.log_weight(variants) - model.log_weight(wild[None, :])[0]
    assert np.abs(exact - assay["DMS_score"].to_numpy()).max() <= 1e-12 * max(1.0, np.abs(exact).max())
    cutoff = reference.loc[0, "DMS_binarization_cutoff"]
    assert cutoff == pytest.approx(np.median(exact), abs=1e-12)
    assert (assay["DMS_score_bin"].to_numpy() == (exact >= cutoff)).all()
    depth = assay["mutant"].str.count(":") + 1
    assert (depth == 1).sum() == 32 * 19 and (depth == 2).sum() == 640 and (depth == 3).sum() == 64
    # the doubles at planted edges carry epistasis; the others are additive by construction
    edges = {tuple(e) for e in truth["edges"].tolist()}
    singles = dict(zip(assay["mutant"][depth == 1], assay["DMS_score"][depth == 1]))
    epistasis = {}
    for m, score in zip(assay["mutant"][depth == 2], assay["DMS_score"][depth == 2]):
        a, b = m.split(":")
        epistasis[m] = (score - singles[a] - singles[b], (int(a[1:-1]) - 1, int(b[1:-1]) - 1) in edges)
    assert max(abs(e) for e, planted in epistasis.values() if not planted) < 1e-9
    assert np.mean([abs(e) for e, planted in epistasis.values() if planted]) > 0.5


# Training: the study recipe for 150 steps of 2,048 tokens (~5 passes over the 1,800 training sequences) learns
# the site profiles: the assay's Spearman was 0.66 (0.79 after 300 steps), and none of 1,000 permutations reached
# it (p = 1/1001, the smallest possible); the bar is Spearman > 0 at p < 0.01
TRAIN_STEPS = 150
PERMUTATIONS = 1000


def train_potts_pmlm(root: Path, weights: Path) -> None:
    records = (FIXTURE / "potts_family.fasta").read_text().splitlines()
    (root / "train.fasta").write_text("\n".join(records[:3600]) + "\n")  # 1,800 sequences
    (root / "valid.fasta").write_text("\n".join(records[3600:]) + "\n")  # 200 held out
    assert (
        main(
            [
                "tokenize",
                "--input",
                f"train={root / 'train.fasta'}",
                "--input",
                f"valid={root / 'valid.fasta'}",
                "--out-dir",
                str(root / "shards"),
                "--num-shards",
                "1",
                "--row-group-size",
                "64",
            ]
        )
        == 0
    )
    sets = [
        "objective.name=pmlm",
        f"optim.total_steps={TRAIN_STEPS}",
        f"optim.warmup_steps={TRAIN_STEPS // 10}",
        "tokens_per_step=2048",
        "save_every=0",
        "eval_batches=5",
    ]
    args = [
        "pretrain",
        "--config",
        str(RECIPE),
        "--shards",
        str(root / "shards"),
        "--out",
        str(root / "run"),
        "--final",
        str(weights),
    ]
    for item in sets:
        args += ["--set", item]
    assert main(args) == 0


@pytest.mark.slow
def test_whole_chain_on_the_potts_assay_over_loopback_http(tmp_path):
    """fetch (zip + reference over HTTP, checksums) -> select -> score (a second, singles-only assay of the same
    protein in another category too) -> aggregate -> tables, by `snakemake --cores 2 proteingym`, with a tiny
    PMLM trained on the Potts family: Spearman > 0 with a permutation p-value < 0.01."""
    work = tmp_path / "work"
    weights = work / "results" / "pg" / "pretrain" / "potts" / "pmlm-tiny" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    train_potts_pmlm(tmp_path, weights)  # placed where the workflow expects the encoder: nothing to pre-train
    served = tmp_path / "served"
    served.mkdir()
    assay = (FIXTURE / f"{POTTS_ID}.csv").read_text()
    singles = "\n".join(line for line in assay.splitlines() if ":" not in line) + "\n"
    write_zip(
        served / "DMS_ProteinGym_substitutions.zip", {f"{POTTS_ID}.csv": assay, "POTTS1_SYNTH_Singles.csv": singles}
    )
    reference = pd.read_csv(FIXTURE / "DMS_substitutions.csv", dtype=str, keep_default_na=False)
    second = reference.iloc[0].copy()
    second["DMS_id"], second["DMS_filename"] = "POTTS1_SYNTH_Singles", "POTTS1_SYNTH_Singles.csv"
    second["coarse_selection_type"] = "Stability"
    pd.concat([reference, second.to_frame().T]).to_csv(served / "DMS_substitutions.csv", index=False)
    sha = {
        name: hashlib.sha256((served / name).read_bytes()).hexdigest()
        for name in ("DMS_ProteinGym_substitutions.zip", "DMS_substitutions.csv")
    }
    with static_http_server(served) as url:
        (tmp_path / "config.yaml").write_text(f"""run: pg
sources:
  potts: {{url: "file://{FIXTURE / "potts_family.fasta"}"}}
  pg_assays: {{url: "{url}/DMS_ProteinGym_substitutions.zip", sha256: {sha["DMS_ProteinGym_substitutions.zip"]}}}
  pg_reference: {{url: "{url}/DMS_substitutions.csv", sha256: {sha["DMS_substitutions.csv"]}}}
datasets:
  potts: {{sources: [potts]}}
pretrain:
  recipes: {{tiny: {RECIPE}}}
  models: [{{dataset: potts, objective: pmlm, preset: tiny}}]
proteingym:
  archive: pg_assays
  reference: pg_reference
  permutations: {PERMUTATIONS}
  device: cpu
""")
        proc = snakemake(
            "proteingym",
            "--cores",
            "2",
            "-s",
            str(REPO / "Snakefile"),
            "--directory",
            str(work),
            "--configfile",
            str(tmp_path / "config.yaml"),
            cwd=REPO,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = work / "results" / "pg"
    summary = pd.read_csv(results / "proteingym" / "summary.tsv", sep="\t")

    def value(level, key, scorer, subset, metric):
        sel = summary[
            (summary["level"] == level)
            & (summary["key"] == key)
            & (summary["scorer"] == scorer)
            & (summary["subset"] == subset)
            & (summary["metric"] == metric)
        ]
        assert len(sel) == 1, (level, key, scorer, subset, metric)
        return sel.iloc[0]

    rho = value("assay", POTTS_ID, "pair_joint", "all", "spearman")["value"]
    p = value("assay", POTTS_ID, "pair_joint", "all", "spearman_p")["value"]
    assert rho > 0 and p < 0.01, (rho, p)
    doubles = {s: value("assay", POTTS_ID, s, "depth2", "spearman")["value"] for s in ("pair_joint", "additive")}
    epistasis = value("assay", POTTS_ID, "pair_joint", "depth2", "epistasis_spearman")
    print(
        f"Potts assay, {TRAIN_STEPS} steps: Spearman {rho:.3f} (p {p:.4f}); doubles: pair joint "
        f"{doubles['pair_joint']:.3f}, additive {doubles['additive']:.3f}; epistasis Spearman "
        f"{epistasis['value']:.3f} over {epistasis['n_mutants']} doubles"
    )
    assert epistasis["n_mutants"] == 640 and all(np.isfinite(list(doubles.values())))
    # one protein in two categories: two (UniProt ID, category) groups, the headline their categories' mean
    overall = value("overall", "overall", "pair_joint", "all", "spearman")
    categories = [
        value("category", c, "pair_joint", "all", "spearman")["value"] for c in ("OrganismalFitness", "Stability")
    ]
    assert overall["value"] == pytest.approx(np.mean(categories)) and (overall["n_assays"], overall["n_proteins"]) == (
        2,
        1,
    )
    assert overall["n_mutants"] == 1312 + 608
    scores = json.loads((results / "proteingym" / "scores" / "potts" / "pmlm-tiny" / f"{POTTS_ID}.json").read_text())
    assert scores["counts"]["skipped"] == {} and scores["counts"]["scored"] == 1312
    assert scores["cost"]["forward_rows"]["sites"] == 32 and scores["permutations"] == PERMUTATIONS
    tables = results / "tables"
    headline = (tables / "proteingym.md").read_text()
    assert "ESM2 (650M)" in headline and "PMLM-tiny@potts" in headline and "pair joint" in headline
    assert "POTTS1_SYNTH_Potts" in (tables / "proteingym_doubles.md").read_text()
    for name in ("proteingym_categories.svg", "proteingym_doubles.svg"):
        assert (results / "figures" / name).stat().st_size > 0
    assert (work / "resources" / "sources" / "pg_assays" / "DMS_ProteinGym_substitutions.zip").is_file()


# --- the workflow's plan ----------------------------------------------------------------------------------------

ANY_ENCODERS = """sources:
  uniprot_sample:
    url: file:data/demo/uniprot_sample.fasta.gz
    sha256: f03d5f021ca8089955bc86d58ce5a985045d0f064a07d1ea1f17c31fa1d7f091
datasets:
  demo: {sources: [uniprot_sample]}
pretrain:
  recipes: {tiny: config/train/tiny.yaml}
  models:
    - {dataset: demo, objective: pmlm, preset: tiny}
    - {dataset: demo, objective: mlm, preset: tiny}
"""


@pytest.mark.parametrize("assays", ["all", "listed"])
def test_proteingym_config_plans_fetch_score_aggregate_tables(tmp_path, assays):
    """config/proteingym.yaml's benchmark with its encoders replaced by trained ones (the released model needs the
    import rule of the released-model workflow): fetch -> select -> score per assay x encoder -> aggregate ->
    tables. With assays: all the scoring jobs follow the selection (a checkpoint); listed ones are planned now."""
    override = tmp_path / "encoders.yaml"
    listed = ["BLAT_ECOLX_Stiffler_2015", "GFP_AEQVI_Sarkisyan_2016"]
    override.write_text(ANY_ENCODERS + ("" if assays == "all" else f"proteingym:\n  assays: {listed}\n"))
    # --forceall: every job of the plan, whatever an earlier run in this checkout left in resources/ or results/
    proc = snakemake(
        "-n", "-p", "--forceall", "--configfile", "config/proteingym.yaml", str(override), cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    assert counts["fetch_source"] == 3  # the archive, the reference file, the demo sequences
    assert counts["select_proteingym_assays"] == counts["aggregate_proteingym"] == counts["tabulate_proteingym"] == 1
    assert (
        "ProteinGym_v1.3/DMS_ProteinGym_substitutions.zip -o resources/sources/proteingym_substitutions/" in proc.stdout
    )
    assert "--sha256 a8f498011532a74aa9fe556a50555a75e928c5837d19c06a87592ae04049b308" in proc.stdout
    if assays == "all":
        assert "score_proteingym_assay" not in counts
        assert "checkpoint jobs" in proc.stdout + proc.stderr
    else:
        assert counts["score_proteingym_assay"] == 4  # 2 assays x 2 encoders
        scores = [line for line in proc.stdout.splitlines() if "-m pmlm proteingym score" in line]
        flags = "--double auto --mismatch skip --permutations 1000 --device auto --label"
        assert (
            sorted(line.split(flags)[1].split()[0] for line in scores) == ["MLM-tiny@demo"] * 2 + ["PMLM-tiny@demo"] * 2
        )
        for assay in listed:
            assert f"results/proteingym/proteingym/scores/demo/pmlm-tiny/{assay}.json" in proc.stdout


@pytest.mark.parametrize("assays", ["all", "listed"])
def test_proteingym_config_plans_the_released_model(tmp_path, assays):
    """config/proteingym.yaml as it is: the released PMLM-650M fetched (its checksum) and imported, then scored per
    assay from the imported weights, aggregated and tabulated."""
    args = ["-n", "-p", "--configfile", "config/proteingym.yaml"]
    if assays == "listed":
        override = tmp_path / "listed.yaml"
        override.write_text("proteingym:\n  assays: [BLAT_ECOLX_Stiffler_2015, GFP_AEQVI_Sarkisyan_2016]\n")
        args.append(str(override))
    proc = snakemake(*args, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    assert counts["fetch_source"] == 3  # the archive, the reference file, the released checkpoint
    assert counts["import_release"] == counts["select_proteingym_assays"] == counts["aggregate_proteingym"] == 1
    assert counts["tabulate_proteingym"] == 1
    assert "--sha256 41ec3830624151782d20d41c033bd22a4a268a065ccb2dc8276ecf5d7cd62caa" in proc.stdout
    weights = "results/proteingym/pretrain/ur50-release/pmlm-650m/model.safetensors"
    if assays == "all":
        assert "score_proteingym_assay" not in counts and "checkpoint jobs" in proc.stdout + proc.stderr
    else:
        scores = [line for line in proc.stdout.splitlines() if "-m pmlm proteingym score" in line]
        assert counts["score_proteingym_assay"] == len(scores) == 2
        assert all(f"score {weights} " in line and "--label PMLM-650m@ur50-release" in line for line in scores)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("proteingym: {archive: nope, reference: ref}\n", "config.proteingym.archive: unknown source 'nope'"),
        (
            "proteingym: {archive: zip, reference: ref, encoders: [demo/pmlm-base]}\n",
            "config.proteingym.encoders[0]: 'demo/pmlm-base' is not an encoder of pretrain.models",
        ),
        ("proteingym: {archive: zip, reference: ref, assays: []}\n", "config.proteingym.assays"),
    ],
)
def test_a_broken_proteingym_section_names_the_key(tmp_path, text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        ANY_ENCODERS.replace("sources:\n", "sources:\n  zip: {url: 'file:a.zip'}\n  ref: {url: 'file:r.csv'}\n") + text
    )
    proc = snakemake("-n", "--configfile", str(cfg), cwd=REPO, timeout=300)
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr


def test_benchmark_smoke_run(capsys):
    """bench/bench_proteingym.py --quick: the assay shape it claims (19 singles per site, doubles per pair), one
    forward row per site and per pair, 32 rows to a pass, and the side-by-side batching rounds."""
    spec = importlib.util.spec_from_file_location("bench_proteingym", REPO / "bench" / "bench_proteingym.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (row,) = result["results"]
    length, sites, pairs, per_pair = bench.QUICK_SHAPE
    assert (row["encoder"], row["length"]) == ("demo", length)
    assert (row["singles"], row["doubles"], row["mutants"]) == (
        19 * sites,
        pairs * per_pair,
        19 * sites + pairs * per_pair,
    )
    assert row["rows"] == sites + pairs and row["forward_passes"] == -(-sites // 32) - (-pairs // 32)
    assert row["mutants_per_s"] > 0 and len(row["batching"]["rounds"]) == 1
    assert row["gpu_estimate"]["tflops_per_row"] == pytest.approx(
        bench.row_flops(bench.ENCODERS["demo"], length + 2) / 1e12
    )
