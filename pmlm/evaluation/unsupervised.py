"""Contact scores without fine-tuning: dependence measures on a pair model's joint
distribution P(x_i, x_j), average-product correction, and an MSA mutual-information baseline.

The joint/marginal functions accept numpy arrays or torch tensors and return the same kind,
so validation code can call them on model outputs directly. Pair classes follow the pair
head's layout: class index ``a * NUM_RESIDUES + b`` is (x_i = a, x_j = b), residue classes
as in ``pmlm.alphabet`` (token id - FIRST_RESIDUE_ID).
"""

from __future__ import annotations

import numpy as np

from pmlm.alphabet import NUM_PAIR_CLASSES, NUM_RESIDUES

# Floor under probabilities before a log: keeps KL finite when the joint puts (numerically)
# zero mass where the product of marginals does not.
DEFAULT_EPS = 1e-12
# MSA states: the 20 residue classes plus one state for gaps and anything else.
GAP_STATE = NUM_RESIDUES
NUM_MSA_STATES = NUM_RESIDUES + 1
# Pseudocount weight lambda as in mean-field DCA (Morcos et al. 2011): f = (1-l) f_obs + l/q.
DEFAULT_PSEUDOCOUNT = 0.5
# Sequences at >= this fraction of identical columns share their weight (Morcos et al. 2011).
DEFAULT_REWEIGHT_IDENTITY = 0.8
# Upper bound on the temporary (block, q, L, q) pair-count array, in float64 elements.
_PAIR_BLOCK_ELEMENTS = 8_000_000


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _log(x):
    return x.log() if _is_torch(x) else np.log(x)


def _floor(x, eps: float):
    return x.clamp_min(eps) if _is_torch(x) else np.maximum(x, eps)


def as_joint(joint):
    """(..., 400) pair-head probabilities -> (..., 20, 20); (..., 20, 20) passes through."""
    shape = tuple(joint.shape)
    if shape[-2:] == (NUM_RESIDUES, NUM_RESIDUES):
        return joint
    if shape[-1:] == (NUM_PAIR_CLASSES,):
        return joint.reshape(*shape[:-1], NUM_RESIDUES, NUM_RESIDUES)
    raise ValueError(f"joint must end in ({NUM_RESIDUES}, {NUM_RESIDUES}) or ({NUM_PAIR_CLASSES},), got shape {shape}")


def _normalised(p, axes):
    # softmax outputs already sum to 1; renormalising also accepts a marginal taken from a
    # head with extra classes (e.g. X) restricted to the 20 residues
    return p / p.sum(axis=axes, keepdims=True)


def kl_independence(joint, p_i=None, p_j=None, *, eps: float = DEFAULT_EPS):
    """KL(P(x_i) P(x_j) || P(x_i, x_j)) in nats, over the trailing class axes.

    joint: (..., 20, 20) or (..., 400); p_i, p_j: (..., 20) marginals (e.g. from the token
    head); when omitted they are the joint's own row / column sums. Returns (...).
    Zero iff the joint equals the product of the marginals.
    """
    joint = _normalised(as_joint(joint), (-2, -1))
    p_i = joint.sum(axis=-1) if p_i is None else _normalised(p_i, (-1,))
    p_j = joint.sum(axis=-2) if p_j is None else _normalised(p_j, (-1,))
    product = p_i[..., :, None] * p_j[..., None, :]  # (..., 20, 20)
    ratio = _floor(product, eps) / _floor(joint, eps)
    return (product * _log(ratio)).sum(axis=(-2, -1))


def mutual_information(joint, *, eps: float = DEFAULT_EPS):
    """Mutual information of a joint P(x_i, x_j) in nats: KL(P(x_i, x_j) || P(x_i) P(x_j)),
    marginals taken from the joint itself. joint: (..., 20, 20) or (..., 400) -> (...)."""
    joint = _normalised(as_joint(joint), (-2, -1))
    product = joint.sum(axis=-1)[..., :, None] * joint.sum(axis=-2)[..., None, :]  # (..., 20, 20)
    return (joint * _log(_floor(joint, eps) / _floor(product, eps))).sum(axis=(-2, -1))


def symmetrize(matrix):
    """(..., L, L) -> (M + M^T) / 2 over the last two axes."""
    return (matrix + matrix.swapaxes(-1, -2)) / 2


def _off_diagonal(matrix):
    length = matrix.shape[-1]
    if _is_torch(matrix):
        import torch

        eye = torch.eye(length, dtype=torch.bool, device=matrix.device)
        return matrix.masked_fill(eye, 0)
    return np.where(np.eye(length, dtype=bool), 0.0, matrix)


def apc(matrix, *, exclude_diagonal: bool = True):
    """Average-product correction over the last two axes: M_ij - mean_i * mean_j / mean.

    exclude_diagonal=True (the default; Dunn et al. 2008): the diagonal carries no pair
    information, so row, column and overall means run over the L - 1 (resp. L(L-1))
    off-diagonal entries, and the output diagonal is 0. exclude_diagonal=False is the
    sum-based form ESM applies to attention maps (M_ij - a_i a_j / a, diagonal included).
    An all-zero input returns zeros (no correction where the mean is 0).
    """
    length = matrix.shape[-1]
    if matrix.shape[-2] != length:
        raise ValueError(f"apc needs square matrices, got shape {tuple(matrix.shape)}")
    if exclude_diagonal:
        if length < 2:
            return matrix * 0
        matrix = _off_diagonal(matrix)
        row = matrix.sum(axis=-1, keepdims=True) / (length - 1)  # (..., L, 1)
        col = matrix.sum(axis=-2, keepdims=True) / (length - 1)  # (..., 1, L)
        mean = matrix.sum(axis=(-2, -1), keepdims=True) / (length * (length - 1))
    else:
        row = matrix.sum(axis=-1, keepdims=True)
        col = matrix.sum(axis=-2, keepdims=True)
        mean = matrix.sum(axis=(-2, -1), keepdims=True)
    safe_mean = mean + (mean == 0)  # the correction is 0 wherever the mean is 0
    corrected = matrix - row * col / safe_mean
    return _off_diagonal(corrected) if exclude_diagonal else corrected


