"""The pair read-out: a model's joint P(x_i, x_j) for pairs of one sequence, and its departure from
independence, KL(P(x_i) P(x_j) || P(x_i, x_j)) (the paper's measure) and the joint's mutual information.

One home for the KL histogram (``pmlm kl``), the unsupervised contacts (``pmlm evaluate --head
pair-kl|pair-mi``, ``pmlm contacts`` without a head: ``unsupervised_contact_scores``) and the co-evolution
study. Two ways to get the joint:

* ``mask_pairs=True``: one copy of the sequence per pair with exactly i and j set to <mask>, as in
  pre-training, so the joint and the marginals condition on the same context X_/{i,j};
* ``mask_pairs=False``: one forward pass of the unmasked sequence, the pair head read at every
  pair (one pass per protein instead of one per pair).

Marginals come from the token head at the same positions; a model without one (pair-only) takes
the joint's own row and column sums, as its MLM marginal comes from the pair head too. Pairs are
(P, 2) residue indices (i, j) of the sequence, i < j.
"""

from __future__ import annotations

import numpy as np
import torch

from pmlm import alphabet
from pmlm.evaluation.unsupervised import apc, kl_independence, mutual_information
from pmlm.model.symmetry import symmetrize
from pmlm.tokens import RESIDUE_OFFSET, batch_tokens, token_positions


def residue_joint(pair_logits: torch.Tensor) -> torch.Tensor:
    """Pair-head logits -> (P, 20, 20) joint over standard residues (also for the 'full' vocabulary, renormalised
    over the standard-residue block)."""
    k = pair_logits.shape[-1]
    if k == alphabet.NUM_PAIR_CLASSES:
        return torch.softmax(pair_logits, dim=-1).reshape(-1, alphabet.NUM_RESIDUES, alphabet.NUM_RESIDUES)
    if k == alphabet.NUM_FULL_PAIR_CLASSES:
        side = alphabet.FULL_PAIR_SIDE
        full = torch.softmax(pair_logits, dim=-1).reshape(-1, side, side)
        lo, hi = alphabet.FIRST_RESIDUE_ID, alphabet.FIRST_RESIDUE_ID + alphabet.NUM_RESIDUES
        sub = full[:, lo:hi, lo:hi]
        return sub / sub.sum(dim=(-2, -1), keepdim=True)
    raise ValueError(f"unexpected number of pair classes {k}")


# the dependence measures of a joint: the paper's KL from independence and the joint's mutual information
KL = "kl"
MI = "mi"
MEASURES = (KL, MI)


def joint_dependence(
    joint: torch.Tensor, p_i: torch.Tensor | None, p_j: torch.Tensor | None, measures: tuple[str, ...] = MEASURES
) -> dict:
    """The ``measures`` (``kl``, ``mi``: (P,) each) of joints (P, 20, 20); marginals (P, 20) or None for the
    joint's own. Only the measures asked for are computed: each costs about as much as the pair head's read-out."""
    unknown = sorted(set(measures) - set(MEASURES))
    if unknown:
        raise ValueError(f"unknown dependence measure(s) {unknown}: choose from {list(MEASURES)}")
    out = {}
    if KL in measures:
        out[KL] = kl_independence(joint, p_i, p_j)
    if MI in measures:
        out[MI] = mutual_information(joint)
    return out


def all_pairs(length: int) -> np.ndarray:
    """Every unordered pair (i, j), i < j, of a sequence of ``length`` residues, (P, 2), row-major."""
    i, j = np.triu_indices(length, k=1)
    return np.stack([i, j], axis=1)


def sequence_row(residues: np.ndarray) -> torch.Tensor:
    """(L,) residue token ids -> (L + 2,) int64 tokens <cls> residues <eos>."""
    return torch.from_numpy(batch_tokens([residues]).tokens[0])


