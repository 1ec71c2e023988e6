"""Unsupervised read-outs of planted couplings from pre-trained encoders: the pair head's joint with exactly
the pair masked, the MLM's joint by the chain rule, attention maps, and the precision metrics (the
supervised contact head is ``pmlm.coevolution.supervised``).

Sequences here are (N, L) arrays of residue classes 0..19 (token id - FIRST_RESIDUE_ID), all of
one family and one length; positions are 0-based residue indices (token position - 1).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pmlm import alphabet
from pmlm.evaluation.metrics import chance_precision, contact_precision, top_k_precision
from pmlm.evaluation.pair_readout import joint_dependence, masked_copies, pair_dependence, pair_positions
from pmlm.evaluation.unsupervised import apc
from pmlm.model.layout import key_padding_mask
from pmlm.model.symmetry import symmetrize
from pmlm.tokens import batch_tokens


def residue_ids(classes: np.ndarray) -> np.ndarray:
    """Residue classes 0..19 (any shape) -> token ids."""
    return np.asarray(classes, dtype=np.int64) + alphabet.FIRST_RESIDUE_ID


def model_device(model) -> torch.device:
    """Where a model's weights live (CPU for a parameter-free stand-in): inputs are moved there."""
    return next(iter(model.parameters()), torch.zeros(())).device


def sequence_tokens(classes: np.ndarray) -> torch.Tensor:
    """(N, L) residue classes -> (N, L + 2) token ids: <cls> residues <eos>."""
    return torch.from_numpy(batch_tokens(list(residue_ids(classes))).tokens)


# ------------------------------------------------------------------------------------------------
# Joints with exactly the pair masked


def pair_head_dependence(model, sequence: np.ndarray, pairs: np.ndarray, batch_pairs: int) -> dict[str, np.ndarray]:
    """For each pair (i, j), i < j, of one sequence of residue classes, with exactly i and j masked:
    the paper's KL(P(x_i) P(x_j) || P(x_i, x_j)) and the mutual information of the pair-head joint,
    ``kl`` and ``mi``, each (P,)."""
    out = pair_dependence(
        model, residue_ids(sequence), pairs, mask_pairs=True, batch_pairs=batch_pairs, device=model_device(model)
    )
    return {key: value.cpu().numpy() for key, value in out.items()}


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
        chunk = pairs[start : start + per_chunk]
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
        device = model_device(model)
        logits = model(inputs.to(device), token_positions=selected.to(device))["logits"].float().cpu()  # (p*41*2, 20)
        probs = torch.softmax(logits, dim=-1).view(p, CHAIN_ROWS, 2, n)  # [..., 0, :] at i, [..., 1, :] at j
        p_i, p_j = probs[:, 0, 0], probs[:, 0, 1]  # (p, 20) with both masked
        j_given_i = probs[:, 1 : 1 + n, 1]  # (p, 20 a, 20 b): P(x_j=b | x_i=a)
        i_given_j = probs[:, 1 + n :, 0]  # (p, 20 b, 20 a): P(x_i=a | x_j=b)
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
    x = encoder.dropout(encoder._embed_norm(encoder.embed(tokens) + encoder.positions[:T]))  # (B, T, C)
    attn_mask = key_padding_mask(tokens)  # (B, 1, 1, T) or None: the encoder's padded layout
    maps = []
    for layer in encoder.layers:
        attn = layer.attn
        h = x if layer.post_norm else layer.attn_norm(x)  # what the layer's attention reads (post-LN: x itself)
        C = h.shape[-1]
        q, k, _ = attn.qkv(h).view(B, T, 3, attn.heads, C // attn.heads).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        maps.append(torch.softmax(scores, dim=-1))
        x = layer(x, attn_mask)
    return torch.stack(maps, dim=1), encoder._final_norm(x)  # post-LN layers end normalised: no final norm


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
        tokens = sequence_tokens(sequences[start : start + batch_sequences]).to(model_device(model))
        probs, _ = attention_probabilities(model, tokens)
        part = probs[..., 1:-1, 1:-1].double().sum(dim=0).cpu()  # (layers, H, L, L), <cls>/<eos> dropped
        total = part if total is None else total + part
    mean = total / len(sequences)
    corrected = apc(symmetrize(mean))  # (layers, H, L, L)
    return corrected.mean(dim=(0, 1)).numpy()


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
