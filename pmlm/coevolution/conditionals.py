"""An encoder's conditionals at masked (and substituted) sites of one held-out sequence, the raw material of the
study's exact read-outs (``pmlm.coevolution.curve_readouts``).

For a sequence x (residue classes, (L,)):

* **singles**: log P(x_s = a | x with s masked), one masked copy per site (the token head; a pair-only model
  the marginal of its pair head's diagonal), as ``pmlm score`` reads single mutants;
* **pairs**: one copy per pair (i, j) with exactly i and j masked: the pair head's joint (its class ``20 a + b``
  is (x_i = a, x_j = b)) and the token head's two marginals;
* **triples**: one copy per triple with exactly its three sites masked: the triple head's joint where the model
  has one, and the token head's marginals;
* **substitutions** (``substitution_log_conditionals``): site i masked and site j set to each residue b, and the
  mirror, 40 forwards per pair: the token head's conditional of one site given each residue at the other. Its
  double difference is the token head's epistasis by substitution (exact for the true model); with the pair's
  marginals it is also the token head's joint by the chain rule (``chain_rule_joint``);
* **the categorical Jacobian** (``jacobian_epistasis``): nothing masked, one copy per (site j, residue b), the
  token head's log-probabilities at every site: L x 20 forwards for the epistasis of every pair, the cheap
  all-pairs variant of the substitution (the read site sees its own residue, so it is not the conditional).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pmlm import alphabet
from pmlm.coevolution.readouts import model_device, residue_ids, sequence_tokens
from pmlm.evaluation.jacobian import categorical_jacobian
from pmlm.evaluation.pair_readout import residue_joint

Q = alphabet.NUM_RESIDUES


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
def substitution_log_conditionals(model, sequence: np.ndarray, pairs: np.ndarray, batch_rows: int = 1024) -> np.ndarray:
    """(P, 2, 20, 20) log-conditionals of the token head indexed [pair, role, given, own]: role 0 masks i and sets j
    to ``given`` (log P(x_i = own | x_j = given, the rest)), role 1 masks j and sets i (log P(x_j = own | x_i =
    given, the rest)); 40 forwards per pair. Any encoder with a token head has them, an MLM included."""
    device = model_device(model)
    letters = torch.arange(Q) + alphabet.FIRST_RESIDUE_ID
    base = sequence_tokens(sequence[None])[0]  # (T,)
    out = np.zeros((len(pairs), 2, Q, Q))
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
        out[start : start + p] = torch.log_softmax(logits.float(), dim=-1).double().cpu().view(p, 2, Q, Q).numpy()
    return out


def substitution_epistasis(log_conditionals: np.ndarray, sequence: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """The token head's epistasis by substitution, (P, 20, 20) indexed [a, b], from ``substitution_log_conditionals``:
    ``[log P(x_i=a | x_j=b) - log P(x_i=w_i | x_j=b)] - [the same at x_j = w_j]``, averaged with the mirror reading
    (j masked, i set to each a). Exact for the true model (the conditional of one site given the rest)."""
    i_given_b = log_conditionals[:, 0].transpose(0, 2, 1)  # [pair, a, b]: log P(x_i = a | x_j = b)
    j_given_a = log_conditionals[:, 1]  # [pair, a, b]: log P(x_j = b | x_i = a)
    wi, wj = sequence[pairs[:, 0]], sequence[pairs[:, 1]]
    n = np.arange(len(pairs))
    from_i = i_given_b - i_given_b[n, wi][:, None, :]  # [pair, a, b] - [pair, w_i, b]
    from_i = from_i - from_i[n, :, wj][:, :, None]  # minus the same at b = w_j
    from_j = j_given_a - j_given_a[n, :, wj][:, :, None]
    from_j = from_j - from_j[n, wi][:, None, :]
    return 0.5 * (from_i + from_j)


def chain_rule_joint(log_conditionals: np.ndarray, log_marginals: np.ndarray) -> np.ndarray:
    """The token head's joint by the chain rule, log P(x_i = a, x_j = b) (P, 20, 20), both orders averaged:
    ``0.5 [P(x_i=a) P(x_j=b | x_i=a) + P(x_j=b) P(x_i=a | x_j=b)]``, the marginals (P, 2, 20) the token head's
    with exactly the pair masked (``SequenceOutputs.pair_marginals``), the conditionals from
    ``substitution_log_conditionals``: the MLM's only joint, and PMLM's like-for-like."""
    i_first = log_marginals[:, 0, :, None] + log_conditionals[:, 1]  # [pair, a, b]
    j_first = log_marginals[:, 1, None, :] + log_conditionals[:, 0].transpose(0, 2, 1)
    return np.logaddexp(i_first, j_first) - np.log(2.0)


def jacobian_epistasis(model, sequence: np.ndarray, batch_rows: int = 1024) -> np.ndarray:
    """The token head's categorical Jacobian, (L, L, 20, 20) float64 indexed [i, j, a, b]
    (``pmlm.evaluation.jacobian.categorical_jacobian``): nothing masked, site j set to each residue b (L x 20
    forwards), the double difference of log P(x_i = a) at every other site i,
    ``[l_i(a | x_j=b) - l_i(w_i | x_j=b)] - [the same at x_j = w_j]``, averaged with its transpose [j, i, b, a];
    zero on the diagonal."""
    ids = residue_ids(sequence)
    return categorical_jacobian(model, ids, rows_per_batch=batch_rows, device=model_device(model)).cpu().numpy()
