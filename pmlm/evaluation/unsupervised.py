"""Contact scores without fine-tuning, the one MI / APC stack: dependence measures on a joint
distribution P(x_i, x_j) (a pair model's, or an MSA's column-pair frequencies), symmetrisation,
average-product correction, and the MSA baseline built from them (MI + APC of the columns).

The joint/marginal functions accept numpy arrays or torch tensors and return the same kind,
so validation code can call them on model outputs directly. Pair classes follow the pair
head's layout: class index ``a * NUM_RESIDUES + b`` is (x_i = a, x_j = b), residue classes
as in ``pmlm.alphabet`` (token id - FIRST_RESIDUE_ID). The MSA baseline works on the same 20
residue classes as the pair head (the paper's |V_res|^2 = 400 joint), one state per residue,
every sequence weight 1: the families it serves are independent samples without gaps.
"""

from __future__ import annotations

import numpy as np

from pmlm.alphabet import NUM_PAIR_CLASSES, NUM_RESIDUES

# Floor under probabilities before a log: keeps KL finite when the joint puts (numerically)
# zero mass where the product of marginals does not.
DEFAULT_EPS = 1e-12
# Weight of the uniform distribution mixed into MSA frequencies: f = (1 - l) f_obs + l / 20.
DEFAULT_PSEUDOCOUNT = 0.01
# Rows of the (block, L, 20, 20) pair-frequency array the MSA baseline holds at once.
DEFAULT_BLOCK = 32


def _is_torch(x) -> bool:
    # by module name, so numpy-only callers (the MSA baseline of `pmlm synth`) never load torch
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


def _off_diagonal(matrix):
    length = matrix.shape[-1]
    if _is_torch(matrix):
        eye = matrix.new_ones(length).diag().bool()  # (L, L) on the matrix's device, no torch import
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


# ------------------------------------------------------------------------------------------------
# MSA statistics and the MSA baseline


def _one_hot(sequences: np.ndarray) -> np.ndarray:
    x = np.asarray(sequences, dtype=np.int64)  # (N, L)
    if x.ndim != 2 or x.size == 0:
        raise ValueError(f"sequences must be a non-empty (N, L) array of residue classes, got shape {x.shape}")
    if x.min() < 0 or x.max() >= NUM_RESIDUES:
        raise ValueError(f"residue classes must be in [0, {NUM_RESIDUES}), got [{x.min()}, {x.max()}]")
    # float32 keeps co-occurrence counts exact (below 2**24 sequences) at twice the matmul speed
    out = np.zeros((*x.shape, NUM_RESIDUES), dtype=np.float32)
    np.put_along_axis(out, x[..., None], 1.0, axis=-1)
    return out  # (N, L, 20)


def _check_pseudocount(pseudocount: float) -> None:
    if not 0.0 <= pseudocount <= 1.0:
        raise ValueError(f"pseudocount must be in [0, 1], got {pseudocount}")


def _pair_block(flat: np.ndarray, start: int, stop: int, pseudocount: float) -> np.ndarray:
    """Rows [start, stop) of the pair frequencies, (b, L, 20, 20), from the (N, L*20) one-hot."""
    n, length = flat.shape[0], flat.shape[1] // NUM_RESIDUES
    f = (flat[:, start * NUM_RESIDUES : stop * NUM_RESIDUES].T @ flat).astype(np.float64) / n
    f = f.reshape(stop - start, NUM_RESIDUES, length, NUM_RESIDUES).transpose(0, 2, 1, 3)
    return (1.0 - pseudocount) * f + pseudocount / NUM_RESIDUES**2


def msa_mutual_information(
    sequences: np.ndarray, pseudocount: float = DEFAULT_PSEUDOCOUNT, block: int = DEFAULT_BLOCK
) -> np.ndarray:
    """(L, L) mutual information between the columns of an alignment (nats), diagonal 0: the
    joint :func:`mutual_information` of each column pair's frequencies f_ij(a, b), mixed with the
    uniform distribution over the 400 states at weight ``pseudocount``. ``block`` rows at a time,
    so memory stays O(block * L * 400) for long families."""
    _check_pseudocount(pseudocount)
    oh = _one_hot(sequences)  # (N, L, 20)
    length = oh.shape[1]
    flat = oh.reshape(oh.shape[0], -1)
    mi = np.zeros((length, length))
    for start in range(0, length, block):
        stop = min(start + block, length)
        mi[start:stop] = mutual_information(_pair_block(flat, start, stop, pseudocount))  # (b, L)
    np.fill_diagonal(mi, 0.0)
    return mi


def msa_mi_apc(sequences: np.ndarray, pseudocount: float = DEFAULT_PSEUDOCOUNT) -> np.ndarray:
    """The MSA baseline: column mutual information with average-product correction, (L, L)."""
    return apc(msa_mutual_information(sequences, pseudocount))
