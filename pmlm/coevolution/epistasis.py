"""Exact read-outs of the planted-coupling study: an encoder's epistasis and conditional log-loss next to the
Potts model's exact values (``pmlm.synth.exact``), on held-out sequences of the family.

For every evaluation sequence x (residue classes) and model:

* **singles**: log P(x_s = a | x with s masked), one masked copy per site (the token head; a pair-only model
  the marginal of its pair head's diagonal), as ``pmlm score`` reads single mutants;
* **pairs**: one copy per pair (i, j), |i - j| >= ``min_separation``, with exactly i and j masked: the pair
  head's joint (its class ``20 a + b`` is (x_i = a, x_j = b)) and the token head's two marginals;
* **triples** (planted triplets and as many control triples no term joins): one copy per triple with exactly
  its three sites masked: the triple head's joint where the model has one, and the token head's marginals.

Pair epistasis of (i:a, j:b), a != x_i, b != x_j, as ``pmlm score`` computes it (``score``): the pair joint's
log P(a, b) - log P(x_i, x_j) minus the two single scores; an encoder without a pair head scores doubles
additively, so its epistasis is 0. ``joint`` is the joint's own double difference
log P(a,b) - log P(a,x_j) - log P(x_i,b) + log P(x_i,x_j); both equal the exact ``e_ij`` for the true model.
Third-order epistasis (``a != x_i, b != x_j, c != x_k``): the alternating sum of the triple joint's log over the
8 corners; 0 for a model without a triple joint (its triples are scored from pairs at most).

Rank correlation is Spearman's (average ranks for ties). A constant prediction (an MLM's 0) has none to offer
and is given 0; where the exact values are constant (pairs no term joins: exactly 0) it is undefined (None),
and the measure there is how large the predicted values are (``mean_abs``).

Conditional log-loss: with the pair (triple) masked and the rest fixed to x, the cross-entropy
``-sum_y P_exact(y) log Q(y)`` of the model's distribution Q over the 400 (8,000) states, next to the exact
conditional's entropy; their difference, ``gap``, is KL(P_exact || Q) >= 0. Q is the pair (triple) head's
joint, or the product of the token head's marginals in the same forward pass (``product``); for triples a
PMLM also gets its pairwise composition ``pairs``: exp(single scores + the three pair epistases), normalised
over the 8,000 states (what its pair head can say about a triple without a triple head).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

from pmlm import alphabet
from pmlm.coevolution.readouts import model_device, sequence_tokens
from pmlm.evaluation.pair_readout import residue_joint
from pmlm.synth.exact import (
    coupled_pairs,
    double_difference,
    pair_epistasis,
    pair_log_conditional,
    triple_difference,
    triple_epistasis,
    triple_log_conditional,
)
from pmlm.synth.potts import PottsModel

Q = alphabet.NUM_RESIDUES
GROUPS = ("planted", "unplanted", "in_triplet")  # pair groups: planted edges, pairs no term joins, triplet pairs


@dataclass
class SequenceOutputs:
    """One model's read-outs on one sequence (log-probabilities, float64)."""

    singles: np.ndarray  # (L, 20)
    pair_joint: np.ndarray | None  # (P, 20, 20), or None without a pair head
    pair_marginals: np.ndarray | None  # (P, 2, 20) token head with the pair masked, or None without one
    triple_joint: np.ndarray | None  # (T, 20, 20, 20), or None without a triple head
    triple_marginals: np.ndarray | None  # (T, 3, 20)


