"""The sequence encoder: token embeddings plus fixed sinusoidal positions, then Transformer layers, post-LN
(the released code's) or pre-LN.

Choices (the layer recipes per objective: docs/model.md, "Encoder layers"):

* ``model.norm`` picks the layer: ``post`` (fairseq 0.10.2's ``TransformerSentenceEncoderLayer``, what the
  released PMLM code runs): ``x = LN(x + Drop(Attn(x)))``, then ``x = LN(x + Drop(FFN(x)))``, no final LayerNorm;
  ``pre`` (ESM-1b): ``x = x + Drop(Attn(LN(x)))``, ``x = x + Drop(FFN(LN(x)))``, and a final LayerNorm.
  ``FFN(x) = W2 ActDrop(act(W1 x))``. ``model.embedding_norm`` adds a LayerNorm on token + position embeddings,
  before the embedding dropout (fairseq 0.10.2's ``encoder_normalize_before``). Both layers keep the same
  parameter names.
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
* No query ever attends to ``<pad>``, in either layout (``pmlm.model.layout``): ``padded`` passes a key-padding mask
  to ``scaled_dot_product_attention`` (on CPU with attention dropout, ``pmlm.model.dropout_attention``), ``packed``
  runs every layer on the T real tokens (``pmlm.model.attention``). ``auto`` packs where the fused kernel runs (CUDA
  under bf16 / fp16) and for inference on a CPU (no autograd: the linear layers skip the pads, and the per-sequence
  attention costs little without a backward), and stays padded elsewhere, e.g. training on a CPU, where the
  blockwise dropout kernel is the faster path.
* **Precision** (docs/gpu.md): under autocast the residual stream stays in autocast's dtype; ``LayerNorm`` computes
  in fp32 internally and returns the input's dtype.
* ``encode`` is the whole computation from ``EncoderInputs`` to the output rows, without a host synchronisation, and
  ``compile_encoder`` compiles it whole (one graph: the packed attention is an op, not a graph break).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pmlm.alphabet import PAD_ID, VOCAB_SIZE
from pmlm.errors import PmlmError
from pmlm.model.attention import HALF_DTYPES, Packing, flash_usable, packed_attention
from pmlm.model.config import ModelConfig
from pmlm.model.dropout_attention import attention
from pmlm.model.layout import EncoderInputs, Layout, build_inputs, unpack

INIT_STD = 0.02  # std of Linear weights (BERT / fairseq RoBERTa)
POSITION_BASE = 10000.0  # wavelength base of the sinusoidal positions


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


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that returns half inputs in their dtype (module docstring, Precision): fp32 statistics and
    weights, the output rounded once. Full-precision inputs take ``nn.LayerNorm``'s own path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in HALF_DTYPES:
            # the aten op itself, not F.layer_norm: autocast lists layer_norm among its fp32 ops and would cast up
            return torch.native_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)[0]
        return super().forward(x)


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
        self.post_norm = not cfg.norm.final
        self.act = ACTIVATIONS[cfg.activation]
        self.attn_norm = LayerNorm(cfg.hidden)
        self.attn = SelfAttention(cfg)
        self.ffn_norm = LayerNorm(cfg.hidden)
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
    """Token ids (B, L) -> contextual representations (B, L, C); ``encode``: ``EncoderInputs`` -> output rows.

    ``attention`` (a ``Layout``: auto, packed, padded) picks the layout of padded batches (module docstring); it is a
    run-time setting, not part of the weights or the config.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.attention = Layout.AUTO
        self.embed = nn.Embedding(VOCAB_SIZE, cfg.hidden, padding_idx=PAD_ID)
        # not a parameter and not saved: rebuilt from the config on load
        self.register_buffer("positions", position_table(cfg), persistent=False)
        self.embed_norm = LayerNorm(cfg.hidden) if cfg.embedding_norm else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        # post-LN layers end in a LayerNorm already; pre-LN leaves the residual stream unnormalised
        self.final_norm = LayerNorm(cfg.hidden) if cfg.norm.final else None
        self._compiled = None  # compile_encoder's function, if compiled
        self._static = False  # whether it takes one shape (compile_encoder)

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids -> (B, L, C), in the layout ``attention`` picks here (zeros at <pad> when packed)."""
        inputs = build_inputs(tokens, self.layout(tokens.device))
        return unpack(self.encode(inputs), inputs)

    def encode(self, inputs: EncoderInputs) -> torch.Tensor:
        """``inputs`` -> the output rows (rows, C): packed (T, C), padded (B * L, C). No host synchronisation."""
        if self.cfg.max_len < inputs.shape[1]:
            raise PmlmError(
                f"batch of {inputs.shape[1]} tokens exceeds the model's max_len {self.cfg.max_len} "
                "(which counts <cls> and <eos>); crop the sequences or use a larger max_len"
            )
        device = inputs.tokens.device.type
        # the residual stream's dtype (module docstring, Precision): decided here, outside any compiled graph
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        if self._compiled is None:
            return self.run(inputs.tokens, inputs.positions, inputs.cu_seqlens, inputs.max_len, inputs.key_mask, dtype)
        if self._static:  # one shape (layout.StaticShape), replayed as a CUDA graph: a new step's outputs each time
            torch.compiler.cudagraph_mark_step_begin()
            return self._compiled(
                inputs.tokens, inputs.positions, inputs.cu_seqlens, inputs.max_len, inputs.key_mask, dtype
            )
        # batch after batch the rows change: one graph for any number of them
        dynamic = [(inputs.tokens, d) for d in range(inputs.tokens.dim())]
        if inputs.packed:
            dynamic += [(inputs.positions, 0), (inputs.cu_seqlens, 0)]
        elif inputs.key_mask is not None:
            dynamic += [(inputs.key_mask, 0), (inputs.key_mask, 3)]
        for tensor, dim in dynamic:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
        return self._compiled(
            inputs.tokens, inputs.positions, inputs.cu_seqlens, inputs.max_len, inputs.key_mask, dtype
        )

    def run(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
        max_len: int,
        key_mask: torch.Tensor | None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The encoder on one layout's tensors (``EncoderInputs``' fields) -> (rows, C); ``dtype``: the residual
        stream's, under autocast."""
        if positions is not None:  # packed: (T,) tokens
            x = self.embed(tokens) + self.positions.index_select(0, positions)  # (T, C)
            layout = Packing(cu_seqlens, max_len)
        else:  # padded: (B, L) tokens
            x = self.embed(tokens) + self.positions[: tokens.shape[1]]  # (B, L, C)
            layout = key_mask
        if dtype is not None:
            x = x.to(dtype)
        x = self.dropout(self._embed_norm(x))
        for layer in self.layers:
            x = layer(x, layout)
        x = self._final_norm(x)
        return x.reshape(-1, x.shape[-1])  # (rows, C)

    def _embed_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.embed_norm is None else self.embed_norm(x)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.final_norm is None else self.final_norm(x)

    def compile_encoder(self, per_layer: bool = False, static: bool = False, **options) -> None:
        """``torch.compile`` the encoder: whole (``encode``'s computation as one graph, the packed attention an op in
        it), or ``per_layer`` (each layer its own graph, for FSDP's per-layer parameter gathers). ``static``: every
        batch comes in one shape (``layout.StaticShape``; for CUDA graphs), else the rows are marked dynamic.
        ``options`` go to ``torch.compile`` (``mode``, ``backend``); parameter names are unchanged."""
        if per_layer:
            for layer in self.layers:
                layer.compile(dynamic=False if static else None, **options)
            return
        self._static = static
        self._compiled = torch.compile(self.run, dynamic=False if static else None, **options)

    def layout(self, device: torch.device, dtype: torch.dtype | None = None, *, grad: bool | None = None) -> Layout:
        """The layout a batch takes here (module docstring): ``attention`` unless auto. ``dtype``: attention's
        (default: autocast's on this device, else the weights'); ``grad``: whether autograd records (default: now)."""
        chosen = Layout.parse(self.attention, "attention")  # the Python API may set a name
        if chosen is not Layout.AUTO:
            return chosen
        grad = torch.is_grad_enabled() if grad is None else grad
        if device.type == "cpu" and not grad:
            # inference on a CPU: every linear layer skips the pads, and a per-sequence attention loop without a
            # backward costs little beside them (pmlm embed 1.6x faster on batches with a quarter of pads)
            return Layout.PACKED
        if dtype is None:
            autocast = torch.is_autocast_enabled(device.type)
            dtype = torch.get_autocast_dtype(device.type) if autocast else self.embed.weight.dtype
        return Layout.PACKED if flash_usable(device, dtype, self.cfg.head_dim) else Layout.PADDED


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
