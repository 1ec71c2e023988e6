"""``pmlm.load(path)``: a trained encoder (or a fine-tuned contact head with its encoder) as one object with
``embed``, ``contacts`` and ``score``, the same computations as ``pmlm embed``, ``pmlm contacts`` and
``pmlm score``, at the same precision (the one the head's or encoder's run recorded, unless asked otherwise).
Sequences are given as strings of residue letters (``ACDEFGHIKLMNPQRSTVWY`` or X, either case), checked as the commands
check a FASTA record (``pmlm.inference.sequences``); a head's encoder is found relative to the head's folder, as the
head records it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from pmlm.artefacts import read_encoder_info, recorded_precision
from pmlm.choices import Precision
from pmlm.errors import ConfigError, InputError
from pmlm.inference.contacts import choose_readout, head_map, readout_map
from pmlm.inference.embedding import embed_residues, layer_index
from pmlm.inference.mutations import parse_mutant, score_mutants
from pmlm.inference.options import Readout
from pmlm.inference.sequences import check_sequence
from pmlm.pretrained import is_head, load_encoder, load_head, pick_device
from pmlm.tokens import DEFAULT_TOKENS_PER_BATCH, max_residues
from pmlm.train.runtime import autocast, evaluation_precision
from pmlm.vocabulary import TASK_CONTACT


class TrainedModel:
    """A loaded encoder; ``head`` (a contact TaskModel) when loaded from a fine-tuned contact head; ``precision``,
    that of its forward passes."""

    def __init__(self, encoder, info: dict, path: Path, device: torch.device, precision: Precision, head=None):
        self.encoder, self.info, self.path, self.device, self.head = encoder, info, path, device, head
        self.precision, self.autocast = precision, autocast(precision, device)

    def __repr__(self) -> str:
        cfg = self.encoder.cfg
        return (
            f"TrainedModel({self.path}, {self.info['objective']['name']}, {cfg.num_layers} x {cfg.hidden}, "
            f"window {max_residues(cfg.max_len)}{', contact head' if self.head is not None else ''})"
        )

    def _residues(self, sequence: str, what: str = "sequence") -> np.ndarray:
        """Token ids of a sequence read as the commands read a FASTA record (lowercase accepted; letters outside the
        alphabet, nucleotides and an empty sequence refused in one line)."""
        if not isinstance(sequence, str):
            raise InputError(f"<{what}>", f"expected a string of residue letters, got {type(sequence).__name__}")
        return check_sequence(f"<{what}>", what, sequence, 1).residues

    def embed(
        self,
        sequences: str | list[str],
        *,
        layer: int = -1,
        mean: bool = False,
        tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
    ):
        """(L, C) float32 per-residue embeddings of a sequence (a list of them for a list), or the (C,) mean
        over residues with ``mean=True``; ``layer`` as ``pmlm embed --layer``."""
        single = isinstance(sequences, str)
        seqs = [sequences] if single else list(sequences)
        residues = [self._residues(s, f"sequence {k}") for k, s in enumerate(seqs)]
        out = embed_residues(
            self.encoder,
            residues,
            layer=layer_index(layer, self.encoder.cfg.num_layers),
            tokens_per_batch=tokens_per_batch,
            device=self.device,
            autocast=self.autocast,
        )
        if mean:
            out = [e.mean(axis=0, dtype=np.float64).astype(np.float32) for e in out]
        return out[0] if single else out

    def contacts(
        self, sequence: str, *, readout: str = "auto", tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH
    ) -> np.ndarray:
        """(L, L) contact probabilities from the contact head, or without one the encoder's unsupervised read-out
        (``readout``: ``pair``, ``jacobian`` or ``auto``, as ``pmlm contacts --readout``); NaN for pairs no window
        holds."""
        residues = self._residues(sequence)
        chosen = Readout.parse(readout, "readout")
        if self.head is not None and chosen is not Readout.AUTO:
            raise ConfigError(f"{self.path}: readout={chosen.value!r} reads an encoder; this is a contact head")
        with self.autocast():
            if self.head is not None:
                return head_map(self.head, residues, self.device)
            chosen = choose_readout(self.encoder, chosen, self.path)
            return readout_map(self.encoder, residues, self.device, chosen, tokens_per_batch)

    def score(self, sequence: str, mutants: list[str], *, double: str = "auto", triple: str = "auto") -> list[dict]:
        """One dict per mutant (``A23G``, ``A23G:L40P``, ``A23G:L40P:K51E``, ...; 1-based): mutant, kind, score,
        additive, epistasis, double_from, triple_from, multi_from (see ``pmlm score``; a mutant whose sites do not
        fit one window is scored additively under ``auto``, as there)."""
        residues = self._residues(sequence)
        letters = sequence.upper()  # the wild type as read (lowercase accepted, as in a FASTA)
        parsed = [parse_mutant(m, letters, "<mutants>", k + 1) for k, m in enumerate(mutants)]
        with self.autocast():
            return score_mutants(
                self.encoder,
                residues,
                parsed,
                double=double,
                triple=triple,
                device=self.device,
                path="<mutants>",
                model_name=str(self.path),
            )


def load(
    path: str | os.PathLike,
    device: str = "cpu",
    *,
    encoder: str | os.PathLike | None = None,
    precision: str = "auto",
    adapter: str | os.PathLike | None = None,
) -> TrainedModel:
    """An encoder (model.safetensors or its folder) or a contact head (head.safetensors or its folder);
    ``encoder`` overrides the encoder a head records (heads written before paths were recorded relative to
    the head's folder need it outside the folder they were made in); it is checked by sha256. ``precision``:
    ``auto`` (what the head's or encoder's run recorded; fp32 off CUDA), ``fp32`` or ``bf16`` (CUDA only).
    ``adapter``: a fine-tuned run with LoRA adapters, put into the encoder (``pmlm embed --adapter``); a head brings
    its own run's."""
    dev = pick_device(device)
    if is_head(path) and adapter is not None:
        raise ConfigError("a head brings its own run's adapters (if it has any); drop adapter=")
    if is_head(path):
        head = load_head(path, dev, encoder=encoder, task=TASK_CONTACT)
        recorded = recorded_precision(head.info, head.path)
        arithmetic = evaluation_precision(dev, recorded, precision, trained="the head", command="pmlm.load")
        encoder_info = read_encoder_info(head.encoder_path)
        return TrainedModel(head.model.encoder, encoder_info, head.path, dev, arithmetic, head.model)
    encoder, info, weights = load_encoder(path, dev, adapter=adapter)
    recorded = recorded_precision(info, weights)
    arithmetic = evaluation_precision(dev, recorded, precision, trained="the encoder", command="pmlm.load")
    return TrainedModel(encoder, info, weights, dev, arithmetic)