def _masked(sequence: np.ndarray, site_sets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of ``sequence`` (L,) with each row's sites (n, k) masked, (n, L + 2), and the sites' token positions."""
    tokens = sequence_tokens(sequence[None])[0].repeat(len(site_sets), 1)  # (n, T)
    positions = torch.as_tensor(np.asarray(site_sets, dtype=np.int64) + 1)  # <cls> is token 0
    tokens[torch.arange(len(site_sets))[:, None], positions] = alphabet.MASK_ID
    return tokens, positions


def _selected(positions: torch.Tensor, width: int) -> torch.Tensor:
    selected = torch.zeros(positions.shape[0], width, dtype=torch.bool)
    selected[torch.arange(positions.shape[0])[:, None], positions] = True
    return selected


def _log_marginals(model, tokens, positions, device, out) -> torch.Tensor:
    """(n, k, 20) log-marginals at each row's masked sites from the token head (row-major selection: the sites
    come out in increasing position, so rows are sorted back to the order given)."""
    logits = out["logits"].float().view(len(tokens), positions.shape[1], Q)
    order = positions.argsort(dim=1).argsort(dim=1).to(logits.device)  # rank of each site among its row's sites
    logits = torch.gather(logits, 1, order[..., None].expand(-1, -1, Q))
    return torch.log_softmax(logits, dim=-1)


@torch.no_grad()
def sequence_outputs(
    model, sequence: np.ndarray, pairs: np.ndarray, triples: np.ndarray, batch_rows: int = 1024
) -> SequenceOutputs:
    """Every read-out of the module docstring for one sequence of residue classes (L,), pairs (P, 2) and
    triples (T, 3) of 0-based sites."""
    device = model_device(model)
    has_tokens = model.token_head is not None
    has_pairs = getattr(model, "pair_head", None) is not None
    has_triples = getattr(model, "triple_head", None) is not None
    length = len(sequence)

    singles = []
    sites = np.arange(length)[:, None]
    for start in range(0, length, batch_rows):
        tokens, pos = _masked(sequence, sites[start : start + batch_rows])
        rows = torch.arange(len(tokens))
        if has_tokens:
            out = model(tokens.to(device), token_positions=_selected(pos, tokens.shape[1]).to(device))
            singles.append(torch.log_softmax(out["logits"].float(), dim=-1))
        else:  # pair-only: the marginal of the diagonal pair (s, s)
            index = torch.stack([rows, pos[:, 0], pos[:, 0]], dim=1)
            out = model(tokens.to(device), pair_index=index.to(device))
            singles.append(residue_joint(out["pair_logits"].float()).sum(dim=-1).log())
    result = {"singles": torch.cat(singles).double().cpu().numpy()}

    for name, site_sets, head in (("pair", pairs, has_pairs), ("triple", triples, has_triples)):
        joints, marginals = [], []
        for start in range(0, len(site_sets), batch_rows):
            chunk = site_sets[start : start + batch_rows]
            tokens, pos = _masked(sequence, chunk)
            rows = torch.arange(len(tokens))[:, None]
            kwargs = {}
            if has_tokens:
                kwargs["token_positions"] = _selected(pos, tokens.shape[1]).to(device)
            if head:
                kwargs[f"{name}_index"] = torch.cat([rows, pos], dim=1).to(device)
            out = model(tokens.to(device), **kwargs)
            if has_tokens:
                marginals.append(_log_marginals(model, tokens, pos, device, out))
            if head:
                logits = out[f"{name}_logits"].float()
                if name == "pair":
                    joints.append(residue_joint(logits).log())
                else:
                    joints.append(torch.log_softmax(logits, dim=-1).view(-1, Q, Q, Q))
        result[f"{name}_joint"] = torch.cat(joints).double().cpu().numpy() if joints else None
        result[f"{name}_marginals"] = torch.cat(marginals).double().cpu().numpy() if marginals else None
    return SequenceOutputs(**result)


@torch.no_grad()
def substitution_epistasis(model, sequence: np.ndarray, pairs: np.ndarray, batch_rows: int = 1024) -> np.ndarray:
    """The token head's epistasis by substitution, (P, 20, 20): site i masked and site j set to each b,
    ``[log P(x_i=a | x_j=b) - log P(x_i=w_i | x_j=b)] - [the same at x_j = w_j]``, averaged with the mirror
    reading (j masked, i set to each a). Exact for the true model (the conditional of one site given the rest);
    40 forwards per pair. Any encoder with a token head has it, an MLM included."""
    device = model_device(model)
    letters = torch.arange(Q) + alphabet.FIRST_RESIDUE_ID
    base = sequence_tokens(sequence[None])[0]  # (T,)
    out = np.zeros((len(pairs), Q, Q))
    per_chunk = max(1, batch_rows // (2 * Q))
    for start in range(0, len(pairs), per_chunk):
        chunk = pairs[start : start + per_chunk]
        p = len(chunk)
        pos = torch.as_tensor(chunk + 1)  # (p, 2) token positions
        rows = torch.arange(p)
        tokens = base.repeat(p, 2, Q, 1)  # (p, role, 20, T): role 0 masks i and sets j, role 1 the mirror
        tokens[rows, 0, :, pos[:, 0]] = alphabet.MASK_ID
        tokens[rows, 0, :, pos[:, 1]] = letters
        tokens[rows, 1, :, pos[:, 1]] = alphabet.MASK_ID
        tokens[rows, 1, :, pos[:, 0]] = letters
        masked_at = torch.stack([pos[:, 0], pos[:, 1]], dim=1)[:, :, None].expand(p, 2, Q)  # (p, role, 20)
        selected = torch.zeros(tokens.shape, dtype=torch.bool)
        selected.view(-1, tokens.shape[-1])[torch.arange(p * 2 * Q), masked_at.reshape(-1)] = True
        logits = model(
            tokens.view(-1, tokens.shape[-1]).to(device), token_positions=selected.view(-1, tokens.shape[-1]).to(device)
        )["logits"]
        log_p = torch.log_softmax(logits.float(), dim=-1).double().cpu().view(p, 2, Q, Q)  # [pair, role, given, own]
        i_given_b = log_p[:, 0].transpose(1, 2).numpy()  # [pair, a, b]: log P(x_i = a | x_j = b)
        j_given_a = log_p[:, 1].numpy()  # [pair, a, b]: log P(x_j = b | x_i = a)
        wi, wj = sequence[chunk[:, 0]], sequence[chunk[:, 1]]
        n = np.arange(p)
        from_i = i_given_b - i_given_b[n, wi][:, None, :]  # [pair, a, b] - [pair, w_i, b]
        from_i = from_i - from_i[n, :, wj][:, :, None]  # minus the same at b = w_j
        from_j = j_given_a - j_given_a[n, :, wj][:, :, None]
        from_j = from_j - from_j[n, wi][:, None, :]
        out[start : start + p] = 0.5 * (from_i + from_j)
    return out


# ------------------------------------------------------------------------------------------------
# Measures


def rank_correlation(predicted: np.ndarray, exact: np.ndarray) -> float | None:
    """Spearman's rank correlation; 0 for a constant prediction, None where the exact values are constant."""
    predicted, exact = np.ravel(predicted), np.ravel(exact)
    if exact.size < 2 or np.ptp(exact) == 0:
        return None
    if np.ptp(predicted) == 0:
        return 0.0
    rp, re = _ranks(predicted), _ranks(exact)
    rp, re = rp - rp.mean(), re - re.mean()
    return float((rp @ re) / math.sqrt((rp @ rp) * (re @ re)))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts
    return (starts + (counts - 1) / 2.0)[inverse]


