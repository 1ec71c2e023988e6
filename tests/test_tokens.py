"""The token batch builder: golden rows, crop windows, padding and the residue map."""

from __future__ import annotations

import numpy as np
import pytest

from pmlm.alphabet import CLS_ID, EOS_ID, PAD_ID, encode
from pmlm.tokens import batch_tokens, crop_room, max_residues, padded_width, token_positions


def test_golden_rows_with_padding():
    a, b = encode("ACDE"), encode("KL")
    out = batch_tokens([a, b])
    assert out.tokens.dtype == np.int64
    assert out.tokens.tolist() == [
        [CLS_ID, *a.tolist(), EOS_ID],
        [CLS_ID, *b.tolist(), EOS_ID, PAD_ID, PAD_ID],
    ]
    assert out.lengths.tolist() == [4, 2] and out.starts.tolist() == [0, 0]
    assert out.residue_mask().tolist() == [[True] * 4, [True, True, False, False]]


def test_windows_crop_and_map_back_to_residues():
    seq = encode("ACDEFGHIKL")
    out = batch_tokens([seq, seq[:3]], starts=[4, 0], max_residues=5, pad_to_multiple=8, dtype=np.uint8)
    assert out.tokens.shape == (2, 8) and out.tokens.dtype == np.uint8  # 5 + 2 specials, rounded up to 8
    assert out.lengths.tolist() == [5, 3]
    # residue r of a row sits at token position r - start + 1
    row0 = out.tokens[0]
    for r in range(4, 9):
        assert row0[token_positions(r - out.starts[0])] == seq[r]
    assert row0[6] == EOS_ID and row0[7] == PAD_ID
    with pytest.raises(ValueError, match="outside"):
        batch_tokens([seq], starts=[11])


def test_crop_room_and_window_sizes():
    assert crop_room(np.array([3, 10, 11]), 10).tolist() == [1, 1, 2]
    assert max_residues(256) == 254
    assert padded_width(254, 8) == 256 and padded_width(255, 8) == 264
