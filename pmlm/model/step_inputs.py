"""What one micro-batch of a pre-training objective hands the device: the encoder's inputs in their layout and, for
each head, which of the encoder's output rows it reads and the labels it is scored on.

Everything data-dependent (which residues are masked, which output rows they land on, every ordered pair and
sampled triple of them and their classes, how many of each) is decided here, from a masked batch's rows on the
host, and moved to the device in one go (``StepInputs.to``): the step itself then gathers and scores with static
index tensors and never reads a value back (no ``nonzero``, ``unique``, boolean masks or ``.item()``), so the GPU
never waits for Python and the encoder compiles whole.

The heads index the N masked standard residues, gathered once from the encoder's output (``token_rows``): the token
head scores all N, the pair head every pair (i, j), i < j, of them within one sequence in both orders, the triple
head the sampled triples. Pairs and triples are indices into those N rows, so the pair head projects each masked
residue once without looking for the distinct ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from pmlm.alphabet import IGNORE_INDEX, NUM_RESIDUES
from pmlm.model.config import PairVocab
from pmlm.model.layout import EncoderInputs, Layout, StaticShape, build_inputs, output_rows
from pmlm.model.objective import Objective


@dataclass(frozen=True)
class StepInputs:
    """One micro-batch of an objective, as the device takes it (module docstring)."""

    objective: Objective  # which heads run
    pair_vocab: PairVocab  # the pair head's classes
    encoder: EncoderInputs
    token_rows: Tensor  # (N,) int64 the encoder's output rows of the masked standard residues, row-major
    targets: Tensor  # (N,) int64 their residue classes
    counts: Tensor  # (3,) int64 N, 2P ordered pairs i != j, T triples: this micro-batch's counters
    pairs: Tensor | None = None  # (P, 2) int64 rows of the N: every i < j of one sequence, sorted
    pair_labels: Tensor | None = None  # (2P,) int64 the pairs' classes, then their swaps' (the mirrored order)
    diagonal_labels: Tensor | None = None  # (N,) int64 the class of (i, i), where the pair term has the diagonal
    triples: Tensor | None = None  # (T, 3) int64 rows of the N, i < j < k in the sequence
    triple_labels: Tensor | None = None  # (T,) int64 class 400 x_i + 20 x_j + x_k

    def to(self, device: torch.device, non_blocking: bool = False) -> StepInputs:
        """All tensors on ``device`` (pinned host memory and ``non_blocking``: copies that do not wait)."""
        moved = {k: v.to(device, non_blocking=non_blocking) for k, v in self._tensors().items()}
        return dataclasses.replace(self, encoder=self.encoder.to(device, non_blocking), **moved)

    def pin_memory(self) -> StepInputs:
        pinned = {k: v.pin_memory() for k, v in self._tensors().items()}
        return dataclasses.replace(self, encoder=self.encoder.pin_memory(), **pinned)

    def _tensors(self) -> dict[str, Tensor]:
        names = (f.name for f in dataclasses.fields(self) if f.name != "encoder")
        return {name: getattr(self, name) for name in names if isinstance(getattr(self, name), Tensor)}


def upper_pair_indices(valid: Tensor) -> tuple[Tensor, Tensor]:
    """Every pair i < j of flagged positions within a row of ``valid`` (B, L) bool, as indices into the flagged
    positions in row-major order: (first (P,), second (P,)), sorted by (row, i, j). No (B, L, L) intermediate."""
    pos = valid.nonzero()  # (N, 2) row-major, so grouped by row and sorted by position
    n = pos.shape[0]
    rows = pos[:, 0]
    group_end = torch.bincount(rows, minlength=valid.shape[0]).cumsum(0)[rows]  # (N,) exclusive end of the row
    k = torch.arange(n, device=valid.device)
    later = group_end - k - 1  # (N,) partners after element k in its row
    total = int(later.sum())
    first = torch.repeat_interleave(k, later, output_size=total)  # (P,)
    run_start = later.cumsum(0) - later  # (N,) where element k's run begins in the output
    second = first + 1 + (torch.arange(total, device=valid.device) - run_start[first])  # (P,)
    return first, second


def step_inputs(
    inputs: Tensor,
    targets: Tensor,
    triples: Tensor | None,
    objective: Objective,
    layout: Layout,
    pair_vocab: PairVocab,
    static: StaticShape | None = None,
) -> StepInputs:
    """The StepInputs of masked rows: ``inputs`` (B, L) token ids after masking, ``targets`` (B, L) residue class at
    masked standard residues (IGNORE_INDEX elsewhere), ``triples`` (T, 4) rows (b, i, j, k) of the triple head:
    the rows and labels of ``objective``'s heads, the encoder's inputs in ``layout`` (packed or padded; ``static``:
    the packed layout's fixed shapes). Runs where the tensors are: on the host in training."""
    B, L = inputs.shape
    encoder = build_inputs(inputs, layout, static)
    valid = targets.ne(IGNORE_INDEX)  # (B, L) masked standard residues
    flat = valid.reshape(-1).nonzero().squeeze(1)  # (N,) places in the (B * L) flattening, row-major
    classes = targets.reshape(-1).index_select(0, flat)  # (N,)
    n = flat.numel()
    fields = {}
    ordered = 0
    if objective.pair_head:
        first, second = upper_pair_indices(valid)
        ordered = 2 * first.numel()
        a, b = classes[first], classes[second]
        labels = torch.cat([pair_vocab.pair_class(a, b), pair_vocab.pair_class(b, a)])  # (2P,)
        fields.update(pairs=torch.stack([first, second], dim=1), pair_labels=labels)
        if objective.diagonal:
            fields["diagonal_labels"] = pair_vocab.pair_class(classes, classes)
    count = 0
    if objective.triple_head:
        # the N residues' ranks by place: a triple's (b, i) -> its row of the N
        rank = torch.full((B * L,), -1, dtype=torch.long, device=inputs.device)
        rank[flat] = torch.arange(n, device=inputs.device)
        rows = rank[triples[:, :1] * L + triples[:, 1:]]  # (T, 3)
        a, b, c = (classes[rows[:, r]] for r in range(3))
        fields.update(triples=rows, triple_labels=(a * NUM_RESIDUES + b) * NUM_RESIDUES + c)
        count = rows.shape[0]
    counts = torch.tensor([n, ordered, count], dtype=torch.long, device=inputs.device)
    return StepInputs(objective, pair_vocab, encoder, output_rows(encoder, flat), classes, counts, **fields)
