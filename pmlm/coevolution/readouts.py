"""Read-outs of planted couplings from pre-trained encoders: the pair head's joint with exactly the pair
masked, the MLM's joint by the chain rule, attention maps, linear probes, and the precision metrics.

Sequences here are (N, L) arrays of residue classes 0..19 (token id - FIRST_RESIDUE_ID), all of
one family and one length; positions are 0-based residue indices (token position - 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pmlm import alphabet
from pmlm.errors import ConfigError
from pmlm.evaluation.metrics import chance_precision, contact_precision, top_k_precision
from pmlm.evaluation.pair_readout import joint_dependence, masked_copies, pair_dependence, pair_positions
from pmlm.evaluation.unsupervised import apc, symmetrize
from pmlm.model.encoder import key_padding_mask
from pmlm.tokens import batch_tokens


def residue_ids(classes: np.ndarray) -> np.ndarray:
    """Residue classes 0..19 (any shape) -> token ids."""
    return np.asarray(classes, dtype=np.int64) + alphabet.FIRST_RESIDUE_ID


def sequence_tokens(classes: np.ndarray) -> torch.Tensor:
    """(N, L) residue classes -> (N, L + 2) token ids: <cls> residues <eos>."""
    return torch.from_numpy(batch_tokens(list(residue_ids(classes))).tokens)


# ------------------------------------------------------------------------------------------------
# Joints with exactly the pair masked


def pair_head_dependence(model, sequence: np.ndarray, pairs: np.ndarray, batch_pairs: int) -> dict[str, np.ndarray]:
    """For each pair (i, j), i < j, of one sequence of residue classes, with exactly i and j masked:
    the paper's KL(P(x_i) P(x_j) || P(x_i, x_j)) and the mutual information of the pair-head joint,
    ``kl`` and ``mi``, each (P,)."""
    out = pair_dependence(model, residue_ids(sequence), pairs, mask_pairs=True, batch_pairs=batch_pairs)
    return {key: value.numpy() for key, value in out.items()}


# rows per pair of the chain rule: both masked, then x_i = a (20 rows), then x_j = b (20 rows)
CHAIN_ROWS = 1 + 2 * alphabet.NUM_RESIDUES


@torch.no_grad()
def chain_rule_dependence(model, sequence: np.ndarray, pairs: np.ndarray, batch_rows: int) -> dict[str, np.ndarray]:
    """KL(P(x_i) P(x_j) || P(x_i, x_j)) and the joint's MI for a token-head (MLM) model, each (P,).

    An MLM has no joint, but the chain rule gives one from its own conditionals with exactly the
    pair masked: P(a, b) = P(x_i=a) P(x_j=b | x_i=a), with x_i filled in and x_j still masked.
    The two orders (i first, j first) are averaged so neither position is privileged. The
    marginals are the token head's with both positions masked, as for the pair head.
    Costs CHAIN_ROWS forwards per pair.
    """
    if model.token_head is None:
        raise ValueError("chain_rule_dependence needs a model with a token head")
    tokens = sequence_tokens(sequence[None])[0]  # (T,)
    n = alphabet.NUM_RESIDUES
    letters = torch.arange(n) + alphabet.FIRST_RESIDUE_ID  # (20,)
    per_chunk = max(1, batch_rows // CHAIN_ROWS)
    parts = []
    for start in range(0, len(pairs), per_chunk):
        chunk = pairs[start:start + per_chunk]
        p = len(chunk)
        both, pos_i, pos_j = masked_copies(tokens, chunk)  # (p, T)
        rows = torch.arange(p)
        given_i = both[:, None, :].repeat(1, n, 1)  # (p, 20, T)
        given_i[rows, :, pos_i] = letters
        given_j = both[:, None, :].repeat(1, n, 1)
        given_j[rows, :, pos_j] = letters
        inputs = torch.cat([both[:, None], given_i, given_j], dim=1).view(p * CHAIN_ROWS, -1)  # (p * 41, T)
        pi, pj = pos_i.repeat_interleave(CHAIN_ROWS), pos_j.repeat_interleave(CHAIN_ROWS)
        selected = pair_positions(inputs.shape[0], pi, pj, inputs.shape[1])
        logits = model(inputs, token_positions=selected)["logits"].float()  # (p * 41 * 2, 20)
        probs = torch.softmax(logits, dim=-1).view(p, CHAIN_ROWS, 2, n)  # [..., 0, :] at i, [..., 1, :] at j
        p_i, p_j = probs[:, 0, 0], probs[:, 0, 1]  # (p, 20) with both masked
        j_given_i = probs[:, 1:1 + n, 1]  # (p, 20 a, 20 b): P(x_j=b | x_i=a)
        i_given_j = probs[:, 1 + n:, 0]  # (p, 20 b, 20 a): P(x_i=a | x_j=b)
        joint = 0.5 * (p_i[:, :, None] * j_given_i + (p_j[:, :, None] * i_given_j).transpose(1, 2))  # (p, 20, 20)
        parts.append(joint_dependence(joint, p_i, p_j))
    return {key: torch.cat([part[key] for part in parts]).numpy() for key in ("kl", "mi")}


def dependence_map(values: np.ndarray, pairs: np.ndarray, length: int) -> np.ndarray:
    """(P,) values of pairs (i, j) -> symmetric (L, L) matrix, diagonal 0."""
    out = np.zeros((length, length))
    out[pairs[:, 0], pairs[:, 1]] = values
    out[pairs[:, 1], pairs[:, 0]] = values
    return out


# ------------------------------------------------------------------------------------------------
# Attention maps


@torch.no_grad()
def attention_probabilities(model, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention probabilities of every layer and head, (B, layers, H, T, T), plus the encoder output.

    ``scaled_dot_product_attention`` returns no weights, so each layer's probabilities are
    recomputed from its own LayerNorm and q/k projection exactly as ``SelfAttention`` forms them
    (softmax(q k^T / sqrt(D)) over the same key-padding mask); the hidden states are advanced by
    the layers themselves, so the probabilities belong to the very activations the model computes.
    """
    encoder = model.encoder
    B, T = tokens.shape
    x = encoder.dropout(encoder.embed(tokens) + encoder.positions[:T])  # (B, T, C)
    attn_mask = key_padding_mask(tokens)  # (B, 1, 1, T) or None: the encoder's padded layout
    maps = []
    for layer in encoder.layers:
        attn = layer.attn
        h = layer.attn_norm(x)
        C = h.shape[-1]
        q, k, _ = attn.qkv(h).view(B, T, 3, attn.heads, C // attn.heads).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        maps.append(torch.softmax(scores, dim=-1))
        x = layer(x, attn_mask)
    return torch.stack(maps, dim=1), encoder.final_norm(x)


@torch.no_grad()
def attention_contact_scores(model, sequences: np.ndarray, batch_sequences: int) -> np.ndarray:
    """Unsupervised contacts from attention, (L, L): maps averaged over sequences, restricted to
    residues, symmetrised, APC per layer and head, then averaged over layers and heads.

    APC goes per head before the head average because heads differ in their own row/column
    background (a head that always looks at one position, a head that looks at neighbours);
    averaging first would let one head's background survive the correction.
    """
    total = None
    for start in range(0, len(sequences), batch_sequences):
        probs, _ = attention_probabilities(model, sequence_tokens(sequences[start:start + batch_sequences]))
        part = probs[..., 1:-1, 1:-1].double().sum(dim=0)  # (layers, H, L, L), <cls>/<eos> dropped
        total = part if total is None else total + part
    mean = total / len(sequences)
    corrected = apc(symmetrize(mean))  # (layers, H, L, L)
    return corrected.mean(dim=(0, 1)).numpy()


# ------------------------------------------------------------------------------------------------
# Linear probe on pair features


@torch.no_grad()
def pair_features(model, sequences: np.ndarray, batch_sequences: int) -> np.ndarray:
    """Pair features of one family, (L, L, 2C): concat(mean_s h_i * h_j, mean_s (h_i - h_j)) over
    the sequences s, h the encoder output of the unmasked sequence (<cls>/<eos> dropped)."""
    prod = diff_mean = None
    for start in range(0, len(sequences), batch_sequences):
        h = model.encode(sequence_tokens(sequences[start:start + batch_sequences]))[:, 1:-1].double()  # (b, L, C)
        p = torch.einsum("sic,sjc->ijc", h, h)  # (L, L, C)
        m = h.sum(dim=0)  # (L, C)
        prod = p if prod is None else prod + p
        diff_mean = m if diff_mean is None else diff_mean + m
    n = len(sequences)
    mean_h = diff_mean / n  # (L, C)
    diff = mean_h[:, None, :] - mean_h[None, :, :]  # (L, L, C)
    return torch.cat([prod / n, diff], dim=-1).float().numpy()


@dataclass(frozen=True)
class ProbeConfig:
    """L2-regularised logistic regression fitted by L-BFGS on standardised pair features."""

    l2: float = 1e-2  # weight of the mean-squared-weight penalty
    max_iter: int = 200  # L-BFGS iterations
    min_separation: int = 6  # pairs closer than this are neither trained on nor scored

    def __post_init__(self) -> None:
        if not self.l2 >= 0:
            raise ConfigError(f"probe_l2 (--probe-l2) must be >= 0, got {self.l2}")
        if self.max_iter < 1:
            raise ConfigError(f"probe_max_iter (--probe-max-iter) must be >= 1, got {self.max_iter}")
        if self.min_separation < 1:
            raise ConfigError(f"min_separation (--min-separation) must be >= 1, got {self.min_separation}")


def _probe_rows(features: np.ndarray, contacts: np.ndarray, min_separation: int) -> tuple[np.ndarray, np.ndarray]:
    """Both orders of every pair |i-j| >= min_separation: (rows, 2C) features and (rows,) labels."""
    i, j = np.triu_indices(features.shape[0], k=min_separation)
    x = np.concatenate([features[i, j], features[j, i]])
    y = np.concatenate([contacts[i, j], contacts[j, i]]).astype(np.float32)
    return x, y


def fit_probe(train: list[tuple[np.ndarray, np.ndarray]], cfg: ProbeConfig) -> dict:
    """Fit on (features (L, L, 2C), contacts (L, L)) of some families; returns weights and scaling.
    Deterministic: zero initialisation and full-batch L-BFGS."""
    xs, ys = zip(*(_probe_rows(f, c, cfg.min_separation) for f, c in train))
    x = torch.from_numpy(np.concatenate(xs)).double()
    y = torch.from_numpy(np.concatenate(ys)).double()
    mean, std = x.mean(dim=0), x.std(dim=0).clamp_min(1e-8)
    x = (x - mean) / std
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=cfg.max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(x @ w + b, y) + cfg.l2 * (w**2).mean()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return {"w": w.detach(), "b": b.detach(), "mean": mean, "std": std}


def probe_scores(probe: dict, features: np.ndarray) -> np.ndarray:
    """Symmetric (L, L) logits of a fitted probe: the mean of the (i, j) and (j, i) orders."""
    x = (torch.from_numpy(features).double() - probe["mean"]) / probe["std"]
    logits = (x @ probe["w"] + probe["b"]).numpy()  # (L, L)
    return symmetrize(logits)


# ------------------------------------------------------------------------------------------------
# Metrics


def precisions(scores: np.ndarray, contacts: np.ndarray, min_separation: int, k_divisor: int) -> dict[str, float]:
    """Top-(#planted edges) precision and P@L/k_divisor, both over pairs |i-j| >= min_separation."""
    upper = np.triu(contacts, k=min_separation)
    edges = int(upper.sum())
    length = scores.shape[0]
    return {
        "p_at_edges": top_k_precision(scores, contacts, edges, min_separation) if edges else math.nan,
        "p_at_l5": contact_precision(
            scores, contacts, np.ones(length, dtype=bool), min_sep=min_separation, k_divisor=k_divisor
        ),
        "chance": chance_precision(contacts, min_separation),
    }


def split_pairs(pairs: np.ndarray, contacts: np.ndarray, min_separation: int) -> tuple[np.ndarray, np.ndarray]:
    """Masks (P,) of planted pairs and of non-planted pairs with |i-j| >= min_separation."""
    sep = pairs[:, 1] - pairs[:, 0]
    planted = contacts[pairs[:, 0], pairs[:, 1]]
    return planted, ~planted & (sep >= min_separation)
