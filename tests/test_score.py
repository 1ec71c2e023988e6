"""`pmlm score`: single mutants by masked marginal and double mutants from the pair head's joint, both against
references computed by hand from the model's own logits (both pair vocabularies, pair classes labelled as the
objective labels them); triple mutants from a Triple MLM's triple joint, from a PMLM's pairs or additively, and
mutants of 4+ sites from the pairs, by the same rule as the ProteinGym scorer; mutants wider than the window
additive row by row; epistasis exactly zero for an MLM encoder; the input's columns kept, lowercase accepted;
one-line refusals with no output, and outputs checked before anything runs."""

from __future__ import annotations

import csv
import io
import itertools

import numpy as np
import pytest
import torch
from tiny_models import pair_labels, random_letters, tiny_encoder, write_fasta

import pmlm
from pmlm import alphabet
from pmlm.cli import main
from pmlm.inference import mutant_table, mutations
from pmlm.model.triple import triple_labels
from pmlm.pretrained import load_encoder
from pmlm.proteingym.assay_scoring import score_assay
from pmlm.proteingym.assays import read_assay
from pmlm.tokens import batch_tokens

# log-probabilities are fp32 softmaxes of logits of size ~10-100: differences agree to a few fp32 ulps of them
ATOL = 1e-4

# every test of this module runs torch on one thread (conftest.single_thread)
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("score")
    wild = random_letters(14, seed=7)
    return {
        "pmlm": tiny_encoder(root / "pmlm" / "model.safetensors"),
        "full": tiny_encoder(root / "full" / "model.safetensors", pair_vocab="full", seed=1),
        "mlm": tiny_encoder(root / "mlm" / "model.safetensors", objective="mlm", seed=2),
        "pair_only": tiny_encoder(root / "pair_only" / "model.safetensors", objective="pmlm_pair_only", seed=3),
        "tmlm": tiny_encoder(root / "tmlm" / "model.safetensors", objective="tmlm", seed=4),
        "wild": wild,
        "fasta": write_fasta(root / "wt.fasta", {"wt": wild}),
        "root": root,
    }


def _mutants(wild: str) -> list[str]:
    """Two singles, their double, a double listed with the later site first, a double with a wild-type
    'mutation' (a no-op) and a double at adjacent sites."""

    def site(pos: int, to: str) -> str:
        return f"{wild[pos - 1]}{pos}{to}"

    other = lambda pos: next(c for c in "AGWP" if c != wild[pos - 1])  # noqa: E731
    a, b, c = site(3, other(3)), site(10, other(10)), site(11, other(11))
    return [a, b, f"{a}:{b}", f"{b}:{a}", f"{a}:{site(10, wild[9])}", f"{b}:{c}"]


def _write_csv(path, mutants: list[str]):
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["mutant", "DMS_score"])
        writer.writerows([m, k] for k, m in enumerate(mutants))
    return path


