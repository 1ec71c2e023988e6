"""The PMLM network: sequence encoder plus optional token and pair prediction heads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pmlm.errors import ConfigError
from pmlm.model.config import ModelConfig
from pmlm.model.encoder import Encoder, init_weights
from pmlm.model.heads import PairHead, TokenHead
from pmlm.model.step_inputs import StepInputs
from pmlm.model.triple import TripleHead


@dataclass
class PretrainingOutputs:
    """What the heads give one micro-batch of an objective (``StepInputs``): the losses' raw material."""

    representations: torch.Tensor  # (rows, C) the encoder's output rows
    token_logits: torch.Tensor | None = None  # (N, 20) at the masked standard residues
    pair_ce: torch.Tensor | None = None  # cross-entropy summed over both orders of every masked pair
    pair_correct: torch.Tensor | None = None  # int64: of those, how many the head's argmax gets right
    diagonal_logits: torch.Tensor | None = None  # (N, K) the pair head at (i, i), where the objective scores them
    triple_logits: torch.Tensor | None = None  # (T, 8000)


class PMLMModel(nn.Module):
    """Encoder with a 20-class token head, a masked-pair head and/or a triple head, per ``ModelConfig``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.token_head = TokenHead(cfg.hidden, cfg.activation) if cfg.token_head else None
        self.pair_head = (
            PairHead(cfg.hidden, cfg.pair_classes, cfg.pair_chunk_size, cfg.activation, unary=cfg.pair_unary)
            if cfg.pair_head
            else None
        )
        if self.pair_head is not None and cfg.product_base:
            self.pair_head.set_product_base(self.token_head)
        self.triple_head = (
            TripleHead(cfg.hidden, cfg.triple_hidden, cfg.triple_rank, cfg.triple_chunk_size, cfg.activation)
            if cfg.triple_head
            else None
        )
        if self.triple_head is not None and cfg.product_base:
            self.triple_head.set_product_base(self.token_head)
        self.apply(init_weights)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (B, L) -> representations (B, L, C)."""
        return self.encoder(tokens)

    def forward(
        self,
        tokens: torch.Tensor | StepInputs,
        pair_index: torch.Tensor | None = None,
        return_pair_repr: bool = False,
        *,
        token_positions: torch.Tensor | None = None,
        mirror_pairs: bool = False,
        triple_index: torch.Tensor | None = None,
    ) -> dict:
        """Run the encoder and the configured heads.

        tokens: (B, L) int64 with <cls> at 0, <eos> after the last residue, <pad> after that.
        pair_index: (P, 3) int64 rows (b, i, j), the ordered pairs whose joint distribution
        is predicted; the pair head runs only when it is given.
        token_positions: optional (B, L) bool; the token head then scores only those
        positions and ``logits`` is (N, 20) in row-major order (the objectives use this).
        mirror_pairs: also score every swapped row (b, j, i); ``pair_logits`` is then (2P, K),
        the given rows first (see ``PairHead``).
        triple_index: (T, 4) int64 rows (b, i, j, k), i < j < k, whose joint the triple head predicts.

        ``tokens`` may instead be a pre-training micro-batch's ``StepInputs``: the heads its objective needs then run
        on the rows it names, and the result is ``PretrainingOutputs`` (``pretraining_outputs``).

        Returns a dict: ``representations`` (B, L, C); ``logits`` (B, L, 20) or None;
        ``pair_logits`` (P, K) or None; ``pair_repr`` (P, 2C) or None, the output of the
        pair head's first block (M+); ``triple_logits`` (T, 8000) or None (class ``400 a + 20 b + c``).
        """
        if isinstance(tokens, StepInputs):
            return self.pretraining_outputs(tokens)
        if pair_index is not None and self.pair_head is None:
            raise ConfigError("pair_index was given but this model has no pair head (model.pair_head is false)")
        if triple_index is not None and self.triple_head is None:
            raise ConfigError("triple_index was given but this model has no triple head (model.triple_head is false)")
        if return_pair_repr and pair_index is None:
            raise ValueError("return_pair_repr needs a pair_index naming the pairs")
        reps = self.encoder(tokens)  # (B, L, C)
        logits = None
        if self.token_head is not None:
            # (N, 20) at the selected positions, else (B, L, 20)
            logits = self.token_head(reps if token_positions is None else reps[token_positions])
        pair_logits = pair_repr = None
        if pair_index is not None:
            pair_logits, pair_repr = self.pair_head(reps, pair_index, mirror=mirror_pairs, return_repr=return_pair_repr)
        triple_logits = None if triple_index is None else self.triple_head(reps, triple_index)
        return {
            "representations": reps,
            "logits": logits,
            "pair_logits": pair_logits,
            "pair_repr": pair_repr,
            "triple_logits": triple_logits,
        }

    def pretraining_outputs(self, step: StepInputs) -> PretrainingOutputs:
        """The encoder on ``step``'s inputs, the masked residues' rows gathered once, and the heads of its objective
        on them; nothing is read back to the host."""
        reps = self.encoder.encode(step.encoder)  # (rows, C)
        h = reps.index_select(0, step.token_rows)  # (N, C)
        out = PretrainingOutputs(reps)
        if step.objective.token_head:
            out.token_logits = self.token_head(h)  # (N, 20)
        if step.pairs is not None:
            out.pair_ce, out.pair_correct = self.pair_head.loss(h, step.pairs, step.pair_labels)
        if step.diagonal_labels is not None:
            diagonal = torch.arange(h.shape[0], device=h.device).unsqueeze(1).expand(-1, 2)  # (N, 2) rows (i, i)
            out.diagonal_logits = self.pair_head.from_rows(h, diagonal)[0]  # (N, K)
        if step.triples is not None:
            out.triple_logits = self.triple_head.from_rows(h, step.triples)  # (T, 8000)
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def unwrap(model: nn.Module) -> PMLMModel:
    """The PMLMModel inside DistributedDataParallel / torch.compile wrappers."""
    while not isinstance(model, PMLMModel):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            raise TypeError(f"expected a PMLMModel (or a wrapper of one), got {type(model).__name__}")
        model = inner
    return model
