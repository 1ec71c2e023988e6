"""The planted-coupling study's data: which sequences of each ``pmlm synth`` family are held out, and
the families read back with their planted contacts (see ``pmlm.coevolution.evaluate`` for the split rule).
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
class StudyConfig:
    """How held-out sequences are chosen and how much of them each read-out uses."""

    valid_fraction: float = 0.1  # share of each family's sequences held out (per-sequence hash draw)
    split_seed: int = 0  # seed of that draw; the split rule and this evaluation must agree
    seed: int = 0  # the study seed: recorded with the results; orders the contact head's folds, seeds its fit
    # held-out sequences per family, the same first ones for every read-out (pair head, chain rule,
    # attention, supervised contact head), so no read-out is averaged over more data than another
    sequences: int = 8
    chain_rule: int = 1  # 1: the token head's chain-rule joint too (41 forwards per pair); 0 skips it
    min_separation: int = 6  # contact metrics and KL groups use pairs with |i-j| >= this
    k_divisor: int = 5  # P@L/k
    head_steps: int = 300  # full-batch Adam steps of the supervised contact head
    head_lr: float = 1e-2  # its learning rate
    head_dropout: float = 0.0  # dropout on its pair features (TAPE's fine-tuning uses 0.5 on far more data)
    batch_rows: int = 4096  # sequences per forward pass (bounds memory)
    # 1: epistasis and conditional log-loss against the exact Potts values (pmlm.coevolution.epistasis); 0 skips
    exact: int = 1
    # 1: also the token heads' epistasis by substitution (40 forwards per pair, planted and as many other pairs)
    substitution: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"valid_fraction (--valid-fraction) must be in (0, 1), got {self.valid_fraction}")
        for name in ("chain_rule", "exact", "substitution"):
            if getattr(self, name) not in (0, 1):
                raise ConfigError(f"{name} (--{name.replace('_', '-')}) must be 0 or 1, got {getattr(self, name)}")
        for name in ("sequences", "min_separation", "k_divisor", "head_steps", "batch_rows"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} (--{name.replace('_', '-')}) must be >= 1, got {getattr(self, name)}")
        if not self.head_lr > 0:
            raise ConfigError(f"head_lr (--head-lr) must be > 0, got {self.head_lr}")
        if not 0.0 <= self.head_dropout < 1.0:
            raise ConfigError(f"head_dropout (--head-dropout) must be in [0, 1), got {self.head_dropout}")


@dataclass
class FamilyData:
    """One family's sequences (residue classes) on both sides of the split, and its planted edges."""

    name: str
    train: np.ndarray  # (N, L) uint8
    heldout: np.ndarray  # (M, L) uint8
    contacts: np.ndarray  # (L, L) bool, symmetric
    heldout_ids: list[str]  # (M,) sequence ids of ``heldout``, in file order
    potts: PottsModel | None = None  # the family's model (params/<family>.safetensors), None if not written

    def evaluation_rows(self, cfg: StudyConfig) -> tuple[np.ndarray, list[str]]:
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


def split_records(fasta: str | Path, cfg: StudyConfig):
    """Yield (id, family, sequence, line, held_out) for every record of the FASTA."""
    for seq_id, family, sequence, line in read_family_records(fasta):
        yield seq_id, family, sequence, line, seeded_draw(seq_id, cfg.split_seed) < cfg.valid_fraction


def load_families(synth_dir: str | Path, cfg: StudyConfig) -> list[FamilyData]:
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
                "change --valid-fraction or sample more sequences"
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
