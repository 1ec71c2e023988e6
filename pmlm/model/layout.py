"""What the encoder takes, in either layout, built on the host: padded (B, L) rows with a key mask, or the packed T
real tokens with their sequences' offsets. The one home of both layouts and of the map from a token (b, i) of a
padded batch to the encoder's output row.

* **padded**: ``tokens`` (B, L) and a (B, 1, 1, L) key mask, True where a key may be attended to, or None when the
  batch has no ``<pad>``; position 0 of every row stays visible, so an all-``<pad>`` filler row yields finite values.
  Output row of token (b, i): ``b * L + i``.
* **packed**: ``tokens`` (T,) and ``positions`` (T,): every non-``<pad>`` token row by row, then filler tokens up to a
  multiple of ``ROW_MULTIPLE`` rows (few shapes for a compiled encoder: ``<pad>`` at position 0), cut into filler
  sequences of at most ``max_len`` rows so that every row belongs to a sequence and stays finite; ``cu_seqlens`` (S + 1,) int32 holds the
  sequences' offsets (one per row of the padded batch, empty rows included, then the filler's), ``max_len`` a bound
  on their length, rounded up to ``LENGTH_MULTIPLE`` (FlashAttention sizes its grid by it; a few values keep the
  compiled encoder from specialising on every batch). Output row of token (b, i): its place in that order
  (``rows``).

``StaticShape`` fixes the packed layout's shapes whatever the batch (for CUDA graphs, which replay one shape): the
rows filled up to a fixed count, the offsets padded with empty sequences to a fixed count, the length bound fixed.

Building either from (B, L) tokens reads them, so it runs where the batch is built: the training loop's host, once
per micro-batch, before everything is moved to the device in one go (``EncoderInputs.to``). A command that holds its
tokens on the device builds them there at the cost of a few synchronisations (inference does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pmlm.alphabet import PAD_ID
from pmlm.choices import Choice
from pmlm.model.attention import Packing
from pmlm.tokens import round_up

ROW_MULTIPLE = 64  # packed rows are filled up to a multiple of this
LENGTH_MULTIPLE = 64  # the packed layout's bound on a sequence's rows is a multiple of this


class Layout(Choice):
    """The attention layout of a run or command (``attention:`` in recipes). ``auto`` is decided per device, dtype
    and autograd (``pmlm.model.encoder.Encoder.layout``)."""

    AUTO = "auto"
    PACKED = "packed"
    PADDED = "padded"

    @property
    def packs(self) -> bool:
        return self is Layout.PACKED


@dataclass(frozen=True)
class StaticShape:
    """Fixed packed shapes (module docstring): ``rows`` packed rows, ``sequences`` entries of offsets after the first,
    every sequence at most ``max_len`` rows."""

    rows: int
    sequences: int
    max_len: int

    @classmethod
    def of_micro_batch(cls, tokens: int, max_len: int, pad_to_multiple: int = 1) -> StaticShape:
        """The shape that holds any micro-batch of a ``tokens`` budget of rows up to ``max_len`` tokens: a part may
        exceed its budget by one row (pmlm.train.step_layout), and a row holds at least 3 tokens."""
        bound = round_up(max_len, LENGTH_MULTIPLE)
        rows = round_up(tokens + max_len, ROW_MULTIPLE)
        smallest_row = round_up(3, pad_to_multiple)
        return cls(rows, (tokens + max_len) // smallest_row + rows // bound + 2, bound)


@dataclass(frozen=True)
class EncoderInputs:
    """One batch as the encoder takes it (module docstring)."""

    tokens: Tensor  # padded (B, L) | packed (T,) int64 token ids
    shape: tuple[int, int]  # (B, L) of the padded batch these rows came from
    key_mask: Tensor | None = None  # padded: (B, 1, 1, L) bool, True = may attend; None when nothing is <pad>
    positions: Tensor | None = None  # packed: (T,) int64 position of each row in its sequence (<cls> = 0)
    cu_seqlens: Tensor | None = None  # packed: (S + 1,) int32 sequence offsets
    max_len: int = 0  # packed: no sequence has more rows
    index: Tensor | None = None  # packed: (T_real,) int64 the real tokens' places in the (B * L) flattening

    @property
    def packed(self) -> bool:
        return self.positions is not None

    @property
    def packing(self) -> Packing:
        return Packing(self.cu_seqlens, self.max_len)

    @property
    def rows(self) -> int:
        """Rows of the encoder's output: T packed, B * L padded."""
        return self.tokens.shape[0] if self.packed else self.shape[0] * self.shape[1]

    def to(self, device: torch.device, non_blocking: bool = False) -> EncoderInputs:
        return dataclasses.replace(self, **_moved(self, device, non_blocking))

    def pin_memory(self) -> EncoderInputs:
        return dataclasses.replace(self, **{k: v.pin_memory() for k, v in _tensors(self).items()})


