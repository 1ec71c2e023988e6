"""Every read-out of one encoder at one budget point of ``pmlm coevolution curves``, and the classical baselines,
on the same held-out sequences of each family, as ``(readout, metric, value)`` records.

Epistasis against the exact Potts values (``spearman_planted``: Spearman over every double mutant of the planted
pairs; ``mean_abs_planted`` / ``mean_abs_unplanted``: the size of the predicted epistasis, exactly 0 off the
planted edges):

* ``pair_joint_score`` / ``pair_joint``: the pair head's joint, as ``pmlm score`` computes it and as the joint's own
  double difference (every pair |i-j| >= min_separation);
* ``substitution`` and ``chain_rule``: the token head by substitution and the token head's chain-rule joint, at
  the planted pairs and as many pairs no term joins (40 forwards per pair; ``pmlm.coevolution.measures``);
* ``jacobian``: the token head's categorical Jacobian (unmasked), every pair.

Conditional log-loss (``gap_planted`` / ``gap_unplanted``: KL of the exact pair conditional to the model's joint,
nats): ``pair_joint``, ``chain_rule`` and ``product`` (the token head's two marginals with the pair masked).

Contacts (``p_edges``: top-#planted-edges precision over |i-j| >= min_separation; ``p_l5``: P@L/5 there;
``p_edges_long`` / ``p_l5_long``: the same over |i-j| >= long_separation with the long edges' count), score maps
averaged over the sequences, then APC: ``pair_mi_apc`` / ``pair_kl_apc`` (the pair head's MI, and the paper's KL
to the token head's marginals), ``attention_apc``, ``jacobian_apc`` or (``token_contacts: masked``)
``substitution_apc`` (Frobenius norms of the token head's epistasis tensors) and ``chain_rule_mi_apc``; the
supervised linear head of the paper's protocol (``supervised_m``, ``supervised_mplus``: fitted on the other fold of
families, precision per sequence averaged, ``pmlm.coevolution.supervised``).

Baselines (``baseline_records``): ``chance``, ``exact_couplings_apc`` (the true couplings' Frobenius norms, the
ceiling), ``plm_apc`` and ``plm`` (the pseudo-likelihood Potts fit's contacts, epistasis and log-loss gap),
``msa_mi_apc`` (MI + APC of the training sequences), ``exact`` (the exact conditionals' entropy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pmlm.coevolution.conditionals import (
    Q,
    chain_rule_joint,
    jacobian_epistasis,
    sequence_outputs,
    substitution_epistasis,
    substitution_log_conditionals,
)
from pmlm.coevolution.curves_config import CurveEvaluation
from pmlm.coevolution.heldout import FamilyData
from pmlm.coevolution.measures import (
    epistasis_measures,
    exact_pair_values,
    group_losses,
    off_wild_type,
    pair_groups,
    predicted_pair_epistasis,
    product_log_joint,
    substitution_index,
)
from pmlm.coevolution.readouts import attention_contact_scores, dependence_map
from pmlm.coevolution.supervised import family_scores, fold_heads
from pmlm.coevolution.triples import control_triples, triple_epistasis_measures, triple_logloss
from pmlm.evaluation.metrics import chance_precision, contact_precision, top_k_precision
from pmlm.evaluation.pair_readout import joint_dependence
from pmlm.evaluation.unsupervised import apc, msa_mi_apc, mutual_information
from pmlm.synth.exact import double_difference, triple_epistasis, triple_log_conditional
from pmlm.synth.pseudolikelihood import FittedPotts
from pmlm.vocabulary import FEATURES_M, FEATURES_M_PLUS

Record = tuple[str, str, float]  # (readout, metric, value); NaN where a measure has no value
EPISTASIS_METRICS = ("spearman_planted", "mean_abs_planted", "mean_abs_unplanted")
EXTRA_METRICS = ("spearman_all", "mean_abs_in_triplet")  # where they have a value: every pair; pairs in a triplet
NO_TRIPLES = np.zeros((0, 3), dtype=np.int64)
GROUPS = ("planted", "unplanted")
# supervised read-outs: (read-out, features, needs a pair head)
SUPERVISED = (("supervised_m", FEATURES_M, False), ("supervised_mplus", FEATURES_M_PLUS, True))


@dataclass
class Triples:
    """A family's planted triplets and as many control triples no term joins, with their exact values."""

    sites: np.ndarray  # (T, 3) i < j < k
    planted: np.ndarray  # (T,) bool
    pairs: np.ndarray  # the pairs inside the triples (the pairwise composition reads them)
    exact_eps: np.ndarray  # (n, T, 20, 20, 20) third-order epistasis
    exact_log: np.ndarray  # (n, T, 20, 20, 20) log P(x_i, x_j, x_k | the rest)