def cross_entropy(exact_log: np.ndarray, model_log: np.ndarray) -> np.ndarray:
    """-sum_y P_exact(y) log Q(y) per row; rows are flattened states, (n,)."""
    p = np.exp(exact_log.reshape(len(exact_log), -1))
    return -(p * model_log.reshape(len(model_log), -1)).sum(axis=1)


def _normalise(log_values: np.ndarray) -> np.ndarray:
    flat = log_values.reshape(len(log_values), -1)
    top = flat.max(axis=1, keepdims=True)
    return (flat - top - np.log(np.exp(flat - top).sum(axis=1, keepdims=True))).reshape(log_values.shape)


def _off_wild_type(values: np.ndarray, wild: list[np.ndarray]) -> np.ndarray:
    """Entries (n, q, ..., q) with every axis away from the row's wild type, flattened per row into one array."""
    keep = np.ones(values.shape, dtype=bool)
    n = np.arange(len(values))
    for axis, w in enumerate(wild, start=1):
        index = [slice(None)] * values.ndim
        index[0], index[axis] = n, w
        keep[tuple(index)] = False
    return values[keep]


def pair_groups(potts: PottsModel, pairs: np.ndarray) -> dict[str, np.ndarray]:
    """Masks (P,) of planted edges, pairs inside a triplet (not planted edges), and pairs no term joins."""
    edges = {(int(i), int(j)) for i, j in potts.edges}
    coupled = coupled_pairs(potts)
    keys = [(int(i), int(j)) for i, j in pairs]
    planted = np.array([k in edges for k in keys], dtype=bool)
    joined = np.array([k in coupled for k in keys], dtype=bool)
    return {"planted": planted, "in_triplet": joined & ~planted, "unplanted": ~joined}


