"""The co-evolution study's encoder inputs and attention read-out: residue classes to tokens, pair values to maps,
and contacts from attention maps (the other read-outs are ``pmlm.coevolution.conditionals``, the supervised
contact head ``pmlm.coevolution.supervised``).

Sequences here are (N, L) arrays of residue classes 0..19 (token id - FIRST_RESIDUE_ID), all of
one family and one length; positions are 0-based residue indices (token position - 1).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pmlm import alphabet
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
