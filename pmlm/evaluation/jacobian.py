"""The categorical Jacobian of an encoder's token head: nothing masked, one copy of the sequence per (site j,
residue b), the token head's log-probabilities l_i(a) at every site i. Any encoder with a token head has it (an
MLM, PMLM, an imported ESM model); the co-evolution study reads its epistasis (``categorical_jacobian``) and
``pmlm contacts`` its unsupervised contact map (``jacobian_contact_scores``). The definition, its cost and memory:
docs/contacts.md, "The categorical Jacobian".

J is exact epistasis for a model emitting the true conditionals; the read site sees its own residue, so it is not
the conditional. ``D``'s reference in b is x itself, so X there needs nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from pmlm import alphabet
from pmlm.evaluation.unsupervised import apc
from pmlm.tokens import RESIDUE_OFFSET, batch_tokens

Q = alphabet.NUM_RESIDUES
# rows of the table symmetrised at once when the contact map is read (bounds the temporaries to rows x L x 400)
NORM_ROWS = 64


def _log_probs(model, tokens: torch.Tensor, length: int, device) -> torch.Tensor:
    """(R, L, 20) float32 log-probabilities of the token head at every residue of each row of ``tokens``."""
    selected = torch.zeros(tokens.shape, dtype=torch.bool)
    selected[:, RESIDUE_OFFSET : RESIDUE_OFFSET + length] = True  # every residue position, row-major
    logits = model(tokens.to(device), token_positions=selected.to(device))["logits"]
    return torch.log_softmax(logits.float(), dim=-1).view(len(tokens), length, Q)


@torch.no_grad()
def double_differences(
    model, residues: np.ndarray, *, rows_per_batch: int, device="cpu", dtype=torch.float32
) -> torch.Tensor:
    """J of the module docstring before its symmetrisation, (L, L, 20, 20) indexed [i, j, a, b], on ``device``;
    ``residues`` (L,) token ids (X allowed)."""
    if model.token_head is None:
        raise ValueError("the categorical Jacobian needs a model with a token head")
    length = int(residues.size)
    base = torch.from_numpy(batch_tokens([residues]).tokens[0])  # (T,)
    wild = _log_probs(model, base[None], length, device)[0].to(dtype)  # (L, 20) l_i(a | x)
    table = torch.empty(length, Q, length, Q, dtype=dtype, device=device)  # [j, b, i, a] = l_i(a | x_j = b)
    flat = table.view(length * Q, length, Q)
    sites = torch.arange(length).repeat_interleave(Q)  # row r substitutes site r // 20 with residue r % 20
    letters = torch.arange(Q).repeat(length) + alphabet.FIRST_RESIDUE_ID
    step = max(1, int(rows_per_batch))
    for start in range(0, length * Q, step):
        stop = min(start + step, length * Q)
        tokens = base.repeat(stop - start, 1)  # (r, T)
        tokens[torch.arange(stop - start), sites[start:stop] + RESIDUE_OFFSET] = letters[start:stop]
        flat[start:stop] = _log_probs(model, tokens, length, device).to(dtype)
    table = table.permute(2, 0, 3, 1)  # [i, j, a, b], a view
    with torch.autocast(torch.device(device).type, enabled=False):  # the differences in dtype, not bf16
        _refer_to_wild_type(table, wild, residues, device)
    return table


def _refer_to_wild_type(table: torch.Tensor, wild: torch.Tensor, residues: np.ndarray, device) -> None:
    """l_i(a | x_j = b) [i, j, a, b] -> J in place: minus l_i(a | x), then minus the value at a = w_i (the mean over
    a at X)."""
    length, dtype = table.shape[0], table.dtype
    table -= wild[:, None, :, None]  # D
    # the reference in a: one-hot at the wild-type residue, uniform over the 20 at X
    classes = torch.as_tensor(residues.astype(np.int64) - alphabet.FIRST_RESIDUE_ID)
    standard = (classes >= 0) & (classes < Q)
    reference = torch.full((length, Q), 1.0 / Q, dtype=dtype)
    reference[standard] = torch.nn.functional.one_hot(classes[standard], Q).to(dtype)
    reference = reference.to(device)
    table -= torch.einsum("ia,ijab->ijb", reference, table)[:, :, None, :]  # an (L, L, 20) temporary


def categorical_jacobian(
    model, residues: np.ndarray, *, rows_per_batch: int, device="cpu", dtype=torch.float64
) -> torch.Tensor:
    """The symmetrised J (module docstring), (L, L, 20, 20) indexed [i, j, a, b], zero on the diagonal."""
    table = double_differences(model, residues, rows_per_batch=rows_per_batch, device=device, dtype=dtype)
    out = 0.5 * (table + table.permute(1, 0, 3, 2))
    out[torch.arange(out.shape[0]), torch.arange(out.shape[0])] = 0.0
    return out


def jacobian_contact_scores(model, residues: np.ndarray, *, rows_per_batch: int, device="cpu") -> np.ndarray:
    """(L, L) float64 unsupervised contact scores of one sequence: the Frobenius norm of each pair's symmetrised
    20 x 20 block of J, then APC (the co-evolution study's ``jacobian_apc``, on one sequence); float32 arithmetic."""
    table = double_differences(model, residues, rows_per_batch=rows_per_batch, device=device)
    length = table.shape[0]
    norms = torch.empty(length, length, dtype=torch.float64)
    for start in range(0, length, NORM_ROWS):
        rows = slice(start, min(start + NORM_ROWS, length))
        block = 0.5 * (table[rows] + table[:, rows].permute(1, 0, 3, 2))  # (r, L, 20, 20)
        norms[rows] = block.double().square().sum(dim=(-2, -1)).sqrt().cpu()
    norms.fill_diagonal_(0.0)
    return apc(norms).numpy()
