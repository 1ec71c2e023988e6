"""The single source of token ids for every model, loader and table in pmlm.

Layout (vocabulary padded to a multiple of 8 so embedding and output matrices align
with tensor-core tiles)::

    0 <cls>  1 <pad>  2 <eos>  3 <unk>
    4..23    the 20 standard residues, in the order of RESIDUES
    24 X     unknown / ambiguous residue
    25 <mask>
    26..31   <null_0>..<null_5>  (padding of the vocabulary, never produced)

Residue class index (0..19, used by the token head and the 400-class pair head) is
``token_id - FIRST_RESIDUE_ID`` for standard residues.

The ``full`` pair vocabulary squares the released PMLM code's dictionary (fairseq: ``<s> <pad> </s>
<unk>``, the 22 symbols of its ``dict.txt`` = 20 residues, ``X`` and the alignment gap ``-``, then
``<mask>``: 27 tokens, 729 pair classes). That dictionary is ours without the vocabulary padding plus
the gap, which no input of ours holds; ``FULL_PAIR_SIDE`` counts it from the tokens below, and a pair's
full class is ``FULL_PAIR_SIDE * id_i + id_j`` over our token ids (the gap's slot, the last, is never a
label).

Non-standard letters (documented mapping, applied by ``pmlm ingest`` under the
``nonstandard: map`` policy): U (selenocysteine) -> C, O (pyrrolysine) -> K,
B (D or N), Z (E or Q) and J (I or L) -> X. Lowercase letters are uppercased under
``case: upper``. Token ids are therefore only produced from the 21 letters
``ACDEFGHIKLMNPQRSTVWYX``.
"""

from __future__ import annotations

import numpy as np

CLS, PAD, EOS, UNK = "<cls>", "<pad>", "<eos>", "<unk>"
MASK = "<mask>"
SPECIALS = (CLS, PAD, EOS, UNK)
RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
UNKNOWN_RESIDUE = "X"
VOCAB_MULTIPLE = 8

CLS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
FIRST_RESIDUE_ID = 4
X_ID = FIRST_RESIDUE_ID + len(RESIDUES)  # 24
MASK_ID = X_ID + 1  # 25
NUM_RESIDUES = len(RESIDUES)  # 20: classes of the token head
NUM_PAIR_CLASSES = NUM_RESIDUES * NUM_RESIDUES  # 400: classes of the pair head
# the class of a position, pair or triple no loss counts (unmasked positions, masked non-standard residues, padding
# rows): cross-entropy's ignore_index
IGNORE_INDEX = -100

_base = [*SPECIALS, *RESIDUES, UNKNOWN_RESIDUE, MASK]
_n_null = (-len(_base)) % VOCAB_MULTIPLE
TOKENS: tuple[str, ...] = tuple(_base + [f"<null_{i}>" for i in range(_n_null)])
VOCAB_SIZE = len(TOKENS)  # 32
GAP = "-"  # the released dictionary's alignment gap: a pair-class slot only, never a token of ours
FULL_PAIR_SIDE = len(_base) + 1  # 27: our unpadded tokens plus the gap = the released dictionary
NUM_FULL_PAIR_CLASSES = FULL_PAIR_SIDE * FULL_PAIR_SIDE  # 729
TOKEN_TO_ID = {tok: i for i, tok in enumerate(TOKENS)}

# Non-standard amino-acid letters and what the `map` policy turns them into.
NONSTANDARD_MAP = {"U": "C", "O": "K", "B": "X", "Z": "X", "J": "X"}

# 256-entry lookup: byte of an (already normalised, uppercase) residue letter -> token id.
# Anything else maps to 255, which callers treat as "invalid".
INVALID_BYTE = 255
_lut = np.full(256, INVALID_BYTE, dtype=np.uint8)
for _letter in RESIDUES + UNKNOWN_RESIDUE:
    _lut[ord(_letter)] = TOKEN_TO_ID[_letter]
BYTE_TO_ID: np.ndarray = _lut
BYTE_TO_ID.setflags(write=False)

# bytes.translate table equivalent of BYTE_TO_ID (fast path for tokenizing whole records)
TRANSLATE_TABLE = bytes(int(v) for v in BYTE_TO_ID)


def encode(sequence: str) -> np.ndarray:
    """Residue letters -> token ids (uint8), without <cls>/<eos>.

    The sequence must already be normalised (uppercase, letters of ``RESIDUES`` or X);
    raises ValueError naming the first offending character otherwise.
    """
    ids = np.frombuffer(sequence.encode("ascii", "replace").translate(TRANSLATE_TABLE), dtype=np.uint8)
    bad = np.flatnonzero(ids == INVALID_BYTE)
    if bad.size:
        pos = int(bad[0])
        raise ValueError(f"character {sequence[pos]!r} at position {pos + 1} is not a residue letter")
    return ids


def decode(ids) -> str:
    """Token ids -> string; specials are rendered by name (e.g. ``<mask>``)."""
    return "".join(TOKENS[int(i)] for i in ids)


def residue_class(token_ids: np.ndarray) -> np.ndarray:
    """Token ids -> residue class 0..19, or -1 for anything that is not a standard residue."""
    ids = np.asarray(token_ids).astype(np.int64)
    cls = ids - FIRST_RESIDUE_ID
    return np.where((cls >= 0) & (cls < NUM_RESIDUES), cls, -1)