def masked_copies(tokens: torch.Tensor, pairs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One copy of ``tokens`` (T,) per pair with exactly that pair set to <mask>: (P, T), and the
    pairs' token positions i, j (P,) each."""
    pos_i = torch.as_tensor(token_positions(pairs[:, 0]))
    pos_j = torch.as_tensor(token_positions(pairs[:, 1]))
    rows = torch.arange(len(pairs))
    copies = tokens.repeat(len(pairs), 1)  # (P, T)
    copies[rows, pos_i] = alphabet.MASK_ID
    copies[rows, pos_j] = alphabet.MASK_ID
    return copies, pos_i, pos_j


def pair_positions(rows: int, pos_i: torch.Tensor, pos_j: torch.Tensor, length: int) -> torch.Tensor:
    """(rows, T) bool selecting token positions i and j of each row (the token head then scores only those)."""
    selected = torch.zeros(rows, length, dtype=torch.bool)
    selected[torch.arange(rows), pos_i] = True
    selected[torch.arange(rows), pos_j] = True
    return selected


def _masked_chunk(model, tokens, chunk, mirror, device) -> tuple:
    """Exactly the pair masked, one copy per pair: (joints of the given orders, then the swaps; p_i; p_j)."""
    copies, pos_i, pos_j = masked_copies(tokens, chunk)  # (p, T)
    n = len(chunk)
    rows = torch.arange(n)
    has_token_head = model.token_head is not None
    selected = pair_positions(n, pos_i, pos_j, copies.shape[1]) if has_token_head else None
    out = model(
        copies.to(device),
        pair_index=torch.stack([rows, pos_i, pos_j], dim=1).to(device),
        token_positions=None if selected is None else selected.to(device),
        mirror_pairs=mirror,
    )
    joint = residue_joint(out["pair_logits"].float())  # (p, 20, 20), or (2p, 20, 20) mirrored
    p_i = p_j = None
    if has_token_head:
        # row-major selection and i < j: each row's two logits are (i, j) in that order
        marginals = torch.softmax(out["logits"].float(), dim=-1).view(n, 2, alphabet.NUM_RESIDUES)
        p_i, p_j = marginals[:, 0], marginals[:, 1]
    return joint, p_i, p_j


def _unmasked_chunk(model, reps, p, chunk, mirror, device) -> tuple:
    """The pair head read at the given pairs of one unmasked pass (``reps`` (1, T, C)), as ``_masked_chunk``."""
    i = torch.as_tensor(chunk[:, 0], device=device)
    j = torch.as_tensor(chunk[:, 1], device=device)
    index = torch.stack([torch.zeros_like(i), i + RESIDUE_OFFSET, j + RESIDUE_OFFSET], dim=1)  # (p, 3)
    logits, _ = model.pair_head(reps, index, mirror=mirror)
    joint = residue_joint(logits.float())  # (p, 20, 20), or (2p, 20, 20) mirrored
    return joint, None if p is None else p[i], None if p is None else p[j]


@torch.no_grad()
def pair_dependence(
    model,
    residues: np.ndarray,
    pairs: np.ndarray,
    *,
    mask_pairs: bool = True,
    mirror: bool = False,
    batch_pairs: int = 4096,
    device="cpu",
    measures: tuple[str, ...] = MEASURES,
) -> dict[str, torch.Tensor]:
    """KL(P(x_i) P(x_j) || P(x_i, x_j)) and the joint's mutual information for each pair (i, j) of
    one sequence (``residues`` (L,) token ids), as float32 CPU tensors ``kl`` and ``mi``, (P,): those of
    ``measures`` only.

    ``mirror=True`` also reads the swapped order (j, i) from the same forward pass: the outputs are
    then (2P,), the given orders first. ``batch_pairs`` pairs go through the model at once.
    """
    if model.pair_head is None:
        raise ValueError("the pair read-out needs a model with a pair head (objective pmlm)")
    tokens = sequence_row(residues)  # (T,)
    if not mask_pairs:
        reps = model.encode(tokens[None].to(device))  # (1, T, C)
        length = int(residues.size)
        p = None
        if model.token_head is not None:
            p = torch.softmax(model.token_head(reps[0, RESIDUE_OFFSET : RESIDUE_OFFSET + length]).float(), dim=-1)
    given: list[dict] = []
    swapped: list[dict] = []
    for start in range(0, len(pairs), batch_pairs):
        chunk = pairs[start : start + batch_pairs]
        if mask_pairs:
            joint, p_i, p_j = _masked_chunk(model, tokens, chunk, mirror, device)
        else:
            joint, p_i, p_j = _unmasked_chunk(model, reps, p, chunk, mirror, device)
        given.append(joint_dependence(joint[: len(chunk)], p_i, p_j, measures))
        if mirror:
            swapped.append(joint_dependence(joint[len(chunk) :], p_j, p_i, measures))
    return {key: torch.cat([part[key].cpu() for part in given + swapped]) for key in MEASURES if key in measures}


def unsupervised_contact_scores(
    model, residues: np.ndarray, measure: str, *, mask_pairs: bool = False, pair_batch: int = 4096, device="cpu"
) -> np.ndarray:
    """(L, L) unsupervised contact scores of one sequence from the pair head's joints: ``measure`` (``kl`` or
    ``mi``, see ``pair_dependence``) of both orders of every pair i < j, symmetrised, then APC (which zeroes the
    diagonal). The read-out of ``pmlm evaluate --head pair-kl|pair-mi``, ``pmlm contacts`` and the report."""
    length = int(residues.size)
    pairs = all_pairs(length)  # (P, 2) rows (i, j), i < j
    values = pair_dependence(
        model,
        residues,
        pairs,
        mask_pairs=mask_pairs,
        mirror=True,
        batch_pairs=pair_batch,
        device=device,
        measures=(measure,),
    )[measure].double()  # (2P,): the (i, j) orders, then (j, i)
    scores = torch.zeros(length, length, dtype=torch.float64)
    i, j = torch.from_numpy(pairs[:, 0]), torch.from_numpy(pairs[:, 1])
    scores[i, j] = values[: len(pairs)]
    scores[j, i] = values[len(pairs) :]
    return apc(symmetrize(scores)).numpy()
