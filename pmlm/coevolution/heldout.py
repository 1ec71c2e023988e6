"""The planted-coupling study's data: which sequences of each ``pmlm synth`` family are held out, and
the families read back with their planted contacts and Potts models.

The split: every family contributes sequences to both sides, a sequence held out when a hash of (split seed,
sequence id) falls below ``valid_fraction`` (per sequence, deterministic, independent of file order). Encoders
train on the other sequences of the same families (the couplings are per family, so held-out sequences of unseen
families would test nothing learnable); every model read-out uses held-out sequences only, the baselines that fit
an alignment the training sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pmlm.alphabet import RESIDUES
from pmlm.data.fasta import read_fasta
from pmlm.data.split import seeded_draw
from pmlm.errors import ConfigError, InputError
from pmlm.synth.parameters import PARAMS_DIR, read_potts
from pmlm.synth.potts import PottsModel, read_contacts
from pmlm.synth.synthesize import CONTACTS_DIR
from pmlm.synth.synthesize import FASTA_NAME as FAMILIES_FASTA

_LETTER_CLASS = np.full(256, -1, dtype=np.int16)
_LETTER_CLASS[np.frombuffer(RESIDUES.encode("ascii"), dtype=np.uint8)] = np.arange(len(RESIDUES))


@dataclass
class SplitConfig:
    """Which sequences of each family are held out: a hash of (split seed, sequence id) below ``valid_fraction``."""

    valid_fraction: float = 0.1  # share of each family's sequences held out (per-sequence hash draw)
    split_seed: int = 0  # seed of that draw

    def __post_init__(self) -> None:
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"valid_fraction must be in (0, 1), got {self.valid_fraction}")


@dataclass
class FamilyData:
    """One family's sequences (residue classes) on both sides of the split, and its planted edges."""

    name: str
    train: np.ndarray  # (N, L) uint8
    heldout: np.ndarray  # (M, L) uint8
    contacts: np.ndarray  # (L, L) bool, symmetric
    heldout_ids: list[str]  # (M,) sequence ids of ``heldout``, in file order
    potts: PottsModel | None = None  # the family's model (params/<family>.safetensors), None if not written

    def evaluation_rows(self, cfg) -> tuple[np.ndarray, list[str]]:
        """The held-out sequences every read-out uses: the first ``cfg.sequences`` in file order, (n, L), and ids."""
        n = min(cfg.sequences, len(self.heldout))
        return self.heldout[:n], self.heldout_ids[:n]

    @property
    def length(self) -> int:
        return int(self.contacts.shape[0])


def _family_of(title: str) -> str | None:
    for word in title.split()[1:]:
        if word.startswith("family="):
            return word[len("family=") :] or None
    return None


def read_family_records(fasta: str | Path):
    """Yield (id, family, residue letters, line) of ``pmlm synth``'s FASTA; every header needs ``family=``."""
    for rec in read_fasta(fasta):
        family = _family_of(rec.title)
        if family is None:
            raise InputError(
                fasta, f"record {rec.id!r}: header has no family=NAME (write it with pmlm synth)", line=rec.line
            )
        yield rec.id, family, rec.sequence, rec.line


def split_records(fasta: str | Path, cfg: SplitConfig):
    """Yield (id, family, sequence, line, held_out) for every record of the FASTA."""
    for seq_id, family, sequence, line in read_family_records(fasta):
        yield seq_id, family, sequence, line, seeded_draw(seq_id, cfg.split_seed) < cfg.valid_fraction


def load_families(synth_dir: str | Path, cfg: SplitConfig) -> list[FamilyData]:
    """Read ``pmlm synth`` output, split each family, attach its planted contacts."""
    synth_dir = Path(synth_dir)
    fasta = synth_dir / FAMILIES_FASTA
    sides: dict[str, tuple[list, list]] = {}
    ids: dict[str, list[str]] = {}
    lengths: dict[str, int] = {}
    for seq_id, family, sequence, line, held_out in split_records(fasta, cfg):
        classes = _LETTER_CLASS[np.frombuffer(sequence.encode("ascii", "replace"), dtype=np.uint8)]
        if (classes < 0).any():
            pos = int(np.flatnonzero(classes < 0)[0])
            raise InputError(
                fasta,
                f"record {seq_id!r}: {sequence[pos]!r} at residue {pos + 1} is not one of the 20 standard residues",
                line=line,
            )
        if lengths.setdefault(family, len(classes)) != len(classes):
            raise InputError(
                fasta,
                f"record {seq_id!r} has {len(classes)} residues but family {family} has "
                f"{lengths[family]}; a family's sequences must align position by position",
                line=line,
            )
        sides.setdefault(family, ([], []))[int(held_out)].append(classes.astype(np.uint8))
        if held_out:
            ids.setdefault(family, []).append(seq_id)
    families = []
    for name in sorted(sides):
        train, heldout = sides[name]
        if not train or not heldout:
            side = "training" if not train else "held-out"
            raise ConfigError(
                f"family {name} has no {side} sequences at valid_fraction {cfg.valid_fraction}; "
                "change valid_fraction or sample more sequences"
            )
        length = lengths[name]
        edges, _ = read_contacts(synth_dir / CONTACTS_DIR / f"{name}.tsv", length)
        contacts = np.zeros((length, length), dtype=bool)
        contacts[edges[:, 0], edges[:, 1]] = True
        contacts |= contacts.T
        params = synth_dir / PARAMS_DIR / f"{name}.safetensors"
        potts = read_potts(params) if params.exists() else None  # older pmlm synth output has none
        if potts is not None and potts.length != length:
            raise InputError(params, f"a model of {potts.length} sites for family {name} of length {length}")
        families.append(FamilyData(name, np.stack(train), np.stack(heldout), contacts, ids[name], potts))
    return families
