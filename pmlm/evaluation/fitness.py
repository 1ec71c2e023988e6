"""How well a mutation-effect score ranks measured fitness, with ProteinGym's definitions of each metric.

ProteinGym's zero-shot DMS benchmark (OATML-Markslab/ProteinGym, ``proteingym/performance_DMS_benchmarks.py``)
scores a predictor on one assay by:

* Spearman's rank correlation of the score with ``DMS_score`` (ties share their average rank);
* AUC of the score against ``DMS_score_bin`` (area under the ROC curve; tied scores count one half);
* MCC of ``score >= median(score)`` against ``DMS_score_bin`` (0 when a margin of the confusion table is empty);
* NDCG at the top 10 %: ``k = floor(n / 10)``, gains the min-max scaled ``DMS_score``, the discounted gain
  ``sum gain / log2(rank + 1)`` of the k best-scored mutants over that of the k fittest, and 0 when no mutant
  with a non-zero gain is among the k best-scored.

Ties in a ranking (NDCG's top k) are broken by input order here (a stable sort); ProteinGym's unstable
``argsort`` leaves that order unspecified. Every function takes plain arrays and returns a float (NaN where
the metric is undefined: fewer than two mutants, a constant vector, one class only).
"""

from __future__ import annotations

import math

import numpy as np

NDCG_TOP_PERCENT = 10
PERMUTATION_ENTRIES = 1 << 22  # permutations drawn and scored at once: at most this many indices (32 MiB)


def _vector(x, name: str) -> np.ndarray:
    out = np.asarray(x, dtype=np.float64).ravel()
    if not np.isfinite(out).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return out


def average_ranks(x) -> np.ndarray:
    """1-based ranks of ``x`` (ascending), tied values sharing the mean of their ranks."""
    x = _vector(x, "values")
    n = x.size
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    new = np.r_[True, ordered[1:] != ordered[:-1]] if n else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], n]  # exclusive
    group_rank = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts + 1 .. ends
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = group_rank[np.cumsum(new) - 1]
    return ranks


def _centred_ranks(x) -> np.ndarray:
    r = average_ranks(x)
    return r - r.mean()


def spearman(y_true, y_score) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks; NaN when either side is constant."""
    a, b = _centred_ranks(y_true), _centred_ranks(y_score)
    if a.size != b.size:
        raise ValueError(f"{a.size} measured values but {b.size} scores")
    denom = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / denom if denom > 0 else float("nan")


def spearman_permutation_p(y_true, y_score, permutations: int, seed: int = 0):
    """One-sided permutation p-value of Spearman's rho > 0: ``(1 + #{rho_perm >= rho}) / (1 + permutations)``,
    the measurements shuffled against the scores (so the smallest possible value is 1 / (1 + permutations)).
    ``y_score`` (n,) gives a float; (n, k), k scorers tested on the same shuffles, an array of k p-values."""
    a = _centred_ranks(y_true)
    scores = np.asarray(y_score, dtype=np.float64)
    single = scores.ndim == 1
    b = np.stack([_centred_ranks(column) for column in scores.reshape(a.size, -1).T], axis=1)  # (n, k)
    if a.size < 2 or permutations < 1:
        return float("nan") if single else np.full(b.shape[1], np.nan)
    observed = a @ b  # (k,)
    # sums of the same terms in another order differ by rounding only: count those as ties, not as below
    slack = 1e-9 * (np.abs(a) @ np.abs(b))
    rng = np.random.default_rng(seed)
    at_least = np.zeros(b.shape[1], dtype=np.int64)
    block = max(1, PERMUTATION_ENTRIES // a.size)
    for start in range(0, permutations, block):
        count = min(block, permutations - start)
        shuffled = rng.permuted(np.broadcast_to(np.arange(a.size), (count, a.size)), axis=1)  # (count, n)
        at_least += (a[shuffled] @ b >= observed - slack).sum(axis=0)
    p = (1 + at_least) / (1 + permutations)
    return float(p[0]) if single else p


def _labels(labels, n: int) -> np.ndarray:
    y = _vector(labels, "labels")
    if y.size != n:
        raise ValueError(f"{y.size} labels but {n} scores")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    return y.astype(bool)


def roc_auc(labels, y_score) -> float:
    """Area under the ROC curve of ``y_score`` for the positive class (label 1): the Mann-Whitney U statistic
    over n1 * n0, ties counting one half; NaN unless both classes occur."""
    score = _vector(y_score, "scores")
    y = _labels(labels, score.size)
    n1 = int(y.sum())
    n0 = y.size - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    ranks = average_ranks(score)
    return (float(ranks[y].sum()) - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def mcc_at_median(labels, y_score) -> float:
    """Matthews correlation of the prediction ``y_score >= median(y_score)`` with ``labels``; 0 when a margin of
    the confusion table is empty (scikit-learn's convention, which ProteinGym calls)."""
    score = _vector(y_score, "scores")
    y = _labels(labels, score.size)
    if y.size == 0:
        return float("nan")
    pred = score >= np.median(score)
    tp = float((pred & y).sum())
    tn = float((~pred & ~y).sum())
    fp = float((pred & ~y).sum())
    fn = float((~pred & y).sum())
    denom = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denom if denom > 0 else 0.0


def _dcg_top(gains: np.ndarray, order_key: np.ndarray, k: int) -> tuple[float, int]:
    """Discounted gain of the k entries ranked first by ``order_key`` (descending, ties by input order), and how
    many of them have a non-zero gain."""
    ranks = np.empty(gains.size, dtype=np.int64)
    ranks[np.argsort(-order_key, kind="stable")] = np.arange(1, gains.size + 1)
    top = (ranks <= k) & (gains != 0)
    return float((gains[top] / np.log2(ranks[top] + 1.0)).sum()), int(top.sum())


def ndcg(y_true, y_score, top_percent: float = NDCG_TOP_PERCENT) -> float:
    """ProteinGym's NDCG: gains are min-max scaled measurements, the top ``floor(n * top_percent / 100)`` ranks
    count; 0 when none of the best-scored top has a non-zero gain, NaN when the measurements are constant."""
    true, score = _vector(y_true, "measurements"), _vector(y_score, "scores")
    if true.size != score.size:
        raise ValueError(f"{true.size} measured values but {score.size} scores")
    if true.size == 0:
        return float("nan")
    span = float(true.max() - true.min())
    if span == 0:
        return float("nan")
    gains = (true - true.min()) / span
    k = math.floor(true.size * top_percent / 100.0)
    dcg, hits = _dcg_top(gains, score, k)
    if hits == 0:
        return 0.0
    ideal, _ = _dcg_top(gains, gains, k)
    return dcg / ideal


def fitness_metrics(dms_score, dms_bin, y_score) -> dict[str, float]:
    """Spearman, AUC, MCC and NDCG of one score on one set of mutants (NaN for fewer than two mutants)."""
    if len(y_score) < 2:
        return {"spearman": float("nan"), "auc": float("nan"), "mcc": float("nan"), "ndcg": float("nan")}
    return {
        "spearman": spearman(dms_score, y_score),
        "auc": roc_auc(dms_bin, y_score),
        "mcc": mcc_at_median(dms_bin, y_score),
        "ndcg": ndcg(dms_score, y_score),
    }
