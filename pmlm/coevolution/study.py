"""The planted-coupling study's engine: every read-out of an MLM and a PMLM encoder on each family's
held-out sequences, scored against the planted contacts (``pmlm coevolution`` runs it)."""

from __future__ import annotations

import sys

import numpy as np

from pmlm.coevolution.heldout import FamilyData, StudyConfig
from pmlm.coevolution.readouts import (
    CHAIN_ROWS,
    attention_contact_scores,
    chain_rule_dependence,
    dependence_map,
    pair_head_dependence,
    precisions,
    split_pairs,
)
from pmlm.coevolution.supervised import supervised_contacts
from pmlm.evaluation.pair_readout import all_pairs
from pmlm.evaluation.unsupervised import apc, msa_mi_apc
from pmlm.vocabulary import PMLM


def readout_costs(length: int) -> dict[str, dict[str, float]]:
    """Encoder forward passes (rows of length L + 2) each read-out spends per evaluation sequence and per
    scored pair (all L(L-1)/2 pairs), for a family of ``length`` residues. The supervised head's fitting
    reuses the same single pass per sequence (the encoder is frozen) plus the head's own steps."""
    pairs = length * (length - 1) // 2
    per_sequence = {
        "pair_head_mi_apc": pairs,
        "pair_head_kl_apc": pairs,
        "chain_rule_mi_apc": CHAIN_ROWS * pairs,
        "attention_apc": 1,
        "supervised_m": 1,
        "supervised_mplus": 1,
    }
    return {r: {"forwards_per_sequence": float(n), "forwards_per_pair": n / pairs} for r, n in per_sequence.items()}


def _group_values(values: np.ndarray, pairs: np.ndarray, contacts: np.ndarray, min_sep: int) -> dict[str, list]:
    planted, other = split_pairs(pairs, contacts, min_sep)
    return {"planted": values[planted].tolist(), "non_planted": values[other].tolist()}


def _dependence_readout(fn, model, family: FamilyData, batch: int, cfg: StudyConfig) -> tuple[dict, dict, list]:
    """Averaged (L, L) MI and KL maps over the evaluation sequences, every KL / MI value grouped by
    planted, and the ids of the sequences averaged over."""
    pairs = all_pairs(family.length)
    mi_map = np.zeros((family.length, family.length))
    kl_map = np.zeros_like(mi_map)
    kl_values, mi_values = [], []
    rows, ids = family.evaluation_rows(cfg)
    for sequence in rows:
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
    return {"mi": mi_map / len(rows), "kl": kl_map / len(rows)}, values, ids


def evaluate_models(families: list[FamilyData], models: dict, cfg: StudyConfig) -> dict:
    """All read-outs for each family: precisions per (read-out, model), KL / MI values for histograms, and
    the ids of the held-out sequences each read-out averaged over (the same ones for all of them).
    Deterministic: the supervised head's random start is seeded from the study seed."""

    def prec(scores: np.ndarray, fam: FamilyData) -> dict[str, float]:
        return precisions(scores, fam.contacts, cfg.min_separation, cfg.k_divisor)

    per_family: dict[str, dict] = {}
    used: dict[str, dict[str, list[str]]] = {}  # family -> read-out -> sequence ids averaged over
    # read-out -> model -> measure (kl, mi) -> planted / non_planted values
    dependence_values: dict[str, dict] = {}

    def keep_values(readout: str, model: str, values: dict) -> None:
        slot = dependence_values.setdefault(readout, {}).setdefault(model, {})
        for kind, groups in values.items():
            for group, items in groups.items():
                slot.setdefault(kind, {}).setdefault(group, []).extend(items)

    for fam in families:
        rows, ids = fam.evaluation_rows(cfg)
        row: dict[str, dict] = {"msa_mi_apc": {"msa": prec(msa_mi_apc(fam.train), fam)}}
        maps, values, pair_ids = _dependence_readout(pair_head_dependence, models[PMLM], fam, cfg.batch_rows, cfg)
        # contacts from the MI of the pair head's own joint, not the paper's KL: the KL compares the
        # pair head's joint with the *token* head's marginals, so any disagreement between the two
        # heads (calibration, not coupling) inflates it at every pair; the MI measures dependence
        # inside one distribution. With exactly the pair masked, that dependence given all other
        # residues is what a Potts coupling J_ij creates, and it is zero for uncoupled pairs.
        row["pair_head_mi_apc"] = {PMLM: prec(apc(maps["mi"]), fam)}
        row["pair_head_kl_apc"] = {PMLM: prec(apc(maps["kl"]), fam)}
        keep_values("pair_head", PMLM, values)
        used[fam.name] = {"pair_head_mi_apc": pair_ids, "pair_head_kl_apc": pair_ids}
        row["attention_apc"] = {}
        for name, model in models.items():
            if cfg.chain_rule:
                # the token head's joint by the chain rule: the MLM's only joint, and PMLM's like-for-like
                maps, values, chain_ids = _dependence_readout(chain_rule_dependence, model, fam, cfg.batch_rows, cfg)
                row.setdefault("chain_rule_mi_apc", {})[name] = prec(apc(maps["mi"]), fam)
                keep_values("chain_rule", name, values)
                used[fam.name]["chain_rule_mi_apc"] = chain_ids
            row["attention_apc"][name] = prec(attention_contact_scores(model, rows, cfg.batch_rows), fam)
        used[fam.name]["attention_apc"] = ids
        per_family[fam.name] = row
        print(f"coevolution: {fam.name}: {headline(row)}", file=sys.stderr)

    # the paper's protocol: a contact head fitted on one half of the families, scored on the other
    supervised, folds, supervised_ids = supervised_contacts(families, models, cfg)
    for fam_name, readouts in supervised.items():
        per_family[fam_name].update(readouts)
        used[fam_name].update(supervised_ids[fam_name])
    return {"per_family": per_family, "dependence": dependence_values, "folds": folds, "sequences": used}


def headline(row: dict) -> str:
    """One progress line: top-#edges precision of each read-out."""
    parts = [
        f"{readout}/{model} {metrics['p_at_edges']:.3f}"
        for readout, by_model in row.items()
        for model, metrics in by_model.items()
    ]
    return "P@#edges " + ", ".join(parts) + f"; chance {row['msa_mi_apc']['msa']['chance']:.3f}"
