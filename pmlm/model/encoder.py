"""The sequence encoder: token embeddings plus fixed sinusoidal positions, then Transformer layers, post-LN
(the released code's) or pre-LN.

Choices (documented here once):

* ``model.norm`` picks the layer (``pmlm.model.config`` says which objective gets which by default):

  - ``post`` (fairseq 0.10.2's ``TransformerSentenceEncoderLayer``, what the released PMLM code runs;
    BERT, RoBERTa): ``x = LN(x + Drop(Attn(x)))``, then ``x = LN(x + Drop(FFN(x)))``; no final
    LayerNorm, the last layer's output is the representation;
  - ``pre`` (ESM-1b, fairseq's later ``TransformerEncoder`` with ``--encoder-normalize-before``):
    ``x = x + Drop(Attn(LN(x)))``, ``x = x + Drop(FFN(LN(x)))``, and a final LayerNorm. Gradients
    reach deep stacks without passing through every LayerNorm, so it is the option when a 34- or
    36-layer post-LN run diverges or needs a longer warm-up.

  ``FFN(x) = W2 ActDrop(act(W1 x))`` with ``act`` relu or gelu. ``model.embedding_norm`` adds a
  LayerNorm on token + position embeddings, before the embedding dropout (fairseq 0.10.2's
  ``encoder_normalize_before``). Both layers keep the same parameter names.
* **Non-learnable sinusoidal positions** (paper, Experiment Setup): position ``t`` of the
  token sequence (``<cls>`` is position 0) gets ``[sin(t * f_k), cos(t * f_k)]`` with
  ``f_k = 10000^(-k / (C/2 - 1))``, the fairseq layout (sine half, then cosine half).
  ``model.positions: fairseq`` is fairseq 0.10.2's own numbering, which the released checkpoints were
  trained with: token ``t`` sits at ``t + padding_idx + 1 = t + 2`` (``utils.make_positions``) and the
  table is computed in fp32 (``SinusoidalPositionalEmbedding.get_embedding``), so an imported model adds
  exactly the vectors the released one adds. (fairseq's padding positions get a zero row; ours get a
  row too, but no query attends to ``<pad>`` and nothing reads a ``<pad>`` output.)
* Token embeddings are drawn from N(0, 1) (torch's default, as in the released PMLM code) so token
  identity and position (entries in [-1, 1]) enter the first layer at a comparable scale; the
  ``<pad>`` row is zero.
  Linear weights are N(0, 0.02) with zero bias and LayerNorms start at (1, 0), the
  BERT/fairseq-RoBERTa initialisation, for every objective (the released code uses it for its MLM
  baseline, ``apply_bert_init`` True in mlm.py:376, and keeps torch's default Linear initialisation
  for PMLM, pmlm.py:416; we do not follow that difference).
* No query ever attends to ``<pad>``. Three layouts give that (``Encoder.attention``):
  a batch without padding runs ``scaled_dot_product_attention`` with no mask (fused kernels);
  ``"packed"`` drops the pads, runs every layer on the T real tokens and attention per
  sequence over ``cu_seqlens`` (see ``pmlm.model.attention``), then scatters back to (B, L, C)
  with zeros at ``<pad>``; ``"padded"`` keeps (B, L, C) and passes a key-padding mask to
  ``scaled_dot_product_attention`` (the reference; on a GPU the mask rules out the flash
  kernel; on CPU with attention dropout, ``pmlm.model.dropout_attention``'s blockwise kernel).
  ``"auto"`` packs where a fused variable-length kernel runs (CUDA under bf16 / fp16:
  ``varlen_attn`` without attention dropout, FlashAttention on jagged tensors with it) and for
  inference on a CPU (no autograd: the linear layers skip the pads, and the per-sequence attention
  loop costs little without a backward), and stays padded elsewhere, e.g. training on a CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pmlm.alphabet import PAD_ID, VOCAB_SIZE
from pmlm.errors import PmlmError
from pmlm.model.attention import HALF_DTYPES, Packing, pack, packed_attention, packed_kernel_usable, unpack
from pmlm.model.config import ModelConfig
from pmlm.model.dropout_attention import attention

INIT_STD = 0.02  # std of Linear weights (BERT / fairseq RoBERTa)
POSITION_BASE = 10000.0  # wavelength base of the sinusoidal positions
ATTENTION_LAYOUTS = ("auto", "packed", "padded")


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """Fixed position table (num_positions, dim): sine half then cosine half."""
    half = dim // 2
    # frequencies from 1 down to 1/POSITION_BASE across the half width
    scale = math.log(POSITION_BASE) / max(half - 1, 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float64) * -scale)  # (C/2,)
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * freqs[None, :]  # (T, C/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()  # (T, C)


def fairseq_positions(num_positions: int, dim: int) -> torch.Tensor:
    """fairseq 0.10.2's table for tokens t = 0..num_positions-1 at positions t + PAD_ID + 1, with its fp32
    arithmetic (the same expressions as ``SinusoidalPositionalEmbedding.get_embedding``; fairseq's padding
    index is 1, ours too)."""
    half = dim // 2
    scale = math.log(POSITION_BASE) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -scale)  # (C/2,) fp32
    first = PAD_ID + 1
    angles = torch.arange(first, first + num_positions, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (T, C)


def position_table(cfg: ModelConfig) -> torch.Tensor:
    """(max_len, C) positions of the convention ``cfg.positions`` names (module docstring)."""
    if cfg.positions == "fairseq":
        return fairseq_positions(cfg.max_len, cfg.hidden)
    return sinusoidal_positions(cfg.max_len, cfg.hidden)


def key_padding_mask(tokens: torch.Tensor) -> torch.Tensor | None:
    """(B, 1, 1, L) True where a key may be attended to, or None when ``tokens`` has no <pad>."""
    pad = tokens.eq(PAD_ID)  # (B, L)
    # one host sync per forward buys mask-free (fused) attention for unpadded batches
    if not bool(pad.any()):
        return None
    keep = ~pad
    # position 0 always stays visible so an all-<pad> filler row yields finite values, not NaN
    # (a NaN row would poison weight gradients through 0 * NaN)
    keep[:, 0] = True
    return keep[:, None, None, :]


class SelfAttention(nn.Module):
    """Multi-head self-attention over (B, L, C) with a key-padding mask, or over packed (T, C) rows."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.attention_dropout = cfg.attention_dropout

    def forward(self, x: torch.Tensor, layout: torch.Tensor | Packing | None) -> torch.Tensor:
        dropout_p = self.attention_dropout if self.training else 0.0
        if isinstance(layout, Packing):
            T, C = x.shape
            q, k, v = self.qkv(x).view(T, 3, self.heads, C // self.heads).unbind(1)  # 3 x (T, H, D)
            return self.proj(packed_attention(q, k, v, layout, dropout_p).reshape(T, C))
        B, L, C = x.shape
        # (B, L, 3C) -> 3 x (B, H, L, D)
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        out = attention(q, k, v, layout, dropout_p)  # layout: (B, 1, 1, L) True = may attend, or None; (B, H, L, D)
        return self.proj(out.transpose(1, 2).reshape(B, L, C))


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}  # gelu is the erf form, as fairseq's


