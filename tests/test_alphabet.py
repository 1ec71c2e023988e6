"""Golden token ids: every model, loader and table depends on these never changing silently."""

import numpy as np
import pytest

from pmlm import alphabet as a


def test_golden_ids():
    assert a.TOKENS[:4] == ("<cls>", "<pad>", "<eos>", "<unk>")
    assert (a.CLS_ID, a.PAD_ID, a.EOS_ID, a.UNK_ID) == (0, 1, 2, 3)
    assert a.TOKENS[4:24] == tuple("ACDEFGHIKLMNPQRSTVWY")
    assert a.TOKEN_TO_ID["A"] == 4 and a.TOKEN_TO_ID["Y"] == 23
    assert a.X_ID == 24 and a.TOKENS[24] == "X"
    assert a.MASK_ID == 25 and a.TOKENS[25] == "<mask>"
    assert a.VOCAB_SIZE == 32 and a.VOCAB_SIZE % a.VOCAB_MULTIPLE == 0
    assert all(t.startswith("<null_") for t in a.TOKENS[26:])
    assert a.NUM_RESIDUES == 20 and a.NUM_PAIR_CLASSES == 400


def test_encode_decode_roundtrip():
    ids = a.encode("MKVLAX")
    assert ids.dtype == np.uint8
    assert ids.tolist() == [14, 12, 21, 13, 4, 24]
    assert a.decode(ids) == "MKVLAX"
    assert a.decode([a.CLS_ID, 4, a.MASK_ID, a.EOS_ID]) == "<cls>A<mask><eos>"


@pytest.mark.parametrize("bad", ["MKb", "MK*", "MK-", "MKB", "MKé"])
def test_encode_rejects_unnormalised(bad):
    with pytest.raises(ValueError, match="position 3"):
        a.encode(bad)


def test_residue_class():
    ids = np.array([a.CLS_ID, 4, 23, a.X_ID, a.MASK_ID, a.PAD_ID])
    assert a.residue_class(ids).tolist() == [-1, 0, 19, -1, -1, -1]


def test_nonstandard_mapping_is_documented_and_closed():
    assert a.NONSTANDARD_MAP == {"U": "C", "O": "K", "B": "X", "Z": "X", "J": "X"}
    # every target is encodable, and the 26 letters are all covered by standard + X + mapped
    assert all(t in a.TOKEN_TO_ID for t in a.NONSTANDARD_MAP.values())
    letters = set(a.RESIDUES) | {"X"} | set(a.NONSTANDARD_MAP)
    assert letters == set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