def _read(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _masked(wild: str, sites: list[int]) -> torch.Tensor:
    tokens = torch.from_numpy(batch_tokens([alphabet.encode(wild)]).tokens)
    tokens[0, [p + 1 for p in sites]] = alphabet.MASK_ID  # <cls> is token 0
    return tokens


def _single_reference(model, wild: str, pos: int, wt: str, mut: str) -> float:
    with torch.no_grad():
        logits = model(_masked(wild, [pos]))["logits"][0, pos + 1]  # (20,)
    log_p = torch.log_softmax(logits.double(), dim=-1)
    return float(log_p[alphabet.RESIDUES.index(mut)] - log_p[alphabet.RESIDUES.index(wt)])


def _double_reference(model, wild: str, i: int, j: int, wt: tuple[str, str], mut: tuple[str, str]) -> float:
    """log P(mut) - log P(wt) of the pair head's softmax over all its classes, the class of (a, b) at (i, j)
    taken from the training labels."""
    with torch.no_grad():
        out = model(_masked(wild, [i, j]), pair_index=torch.tensor([[0, i + 1, j + 1]]))
    log_p = torch.log_softmax(out["pair_logits"][0].double(), dim=-1)  # (K,)

    def label(pair: tuple[str, str]) -> int:
        targets = torch.full((1, len(wild) + 2), -100)
        targets[0, i + 1], targets[0, j + 1] = (alphabet.RESIDUES.index(x) for x in pair)
        return int(pair_labels(torch.tensor([[0, i + 1, j + 1]]), targets, model.cfg.pair_vocab)[0])

    return float(log_p[label(mut)] - log_p[label(wt)])


@pytest.mark.parametrize("encoder", ["pmlm", "full"])
def test_scores_agree_with_a_brute_force_reference(tmp_path, case, encoder):
    wild, mutants = case["wild"], _mutants(case["wild"])
    out = tmp_path / "scores.tsv"
    assert (
        main(
            [
                "score",
                str(case[encoder]),
                "--sequence",
                str(case["fasta"]),
                "--mutations",
                str(_write_csv(tmp_path / "m.csv", mutants)),
                "-o",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = _read(out)
    assert [r["mutant"] for r in rows] == mutants
    model, *_ = load_encoder(case[encoder])
    for row in rows:
        sites = [(s[0], int(s[1:-1]) - 1, s[-1]) for s in row["mutant"].split(":")]
        if len(sites) == 1:
            ((wt, pos, mut),) = sites
            assert row["kind"] == "single" and row["double_from"] == "" and row["epistasis"] == ""
            assert float(row["score"]) == pytest.approx(_single_reference(model, wild, pos, wt, mut), abs=ATOL)
            continue
        (wi, i, mi), (wj, j, mj) = sorted(sites, key=lambda s: s[1])
        want = _double_reference(model, wild, i, j, (wi, wj), (mi, mj))
        assert row["kind"] == "double" and row["double_from"] == "pair_joint"
        assert float(row["score"]) == pytest.approx(want, abs=ATOL)
        additive = sum(_single_reference(model, wild, p, w, m) for w, p, m in sites)
        assert float(row["additive"]) == pytest.approx(additive, abs=ATOL)
        assert float(row["epistasis"]) == pytest.approx(want - additive, abs=2 * ATOL)
    by = {r["mutant"]: r for r in rows}
    _a, _b, ab, ba = mutants[:4]
    assert by[ab]["score"] == by[ba]["score"]  # the order of listing does not change the pair
    # the joint is not the product of its marginals: the epistasis term is informative
    assert abs(float(by[ab]["epistasis"])) > 1e-3


def test_epistasis_is_zero_for_an_mlm_encoder(tmp_path, case):
    mutants = _mutants(case["wild"])
    out = tmp_path / "scores.tsv"
    assert (
        main(
            [
                "score",
                str(case["mlm"]),
                "--sequence",
                str(case["fasta"]),
                "--mutations",
                str(_write_csv(tmp_path / "m.csv", mutants)),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    rows = {r["mutant"]: r for r in _read(out)}
    for m in mutants:
        row = rows[m]
        if ":" in m:
            first, second = m.split(":")
            assert row["double_from"] == "additive" and float(row["epistasis"]) == 0.0
            assert float(row["score"]) == float(row["additive"])
            if first in rows and second in rows:
                assert float(row["score"]) == pytest.approx(
                    float(rows[first]["score"]) + float(rows[second]["score"]), rel=1e-12
                )
    # a PMLM encoder asked for the additive score says so too
    pmlm_rows = pmlm.load(case["pmlm"]).score(case["wild"], mutants, double="additive")
    assert all(r["epistasis"] == 0.0 and r["double_from"] == "additive" for r in pmlm_rows if r["kind"] == "double")


def _triple_reference(model, wild: str, sites: list[tuple[str, int, str]]) -> float:
    """log P(mut) - log P(wt) of the triple head's softmax, the classes taken from the training labels."""
    positions = [p for _, p, _ in sites]
    index = torch.tensor([[0] + [p + 1 for p in positions]])
    with torch.no_grad():
        out = model(_masked(wild, positions), triple_index=index)
    log_p = torch.log_softmax(out["triple_logits"][0].double(), dim=-1)

    def label(letters) -> int:
        targets = torch.full((1, len(wild) + 2), -100)
        for p, letter in zip(positions, letters):
            targets[0, p + 1] = alphabet.RESIDUES.index(letter)
        return int(triple_labels(index, targets)[0])

    return float(log_p[label([m for _, _, m in sites])] - log_p[label([w for w, _, _ in sites])])


def test_triple_mutants_from_the_triple_joint_the_pairs_or_additively(tmp_path, case):
    """A Triple MLM scores triples from its triple head; a PMLM from its singles plus the three doubles' epistasis
    (no third-order term); an MLM additively. Sites may be listed in any order."""
    wild = case["wild"]
    other = lambda pos: next(c for c in "AGWP" if c != wild[pos - 1])  # noqa: E731
    sites = [(wild[p - 1], p, other(p)) for p in (2, 7, 12)]
    text = ":".join(f"{w}{p}{m}" for w, p, m in reversed(sites))
    doubles = [f"{w}{p}{m}:{w2}{p2}{m2}" for (w, p, m), (w2, p2, m2) in itertools.combinations(sites, 2)]
    singles = [f"{w}{p}{m}" for w, p, m in sites]
    mutants = singles + doubles + [text]
    scored = {}
    for name in ("tmlm", "pmlm", "mlm"):
        out = tmp_path / f"{name}.tsv"
        assert (
            main(
                [
                    "score",
                    str(case[name]),
                    "--sequence",
                    str(case["fasta"]),
                    "--mutations",
                    str(_write_csv(tmp_path / "m.csv", mutants)),
                    "-o",
                    str(out),
                    "--device",
                    "cpu",
                ]
            )
            == 0
        )
        scored[name] = {r["mutant"]: r for r in _read(out)}
    model, _, _ = load_encoder(case["tmlm"], "cpu")
    row = scored["tmlm"][text]
    assert row["kind"] == "triple" and row["triple_from"] == "triple_joint" and row["double_from"] == ""
    zero_based = [(w, p - 1, m) for w, p, m in sites]
    assert float(row["score"]) == pytest.approx(_triple_reference(model, wild, zero_based), abs=ATOL)
    additive = sum(float(scored["tmlm"][s]["score"]) for s in singles)
    assert float(row["additive"]) == pytest.approx(additive, abs=ATOL)
    assert float(row["epistasis"]) == pytest.approx(float(row["score"]) - additive, abs=2 * ATOL)
    pmlm_rows = scored["pmlm"]
    want = sum(float(pmlm_rows[s]["score"]) for s in singles) + sum(float(pmlm_rows[d]["epistasis"]) for d in doubles)
    assert pmlm_rows[text]["triple_from"] == "pairs" and float(pmlm_rows[text]["score"]) == pytest.approx(
        want, abs=ATOL
    )
    mlm_row = scored["mlm"][text]
    assert mlm_row["triple_from"] == "additive" and float(mlm_row["epistasis"]) == 0.0
    rows = pmlm.load(case["tmlm"]).score(wild, [text], triple="additive")
    assert rows[0]["triple_from"] == "additive" and rows[0]["epistasis"] == 0.0


def test_pair_only_singles_and_the_python_api(case):
    model = pmlm.load(case["pair_only"])
    rows = model.score(case["wild"], _mutants(case["wild"]))
    assert {r["double_from"] for r in rows if r["kind"] == "double"} == {"pair_joint"}
    assert all(np.isfinite(r["score"]) for r in rows)
    api = pmlm.load(case["pmlm"]).score(case["wild"], _mutants(case["wild"])[:3])
    assert [r["kind"] for r in api] == ["single", "single", "double"]


def test_the_python_api_reads_sequences_as_the_commands_do(case):
    """Lowercase is the same residues in ``pmlm.load``'s three methods; a letter outside the alphabet and nucleotides
    are one-line errors (pmlm.inference.sequences), as in a FASTA."""
    model = pmlm.load(case["pmlm"])
    wild, mutants = case["wild"], _mutants(case["wild"])[:3]
    assert model.score(wild.lower(), mutants) == model.score(wild, mutants)
    np.testing.assert_array_equal(model.embed(wild.lower()), model.embed(wild))
    np.testing.assert_array_equal(model.contacts(wild.lower()), model.contacts(wild))
    for bad, message in ((wild[:3] + "B" + wild[4:], "is not a residue letter"), ("ACGT" * 10, "nucleotides")):
        with pytest.raises(pmlm.errors.InputError, match=message) as error:
            model.embed(bad)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "problem",
    [
        "wild_type",
        "outside",
        "no_column",
        "malformed",
        "quadruple_triple_head",
        "column_clash",
        "not_a_residue",
        "same_site",
        "mlm_pair",
        "two_records",
        "far_apart_pair",
        "missing_model",
        "triple_joint",
        "triple_far_apart",
        "pairs_far_apart",
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case, capsys, problem):
    wild = case["wild"]
    first = f"{wild[0]}1A"
    fasta, model, extra = case["fasta"], case["pmlm"], []
    lines = ["mutant,DMS", f"{first},0.1"]
    if problem == "wild_type":
        wrong = "C" if wild[4] != "C" else "D"
        lines.append(f"{wrong}5A,0.2")
        expected = f"m.csv:3: '{wrong}5A': wild type {wrong} does not match the sequence, which has {wild[4]} at 5"
    elif problem == "outside":
        lines.append("A15G,0.2")
        expected = "m.csv:3: 'A15G': position 15 is outside the sequence (1..14)"
    elif problem == "no_column":
        lines = ["variant,DMS", f"{first},1"]
        expected = "m.csv:1: no 'mutant' column"
    elif problem == "malformed":
        lines.append(f"{first};{wild[1]}2A,0.3")
        expected = "m.csv:3: "
    elif problem == "quadruple_triple_head":
        model, extra = case["tmlm"], ["--triple", "triple"]
        lines.append(f"{first}:{wild[1]}2A:{wild[2]}3A:{wild[3]}4A,0.3")
        expected = "m.csv:3: " + repr(lines[-1].split(",")[0]) + ": 4 sites, and the triple head's joint holds three"
    elif problem == "column_clash":
        lines = ["mutant,score", f"{first},0.1"]
        expected = "m.csv:1: column 'score' is one that pmlm score adds (kind, score, additive, "
    elif problem == "triple_joint":
        extra = ["--triple", "triple"]
        lines.append(f"{first}:{wild[4]}5A:{wild[8]}9A,0.3")
        expected = f"{case['pmlm']}: no triple head"
    elif problem in ("triple_far_apart", "pairs_far_apart"):
        long_wild = random_letters(40, seed=9)
        fasta = write_fasta(tmp_path / "long.fasta", {"wt": long_wild})
        model, extra = case["tmlm"], ["--triple", "triple" if problem == "triple_far_apart" else "pairs"]
        lines = ["mutant", f"{long_wild[0]}1A:{long_wild[5]}6A:{long_wild[39]}40A"]
        expected = "m.csv:2: " + repr(lines[-1]) + ": sites 1 and 40 do not fit in one window of 16 residues"
    elif problem == "not_a_residue":
        lines.append(f"{wild[1]}2X,0.3")
        expected = "m.csv:3: " + repr(f"{wild[1]}2X") + ": 'X' is not one of the 20 residues"
    elif problem == "same_site":
        lines.append(f"{first}:{wild[0]}1C,0.3")
        expected = "m.csv:3: "
    elif problem == "mlm_pair":
        model, extra = case["mlm"], ["--double", "pair"]
        lines.append(f"{first}:{wild[4]}5A,0.3")
        expected = f"{case['mlm']}: no pair head (an MLM model)"
    elif problem == "two_records":
        fasta = write_fasta(tmp_path / "two.fasta", {"a": wild, "b": wild})
        expected = f"{fasta}:3: expected one sequence (the wild type), found 2"
    elif problem == "far_apart_pair":
        long_wild = random_letters(40, seed=9)
        fasta = write_fasta(tmp_path / "long.fasta", {"wt": long_wild})
        extra = ["--double", "pair"]
        lines = ["mutant", f"{long_wild[0]}1A:{long_wild[39]}40A"]
        expected = "m.csv:2: " + repr(lines[-1]) + ": sites 1 and 40 do not fit in one window of 16 residues"
    else:
        model = tmp_path / "missing" / "model.safetensors"
        expected = f"{model}: no encoder weights here"
    csv_path = tmp_path / "m.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out" / "scores.tsv"
    assert (
        main(["score", str(model), "--sequence", str(fasta), "--mutations", str(csv_path), "-o", str(out), *extra]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pmlm score: error: ") and expected in err, err
    assert not out.parent.exists()


def _run_score(model, fasta, csv_path, out, *extra) -> int:
    return main(["score", str(model), "--sequence", str(fasta), "--mutations", str(csv_path), "-o", str(out), *extra])


def test_unknown_letters_in_the_wild_type_read_as_x_or_refused(tmp_path, case, capsys):
    """--unknown x reads a B in the wild type as X, counted on stderr: the mutants score as against the wild type
    with X written out. skip leaves the one record out, which is refused in one line; so is the letter without
    a repair, naming the option."""
    wild = case["wild"][:5] + "B" + case["wild"][6:]
    fasta = write_fasta(tmp_path / "b.fasta", {"wt": wild})
    written = write_fasta(tmp_path / "x.fasta", {"wt": wild.replace("B", "X")})
    muts = _write_csv(tmp_path / "m.csv", _mutants(case["wild"]))
    argv = ["score", str(case["pmlm"]), "--mutations", str(muts), "--device", "cpu", "-o"]
    assert main([*argv, str(tmp_path / "ref.tsv"), "--sequence", str(written)]) == 0
    assert main([*argv, str(tmp_path / "x.tsv"), "--sequence", str(fasta), "--unknown", "x"]) == 0
    err = capsys.readouterr().err
    assert "pmlm score: 1 letter outside the alphabet read as X in 1 sequence\n" in err, err
    assert _read(tmp_path / "x.tsv") == _read(tmp_path / "ref.tsv")
    assert main([*argv, str(tmp_path / "skip.tsv"), "--sequence", str(fasta), "--unknown", "skip"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"pmlm score: error: {fasta}: --unknown skip left out the wild type (letters outside the alphabet)"
    assert main([*argv, str(tmp_path / "e.tsv"), "--sequence", str(fasta)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{fasta}:2: record 'wt': character 'B' at position 6" in err, err
    assert "--unknown x reads letters outside the alphabet as X" in err
    assert not any((tmp_path / n).exists() for n in ("skip.tsv", "e.tsv"))


def test_the_input_columns_are_kept_and_letters_may_be_lowercase(tmp_path, case):
    """Every column of the CSV, in order and as given (the mutant text too), then the score columns; a lowercase
    mutant and a lowercase wild type score as their uppercase forms."""
    wild = case["wild"]
    upper = _mutants(wild)[:3]
    lower = [m.lower() for m in upper]
    csv_path = tmp_path / "m.csv"
    csv_path.write_text(
        "name,mutant,DMS_score,note\n"
        + "".join(f'v{k},{m},{0.5 * k},"a, quoted\tcell"\n' for k, m in enumerate(upper + lower))
    )
    out = tmp_path / "scores.tsv"
    assert _run_score(case["pmlm"], case["fasta"], csv_path, out) == 0
    with open(out, newline="") as fh:
        table = list(csv.reader(fh, delimiter="\t"))
    header, rows = table[0], table[1:]
    assert header == ["name", "mutant", "DMS_score", "note", *mutant_table.SCORE_COLUMNS]
    assert [r[:4] for r in rows] == [[f"v{k}", m, str(0.5 * k), "a, quoted\tcell"] for k, m in enumerate(upper + lower)]
    by = {r[1]: dict(zip(header, r)) for r in rows}
    for u, lo in zip(upper, lower):
        assert by[lo]["score"] == by[u]["score"] and by[lo]["kind"] == by[u]["kind"]
    lower_fasta = write_fasta(tmp_path / "lower.fasta", {"wt": wild.lower()})
    out_lower = tmp_path / "lower.tsv"
    assert _run_score(case["pmlm"], lower_fasta, csv_path, out_lower) == 0
    assert _read(out_lower) == _read(out)


def _far_case(tmp_path):
    """A 40-residue wild type (windows of 16 residues) and mutants in and beyond one window."""
    wild = random_letters(40, seed=9)
    s = lambda pos: f"{wild[pos - 1]}{pos}{'A' if wild[pos - 1] != 'A' else 'G'}"  # noqa: E731
    near = {
        "double": f"{s(3)}:{s(10)}",
        "triple": f"{s(3)}:{s(10)}:{s(12)}",
        "multiple": f"{s(3)}:{s(5)}:{s(10)}:{s(12)}",
    }
    far = {
        "double": f"{s(2)}:{s(35)}",
        "triple": f"{s(1)}:{s(20)}:{s(40)}",
        "multiple": f"{s(1)}:{s(5)}:{s(9)}:{s(30)}",
    }
    fasta = write_fasta(tmp_path / "long.fasta", {"wt": wild})
    return fasta, near, far


@pytest.mark.parametrize("encoder", ["pmlm", "tmlm", "mlm"])
def test_mutants_wider_than_the_window_are_scored_additively_row_by_row(tmp_path, case, capsys, encoder):
    """Under auto, a mutant whose sites do not fit one window of the model gets the additive score on its own row
    (the other rows keep their joints) and stderr counts them per kind; an MLM, additive throughout, counts none."""
    fasta, near, far = _far_case(tmp_path)
    mutants = [*near.values(), *far.values()]
    out = tmp_path / "scores.tsv"
    assert _run_score(case[encoder], fasta, _write_csv(tmp_path / "m.csv", mutants), out) == 0
    err = capsys.readouterr().err
    rows = {r["mutant"]: r for r in _read(out)}
    joint = {
        "pmlm": {"double": "pair_joint", "triple": "pairs", "multiple": "pairs"},
        "tmlm": {"double": "pair_joint", "triple": "triple_joint", "multiple": "pairs"},
        "mlm": dict.fromkeys(near, "additive"),
    }[encoder]
    for kind, column in mutations.SOURCE_COLUMN.items():
        assert rows[near[kind]][column] == joint[kind]
        far_row = rows[far[kind]]
        assert far_row[column] == "additive" and far_row["score"] == far_row["additive"]
        assert float(far_row["epistasis"]) == 0.0
        note = f"pmlm score: 1 {kind} scored additively: sites farther apart than the window of 16 residues"
        assert (note in err) == (encoder != "mlm"), err


def test_one_rule_for_three_and_more_sites_in_pmlm_score_and_proteingym(tmp_path, case):
    """The same mutants scored by `pmlm score` and by the ProteinGym scorer (its assay reader and score_assay, what
    `pmlm proteingym score` runs) get the same scores, bit for bit; and a mutant of 4 or more sites on an encoder
    with a pair head is its singles plus every pair's epistasis, each pair's taken from that pair's double."""
    wild = case["wild"]
    other = lambda pos: next(c for c in "AGWP" if c != wild[pos - 1])  # noqa: E731
    sites = {p: f"{wild[p - 1]}{p}{other(p)}" for p in (2, 5, 7, 12)}
    pairs = {pq: f"{sites[pq[0]]}:{sites[pq[1]]}" for pq in itertools.combinations(sites, 2)}
    mutants = [
        *sites.values(),
        *pairs.values(),
        f"{sites[12]}:{sites[2]}:{sites[7]}",
        ":".join(sites.values()),
    ]
    assay = "mutant,mutated_sequence,DMS_score,DMS_score_bin\n"
    for k, m in enumerate(mutants):
        letters = list(wild)
        for part in m.split(":"):
            letters[int(part[1:-1]) - 1] = part[-1]
        assay += f"{m},{''.join(letters)},{0.1 * k:.2f},{k % 2}\n"
    for name in ("pmlm", "tmlm", "mlm"):
        out = tmp_path / f"{name}.tsv"
        assert _run_score(case[name], case["fasta"], _write_csv(tmp_path / "m.csv", mutants), out) == 0
        rows = _read(out)
        model, _, _ = load_encoder(case[name], "cpu")
        read = read_assay(io.StringIO(assay), "assay.csv", wild)
        scored = score_assay(model, alphabet.encode(wild), read.mutants, device="cpu")
        assert [float(r["score"]) for r in rows] == scored["score"].tolist()
        assert [float(r["additive"]) for r in rows] == scored["additive"].tolist()
        for column in mutations.SOURCE_COLUMN.values():
            assert [r[column] for r in rows] == scored[column]
        by = {r["mutant"]: r for r in rows}
        four = by[mutants[-1]]
        assert four["kind"] == "multiple" and four["multi_from"] == ("additive" if name == "mlm" else "pairs")
        epistasis = sum(float(by[d]["epistasis"]) for d in pairs.values())
        singles = sum(float(by[s]["score"]) for s in sites.values())
        assert float(four["score"]) == pytest.approx(singles + epistasis, abs=ATOL)


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("target", ["folder", "dot", "binary_tsv", "fasta_name", "parquet_name"])
def test_the_output_is_checked_before_anything_runs_and_nothing_else_changes(
    tmp_path, case, capsys, monkeypatch, target
):
    """-o naming a folder, '.', an existing file that is not a TSV, or a name of another format: one line, exit 2,
    and every file under the working folder as it was. --overwrite replaces the non-TSV file (it names a file)."""
    work = tmp_path / "work"
    (work / "results").mkdir(parents=True)
    (work / "results" / "keep.txt").write_text("mine\n")
    (work / "x.tsv").write_bytes(b"\x00\x01PAR1 binary\xff")
    (work / "seq.fasta").write_text(">wt\nACDE\n")
    csv_path = _write_csv(work / "m.csv", _mutants(case["wild"])[:2])
    monkeypatch.chdir(work)
    out, expected = {
        "folder": ("results", "-o results: is a folder; -o names the scores file to write (a name ending .tsv)"),
        "dot": (".", "-o .: is a folder"),
        "binary_tsv": ("x.tsv", "-o x.tsv: exists and is not a .tsv file, so it was not written by this command"),
        "fasta_name": ("seq.fasta", "-o seq.fasta: the scores is written as .tsv; name it so"),
        "parquet_name": ("new.parquet", "-o new.parquet: the scores is written as .tsv; name it so"),
    }[target]
    before = _tree(work)
    missing_model = work / "no-model"  # the output is refused before the model is looked for
    assert _run_score(missing_model, case["fasta"], csv_path, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"pmlm score: error: {expected}"), err
    assert _tree(work) == before
    if target == "binary_tsv":
        assert _run_score(case["pmlm"], case["fasta"], csv_path, out, "--overwrite") == 0
        assert [r["mutant"] for r in _read(work / "x.tsv")] == _mutants(case["wild"])[:2]
        assert sorted(_tree(work)) == sorted(before)  # no temporary left beside it
