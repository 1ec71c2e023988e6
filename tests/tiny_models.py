"""Tiny encoders written as `pmlm pretrain` writes them, and FASTA / CSV inputs, for the inference commands'
tests (pmlm embed, contacts, score and pmlm.load)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from pmlm.alphabet import RESIDUES
from pmlm.artefacts import write_encoder
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model


def tiny_encoder(
    path: Path,
    objective: str = "pmlm",
    *,
    max_len: int = 18,
    num_layers: int = 2,
    pair_vocab: str = "standard",
    seed: int = 0,
) -> Path:
    """A randomly initialised encoder (hidden 16, window max_len - 2 residues) at ``path`` (+ model.json).

    The initial output layers are small, so every score would be close to zero; their weights are scaled
    up so that the quantities the tests compare differ visibly between classes and pairs.
    """
    torch.manual_seed(seed)
    cfg = ModelConfig(
        num_layers=num_layers, hidden=16, ffn=32, heads=2, max_len=max_len, dropout=0.0, pair_vocab=pair_vocab
    )
    objective_cfg = ObjectiveConfig(name=objective)
    model = build_model(cfg, objective_cfg)
    with torch.no_grad():
        for head in (model.token_head, model.pair_head):
            if head is not None:
                head.out.weight.mul_(50.0)
        if model.triple_head is not None:  # its three-way factors multiply: a smaller scale gives logits ~10
            model.triple_head.out.weight.mul_(5.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_encoder(
        path, model.state_dict(), {"model": model.cfg.to_dict(), "objective": dataclasses.asdict(objective_cfg)}
    )
    return path


def random_letters(length: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "".join(RESIDUES[k] for k in rng.integers(len(RESIDUES), size=length))


def write_fasta(path: Path, records: dict[str, str]) -> Path:
    path.write_text("".join(f">{name} some description\n{seq}\n" for name, seq in records.items()))
    return path
