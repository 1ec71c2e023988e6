"""The normalisation policy of ``pmlm ingest`` and the normaliser that applies it to one record's
residues: repairs are counted, dropped records counted by reason, and a strict policy turns an
irregularity into a one-line error naming the file and line."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, fields

from pmlm.alphabet import NONSTANDARD_MAP, RESIDUES, UNKNOWN_RESIDUE
from pmlm.errors import ConfigError, InputError

STANDARD = (RESIDUES + UNKNOWN_RESIDUE).encode()
_GAPS = b"-."
_STOP = ord("*")
_NONSTANDARD = "".join(NONSTANDARD_MAP).encode()
_MAP_TABLE = bytes.maketrans(_NONSTANDARD, "".join(NONSTANDARD_MAP.values()).encode())
_X_TABLE = bytes.maketrans(_NONSTANDARD, UNKNOWN_RESIDUE.encode() * len(_NONSTANDARD))


@dataclass
class IngestPolicy:
    """What to do with each kind of irregular input. Defaults suit UniRef50 / Pfam pre-training."""

    case: str = "upper"  # lowercase residues: "upper" (repair, counted) | "error"
    nonstandard: str = "map"  # U->C, O->K, B/Z/J->X: "map" | "x" (all to X) | "drop" (record) | "error"
    gaps: str = "remove"  # '-' and '.' (alignment gaps): "remove" (counted) | "drop" | "error"
    stop: str = "strip"  # a trailing '*': "strip" (counted) | "error"; an internal '*' is invalid
    invalid: str = "drop"  # any other character (digits, punctuation): "drop" (record) | "error"
    min_length: int = 1  # residues after normalisation; shorter records are dropped ("too_short")
    max_length: int = 100_000  # longer records: see too_long
    too_long: str = "drop"  # "drop" (counted) | "error"
    dedup_sequences: bool = True  # drop exact duplicate sequences (the first occurrence is kept)
    # "error" | "drop" (later record) | "rename": a later record gets ID_dupK, the smallest K >= 2 that
    # is neither an id of a kept input record nor an earlier rename (counted)
    duplicate_ids: str = "error"

    _CHOICES = {
        "case": ("upper", "error"),
        "nonstandard": ("map", "x", "drop", "error"),
        "gaps": ("remove", "drop", "error"),
        "stop": ("strip", "error"),
        "invalid": ("drop", "error"),
        "too_long": ("drop", "error"),
        "duplicate_ids": ("error", "drop", "rename"),
    }

    def __post_init__(self):
        for key, choices in self._CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(f"ingest.{key}: {getattr(self, key)!r} is not one of {', '.join(choices)}")
        if not (isinstance(self.min_length, int) and self.min_length >= 1):
            raise ConfigError(f"ingest.min_length must be an integer >= 1, got {self.min_length!r}")
        if not (isinstance(self.max_length, int) and self.max_length >= self.min_length):
            raise ConfigError(f"ingest.max_length must be an integer >= min_length, got {self.max_length!r}")

    @classmethod
    def from_dict(cls, values: dict) -> IngestPolicy:
        known = {f.name for f in fields(cls) if not f.name.startswith("_")}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"ingest: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


class Normaliser:
    """Applies an IngestPolicy to one record's residues (bytes) at a time and counts what it does."""

    def __init__(self, policy: IngestPolicy):
        self.policy = policy
        self.dropped: Counter[str] = Counter()
        self.repaired: Counter[str] = Counter()

    def _fail(self, path: str, line: int, record_id: bytes, message: str):
        raise InputError(path, f"record {record_id.decode(errors='replace')!r}: {message}", line=line)

    def __call__(self, seq: bytes, path: str, line: int, record_id: bytes) -> bytes | None:
        """The clean residues, or None when the record is dropped (reason counted)."""
        p = self.policy
        if seq and seq[-1] == _STOP:
            if p.stop == "error":
                self._fail(path, line, record_id, "trailing '*' (stop codon); set ingest.stop: strip to remove it")
            seq = seq.rstrip(b"*")
            self.repaired["stop_stripped"] += 1
        if not seq.isupper():
            upper = seq.upper()
            if upper != seq:
                if p.case == "error":
                    self._fail(path, line, record_id, "lowercase residues; set ingest.case: upper to convert them")
                seq = upper
                self.repaired["uppercased"] += 1
        leftover = seq.translate(None, STANDARD)
        if leftover:
            seq = self._irregular(seq, leftover, path, line, record_id)
            if seq is None:
                return None
        n = len(seq)
        if n < p.min_length:
            self.dropped["too_short" if n else "empty"] += 1
            return None
        if n > p.max_length:
            if p.too_long == "error":
                self._fail(path, line, record_id, f"{n} residues exceeds ingest.max_length={p.max_length}")
            self.dropped["too_long"] += 1
            return None
        return seq

    def _irregular(self, seq: bytes, leftover: bytes, path: str, line: int, record_id: bytes) -> bytes | None:
        """Gaps, non-standard letters and invalid characters: repaired, dropped or an error."""
        p = self.policy
        if any(c in _GAPS for c in leftover):
            if p.gaps == "error":
                self._fail(path, line, record_id, "alignment gap characters ('-' or '.'); set ingest.gaps: remove")
            if p.gaps == "drop":
                self.dropped["gaps"] += 1
                return None
            seq = seq.translate(None, _GAPS)
            leftover = leftover.translate(None, _GAPS)
            self.repaired["gaps_removed"] += 1
        nonstandard = [c for c in leftover if c in _NONSTANDARD]
        if nonstandard:
            if p.nonstandard == "error":
                self._fail(
                    path, line, record_id, f"non-standard residue {chr(nonstandard[0])!r}; see ingest.nonstandard"
                )
            if p.nonstandard == "drop":
                self.dropped["nonstandard_residue"] += 1
                return None
            seq = seq.translate(_MAP_TABLE if p.nonstandard == "map" else _X_TABLE)
            leftover = leftover.translate(None, _NONSTANDARD)
            self.repaired["nonstandard_mapped"] += 1
        if leftover:
            bad = leftover[0]
            if p.invalid == "error" or (bad == _STOP and p.stop == "error"):
                self._fail(path, line, record_id, f"invalid character {chr(bad)!r} at residue {seq.index(bad) + 1}")
            self.dropped["invalid_character"] += 1
            return None
        if not seq:
            self.dropped["empty"] += 1
            return None
        return seq
