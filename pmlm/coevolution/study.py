"""The planted-coupling study's engine: every read-out of an MLM and a PMLM encoder on each family's
held-out sequences, scored against the planted contacts (``pmlm coevolution`` runs it)."""

from __future__ import annotations

import sys

import numpy as np

from pmlm.coevolution.families import FamilyData, StudyConfig
from pmlm.coevolution.readouts import (
    ProbeConfig,
    attention_contact_scores,
    chain_rule_dependence,
    dependence_map,
    fit_probe,
    pair_features,
    pair_head_dependence,
    precisions,
    probe_scores,
    split_pairs,
)
from pmlm.evaluation.pair_readout import all_pairs
from pmlm.evaluation.unsupervised import apc, msa_mi_apc


def _first(sequences: np.ndarray, count: int) -> np.ndarray:
    return sequences[: min(count, len(sequences))]


def _group_values(values: np.ndarray, pairs: np.ndarray, contacts: np.ndarray, min_sep: int) -> dict[str, list]:
    planted, other = split_pairs(pairs, contacts, min_sep)
    return {"planted": values[planted].tolist(), "non_planted": values[other].tolist()}


def _dependence_readout(fn, model, family: FamilyData, count: int, batch: int, cfg: StudyConfig) -> tuple[dict, dict]:
    """Averaged (L, L) MI and KL maps over held-out sequences, plus every KL / MI value grouped by planted."""
    pairs = all_pairs(family.length)
    mi_map = np.zeros((family.length, family.length))
    kl_map = np.zeros_like(mi_map)
    kl_values, mi_values = [], []
    for sequence in _first(family.heldout, count):
        out = fn(model, sequence, pairs, batch)
        mi_map += dependence_map(out["mi"], pairs, family.length)
        kl_map += dependence_map(out["kl"], pairs, family.length)
        kl_values.append(out["kl"])
        mi_values.append(out["mi"])
    tiled = np.tile(pairs, (len(kl_values), 1))
    values = {
        "kl": _group_values(np.concatenate(kl_values), tiled, family.contacts, cfg.min_separation),
        "mi": _group_values(np.concatenate(mi_values), tiled, family.contacts, cfg.min_separation),
    }
    return {"mi": mi_map, "kl": kl_map}, values


def evaluate_models(families: list[FamilyData], models: dict, cfg: StudyConfig) -> dict:
    """All read-outs for each family: precisions per (read-out, model) and KL / MI values for histograms.
    Deterministic: nothing here draws random numbers."""
    def prec(scores: np.ndarray, fam: FamilyData) -> dict[str, float]:
        return precisions(scores, fam.contacts, cfg.min_separation, cfg.k_divisor)

    per_family: dict[str, dict] = {}
    # read-out -> model -> measure (kl, mi) -> planted / non_planted values
    dependence_values: dict[str, dict] = {}

    def keep_values(readout: str, model: str, values: dict) -> None:
        slot = dependence_values.setdefault(readout, {}).setdefault(model, {})
        for kind, groups in values.items():
            for group, items in groups.items():
                slot.setdefault(kind, {}).setdefault(group, []).extend(items)

    features: dict[str, dict[str, np.ndarray]] = {name: {} for name in models}
    for fam in families:
        row: dict[str, dict] = {"msa_mi_apc": {"msa": prec(msa_mi_apc(fam.train), fam)}}
        maps, values = _dependence_readout(pair_head_dependence, models["pmlm"], fam, cfg.pair_sequences,
                                           cfg.batch_rows, cfg)
        # contacts from the MI of the pair head's own joint, not the paper's KL: the KL compares the
        # pair head's joint with the *token* head's marginals, so any disagreement between the two
        # heads (calibration, not coupling) inflates it at every pair; the MI measures dependence
        # inside one distribution. With exactly the pair masked, that dependence given all other
        # residues is what a Potts coupling J_ij creates, and it is zero for uncoupled pairs.
        row["pair_head_mi_apc"] = {"pmlm": prec(apc(maps["mi"]), fam)}
        row["pair_head_kl_apc"] = {"pmlm": prec(apc(maps["kl"]), fam)}
        keep_values("pair_head", "pmlm", values)
        row["attention_apc"] = {}
        for name, model in models.items():
            if cfg.chain_rule_sequences:
                # the token head's joint by the chain rule: the MLM's only joint, and PMLM's like-for-like
                maps, values = _dependence_readout(chain_rule_dependence, model, fam, cfg.chain_rule_sequences,
                                                   cfg.batch_rows, cfg)
                row.setdefault("chain_rule_mi_apc", {})[name] = prec(apc(maps["mi"]), fam)
                keep_values("chain_rule", name, values)
            scores = attention_contact_scores(model, _first(fam.heldout, cfg.attention_sequences), cfg.batch_rows)
            row["attention_apc"][name] = prec(scores, fam)
            features[name][fam.name] = pair_features(model, _first(fam.heldout, cfg.probe_sequences), cfg.batch_rows)
        per_family[fam.name] = row
        print(f"coevolution: {fam.name}: {headline(row)}", file=sys.stderr)

    # linear probe, two folds over families: fit on one half's planted maps, score the other half
    folds = probe_folds([f.name for f in families], cfg.seed)
    probe_cfg = ProbeConfig(l2=cfg.probe_l2, max_iter=cfg.probe_max_iter, min_separation=cfg.min_separation)
    by_name = {f.name: f for f in families}
    if len(folds) == 2:
        for name in models:
            for fit_on, score_on in ((folds[0], folds[1]), (folds[1], folds[0])):
                probe = fit_probe([(features[name][f], by_name[f].contacts) for f in fit_on], probe_cfg)
                for f in score_on:
                    scores = probe_scores(probe, features[name][f])
                    per_family[f].setdefault("linear_probe", {})[name] = prec(scores, by_name[f])
    return {"per_family": per_family, "dependence": dependence_values, "probe_folds": folds}


def probe_folds(names: list[str], seed: int) -> list[list[str]]:
    """Families in two halves by a seeded shuffle; fewer than two families gives no probe."""
    if len(names) < 2:
        return []
    order = np.random.default_rng(seed).permutation(sorted(names)).tolist()
    half = len(order) // 2
    return [sorted(order[:half]), sorted(order[half:])]


def headline(row: dict) -> str:
    """One progress line: top-#edges precision of each read-out."""
    parts = [f"{readout}/{model} {metrics['p_at_edges']:.3f}" for readout, by_model in row.items()
             for model, metrics in by_model.items()]
    return "P@#edges " + ", ".join(parts) + f"; chance {row['msa_mi_apc']['msa']['chance']:.3f}"