class EncoderLayer(nn.Module):
    """One Transformer layer, post-LN or pre-LN (module docstring): attention block then feed-forward block."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.post_norm = cfg.norm == "post"
        self.act = ACTIVATIONS[cfg.activation]
        self.attn_norm = nn.LayerNorm(cfg.hidden)
        self.attn = SelfAttention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.hidden)
        self.ffn_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.ffn_out = nn.Linear(cfg.ffn, cfg.hidden)
        self.dropout = nn.Dropout(cfg.dropout)
        self.activation_dropout = nn.Dropout(cfg.activation_dropout)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_out(self.activation_dropout(self.act(self.ffn_in(x))))

    def forward(self, x: torch.Tensor, layout: torch.Tensor | Packing | None) -> torch.Tensor:
        """x (B, L, C) with a mask (or None), or packed (T, C) with its Packing; same shape out."""
        if self.post_norm:
            x = self.attn_norm(x + self.dropout(self.attn(x, layout)))
            return self.ffn_norm(x + self.dropout(self.ffn(x)))
        x = x + self.dropout(self.attn(self.attn_norm(x), layout))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class Encoder(nn.Module):
    """Token ids (B, L) -> contextual representations (B, L, C).

    ``attention`` ("auto", "packed", "padded") picks the layout of padded batches (module
    docstring); it is a run-time setting, not part of the weights or the config.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.attention = "auto"
        self.compiled = False  # set by compile_layers
        self.embed = nn.Embedding(VOCAB_SIZE, cfg.hidden, padding_idx=PAD_ID)
        # not a parameter and not saved: rebuilt from the config on load
        self.register_buffer("positions", position_table(cfg), persistent=False)
        self.embed_norm = nn.LayerNorm(cfg.hidden) if cfg.embedding_norm else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        # post-LN layers end in a LayerNorm already; pre-LN leaves the residual stream unnormalised
        self.final_norm = nn.LayerNorm(cfg.hidden) if cfg.norm == "pre" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _B, L = tokens.shape
        if self.cfg.max_len < L:
            raise PmlmError(
                f"batch of {L} tokens exceeds the model's max_len {self.cfg.max_len} "
                "(which counts <cls> and <eos>); crop the sequences or use a larger max_len"
            )
        attn_mask = key_padding_mask(tokens)  # (B, 1, 1, L) or None
        if attn_mask is not None and self._packs(tokens.device):
            packing = pack(tokens.ne(PAD_ID))
            x = self.embed(tokens.reshape(-1).index_select(0, packing.index)) + self.positions[packing.positions]
            x = self.dropout(self._embed_norm(x))  # (T, C)
            if self.compiled:
                torch._dynamo.maybe_mark_dynamic(x, 0)  # T changes every batch: compile for any T at once
            for layer in self.layers:
                x = layer(x, packing)
            return unpack(self._final_norm(x), packing)  # (B, L, C)
        x = self.dropout(self._embed_norm(self.embed(tokens) + self.positions[:L]))  # (B, L, C)
        if self.compiled:
            torch._dynamo.maybe_mark_dynamic(x, 0)  # length-bucketed batches: rows and width vary
            torch._dynamo.maybe_mark_dynamic(x, 1)
        for layer in self.layers:
            x = layer(x, attn_mask)
        return self._final_norm(x)

    def _embed_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.embed_norm is None else self.embed_norm(x)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.final_norm is None else self.final_norm(x)

    def compile_layers(self) -> None:
        """``torch.compile`` every layer in place (parameter names unchanged).

        Per layer rather than the whole model: the layers share one graph, free of graph breaks,
        while the objective's data-dependent steps (masking, pair selection, packing) run eagerly
        around it. Compiling the whole objective breaks its graph at each of those.
        """
        for layer in self.layers:
            layer.compile()
        self.compiled = True

    def _packs(self, device: torch.device) -> bool:
        """Whether a padded batch takes the packed layout (see the module docstring)."""
        if self.attention not in ATTENTION_LAYOUTS:
            raise PmlmError(f"attention must be one of {', '.join(ATTENTION_LAYOUTS)}, got {self.attention!r}")
        if self.attention != "auto":
            return self.attention == "packed"
        if device.type == "cpu" and not torch.is_grad_enabled():
            # inference on a CPU: every linear layer skips the pads, and a per-sequence attention loop without a
            # backward costs little beside them (pmlm embed 1.6x faster on batches with a quarter of pads)
            return True
        # the dtype attention will see: autocast's, else the weights'
        autocast = device.type == "cuda" and torch.is_autocast_enabled("cuda")
        dtype = torch.get_autocast_dtype("cuda") if autocast else self.embed.weight.dtype
        dropout_p = self.cfg.attention_dropout if self.training else 0.0
        return dtype in HALF_DTYPES and packed_kernel_usable(device, dtype, self.cfg.head_dim, dropout_p)


def init_weights(module: nn.Module) -> None:
    """Initialisation described in the module docstring; apply with ``model.apply``."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=1.0)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