def contact_scores_from_joint(joint, p=None, *, measure: str = "kl", use_apc: bool = True, eps: float = DEFAULT_EPS):
    """Unsupervised contact scores (L, L) from a pair model's joints for all pairs.

    joint: (L, L, 20, 20) or (L, L, 400), joint[i, j] = P(x_i, x_j); p: optional (L, 20)
    token-head marginals used by ``measure="kl"``; measure "kl" (the paper's
    KL(P(x_i)P(x_j) || P(x_i, x_j))) or "mi". Symmetrised, diagonal zeroed, then APC.
    """
    joint = as_joint(joint)
    if measure == "kl":
        p_i = None if p is None else p[:, None, :]  # (L, 1, 20)
        p_j = None if p is None else p[None, :, :]  # (1, L, 20)
        scores = kl_independence(joint, p_i, p_j, eps=eps)
    elif measure == "mi":
        scores = mutual_information(joint, eps=eps)
    else:
        raise ValueError(f"measure must be 'kl' or 'mi', got {measure!r}")
    scores = _off_diagonal(symmetrize(scores))  # (L, L)
    return apc(scores) if use_apc else scores


def _msa_one_hot(msa: np.ndarray) -> np.ndarray:
    """(N, L) residue classes, -1 or GAP_STATE for gaps -> (N, L, q) float64 one-hot."""
    states = np.where(msa < 0, GAP_STATE, msa)
    return np.eye(NUM_MSA_STATES)[states]


def sequence_weights(msa, identity: float = DEFAULT_REWEIGHT_IDENTITY) -> np.ndarray:
    """(N,) weights 1 / #{m : identity(n, m) >= threshold}, identity = fraction of identical
    columns (gaps match gaps). Down-weights clusters of near-identical sequences."""
    msa = _check_msa(msa)
    n_seq, length = msa.shape
    one_hot = _msa_one_hot(msa).reshape(n_seq, -1).astype(np.float32)  # (N, L*q)
    neighbours = np.zeros(n_seq)
    chunk = max(1, _PAIR_BLOCK_ELEMENTS // max(n_seq, 1))
    for start in range(0, n_seq, chunk):
        same = one_hot[start:start + chunk] @ one_hot.T  # (c, N) identical columns
        neighbours[start:start + chunk] = (same >= identity * length - 1e-6).sum(axis=1)
    return 1.0 / neighbours


def _check_msa(msa) -> np.ndarray:
    msa = np.asarray(msa)
    if msa.ndim != 2 or msa.shape[0] == 0 or msa.shape[1] == 0:
        raise ValueError(f"msa must be a non-empty (N, L) integer array, got shape {msa.shape}")
    if not np.issubdtype(msa.dtype, np.integer):
        raise ValueError(f"msa must hold integer residue classes, got dtype {msa.dtype}")
    if msa.min() < -1 or msa.max() > GAP_STATE:
        raise ValueError(f"msa values must be residue classes 0..{NUM_RESIDUES - 1}, or -1 / {GAP_STATE} for a gap")
    return msa.astype(np.int64)


def msa_mi_apc(
    msa,
    *,
    pseudocount: float = DEFAULT_PSEUDOCOUNT,
    reweight_identity: float | None = DEFAULT_REWEIGHT_IDENTITY,
) -> np.ndarray:
    """MSA baseline: APC-corrected mutual information between columns, (L, L) scores.

    msa: (N, L) residue classes 0..19, -1 (or 20) for gaps and other symbols, which form a
    21st state. Frequencies are weighted (``reweight_identity=None`` gives every sequence
    weight 1) and mixed with a uniform pseudocount: f_i = (1-l) f_i_obs + l/q,
    f_ij = (1-l) f_ij_obs + l/q^2, which keeps f_ij's marginals equal to f_i. Diagonal 0.
    """
    msa = _check_msa(msa)
    if not 0.0 <= pseudocount < 1.0:
        raise ValueError(f"pseudocount must be in [0, 1), got {pseudocount}")
    n_seq, length = msa.shape
    q = NUM_MSA_STATES
    weights = np.ones(n_seq) if reweight_identity is None else sequence_weights(msa, reweight_identity)
    weights = weights / weights.sum()
    one_hot = _msa_one_hot(msa)  # (N, L, q)
    f_i = (1 - pseudocount) * np.einsum("n,nla->la", weights, one_hot) + pseudocount / q  # (L, q)
    flat = one_hot.reshape(n_seq, length * q)  # (N, L*q)
    weighted = flat * weights[:, None]
    mi = np.zeros((length, length))
    block = max(1, _PAIR_BLOCK_ELEMENTS // (q * length * q))
    for start in range(0, length, block):
        stop = min(length, start + block)
        counts = weighted[:, start * q:stop * q].T @ flat  # (b*q, L*q) weighted pair frequencies
        f_ij = (1 - pseudocount) * counts.reshape(stop - start, q, length, q) + pseudocount / q**2  # (b, q, L, q)
        expected = f_i[start:stop, :, None, None] * f_i[None, None, :, :]  # (b, q, L, q)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(f_ij > 0, f_ij * np.log(f_ij / expected), 0.0)
        mi[start:stop] = terms.sum(axis=(1, 3))
    return apc(mi)