def control_triples(potts: PottsModel, count: int, min_separation: int, seed: int) -> np.ndarray:
    """``count`` site triples (i < j < k, pairwise >= min_separation apart) no term joins at all, drawn with a seed."""
    rng = np.random.default_rng(seed)
    coupled = coupled_pairs(potts)
    out: list[tuple[int, int, int]] = []
    for _ in range(1000 * max(count, 1)):
        if len(out) == count:
            break
        t = tuple(sorted(int(s) for s in rng.choice(potts.length, size=3, replace=False)))
        if (
            t[1] - t[0] >= min_separation
            and t[2] - t[1] >= min_separation
            and t not in out
            and not any(p in coupled for p in itertools.combinations(t, 2))
        ):
            out.append(t)
    return np.array(out, dtype=np.int64).reshape(-1, 3)


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
    exact_pair_eps = np.stack([pair_epistasis(potts, rows, a, b) for a, b in pairs], axis=1)  # (n, P, 20, 20)
    exact_pair_log = np.stack([pair_log_conditional(potts, rows, a, b) for a, b in pairs], axis=1)
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

    if substitution:  # planted pairs and as many pairs no term joins, drawn with the seed
        unplanted = np.flatnonzero(groups["unplanted"])
        sampled = np.random.default_rng(seed).choice(
            unplanted, size=min(len(unplanted), int(groups["planted"].sum())), replace=False
        )
        sub_index = np.sort(np.concatenate([np.flatnonzero(groups["planted"]), sampled]))
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
        result["epistasis"][name] = _pair_epistasis_measures(outs, rows, pairs, groups, exact_pair_eps)
        result["pair_logloss"][name] = _pair_logloss(outs, groups, exact_pair_log)
        if substitution and model.token_head is not None:
            sub = np.stack([substitution_epistasis(model, seq, pairs[sub_index], batch_rows) for seq in rows])
            result["epistasis"][name]["substitution"] = _epistasis_measures(
                sub, rows, pairs[sub_index], sub_groups, exact_pair_eps[:, sub_index]
            )
        if len(triples):
            result["triple_epistasis"][name] = _triple_epistasis_measures(
                outs, rows, pairs, triples, planted_triples, exact_triple_eps
            )
            result["triple_logloss"][name] = _triple_logloss(
                outs, rows, pairs, triples, planted_triples, exact_triple_log
            )
    return result


def predicted_pair_epistasis(out: SequenceOutputs, sequence: np.ndarray, pairs: np.ndarray) -> dict[str, np.ndarray]:
    """``score`` and ``joint`` epistasis (P, 20, 20) of one sequence (zeros without a pair joint)."""
    wi, wj = sequence[pairs[:, 0]], sequence[pairs[:, 1]]
    if out.pair_joint is None:
        zero = np.zeros((len(pairs), Q, Q))
        return {"score": zero, "joint": zero}
    n = np.arange(len(pairs))
    single_i = out.singles[pairs[:, 0]] - out.singles[pairs[:, 0], wi][:, None]  # (P, 20)
    single_j = out.singles[pairs[:, 1]] - out.singles[pairs[:, 1], wj][:, None]
    double = out.pair_joint - out.pair_joint[n, wi, wj][:, None, None]
    return {
        "score": double - single_i[:, :, None] - single_j[:, None, :],
        "joint": double_difference(out.pair_joint, wi, wj),
    }


def _pair_epistasis_measures(outs, rows, pairs, groups, exact) -> dict:
    return {
        kind: _epistasis_measures(
            np.stack([predicted_pair_epistasis(o, seq, pairs)[kind] for o, seq in zip(outs, rows)]),
            rows,
            pairs,
            groups,
            exact,
        )
        for kind in ("score", "joint")
    }


def _epistasis_measures(values: np.ndarray, rows: np.ndarray, pairs: np.ndarray, groups: dict, exact: np.ndarray):
    """Rank correlation and mean |epistasis| of predicted values (n, P, 20, 20) against exact ones, per group."""
    wild = [rows[:, pairs[:, 0]], rows[:, pairs[:, 1]]]  # (n, P) each

    def off_wt(table: np.ndarray, mask: np.ndarray) -> np.ndarray:
        flat = table[:, mask].reshape(-1, Q, Q)
        return _off_wild_type(flat, [w[:, mask].ravel() for w in wild])

    every = np.ones(len(pairs), dtype=bool)
    m = {"spearman_all": rank_correlation(off_wt(values, every), off_wt(exact, every))}
    for group, mask in groups.items():
        if not mask.any():
            continue
        p, e = off_wt(values, mask), off_wt(exact, mask)
        m[f"spearman_{group}"] = rank_correlation(p, e)
        m[f"mean_abs_{group}"] = float(np.abs(p).mean())
        m[f"exact_mean_abs_{group}"] = float(np.abs(e).mean())
    return m


