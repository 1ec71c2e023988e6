"""The learning curves at equal compute (``pmlm coevolution curves``): the pseudo-likelihood Potts fit recovers the
couplings of a family it must recover and reads epistasis and conditionals exactly from its parameters; the study's
config refuses bad input in one line; a CI-sized run writes every read-out of every arm at every budget on the same
held-out sequences, resumes by unit, and its report regenerates a documentation block; the numbers shipped in
docs/coevolution.md are the ones the shipped run wrote."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pmlm.cli import main
from pmlm.coevolution.curve_readouts import encoder_records, family_targets
from pmlm.coevolution.curve_report import BEGIN, END, Results, markdown, markers, write_doc
from pmlm.coevolution.curves import COLUMNS, read_rows, write_rows
from pmlm.coevolution.curves_config import CurveEvaluation, CurvesConfig
from pmlm.coevolution.heldout import FamilyData
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.metrics import top_k_precision
from pmlm.model.config import model_config
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model
from pmlm.synth.exact import pair_epistasis, pair_log_conditional
from pmlm.synth.potts import PottsConfig, PottsModel, family_rng, generate_family
from pmlm.synth.pseudolikelihood import FittedPotts, fit_pseudolikelihood
from pmlm.vocabulary import MLM

ROOT = Path(__file__).resolve().parents[1]
CI_CONFIG = ROOT / "config" / "coevolution_curves_ci.yaml"
SHIPPED_TSV = ROOT / "docs" / "data" / "coevolution_curves.tsv"
DOC = ROOT / "docs" / "coevolution.md"


def doc_block(doc: Path) -> str:
    """The generated block of a page as write_doc leaves it: the text between the line BEGIN and END."""
    text = doc.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, doc
    return text.split(BEGIN + "\n")[1].split(END)[0]


def dense(model: PottsModel) -> tuple[np.ndarray, np.ndarray]:
    """A sparse Potts model's fields and couplings as dense arrays (L, q), (L, L, q, q) [i, j, a, b], in the
    zero-sum gauge (the same conditionals; the smallest L2 penalty of its gauge orbit up to the fields' shift)."""
    length, q = model.fields.shape
    couplings = np.zeros((length, length, q, q))
    fields = model.fields.copy()
    for (i, j), table in zip(model.edges, model.couplings):
        row, col, mean = table.mean(axis=1), table.mean(axis=0), table.mean()
        couplings[i, j] = table - row[:, None] - col[None, :] + mean
        couplings[j, i] = couplings[i, j].T
        fields[i] += row
        fields[j] += col - mean
    return fields - fields.mean(axis=1, keepdims=True), couplings


def pseudolikelihood_loss(sequences: np.ndarray, fields: np.ndarray, couplings: np.ndarray, penalty: float) -> float:
    """The objective of pmlm.synth.pseudolikelihood's docstring, written out with NumPy: the mean over sequences
    of sum_i -log softmax_a(h_i(a) + sum_(j != i) J_ij(a, x_j)) at x_i, plus ``penalty`` (||h||^2 + ||J||^2);
    couplings (L, L, q, q) [i, j, a, b]."""
    n, length = sequences.shape
    off = couplings * (1 - np.eye(length))[:, :, None, None]  # j != i
    local = np.repeat(fields[None], n, axis=0)  # local[n, i, a] = h_i(a) + sum_j J_ij(a, x_nj)
    for j in range(length):
        local += off[:, j][:, :, sequences[:, j]].transpose(2, 0, 1)
    top = local.max(axis=2, keepdims=True)
    log_p = local - top - np.log(np.exp(local - top).sum(axis=2, keepdims=True))
    nll = -np.take_along_axis(log_p, sequences[:, :, None], axis=2).sum() / n
    return float(nll + penalty * (np.square(fields).sum() + np.square(couplings).sum()))


def weighted_correlation(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> float:
    """Pearson's correlation of x and y with each pair weighted."""
    w = weights / weights.sum()
    dx, dy = x - (w * x).sum(), y - (w * y).sum()
    return float((w * dx * dy).sum() / np.sqrt((w * dx * dx).sum() * (w * dy * dy).sum()))


def test_fitted_model_reads_epistasis_and_conditionals_like_the_exact_one():
    """A FittedPotts holding a model's own parameters reproduces pmlm.synth.exact to float64 rounding."""
    cfg = PottsConfig(length=20, num_sequences=8, edges=12, chains=4, burn_in=5, thinning=1)
    family = generate_family("f", cfg, family_rng(4, 0))
    fields, couplings = dense(family.model)
    fitted = FittedPotts(fields, couplings, loss=0.0, iterations=0)
    rows = family.sequences[:3].astype(np.int64)
    pairs = np.array([[0, 7], [2, 19], *family.model.edges[:3]])
    for k, (i, j) in enumerate(pairs):
        np.testing.assert_allclose(
            fitted.pair_log_conditional(rows, pairs)[:, k], pair_log_conditional(family.model, rows, i, j), atol=1e-10
        )
        np.testing.assert_allclose(
            fitted.pair_epistasis(rows, pairs)[:, k], pair_epistasis(family.model, rows, i, j), atol=1e-10
        )
    norms = fitted.coupling_norms()
    np.testing.assert_allclose(norms[tuple(family.model.edges.T)], family.model.coupling_norms(), rtol=1e-12)


def test_pseudolikelihood_fit_recovers_the_planted_couplings():
    """Strong, noiseless couplings and 3,000 sequences: every planted edge ranks first, the fitted couplings follow
    the true ones where the data show them, and the fit beats the true parameters on its own (convex) objective."""
    cfg = PottsConfig(length=24, num_sequences=3000, coupling_strength=3.0, coupling_noise=0.0, burn_in=100, thinning=5)
    family = generate_family("f", cfg, family_rng(7, 0))
    fit = fit_pseudolikelihood(family.sequences, iterations=60)
    contacts = family.model.contact_map()
    assert top_k_precision(fit.contact_scores(), contacts, len(family.model.edges), 6) == 1.0
    true_fields, true_couplings = dense(family.model)
    edges = tuple(family.model.edges.T)
    # Couplings of residue pairs the sequences never show are set by the L2 penalty alone (with strong couplings 84 %
    # of the 400 entries of a planted edge never occur here), so each entry weighs as often as its pair occurs.
    counts = np.zeros((len(family.model.edges), 20, 20))
    for e, (i, j) in enumerate(family.model.edges):
        np.add.at(counts[e], (family.sequences[:, i], family.sequences[:, j]), 1)
    r = weighted_correlation(fit.couplings[edges].ravel(), true_couplings[edges].ravel(), counts.ravel())
    assert r > 0.9, r
    x = family.sequences.astype(np.int64)
    # the fit's recorded loss is the documented objective at its parameters, and no more than at the true ones
    assert fit.loss == pytest.approx(pseudolikelihood_loss(x, fit.fields, fit.couplings, 0.01))
    assert fit.loss <= pseudolikelihood_loss(x, true_fields, true_couplings, 0.01)
    with pytest.raises(ConfigError, match="iterations"):
        fit_pseudolikelihood(family.sequences, iterations=0)


def test_masked_token_contacts_agree_with_the_sampled_pairs():
    """The GPU config's token read-outs at every pair (exact masked substitution, chain-rule MI) give the same
    epistasis and log-loss on the sampled pairs as the CPU config's, from the same forwards batched otherwise."""
    cfg = PottsConfig(length=28, num_sequences=24, chains=4, burn_in=5, thinning=1)
    family = generate_family("f", cfg, family_rng(3, 0))
    data = FamilyData(
        "f",
        family.sequences[:20],
        family.sequences[20:],
        family.model.contact_map(),
        ["a", "b", "c", "d"],
        family.model,
    )
    torch.manual_seed(0)
    layers = yaml.safe_load((ROOT / "config" / "train" / "coevolution_tiny.yaml").read_text())["model"]["overrides"]
    model = build_model(model_config("tiny", MLM, **layers), ObjectiveConfig(name=MLM)).eval()
    out = {}
    for mode in ("jacobian", "masked"):
        ev = CurveEvaluation(sequences=2, token_contacts=mode)
        out[mode] = {(r, m): v for r, m, v in encoder_records(model, family_targets(data, "g", ev, seed=1), ev)}
    assert {r for r, _ in out["masked"]} >= {"substitution_apc", "chain_rule_mi_apc"}
    assert {r for r, _ in out["jacobian"]} >= {"jacobian_apc", "jacobian"}
    for key in [k for k in out["jacobian"] if k[0] in ("substitution", "chain_rule")]:
        assert out["masked"][key] == pytest.approx(out["jacobian"][key], rel=1e-5, abs=1e-6), key


def test_config_refuses_bad_input_in_one_line(tmp_path):
    base = yaml.safe_load(CI_CONFIG.read_text())
    cases = [
        ({"arms": {"pmlm": {"objective": "pmlm"}}}, "arms: the study compares with an MLM"),
        ({"steps": [40, 20]}, "steps must be increasing"),
        ({"groups": {"L40": {"length": 20}}}, "length must be > 24"),
        ({"groups": {"L40": {"lenght": 40}}}, "unknown key"),
        ({"evaluate": {"token_contacts": "all"}}, "token_contacts must be one of"),
        ({"groups": {"L40": {"length": 40, "triplets": -1}}}, "triplets must be >= 0"),
        ({"arms": {"mlm": {"objective": "mlm"}, "x": {"objective": "cbow"}}}, "objective must be one of"),
    ]
    for change, needle in cases:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({**base, **change}))
        with pytest.raises(ConfigError, match=needle):
            CurvesConfig.from_yaml(path)
        assert main(["coevolution", "curves", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()
    # a workflow config's coevolution: section is the same study, read by both entry points
    (tmp_path / "workflow.yaml").write_text(yaml.safe_dump({"run": "x", "coevolution": base}))
    assert CurvesConfig.from_yaml(tmp_path / "workflow.yaml", ["steps=[20]"]) == CurvesConfig.from_dict(
        {**base, "steps": [20]}
    )


def test_the_answer_pairs_each_pmlm_arm_with_the_mlm_on_the_same_units(tmp_path):
    """Five (seed, family) units where PMLM's pair joint beats MLM's substitution by 0.1 on each: the paired mean
    difference is +0.100 and the exact sign-flip p is 2 / 2^5; a unit only one arm has is left out of the pairing."""
    rows = [
        (1, "L40", "-", arm, 0, "training", "flops_per_step", flops) for arm, flops in (("mlm", 2e9), ("pmlm", 3e9))
    ]
    rows += [(1, "L40", "-", arm, 100, "training", "cpu_s", cpu) for arm, cpu in (("mlm", 4.0), ("pmlm", 6.0))]
    for k in range(5):
        rows.append((k, "L40-strong", f"f{k}", "mlm", 100, "substitution", "spearman_planted", 0.1 * k))
        rows.append((k, "L40-strong", f"f{k}", "pmlm", 100, "pair_joint", "spearman_planted", 0.1 * k + 0.1))
        rows.append((k, "L40-strong", f"f{k}", "baseline", 0, "plm", "spearman_planted", 0.8))
    rows.append((9, "L40-strong", "f9", "pmlm", 100, "pair_joint", "spearman_planted", 1.0))  # no MLM partner
    path = tmp_path / "curves.tsv"
    write_rows(path, rows)
    block = markdown(Results(read_rows(path)))
    line = next(x for x in block.splitlines() if x.startswith("| epistasis rho, planted pairs: pair joint vs MLM"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "0.200 ± 0.158" and cells[2] == "0.300 ± 0.158"
    assert cells[3] == "+0.100 (p 0.062; 5/0)"
    assert "| L40 | pmlm | 3.000 | 1.50 | 0.0600 | 1.50 |" in block
    assert "| pseudo-likelihood fit: epistasis rho, planted pairs | 0.800 ± 0.000 | 0.800 ± 0.000 |" in block
    with pytest.raises(InputError, match="mlm arm"):
        Results([r for r in rows if r[3] != "mlm"], path)


def test_doc_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{BEGIN}\nold\n{END}\nrest\n")
    assert write_doc(page, "new\n") and page.read_text() == f"intro\n{BEGIN}\nnew\n{END}\nrest\n"
    assert not write_doc(page, "new\n") and doc_block(page) == "new\n"
    # a page with two blocks (the CPU study's and its GPU-length run's): each is replaced alone
    gpu_begin, gpu_end = markers("coevolution-curves-gpu-length")
    page.write_text(f"{BEGIN}\ncpu\n{END}\nmiddle\n{gpu_begin}\n{gpu_end}\n")
    assert write_doc(page, "gpu\n", "coevolution-curves-gpu-length")
    assert page.read_text() == f"{BEGIN}\ncpu\n{END}\nmiddle\n{gpu_begin}\ngpu\n{gpu_end}\n"
    assert doc_block(page) == "cpu\n"
    page.write_text("no markers\n")
    with pytest.raises(InputError, match="needs one"):
        write_doc(page, "x\n")


# The CI-sized study (config/coevolution_curves_ci.yaml): one seed, two family groups of 32 residues trained together
# (strong and weak couplings), MLM and the paper's PMLM head, 120 steps at 2,048 tokens, two budgets, 4 held-out
# sequences per family. Too short for the encoders to learn much: it checks the mechanics and the report's code path.
def test_ci_study_writes_every_readout_resumes_and_reports(tmp_path):
    out, doc = tmp_path / "out", tmp_path / "page.md"
    doc.write_text(f"# page\n{BEGIN}\n{END}\n")
    args = ["coevolution", "curves", "--config", str(CI_CONFIG), "--out", str(out), "--doc", str(doc)]
    assert main(args) == 0
    cfg = CurvesConfig.from_yaml(CI_CONFIG)
    rows = read_rows(out / "curves.tsv")
    assert (out / "curves.tsv").read_text().splitlines()[0].split("\t") == list(COLUMNS)
    res = Results(rows)
    assert res.steps == cfg.steps and res.arms == list(cfg.arms) and res.seeds == cfg.seeds
    families = sorted(res.group)
    assert len(families) == sum(g.families for g in cfg.groups.values()) * len(cfg.seeds)
    for arm in cfg.arms:
        pair = cfg.arms[arm].objective != "mlm"
        for step in cfg.steps:
            expected = {
                "substitution",
                "chain_rule",
                "jacobian",
                "product",
                "jacobian_apc",
                "attention_apc",
                "supervised_m",
                "chain_rule_kl",
            }
            if pair:
                expected |= {
                    "pair_joint",
                    "pair_joint_score",
                    "pair_mi_apc",
                    "pair_kl_apc",
                    "supervised_mplus",
                    "pair_kl",
                }
            found = {
                r
                for (a, s, r, _), units in res.values.items()
                if a == arm and s == step and set(units) == set(families)
            }
            assert expected <= found, (arm, step, expected - found)
            cpu = res.units(arm, step, "training", "cpu_s")
            assert cpu and all(v > 0 for v in cpu.values())
    # the exact couplings are the ceiling; the classical fits find the strong family's couplings
    ceiling = res.units("baseline", 0, "exact_couplings_apc", "p_edges")
    assert set(ceiling.values()) == {1.0}
    chance = res.units("baseline", 0, "chance", "p_edges")
    for baseline in ("plm_apc", "msa_mi_apc"):
        found = res.units("baseline", 0, baseline, "p_edges")
        assert all(found[u] > 3 * chance[u] for u in found), (baseline, found)
    values = [v for r in rows for v in [r[-1]] if not math.isnan(v)]
    assert all(v >= -1.0 - 1e-9 for v in values)
    # one set of held-out sequences for every read-out: the ids are recorded per family
    ids = (out / "sequences.tsv").read_text().splitlines()
    assert ids[0] == "seed\tgroup\tfamily\tsequences" and len(ids) == 1 + len(families)
    assert all(len(line.split("\t")[3].split(",")) == cfg.evaluate.sequences for line in ids[1:])
    # the page's block is the report of the run, and regenerating it from the TSV changes nothing
    assert doc_block(doc) == markdown(res) == (out / "curves.md").read_text()
    assert "minus mlm" in doc_block(doc)
    assert (out / "curves.png").stat().st_size > 0
    # a rerun finds every unit done: nothing retrains, the same table
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()}
    before = (out / "curves.tsv").read_text()
    assert main(args) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()} == stamps
    assert (out / "curves.tsv").read_text() == before
    # the report command alone writes the same block
    assert (
        main(
            ["coevolution", "curves-report", "--results", str(out / "curves.tsv"), "--out-prefix", str(tmp_path / "r")]
        )
        == 0
    )
    assert (tmp_path / "r.md").read_text() == markdown(res)


# Three-body terms and the Triple MLM through the same study, one unit at a time as the workflow's rules run it.
def test_units_one_by_one_with_triplets_and_a_triple_mlm(tmp_path):
    study = {
        "seeds": [2],
        "groups": {"T32": {"length": 32, "families": 2, "triplets": 2, "triplet_strength": 3.0}},
        "sequences": 300,
        "recipe": str(ROOT / "config" / "train" / "coevolution_tiny.yaml"),
        "set": {"tokens_per_step": 1024, "optim.warmup_steps": 2, "eval_batches": 1},
        "arms": {"mlm": {"objective": "mlm"}, "tmlm": {"objective": "tmlm"}},
        "steps": [10],
        "evaluate": {"sequences": 2, "head_steps": 5},
        "baselines": {"plm_iterations": 5},
    }
    config, out = tmp_path / "study.yaml", tmp_path / "out"
    config.write_text(yaml.safe_dump({"run": "triplets", "coevolution": study}))
    base = ["coevolution", "curves", "--config", str(config), "--out", str(out)]
    assert main([*base, "--prepare", "3"]) == 2 and main([*base, "--unit", "seed2-T32-pmlm"]) == 2  # not the study's
    assert main([*base, "--prepare", "2"]) == 0 and not (out / "units").exists()
    names = ["seed2-all-mlm", "seed2-all-tmlm", "seed2-baseline"]
    for name in names:
        assert main([*base, "--unit", name]) == 0
    assert sorted(p.name for p in (out / "units").iterdir()) == [f"{n}.tsv" for n in sorted(names)]
    assert main([*base, "--collect", "--no-figure"]) == 0
    res = Results(read_rows(out / "curves.tsv"))
    assert len(res.group) == 2
    # without a triple head the third-order epistasis is exactly 0; the Triple MLM's joint and the MLM's product
    # are scored against the exact triple conditional
    assert set(res.units("mlm", 10, "triple_joint", "mean_abs_planted").values()) == {0.0}
    assert len(res.units("tmlm", 10, "triple_joint", "spearman_planted")) == 2
    assert all(v > 0 for v in res.units("tmlm", 10, "triple_joint", "mean_abs_planted").values())
    for arm, readout in (("tmlm", "triple_joint"), ("tmlm", "triple_pairs"), ("mlm", "triple_product")):
        assert all(v > 0 for v in res.units(arm, 10, readout, "gap_planted").values()), (arm, readout)
    assert all(v > 0 for v in res.units("baseline", 0, "exact", "triple_mean_abs_planted").values())
    block = (out / "curves.md").read_text()
    assert "third-order epistasis rho, planted triplets" in block and "exact triple conditional entropy" in block


def test_the_shipped_page_shows_what_the_shipped_run_wrote():
    """docs/coevolution.md's generated block is the report of docs/data/coevolution_curves.tsv, the TSV the shipped
    config's run wrote (config/coevolution_curves.yaml)."""
    assert doc_block(DOC) == markdown(Results(read_rows(SHIPPED_TSV)))
    assert os.path.exists(ROOT / "docs" / "figures" / "coevolution_curves.png")


def _table(block: str, title: str) -> list[list[str]]:
    """The body rows (lists of cells) of the Markdown table after ``title`` in ``block``."""
    rows: list[list[str]] = []
    for line in block[block.index(title) :].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return [row for row in rows[1:] if not set(row[0]) <= set("-")]  # no header, no rule


def test_the_readme_quotes_the_shipped_answer():
    """The README's answer (its section "Does the pair head beat MLM?") quotes the numbers of docs/coevolution.md's
    generated tables, which the test above ties to the shipped run's TSV."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Does the pair head beat MLM?") :].split("\n## ", 1)[0]
    block = doc_block(DOC)

    def mean(cell: str) -> str:
        return f"{float(cell.split(' ±')[0]):.2f}"

    def p_value(cell: str) -> str:
        p = float(cell.split("(p ", 1)[1].split(";")[0])
        return f"{p:.1g}" if p < 0.01 else f"{p:.2f}"

    answer = {row[0]: row[1:] for row in _table(block, "**The answer at 4,000 steps**")}
    row = answer["epistasis rho, planted pairs: pair joint vs MLM token head by substitution"]
    mlm, pmlm, pmlm_diff, product, product_diff = row
    wins, losses = (int(n) for n in pmlm_diff.rstrip(")").split("; ")[1].split("/"))
    assert wins == 0
    assert f"{mean(pmlm)} against {mean(mlm)}, p = {p_value(pmlm_diff)}, {losses} of {losses} units" in section
    assert f"({mean(product)} against {mean(mlm)}, p = {p_value(product_diff)})" in section
    baselines = {row[0]: row[1:] for row in _table(block, "**Classical baselines**")}
    assert f"reaches {mean(baselines['pseudo-likelihood fit: epistasis rho, planted pairs'][-1])}" in section
    contacts = float(baselines["pseudo-likelihood Potts fit, Frobenius + APC: top-#edges"][-1].split(" ±")[0])
    assert f"{100 * contacts:.0f} % contact precision" in section
    relative = [float(row[3]) for row in _table(block, "**Cost**") if row[1] != MLM]  # encoder, arm, GFLOPs, ratio
    assert f"{min(relative):.1f}-{max(relative):.1f}x an MLM step" in section
