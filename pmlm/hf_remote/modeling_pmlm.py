"""A pmlm encoder for ``transformers`` (written by ``pmlm export`` beside config.json and model.safetensors; loaded
with ``trust_remote_code=True``): the encoders no stock architecture holds, those with a pair head (PMLM, the
pair-only variant), a triple head (the Triple MLM), ReLU layers or no LayerNorm on the embeddings.

It depends on torch and transformers only. Parameter names are pmlm's own, so pmlm reads the folder back
(``pmlm import DIR``) tensor for tensor. The network (pmlm's ``pmlm/model`` documents each choice):

* embeddings: token embedding plus a fixed sinusoidal table (``encoder.positions``, stored in the weights: row t is
  the vector of the t-th token, ``<cls>`` first), then an optional LayerNorm (``embedding_norm``);
* layers, post-LN ``x = LN(x + Attn(x)); x = LN(x + FFN(x))`` or pre-LN ``x = x + Attn(LN(x)); x = x + FFN(LN(x))``
  with a final LayerNorm; ``FFN = W2 act(W1 x)``; no query attends to padding;
* token head ``Linear -> act -> LayerNorm -> Linear`` over the 20 residues, returned as logits over the whole
  vocabulary with -inf at tokens that are not residues (the head predicts residues only);
* pair head on ordered pairs (b, i, j): ``M+ = LayerNorm(act(Linear([h_i * h_j ; h_i - h_j])))`` and
  ``pair_logits = Linear(M+)``: 400 classes ``20 a + b`` over residues ``ACDEFGHIKLMNPQRSTVWY`` (``pair_classes``
  400), or 729 classes ``27 t_i + t_j`` over token ids (the released model's dictionary squared, the gap last);
  ``pair_unary`` adds per-residue terms, ``product_base`` the token head's log-marginals at i and j;
* triple head on rows (b, i, j, k): 8,000 logits, class ``400 a + 20 b + c``, from unary, pairwise and rank-R
  three-way factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class PmlmConfig(PreTrainedConfig):
    model_type = "pmlm"

    vocab_size: int = 32
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 256  # tokens, <cls> and <eos> included
    norm: str = "post"  # post | pre
    embedding_norm: bool = False
    hidden_act: str = "relu"  # relu | gelu (erf form)
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    activation_dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    pad_token_id: int | None = 1
    first_residue_id: int = 4  # token ids first_residue_id .. + num_residues - 1 are the residues
    num_residues: int = 20
    token_head: bool = True
    pair_head: bool = True
    pair_classes: int = 400  # 400 (20 x 20 residues) or 729 (27 x 27 token ids)
    pair_unary: bool = False
    product_base: bool = False
    triple_head: bool = False
    triple_rank: int = 16
    triple_width: int = 128


@dataclass
class PmlmOutput(ModelOutput):
    """``logits`` (B, L, vocab), ``last_hidden_state`` (B, L, C), ``hidden_states`` (embeddings and every layer's
    output) when asked, ``pair_logits`` (P, K) and ``pair_representation`` (P, 2C) for ``pair_index``,
    ``triple_logits`` (T, 8000) for ``triple_index``."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    pair_logits: torch.Tensor | None = None
    pair_representation: torch.Tensor | None = None
    triple_logits: torch.Tensor | None = None


class SelfAttention(nn.Module):
    def __init__(self, config: PmlmConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.p = config.attention_probs_dropout_prob
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, L, C = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, L, D) each
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=self.p if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(B, L, C))


class Layer(nn.Module):
    def __init__(self, config: PmlmConfig):
        super().__init__()
        eps = config.layer_norm_eps
        self.post = config.norm == "post"
        self.act = ACTIVATIONS[config.hidden_act]
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.attn = SelfAttention(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.drop = nn.Dropout(config.hidden_dropout_prob)
        self.act_drop = nn.Dropout(config.activation_dropout)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_out(self.act_drop(self.act(self.ffn_in(x))))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.post:
            x = self.attn_norm(x + self.drop(self.attn(x, keep)))
            return self.ffn_norm(x + self.drop(self.feed_forward(x)))
        x = x + self.drop(self.attn(self.attn_norm(x), keep))
        return x + self.drop(self.feed_forward(self.ffn_norm(x)))


class Encoder(nn.Module):
    def __init__(self, config: PmlmConfig):
        super().__init__()
        C, eps = config.hidden_size, config.layer_norm_eps
        self.embed = nn.Embedding(config.vocab_size, C, padding_idx=config.pad_token_id)
        self.register_buffer("positions", torch.zeros(config.max_position_embeddings, C))  # filled from the weights
        self.embed_norm = nn.LayerNorm(C, eps=eps) if config.embedding_norm else None
        self.drop = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(C, eps=eps) if config.norm == "pre" else None

    def forward(self, input_ids: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        L = input_ids.shape[1]
        if self.positions.shape[0] < L:
            raise ValueError(f"{L} tokens exceed max_position_embeddings {self.positions.shape[0]}")
        x = self.embed(input_ids) + self.positions[:L]
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        states = [self.drop(x)]
        for layer in self.layers:
            states.append(layer(states[-1], keep))
        last = states[-1] if self.final_norm is None else self.final_norm(states[-1])
        return last, states


class TokenHead(nn.Module):
    def __init__(self, config: PmlmConfig):
        super().__init__()
        self.act = ACTIVATIONS[config.hidden_act]
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.out = nn.Linear(config.hidden_size, config.num_residues)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.act(self.dense(h))))  # (..., 20)


