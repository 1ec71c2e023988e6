"""The exact read-outs' table of ``pmlm coevolution report``: each encoder's epistasis and conditional log-loss
against the families' exact Potts values (``pmlm.coevolution.epistasis``), mean and sample std over seeds of each
seed's mean over families, with the exact values beside them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pmlm.coevolution.report import _get, _stats
from pmlm.reports.tables import Column, write_table
from pmlm.vocabulary import MLM, PMLM, TMLM

EXACT_MODELS = (MLM, PMLM, TMLM)
MODEL_TITLES = {MLM: "MLM", PMLM: "PMLM", TMLM: "Triple MLM"}


def _summary(doc: dict, *keys):
    return _get(doc, "exact", "summary", *keys)


def _loss(doc: dict, section: str, model: str, group: str, stat: str):
    """A log-loss figure of the model's own joint: the triple (pair) head's where it has one, else the pairwise
    composition (triples), else the product of its token head's marginals."""
    losses = _summary(doc, section, model) or {}
    for kind in ("joint", "pairs", "product"):
        if kind in losses and group in losses[kind]:
            return losses[kind][group].get(stat)
    return None


def exact_measures() -> list[tuple[str, Callable[[dict, str], float | None], Callable[[dict], float | None] | None]]:
    """(label, getter of one seed's value for a model, getter of the exact value or None) for every row."""
    rows: list = []
    for kind, title in (
        ("score", "as pmlm score computes it"),
        ("joint", "the pair joint's own double difference"),
        ("substitution", "token head by substitution"),
    ):
        rows.append(
            (
                f"epistasis rank correlation, planted pairs ({title})",
                lambda d, m, k=kind: _summary(d, "epistasis", m, k, "spearman_planted"),
                None,
            )
        )
    rows.append(
        (
            "epistasis rank correlation, all pairs |i-j| >= 6 (as pmlm score)",
            lambda d, m: _summary(d, "epistasis", m, "score", "spearman_all"),
            None,
        )
    )
    for group, title in (
        ("planted", "planted pairs"),
        ("unplanted", "pairs no term joins"),
        ("in_triplet", "pairs inside a three-body term"),
    ):
        rows.append(
            (
                f"mean |epistasis|, {title} (as pmlm score)",
                lambda d, m, g=group: _summary(d, "epistasis", m, "score", f"mean_abs_{g}"),
                lambda d, g=group: _first_model(d, "epistasis", "score", f"exact_mean_abs_{g}"),
            )
        )
    for group, title in (("planted", "planted pairs"), ("unplanted", "pairs no term joins")):
        rows.append(
            (
                f"pair log-loss, {title}, exact conditional (nats; MLM: product of marginals)",
                lambda d, m, g=group: _loss(d, "pair_logloss", m, g, "ce"),
                lambda d, g=group: _first_loss(d, "pair_logloss", g),
            )
        )
        rows.append(
            (
                f"pair log-loss gap to the exact entropy, {title} (KL, nats)",
                lambda d, m, g=group: _loss(d, "pair_logloss", m, g, "gap"),
                None,
            )
        )
    rows.append(
        (
            "third-order epistasis rank correlation, planted triplets",
            lambda d, m: _summary(d, "triple_epistasis", m, "spearman_planted"),
            None,
        )
    )
    for group, title in (("planted", "planted triplets"), ("control", "control triples")):
        rows.append(
            (
                f"mean |third-order epistasis|, {title}",
                lambda d, m, g=group: _summary(d, "triple_epistasis", m, f"mean_abs_{g}"),
                lambda d, g=group: _first_model(d, "triple_epistasis", None, f"exact_mean_abs_{g}"),
            )
        )
        rows.append(
            (
                f"triple log-loss gap, {title} (KL, nats; triple joint, else pairwise composition, else product)",
                lambda d, m, g=group: _loss(d, "triple_logloss", m, g, "gap"),
                None,
            )
        )
    return rows


def _first_model(doc: dict, section: str, kind: str | None, key: str):
    """An exact value stored beside every model's prediction: the first model's copy."""
    for model in EXACT_MODELS:
        node = _summary(doc, section, model)
        if node is not None:
            node = node.get(kind) if kind else node
            if node and node.get(key) is not None:
                return node[key]
    return None


def _first_loss(doc: dict, section: str, group: str):
    for model in EXACT_MODELS:
        value = _loss(doc, section, model, group, "entropy")
        if value is not None:
            return value
    return None


def exact_rows(docs: list[dict]) -> list[dict]:
    rows = []
    for label, getter, exact in exact_measures():
        row = {"source": "ours", "measure": label, "seeds": len(docs)}
        for model in EXACT_MODELS:
            row[f"{model}_mean"], row[f"{model}_std"] = _stats([getter(d, model) for d in docs])
        row["exact"] = _stats([exact(d) for d in docs])[0] if exact is not None else None
        if any(row[f"{m}_mean"] is not None for m in EXACT_MODELS):
            rows.append(row)
    return rows


def write_exact_table(docs: list[dict], prefix: str) -> list[Path]:
    num = "{:.3g}"
    columns = [Column("measure", "measure")]
    for model in EXACT_MODELS:
        columns += [
            Column(f"{model}_mean", f"{MODEL_TITLES[model]} mean", num),
            Column(f"{model}_std", f"{MODEL_TITLES[model]} std", num),
        ]
    columns += [Column("exact", "exact value", num), Column("seeds", "seeds")]
    sequences = _get(docs[0], "config", "sequences")
    caption = (
        f"Epistasis and conditional log-loss against the families' exact Potts values, on the same {sequences} "
        f"held-out sequences per family: mean and sample std over {len(docs)} seeds of each seed's mean over "
        "families. Epistasis of a double mutant is its score minus the two single scores (pmlm score); the "
        "exact value is J(a,b) - J(a,x_j) - J(x_i,b) + J(x_i,x_j) (and the three-body terms' share). Rank "
        "correlation is Spearman's over every double (triple) mutant of each pair (triple); a constant "
        "prediction (an MLM's additive 0) scores 0. Log-loss: cross-entropy of the model's joint with the "
        "pair (triple) masked under the exact conditional with the rest fixed; the gap to the exact "
        "entropy is the KL divergence."
    )
    return write_table(exact_rows(docs), columns, prefix, caption=caption)
