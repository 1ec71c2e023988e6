"""What the inference commands read: an encoder or a fine-tuned head given as a file or its folder, the
device, and FASTA records checked to be residue sequences (one-line errors naming file and line).

A FASTA read here must already be clean: residues ``ACDEFGHIKLMNPQRSTVWY`` or ``X``, unique non-empty ids.
Anything else is an error, not a repair: ``pmlm ingest`` is the command that normalises sequences and
counts what it changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pmlm import alphabet
from pmlm.artefacts import read_head_info, sidecar_path
from pmlm.data.fasta import read_fasta
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.pretrained import load_pretrained
from pmlm.finetune.scoring import load_finetuned
from pmlm.model.pmlm_model import PMLMModel

ENCODER_FILE = "model.safetensors"
HEAD_FILE = "head.safetensors"
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Sequence:
    """One FASTA record, checked: its id, letters, residue token ids (uint8) and header line."""

    id: str
    letters: str
    residues: np.ndarray  # (L,) token ids, no specials
    line: int


def pick_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but no CUDA device is visible")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def artefact_file(path: str | os.PathLike, name: str) -> Path:
    """``path`` itself, or ``path/name`` when ``path`` is a folder."""
    path = Path(path)
    return path / name if path.is_dir() else path


def is_head(path: str | os.PathLike) -> bool:
    """Whether ``path`` (file or folder) is a fine-tuned head rather than an encoder."""
    path = Path(path)
    if path.is_dir():
        return (path / HEAD_FILE).is_file() and not (path / ENCODER_FILE).is_file()
    return path.name == HEAD_FILE or sidecar_path(path).name == "head.json"


def load_encoder(path: str | os.PathLike, device: torch.device) -> tuple[PMLMModel, dict, Path]:
    """(model in eval mode, sidecar info, weights path) of a pre-trained encoder file or folder."""
    weights = artefact_file(path, ENCODER_FILE)
    if not weights.is_file():
        raise InputError(weights, "no encoder weights here (model.safetensors with its model.json, "
                                  "written by pmlm pretrain)")
    try:
        model, info = load_pretrained(weights, device)
    except ConfigError as exc:  # values the model config refuses: the sidecar is what is wrong
        raise InputError(sidecar_path(weights), f"incompatible model description: {exc}") from None
    return model, info, weights


def load_contact_head(path: str | os.PathLike, encoder: str | os.PathLike | None, device: torch.device):
    """(TaskModel, head path, encoder path) of a fine-tuned contact head; ``encoder`` overrides (and is checked
    against) the encoder the head records, which is found relative to the head's folder."""
    head = artefact_file(path, HEAD_FILE)
    if not head.is_file():
        raise InputError(head, "no head weights here (head.safetensors with its head.json, written by pmlm finetune)")
    config = read_head_info(head)["config"]
    task = config.get("task") if isinstance(config, dict) else None
    if task != "contact":
        raise InputError(sidecar_path(head), f"a {task} head, not a contact head")
    override = None if encoder is None else artefact_file(encoder, ENCODER_FILE)
    try:
        model, _, _, encoder_path = load_finetuned(head, override, device)
    except ConfigError as exc:
        raise InputError(sidecar_path(head), f"incompatible head description: {exc}") from None
    return model, head, Path(encoder_path)


def check_sequence(path: str | os.PathLike, seq_id: str, letters: str, line: int) -> np.ndarray:
    """Residue token ids of one record, or a one-line error naming the file and the record's line."""
    if not seq_id:
        raise InputError(path, "record without an id", line=line)
    if not letters:
        raise InputError(path, f"record {seq_id!r} has no residues", line=line)
    try:
        return alphabet.encode(letters)
    except ValueError as exc:
        raise InputError(path, f"record {seq_id!r}: {exc} (expected {alphabet.RESIDUES} or X; "
                               "pmlm ingest normalises sequences)", line=line) from None


def read_sequences(path: str | os.PathLike) -> list[Sequence]:
    """Every record of a FASTA / FASTA.gz file, checked (unique ids, residue letters)."""
    out, seen = [], {}
    for record in read_fasta(path):
        if record.id in seen:
            raise InputError(path, f"duplicate id {record.id!r} (first at line {seen[record.id]})", line=record.line)
        seen[record.id] = record.line
        out.append(Sequence(record.id, record.sequence, check_sequence(path, record.id, record.sequence, record.line),
                            record.line))
    return out