def _group_losses(exact_log: np.ndarray, model_log: np.ndarray, masks: dict[str, np.ndarray]) -> dict:
    """Mean CE, exact entropy and gap per group of (n, P, ...) distributions."""
    n, count = exact_log.shape[:2]
    flat_exact = exact_log.reshape(n * count, -1)
    ce = cross_entropy(flat_exact, model_log.reshape(n * count, -1)).reshape(n, count)
    entropy = cross_entropy(flat_exact, flat_exact).reshape(n, count)
    out = {}
    for group, mask in masks.items():
        if mask.any():
            out[group] = {
                "ce": float(ce[:, mask].mean()),
                "entropy": float(entropy[:, mask].mean()),
                "gap": float((ce - entropy)[:, mask].mean()),
            }
    return out


def _pair_logloss(outs, groups, exact_log) -> dict:
    out = {}
    if outs[0].pair_joint is not None:
        out["joint"] = _group_losses(exact_log, np.stack([o.pair_joint for o in outs]), groups)
    if outs[0].pair_marginals is not None:
        marg = np.stack([o.pair_marginals for o in outs])  # (n, P, 2, 20)
        out["product"] = _group_losses(exact_log, marg[:, :, 0, :, None] + marg[:, :, 1, None, :], groups)
    return out


def _pair_index(pairs: np.ndarray) -> dict[tuple[int, int], int]:
    return {(int(a), int(b)): k for k, (a, b) in enumerate(pairs)}


def pairwise_triple_composition(
    out: SequenceOutputs, sequence: np.ndarray, pairs: np.ndarray, triples: np.ndarray
) -> np.ndarray | None:
    """log Q(a, b, c) of each triple from singles and the three pair epistases (``score``), normalised,
    (T, 20, 20, 20); None without a pair joint."""
    if out.pair_joint is None:
        return None
    eps = predicted_pair_epistasis(out, sequence, pairs)["score"]
    index = _pair_index(pairs)
    s = out.singles
    logits = []
    for i, j, k in triples:
        value = s[i][:, None, None] + s[j][None, :, None] + s[k][None, None, :]
        value = value + eps[index[(i, j)]][:, :, None] + eps[index[(i, k)]][:, None, :] + eps[index[(j, k)]][None]
        logits.append(value)
    return _normalise(np.stack(logits))


def _triple_epistasis_measures(outs, rows, pairs, triples, planted, exact) -> dict:
    wild = [rows[:, triples[:, s]] for s in range(3)]  # (n, T) each
    if outs[0].triple_joint is None:
        pred = np.zeros_like(exact)
    else:
        pred = np.stack(
            [triple_difference(o.triple_joint, *(seq[triples[:, s]] for s in range(3))) for o, seq in zip(outs, rows)]
        )
    out = {}
    for group, mask in (("planted", planted), ("control", ~planted)):
        if mask.any():
            flat_p = pred[:, mask].reshape(-1, Q, Q, Q)
            flat_e = exact[:, mask].reshape(-1, Q, Q, Q)
            w = [x[:, mask].ravel() for x in wild]
            p, e = _off_wild_type(flat_p, w), _off_wild_type(flat_e, w)
            out[f"spearman_{group}"] = rank_correlation(p, e)
            out[f"mean_abs_{group}"] = float(np.abs(p).mean())
            out[f"exact_mean_abs_{group}"] = float(np.abs(e).mean())
    return out


def _triple_logloss(outs, rows, pairs, triples, planted, exact_log) -> dict:
    masks = {"planted": planted, "control": ~planted}
    out = {}
    if outs[0].triple_joint is not None:
        out["joint"] = _group_losses(exact_log, np.stack([o.triple_joint for o in outs]), masks)
    composed = [pairwise_triple_composition(o, seq, pairs, triples) for o, seq in zip(outs, rows)]
    if composed[0] is not None:
        out["pairs"] = _group_losses(exact_log, np.stack(composed), masks)
    if outs[0].triple_marginals is not None:
        m = np.stack([o.triple_marginals for o in outs])  # (n, T, 3, 20)
        product = m[:, :, 0, :, None, None] + m[:, :, 1, None, :, None] + m[:, :, 2, None, None, :]
        out["product"] = _group_losses(exact_log, product, masks)
    return out


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