def _tensors(inputs) -> dict[str, Tensor]:
    fields = (f.name for f in dataclasses.fields(inputs))
    return {name: getattr(inputs, name) for name in fields if isinstance(getattr(inputs, name), Tensor)}


def _moved(inputs, device: torch.device, non_blocking: bool) -> dict:
    return {k: v.to(device, non_blocking=non_blocking) for k, v in _tensors(inputs).items()}


def key_padding_mask(tokens: Tensor) -> Tensor | None:
    """(B, 1, 1, L) True where a key may be attended to, or None when ``tokens`` has no <pad> (one read of the
    tokens: free on the host, a synchronisation on a device)."""
    pad = tokens.eq(PAD_ID)  # (B, L)
    if not bool(pad.any()):
        return None
    keep = ~pad
    # position 0 always stays visible so an all-<pad> filler row yields finite values, not NaN
    # (a NaN row would poison weight gradients through 0 * NaN)
    keep[:, 0] = True
    return keep[:, None, None, :]


def padded_inputs(tokens: Tensor) -> EncoderInputs:
    """The padded layout of ``tokens`` (B, L)."""
    return EncoderInputs(tokens, tuple(tokens.shape), key_mask=key_padding_mask(tokens))


def packed_inputs(tokens: Tensor, row_multiple: int = ROW_MULTIPLE, static: StaticShape | None = None) -> EncoderInputs:
    """The packed layout of ``tokens`` (B, L) (module docstring); rows may be empty (an all-<pad> filler row).
    ``static``: fixed shapes, an error if the tokens do not fit them."""
    B, L = tokens.shape
    keep = tokens.ne(PAD_ID)  # (B, L)
    lengths = keep.sum(dim=1)  # (B,)
    index = keep.reshape(-1).nonzero().squeeze(1)  # (T_real,)
    real = index.numel()
    longest = int(lengths.max()) if B else 0
    bound = max(round_up(longest, LENGTH_MULTIPLE), LENGTH_MULTIPLE) if static is None else static.max_len
    total = round_up(max(real, 1), row_multiple) if static is None else static.rows
    filler = total - real
    # filler sequences of at most `bound` rows: every row is in a sequence, none longer than the bound
    fill_lengths = [bound] * (filler // bound) + ([filler % bound] if filler % bound else [])
    if static is not None:
        if longest > bound or filler < 0 or B + len(fill_lengths) > static.sequences:
            raise ValueError(f"a batch of {B} rows, {real} tokens, longest {longest}, does not fit {static}")
        fill_lengths += [0] * (static.sequences - B - len(fill_lengths))  # empty sequences: a fixed count
    seq_lengths = torch.cat([lengths, torch.tensor(fill_lengths, dtype=lengths.dtype, device=lengths.device)])
    cu_seqlens = F.pad(seq_lengths.cumsum(0), (1, 0)).to(torch.int32)  # (S + 1,)
    positions = index % L
    ids = tokens.reshape(-1).index_select(0, index)
    if filler:  # <pad> at position 0: any model's position table has that row
        positions = torch.cat([positions, positions.new_zeros(filler)])
        ids = torch.cat([ids, ids.new_full((filler,), PAD_ID)])
    return EncoderInputs(ids, (B, L), positions=positions, cu_seqlens=cu_seqlens, max_len=bound, index=index)


def build_inputs(tokens: Tensor, layout: Layout, static: StaticShape | None = None) -> EncoderInputs:
    """``tokens`` (B, L) in ``layout`` (packed, in ``static`` shapes if given, or padded)."""
    return packed_inputs(tokens, static=static) if layout.packs else padded_inputs(tokens)


def output_rows(inputs: EncoderInputs, flat: Tensor) -> Tensor:
    """The encoder's output rows of the tokens at ``flat`` (any shape) places of the (B * L) flattening: the place
    itself padded; its rank among the real tokens packed (every place must hold a real token)."""
    if not inputs.packed:
        return flat
    rank = torch.full((inputs.shape[0] * inputs.shape[1],), -1, dtype=torch.long, device=flat.device)
    rank[inputs.index.to(flat.device)] = torch.arange(inputs.index.numel(), device=flat.device)
    return rank[flat]


def unpack(x: Tensor, inputs: EncoderInputs) -> Tensor:
    """The encoder's output rows (rows, C) -> (B, L, C): zeros at <pad> in the packed layout; differentiable."""
    B, L = inputs.shape
    C = x.shape[-1]
    if not inputs.packed:
        return x.view(B, L, C)
    real = inputs.index.numel()
    out = x.new_zeros(B * L, C).index_copy(0, inputs.index, x[:real])
    return out.view(B, L, C)