def family_triples(family: FamilyData, rows: np.ndarray, min_separation: int, seed: int) -> Triples | None:
    potts = family.potts
    if not len(potts.triplets):
        return None
    planted = potts.triplets.astype(np.int64).reshape(-1, 3)
    sites = np.concatenate([planted, control_triples(potts, len(planted), min_separation, seed)])
    inside = sorted({p for t in sites.tolist() for p in ((t[0], t[1]), (t[0], t[2]), (t[1], t[2]))})
    eps = np.stack([triple_epistasis(potts, rows, tuple(t)) for t in sites], axis=1)
    log = np.stack([triple_log_conditional(potts, rows, tuple(t)) for t in sites], axis=1)
    is_planted = np.arange(len(sites)) < len(planted)
    return Triples(sites, is_planted, np.array(inside, dtype=np.int64), eps, log)


@dataclass
class FamilyTargets:
    """One family's evaluation rows and the exact values every read-out is scored against, computed once."""

    family: FamilyData
    group: str  # the family group of the study config
    rows: np.ndarray  # (n, L) int64, the first held-out sequences
    ids: list[str]  # their sequence ids
    pairs: np.ndarray  # (P, 2) every pair |i-j| >= min_separation, i < j
    groups: dict[str, np.ndarray]  # planted / unplanted masks over pairs
    exact_eps: np.ndarray  # (n, P, 20, 20) exact epistasis
    exact_log: np.ndarray  # (n, P, 20, 20) exact log P(x_i, x_j | the rest)
    sub_index: np.ndarray  # pairs scored by substitution: every planted pair and as many unplanted
    triples: Triples | None = None  # the planted three-body terms and as many control triples, if the family has any

    def subset(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {g: m[index] for g, m in self.groups.items()}


def family_targets(family: FamilyData, group: str, ev: CurveEvaluation, seed: int) -> FamilyTargets:
    if family.potts is None:
        raise ValueError(f"family {family.name} has no Potts model (params/ of pmlm synth)")
    n = min(ev.sequences, len(family.heldout))
    rows = family.heldout[:n].astype(np.int64)
    i, j = np.triu_indices(family.length, k=ev.min_separation)
    pairs = np.stack([i, j], axis=1).astype(np.int64)
    groups = {g: m for g, m in pair_groups(family.potts, pairs).items() if g != "in_triplet" or m.any()}
    eps, log = exact_pair_values(family.potts, rows, pairs)
    sub_index = substitution_index(groups, seed)
    triples = family_triples(family, rows, ev.min_separation, seed)
    return FamilyTargets(family, group, rows, family.heldout_ids[:n], pairs, groups, eps, log, sub_index, triples)


def contact_records(readout: str, scores: np.ndarray, t: FamilyTargets, ev: CurveEvaluation) -> list[Record]:
    """Top-#edges precision and P@L/k over |i-j| >= min_separation, and the same over the long range."""
    contacts = t.family.contacts
    valid = np.ones(t.family.length, dtype=bool)
    out = []
    for suffix, min_sep in (("", ev.min_separation), ("_long", ev.long_separation)):
        edges = int(np.triu(contacts, k=min_sep).sum())
        top = top_k_precision(scores, contacts, edges, min_sep) if edges else math.nan
        out.append((readout, f"p_edges{suffix}", top))
        out.append(
            (
                readout,
                f"p_l5{suffix}",
                contact_precision(scores, contacts, valid, min_sep=min_sep, k_divisor=ev.k_divisor),
            )
        )
    return out


def _epistasis_records(readout: str, measures: dict) -> list[Record]:
    extra = [(readout, m, float(measures[m])) for m in EXTRA_METRICS if measures.get(m) is not None]
    return [(readout, m, _value(measures.get(m))) for m in EPISTASIS_METRICS] + extra


def _kl_records(readout: str, kl: np.ndarray, groups: dict[str, np.ndarray]) -> list[Record]:
    """Medians of KL(P(x_i) P(x_j) || P(x_i, x_j)) (n, P) at planted pairs and pairs no term joins, and their ratio:
    how far the joint departs from independence where the truth couples and where it does not."""
    planted, unplanted = (float(np.median(kl[:, groups[g]])) if groups[g].any() else math.nan for g in GROUPS)
    ratio = planted / unplanted if unplanted > 0 else math.nan
    return [
        (readout, "median_planted", planted),
        (readout, "median_unplanted", unplanted),
        (readout, "median_ratio", ratio),
    ]


def _gap_records(readout: str, losses: dict) -> list[Record]:
    return [(readout, f"gap_{g}", losses[g]["gap"]) for g in ("planted", "unplanted") if g in losses]


def _value(x) -> float:
    return math.nan if x is None else float(x)


def _frobenius_map(eps: np.ndarray, pairs: np.ndarray, length: int) -> np.ndarray:
    """Frobenius norms of epistasis tensors (P, 20, 20) as a symmetric (L, L) map."""
    return dependence_map(np.sqrt((eps**2).sum(axis=(1, 2))), pairs, length)


@torch.no_grad()
def encoder_records(model, t: FamilyTargets, ev: CurveEvaluation) -> list[Record]:
    """Every zero-shot read-out of ``model`` on one family (module docstring)."""
    length, pairs, n = t.family.length, t.pairs, len(t.rows)
    outs = [sequence_outputs(model, seq, pairs, NO_TRIPLES, ev.batch_rows) for seq in t.rows]
    records: list[Record] = []
    if model.pair_head is not None:
        for kind, readout in (("score", "pair_joint_score"), ("joint", "pair_joint")):
            eps = np.stack([predicted_pair_epistasis(o, seq, pairs)[kind] for o, seq in zip(outs, t.rows)])
            records += _epistasis_records(readout, epistasis_measures(eps, t.rows, pairs, t.groups, t.exact_eps))
        joints = np.stack([o.pair_joint for o in outs])  # (n, P, 20, 20) log
        records += _gap_records("pair_joint", group_losses(t.exact_log, joints, t.groups))
        maps = {"mi": np.zeros((length, length)), "kl": np.zeros((length, length))}
        kl = []
        for o in outs:
            marg = torch.from_numpy(np.exp(o.pair_marginals)) if o.pair_marginals is not None else None
            dep = joint_dependence(
                torch.from_numpy(np.exp(o.pair_joint)), *(marg.unbind(1) if marg is not None else (None, None))
            )
            kl.append(dep["kl"].numpy())
            for key in maps:
                maps[key] += dependence_map(dep[key].numpy(), pairs, length) / n
        records += _kl_records("pair_kl", np.stack(kl), t.groups)
        records += contact_records("pair_mi_apc", apc(maps["mi"]), t, ev)
        records += contact_records("pair_kl_apc", apc(maps["kl"]), t, ev)
    if model.token_head is not None:
        marginals = np.stack([o.pair_marginals for o in outs])  # (n, P, 2, 20)
        records += _gap_records("product", group_losses(t.exact_log, product_log_joint(marginals), t.groups))
        records += _token_records(model, t, ev, marginals)
    records += contact_records("attention_apc", attention_contact_scores(model, t.rows, ev.batch_rows), t, ev)
    if t.triples is not None:
        records += _triple_records(model, t, ev)
    return records


def _triple_records(model, t: FamilyTargets, ev: CurveEvaluation) -> list[Record]:
    """Third-order epistasis of the triple head's joint (0 without one) at planted triplets and control triples, and
    the triple log-loss gaps of the triple joint, a pair head's composition and the token head's product
    (``pmlm.coevolution.triples``)."""
    x = t.triples
    outs = [sequence_outputs(model, seq, x.pairs, x.sites, ev.batch_rows) for seq in t.rows]
    measures = triple_epistasis_measures(outs, t.rows, x.sites, x.planted, x.exact_eps)
    metrics = ("spearman_planted", "mean_abs_planted", "mean_abs_control")
    records = [("triple_joint", m, _value(measures.get(m))) for m in metrics]
    for kind, losses in triple_logloss(outs, t.rows, x.pairs, x.sites, x.planted, x.exact_log).items():
        records += [(f"triple_{kind}", f"gap_{g}", losses[g]["gap"]) for g in ("planted", "control") if g in losses]
    return records


def _token_records(model, t: FamilyTargets, ev: CurveEvaluation, marginals: np.ndarray) -> list[Record]:
    """The token head's substitution and chain-rule read-outs (sampled pairs, or every pair in ``masked`` mode) and
    its all-pairs contact map."""
    length = t.family.length
    every_pair = ev.token_contacts == "masked"
    index = np.arange(len(t.pairs)) if every_pair else t.sub_index
    chosen = t.pairs[index]
    subs, chains = [], []
    for k, seq in enumerate(t.rows):
        cond = substitution_log_conditionals(model, seq, chosen, ev.batch_rows)  # (P', 2, 20, 20)
        subs.append(substitution_epistasis(cond, seq, chosen))
        chains.append(chain_rule_joint(cond, marginals[k, index]))
    subs, chains = np.stack(subs), np.stack(chains)  # (n, P', 20, 20)
    groups = t.subset(index)
    sampled = np.isin(index, t.sub_index)  # epistasis and log-loss on the same pairs in both modes
    sampled_groups = {g: m & sampled for g, m in groups.items()}
    exact_eps, exact_log = t.exact_eps[:, index], t.exact_log[:, index]
    records = _epistasis_records(
        "substitution", epistasis_measures(subs, t.rows, chosen, sampled_groups, exact_eps, every=False)
    )
    wild = [t.rows[:, chosen[:, 0]], t.rows[:, chosen[:, 1]]]
    chain_eps = np.stack([double_difference(c, wi, wj) for c, wi, wj in zip(chains, *wild)])
    records += _epistasis_records(
        "chain_rule", epistasis_measures(chain_eps, t.rows, chosen, sampled_groups, exact_eps, every=False)
    )
    records += _gap_records("chain_rule", group_losses(exact_log, chains, sampled_groups))
    probs = torch.from_numpy(np.exp(chains))  # (n, P', 20, 20); its marginals are the token head's
    chain_kl = joint_dependence(probs.flatten(0, 1), probs.sum(-1).flatten(0, 1), probs.sum(-2).flatten(0, 1))["kl"]
    records += _kl_records("chain_rule_kl", chain_kl.numpy().reshape(len(chains), -1), sampled_groups)
    if every_pair:
        frob = np.mean([_frobenius_map(s, chosen, length) for s in subs], axis=0)
        records += contact_records("substitution_apc", apc(frob), t, ev)
        mi = np.mean([dependence_map(mutual_information(np.exp(c)), chosen, length) for c in chains], axis=0)
        records += contact_records("chain_rule_mi_apc", apc(mi), t, ev)
        return records
    jac = [jacobian_epistasis(model, seq, ev.batch_rows) for seq in t.rows]  # (L, L, 20, 20) each
    jac_pairs = np.stack([j[t.pairs[:, 0], t.pairs[:, 1]] for j in jac])  # (n, P, 20, 20)
    records += _epistasis_records("jacobian", epistasis_measures(jac_pairs, t.rows, t.pairs, t.groups, t.exact_eps))
    frob = np.mean([_frobenius_map(e, t.pairs, length) for e in jac_pairs], axis=0)
    records += contact_records("jacobian_apc", apc(frob), t, ev)
    return records


def supervised_records(model, targets: list[FamilyTargets], ev: CurveEvaluation, seed: int) -> dict[str, list[Record]]:
    """The paper's protocol (``pmlm.coevolution.supervised.fold_heads``): linear contact heads on frozen M (and M+
    with a pair head) fitted on one half of the families, scored on the other; precision per evaluation sequence,
    averaged. family name -> records."""
    by_name = {t.family.name: t for t in targets}
    heads = [
        (readout, "encoder", features)
        for readout, features, pair in SUPERVISED
        if model.pair_head is not None or not pair
    ]
    out: dict[str, list[Record]] = {name: [] for name in by_name}
    for readout, _, head, score_on in fold_heads({"encoder": model}, [t.family for t in targets], ev, seed, heads):
        for family in score_on:
            scores, _ = family_scores(head, family, ev)
            t = by_name[family.name]
            per_sequence = [{m: v for _, m, v in contact_records(readout, s, t, ev)} for s in scores]
            out[family.name] += [(readout, m, float(np.nanmean([p[m] for p in per_sequence]))) for m in per_sequence[0]]
    return out


def baseline_records(t: FamilyTargets, fit: FittedPotts, ev: CurveEvaluation) -> list[Record]:
    """Chance, the exact couplings (the ceiling), the pseudo-likelihood fit and MSA MI + APC on one family."""
    contacts, potts = t.family.contacts, t.family.potts
    records = [
        ("chance", "p_edges", chance_precision(contacts, ev.min_separation)),
        ("chance", "p_edges_long", chance_precision(contacts, ev.long_separation)),
    ]
    norms = np.zeros((t.family.length, t.family.length))
    norms[potts.edges[:, 0], potts.edges[:, 1]] = potts.coupling_norms()
    records += contact_records("exact_couplings_apc", apc(norms + norms.T), t, ev)
    records += contact_records("plm_apc", fit.contact_scores(), t, ev)
    records += contact_records("msa_mi_apc", msa_mi_apc(t.family.train), t, ev)
    measures = epistasis_measures(fit.pair_epistasis(t.rows, t.pairs), t.rows, t.pairs, t.groups, t.exact_eps)
    records += _epistasis_records("plm", measures)
    records += _gap_records("plm", group_losses(t.exact_log, fit.pair_log_conditional(t.rows, t.pairs), t.groups))
    exact = group_losses(t.exact_log, t.exact_log, t.groups)
    records += [("exact", f"entropy_{g}", exact[g]["entropy"]) for g in ("planted", "unplanted")]
    records += [("exact", "mean_abs_planted", measures["exact_mean_abs_planted"])]
    if t.triples is not None:
        x = t.triples
        exact = group_losses(x.exact_log, x.exact_log, {"planted": x.planted})
        eps = x.exact_eps[:, x.planted].reshape(-1, Q, Q, Q)
        wild = [t.rows[:, x.sites[x.planted, s]].ravel() for s in range(3)]
        records += [("exact", "triple_entropy_planted", exact["planted"]["entropy"])]
        records += [("exact", "triple_mean_abs_planted", float(np.abs(off_wild_type(eps, wild)).mean()))]
    return records