class PairHead(nn.Module):
    def __init__(self, config: PmlmConfig):
        super().__init__()
        width = 2 * config.hidden_size
        self.act = ACTIVATIONS[config.hidden_act]
        self.side = math.isqrt(config.pair_classes)
        self.dense = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.out = nn.Linear(width, config.pair_classes)
        self.unary = nn.Linear(width, 2 * self.side) if config.pair_unary else None

    def forward(self, hi: torch.Tensor, hj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m_plus = self.norm(self.act(self.dense(torch.cat([hi * hj, hi - hj], dim=-1))))  # (P, 2C)
        logits = self.out(m_plus)  # (P, K)
        if self.unary is not None:
            u = self.unary(m_plus).unflatten(-1, (2, self.side))  # (P, 2, side)
            logits = (logits.unflatten(-1, (self.side, self.side)) + u[:, 0, :, None] + u[:, 1, None, :]).flatten(1)
        return logits, m_plus


class TripleHead(nn.Module):
    def __init__(self, config: PmlmConfig):
        super().__init__()
        Q, R, W = config.num_residues, config.triple_rank, config.triple_width
        self.q, self.rank, self.width = Q, R, W
        self.act = ACTIVATIONS[config.hidden_act]
        self.project = nn.Linear(config.hidden_size, 3 * W, bias=False)
        self.product = nn.Linear(config.hidden_size, W)
        self.norm = nn.LayerNorm(W, eps=config.layer_norm_eps)
        self.out = nn.Linear(W, 3 * Q + 3 * Q * Q + 3 * R * Q)

    def forward(self, h: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        T, Q = h[0].shape[0], self.q
        roles = [self.project(x).view(T, 3, self.width)[:, r] for r, x in enumerate(h)]
        z = self.norm(self.act(self.product(h[0] * h[1] * h[2]) + roles[0] + roles[1] + roles[2]))
        unary, pairs, cp = self.out(z).split([3 * Q, 3 * Q * Q, 3 * self.rank * Q], dim=1)
        u, p = unary.view(T, 3, Q), pairs.view(T, 3, Q, Q)
        a, b, c = cp.view(T, 3, self.rank, Q).unbind(1)  # (T, R, Q) each
        logits = torch.einsum("tra,trb,trc->tabc", a, b, c)
        logits = logits + (u[:, 0, :, None, None] + u[:, 1, None, :, None] + u[:, 2, None, None, :])
        logits = logits + p[:, 0][:, :, :, None] + p[:, 1][:, :, None, :] + p[:, 2][:, None, :, :]
        return logits.reshape(T, Q**3)  # class 400 a + 20 b + c


class PmlmPreTrainedModel(PreTrainedModel):
    config_class = PmlmConfig
    base_model_prefix = "pmlm"

    def _init_weights(self, module: nn.Module) -> None:
        """pmlm's initialisation: Linear N(0, 0.02) with zero bias, embeddings N(0, 1) with a zero padding row."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class PmlmForMaskedLM(PmlmPreTrainedModel):
    """Encoder plus the heads the config names (``token_head``, ``pair_head``, ``triple_head``)."""

    def __init__(self, config: PmlmConfig):
        super().__init__(config)
        self.encoder = Encoder(config)
        self.token_head = TokenHead(config) if config.token_head else None
        self.pair_head = PairHead(config) if config.pair_head else None
        self.triple_head = TripleHead(config) if config.triple_head else None
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        pair_index: torch.Tensor | None = None,
        triple_index: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> PmlmOutput:
        """``input_ids`` (B, L): ``<cls>`` residues ``<eos>``, right-padded; ``attention_mask`` (B, L), 1 at real
        tokens (default: every token but ``<pad>``); ``pair_index`` (P, 3) rows (b, i, j) of ordered token pairs;
        ``triple_index`` (T, 4) rows (b, i, j, k), i < j < k."""
        real = input_ids.ne(self.config.pad_token_id) if attention_mask is None else attention_mask.bool()
        keep = real.clone()
        keep[:, 0] = True  # an all-padding row attends to its first token rather than to nothing (no NaN)
        last, states = self.encoder(input_ids, keep[:, None, None, :])
        logits = pair_logits = pair_repr = triple_logits = None
        residues = slice(self.config.first_residue_id, self.config.first_residue_id + self.config.num_residues)
        if self.token_head is not None:
            logits = last.new_full((*last.shape[:2], self.config.vocab_size), float("-inf"))
            logits[..., residues] = self.token_head(last)
        if pair_index is not None:
            b, i, j = pair_index.unbind(1)
            pair_logits, pair_repr = self.pair_head(last[b, i], last[b, j])
            if self.config.product_base:
                base = torch.log_softmax(self.token_head(last).float(), dim=-1).to(pair_logits.dtype)  # (B, L, 20)
                joint = pair_logits.unflatten(-1, (self.pair_head.side, self.pair_head.side))
                pair_logits = (joint + base[b, i][:, :, None] + base[b, j][:, None, :]).flatten(1)
        if triple_index is not None:
            b, i, j, k = triple_index.unbind(1)
            triple_logits = self.triple_head((last[b, i], last[b, j], last[b, k]))
            if self.config.product_base:
                base = torch.log_softmax(self.token_head(last).float(), dim=-1).to(triple_logits.dtype)
                bi, bj, bk = base[b, i], base[b, j], base[b, k]
                triple_logits = triple_logits + (
                    bi[:, :, None, None] + bj[:, None, :, None] + bk[:, None, None, :]
                ).flatten(1)
        return PmlmOutput(
            logits=logits,
            last_hidden_state=last,
            hidden_states=tuple(states) if output_hidden_states else None,
            pair_logits=pair_logits,
            pair_representation=pair_repr,
            triple_logits=triple_logits,
        )
