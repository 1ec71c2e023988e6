"""Exact read-outs of the planted-coupling study: an encoder's epistasis and conditional log-loss next to the
Potts model's exact values (``pmlm.synth.exact``), on held-out sequences of the family.

For every evaluation sequence and model the encoder's conditionals (``pmlm.coevolution.conditionals``) are read at
every pair |i - j| >= ``min_separation`` (singles, pair joints, token marginals), at the planted triplets and as
many control triples (``pmlm.coevolution.triples``), and with ``substitution`` at the planted pairs and as many
pairs no term joins (the token head's epistasis by substitution, 40 forwards per pair); they are scored by
``pmlm.coevolution.measures``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pmlm.coevolution.conditionals import Q, sequence_outputs, substitution_epistasis, substitution_log_conditionals
from pmlm.coevolution.measures import (
    epistasis_measures,
    exact_pair_values,
    pair_groups,
    pair_logloss,
    predicted_pair_epistasis,
    substitution_index,
)
from pmlm.coevolution.triples import control_triples, triple_epistasis_measures, triple_logloss
from pmlm.synth.exact import triple_epistasis, triple_log_conditional
from pmlm.synth.potts import PottsModel


def _stat(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else None


def family_readouts(
    models: dict,
    potts: PottsModel,
    rows: np.ndarray,
    *,
    min_separation: int = 6,
    batch_rows: int = 1024,
    seed: int = 0,
    substitution: bool = False,
) -> dict:
    """The exact read-outs of every model (name -> encoder) on the evaluation rows (n, L) of one family.

    Returns ``{"pairs": counts, "epistasis": {model: ...}, "pair_logloss": {model: {joint|product: {group:
    {ce, entropy, gap}}}}, "triple_epistasis": ..., "triple_logloss": ...}`` (see the module docstring)."""
    triples = np.concatenate(
        [
            potts.triplets.astype(np.int64).reshape(-1, 3),
            control_triples(potts, len(potts.triplets), min_separation, seed),
        ]
    )
    planted_triples = np.arange(len(triples)) < len(potts.triplets)
    # every pair |i-j| >= min_separation, and the pairs inside the triples (their pairwise composition needs them)
    i, j = np.triu_indices(potts.length, k=min_separation)
    inside = {p for t in triples.tolist() for p in itertools.combinations(t, 2)}
    pairs = np.array(sorted({(int(a), int(b)) for a, b in zip(i, j)} | inside), dtype=np.int64).reshape(-1, 2)
    groups = pair_groups(potts, pairs)

    rows = np.asarray(rows, dtype=np.int64)
    exact_pair_eps, exact_pair_log = exact_pair_values(potts, rows, pairs)  # (n, P, 20, 20) each
    exact_triple_eps = (
        np.stack([triple_epistasis(potts, rows, tuple(t)) for t in triples], axis=1)
        if len(triples)
        else np.zeros((len(rows), 0, Q, Q, Q))
    )
    exact_triple_log = (
        np.stack([triple_log_conditional(potts, rows, tuple(t)) for t in triples], axis=1)
        if len(triples)
        else np.zeros((len(rows), 0, Q, Q, Q))
    )
    sub_index = substitution_index(groups, seed)
    sub_groups = {"planted": groups["planted"][sub_index], "unplanted": groups["unplanted"][sub_index]}

    result: dict = {
        "pairs": {g: int(m.sum()) for g, m in groups.items()},
        "triples": {"planted": int(planted_triples.sum()), "control": int((~planted_triples).sum())},
        "epistasis": {},
        "pair_logloss": {},
        "triple_epistasis": {},
        "triple_logloss": {},
    }
    for name, model in models.items():
        outs = [sequence_outputs(model, seq, pairs, triples, batch_rows) for seq in rows]
        result["epistasis"][name] = {
            kind: epistasis_measures(
                np.stack([predicted_pair_epistasis(o, seq, pairs)[kind] for o, seq in zip(outs, rows)]),
                rows,
                pairs,
                groups,
                exact_pair_eps,
            )
            for kind in ("score", "joint")
        }
        result["pair_logloss"][name] = pair_logloss(outs, groups, exact_pair_log)
        if substitution and model.token_head is not None:
            chosen = pairs[sub_index]
            sub = np.stack(
                [
                    substitution_epistasis(substitution_log_conditionals(model, seq, chosen, batch_rows), seq, chosen)
                    for seq in rows
                ]
            )
            result["epistasis"][name]["substitution"] = epistasis_measures(
                sub, rows, chosen, sub_groups, exact_pair_eps[:, sub_index]
            )
        if len(triples):
            result["triple_epistasis"][name] = triple_epistasis_measures(
                outs, rows, triples, planted_triples, exact_triple_eps
            )
            result["triple_logloss"][name] = triple_logloss(
                outs, rows, pairs, triples, planted_triples, exact_triple_log
            )
    return result


def summarise_readouts(per_family: list[dict]) -> dict:
    """Means over families of every number in ``family_readouts`` results (None where no family has one)."""

    def walk(items: list):
        if isinstance(items[0], dict):
            keys = list(dict.fromkeys(k for item in items for k in item))
            return {k: walk([item[k] for item in items if k in item]) for k in keys}
        return _stat(items)

    return walk(per_family) if per_family else {}


def study_readouts(families: list, models: dict, cfg) -> dict | None:
    """The exact read-outs of every model on each family's evaluation rows (``StudyConfig``: sequences,
    min_separation, batch_rows, seed, substitution); None when no family has its Potts model (older synth output).
    ``{"per_family": {family: family_readouts(...)}, "summary": means over families, "sequences": ids}``."""
    per_family, used = {}, {}
    for fam in families:
        if fam.potts is None:
            continue
        rows, ids = fam.evaluation_rows(cfg)
        per_family[fam.name] = family_readouts(
            models,
            fam.potts,
            rows,
            min_separation=cfg.min_separation,
            batch_rows=cfg.batch_rows,
            seed=cfg.seed,
            substitution=bool(cfg.substitution),
        )
        used[fam.name] = ids
    if not per_family:
        return None
    return {"per_family": per_family, "summary": summarise_readouts(list(per_family.values())), "sequences": used}


def exact_headline(summary: dict) -> str:
    """One progress line: epistasis rank correlation on planted pairs and the planted pairs' log-loss gap."""
    parts = []
    for model, kinds in summary.get("epistasis", {}).items():
        rho = kinds.get("score", {}).get("spearman_planted")
        losses = summary.get("pair_logloss", {}).get(model, {})
        gap = (losses.get("joint") or losses.get("product") or {}).get("planted", {}).get("gap")
        parts.append(f"{model} {_fmt(rho)} (gap {_fmt(gap)} nats)")
    return "epistasis rank correlation on planted pairs: " + ", ".join(parts)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
