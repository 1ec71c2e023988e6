"""The one token layout every model input uses: ``<cls> residues <eos> <pad>...``, a row per sequence
window, with the crop policy and the map from token positions back to residues.

Sequences are 1-D arrays of residue token ids (no specials, ``pmlm.alphabet`` ids). A window is the
slice ``[start, start + length)`` of its sequence; residue ``r`` of the sequence sits at token
position ``r - start + RESIDUE_OFFSET`` of its row. Numpy only, so the loaders can batch in uint8
and hand out tensors themselves (``torch.from_numpy``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pmlm.alphabet import CLS_ID, EOS_ID, PAD_ID

# <cls> and <eos> wrap every window, so a model of max_len tokens takes max_len - 2 residues
SPECIALS_PER_SEQUENCE = 2
RESIDUE_OFFSET = 1  # token position of a window's first residue: <cls> is position 0
# token budget of one inference forward pass (rows x padded width) unless a command is told otherwise
DEFAULT_TOKENS_PER_BATCH = 8192


def max_residues(max_len: int) -> int:
    """Residues of one window for a model that takes ``max_len`` tokens."""
    return max_len - SPECIALS_PER_SEQUENCE


def round_up(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)


def padded_width(residues: int, pad_to_multiple: int = 1) -> int:
    """Tokens of a row holding ``residues`` residues, rounded up to ``pad_to_multiple``."""
    return round_up(residues + SPECIALS_PER_SEQUENCE, pad_to_multiple)


def trimmed_width(rows, pad_to_multiple: int = 1) -> int:
    """Width that holds every token of ``rows`` ((B, L) ids, a NumPy array or a tensor) but their trailing padding,
    rounded up to ``pad_to_multiple``: the width these rows get when batched on their own."""
    if len(rows) == 0:
        return 0
    return round_up(int((rows != PAD_ID).sum(1).max()), pad_to_multiple)


def crop_room(lengths: np.ndarray, max_residues: int) -> np.ndarray:
    """(B,) number of possible window starts of each sequence: a sequence longer than
    ``max_residues`` gets a window starting anywhere in ``[0, room)``, a shorter one starts at 0.

    The crop policy: training draws each start uniformly in ``[0, room)`` from its own seeded
    stream (the stream is part of the loader's resume contract, so the draw stays there);
    evaluation takes the first window (start 0).
    """
    return np.maximum(np.asarray(lengths, dtype=np.int64) - max_residues, 0) + 1


@dataclass(frozen=True)
class TokenBatch:
    """Padded token rows plus where each row's residues came from."""

    tokens: np.ndarray  # (B, T): <cls> residues <eos> <pad>...
    starts: np.ndarray  # (B,) int64, first residue of each row's window in its sequence
    lengths: np.ndarray  # (B,) int64, residues in each row

    def residue_mask(self) -> np.ndarray:
        """(B, L) bool, True at real residues, L the longest window (token positions 1..L)."""
        width = int(self.lengths.max()) if self.lengths.size else 0
        return np.arange(width)[None, :] < self.lengths[:, None]


def token_positions(residues) -> np.ndarray:
    """Residue indices within a window -> token positions in its row (any shape)."""
    return np.asarray(residues) + RESIDUE_OFFSET


def batch_tokens(
    sequences: Sequence[np.ndarray],
    starts: Sequence[int] | np.ndarray | None = None,
    *,
    max_residues: int | None = None,
    pad_to_multiple: int = 1,
    dtype=np.int64,
) -> TokenBatch:
    """Token rows of the windows ``sequences[b][starts[b] : starts[b] + max_residues]``.

    ``starts`` defaults to 0 (the first window) and ``max_residues`` to no crop; the width is
    the longest row rounded up to ``pad_to_multiple`` tokens.
    """
    n = len(sequences)
    starts = np.zeros(n, dtype=np.int64) if starts is None else np.asarray(starts, dtype=np.int64)
    full = np.array([len(s) for s in sequences], dtype=np.int64)
    lengths = full - starts if max_residues is None else np.minimum(full - starts, max_residues)
    if n and (starts.min() < 0 or lengths.min() < 0):
        raise ValueError("a window starts outside its sequence")
    width = padded_width(int(lengths.max()) if n else 0, pad_to_multiple)
    out = np.full((n, width), PAD_ID, dtype=dtype)  # (B, T)
    out[:, 0] = CLS_ID
    for row, (seq, start, length) in enumerate(zip(sequences, starts.tolist(), lengths.tolist())):
        out[row, RESIDUE_OFFSET : RESIDUE_OFFSET + length] = seq[start : start + length]
        out[row, RESIDUE_OFFSET + length] = EOS_ID
    return TokenBatch(tokens=out, starts=starts, lengths=lengths)


# --- sequences longer than one window -------------------------------------------------------------
# A sequence longer than the model's window is read as overlapping windows of ``room`` residues,
# ``stride`` apart (half a window by default), the last one flush with the sequence end; a per-residue
# (or per-pair) quantity is the mean over the windows that hold the residue (or both residues of the
# pair). With the default stride every pair closer than ``room // 2`` lies in some window; a pair that
# no window holds has no value (NaN), which callers report or rank last.


def window_starts(length: int, room: int, stride: int | None = None) -> list[int]:
    """Starts of the windows that cover ``[0, length)``: one window (start 0) when it fits."""
    if room <= 0:
        raise ValueError("a window must hold at least one residue")
    if length <= room:
        return [0]
    stride = max(room // 2, 1) if stride is None else stride
    if not 0 < stride <= room:
        raise ValueError(f"window stride {stride} must be in [1, {room}]")
    starts = list(range(0, length - room, stride))
    return [*starts, length - room]


class WindowMean:
    """Running mean over overlapping windows of a per-residue ``(L, ...)`` or per-pair ``(L, L, ...)``
    quantity of one sequence of ``length`` residues (float64 sums, so the order of windows does not
    matter beyond rounding)."""

    def __init__(self, length: int, trailing_shape: tuple[int, ...] = (), *, pairs: bool = False):
        lead = (length, length) if pairs else (length,)
        self.pairs = pairs
        self.sums = np.zeros(lead + tuple(trailing_shape), dtype=np.float64)
        self.counts = np.zeros(lead, dtype=np.int64)

    def add(self, start: int, values: np.ndarray) -> None:
        """Add one window's values, ``(n, ...)`` or ``(n, n, ...)`` for the residues ``[start, start + n)``."""
        n = values.shape[0]
        window = slice(start, start + n)
        index = (window, window) if self.pairs else (window,)
        self.sums[index] += values
        self.counts[index] += 1

    def mean(self) -> np.ndarray:
        """The mean per residue (or pair); NaN where no window held it."""
        counts = self.counts.reshape(self.counts.shape + (1,) * (self.sums.ndim - self.counts.ndim))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, self.sums / np.maximum(counts, 1), np.nan)
