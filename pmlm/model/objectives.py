"""Pre-training: ``ObjectiveConfig`` (the recipe's ``objective`` section), BERT-style masking and the driver of one
micro-batch (``objective_outputs``); each objective's heads and loss are its type's (``ObjectiveConfig.kind``:
``pmlm.model.objective``, the built-in ones in ``mlm_objective``, ``pmlm_objective``, ``pair_only_objective`` and
``tmlm_objective``).

Normalisation: each term's cross-entropy is summed over its examples and divided by their number in the whole
optimizer step, every micro-batch of every rank (``sample_sizes``), so a "mean" is the mean over the step, however
it is split (docs/training.md, "The objective", cites the released code). ``mask_batch`` draws a step's masks (and
triples) at once; ``MaskedBatch.rows`` is one micro-batch of it.

Masking follows fairseq's MaskTokensDataset: per sequence, ``floor(mask_prob * n + u)``
(u ~ U[0, 1)) of its n residue positions are chosen without replacement (the expected
rate is exactly ``mask_prob``); of those, ``mask_token_prob`` become ``<mask>``,
``random_token_prob`` a residue drawn uniformly from the 20 standard ones, the rest are kept.
Only residue positions (standard and X) are maskable; a masked X gets no target (-100),
so pairs with it are ignored. All randomness comes from the caller's ``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pmlm.alphabet import FIRST_RESIDUE_ID, IGNORE_INDEX, MASK_ID, NUM_RESIDUES, X_ID
from pmlm.errors import ConfigError
from pmlm.model.config import PairVocab
from pmlm.model.layout import Layout, StaticShape
from pmlm.model.objective import Objective, ObjectiveOutputs
from pmlm.model.objective_registry import objective_named
from pmlm.model.pmlm_model import unwrap
from pmlm.model.step_inputs import StepInputs, step_inputs
from pmlm.tokens import trimmed_width
from pmlm.vocabulary import PMLM


@dataclass
class ObjectiveConfig:
    """Which pre-training loss to use and how tokens are masked."""

    name: str = PMLM  # a registered objective's (pmlm.model.objective_registry; the built-in: pmlm.vocabulary)
    mask_prob: float = 0.15  # expected fraction of residue positions selected per sequence
    mask_token_prob: float = 0.8  # of the selected: replaced by <mask>
    random_token_prob: float = 0.1  # of the selected: replaced by a random standard residue
    pair_weight: float = 1.0  # lambda in L = L_mlm + lambda * L_pmlm
    triple_weight: float = 1.0  # tmlm: weight of L_tmlm in L = L_mlm + pair_weight * L_pmlm + triple_weight * L_tmlm
    triples_per_masked: float = 1.0  # tmlm: triples sampled per sequence = ceil(this * its masked residues)

    def __post_init__(self) -> None:
        objective_named(self.name)
        if not 0.0 < self.mask_prob <= 1.0:
            raise ConfigError(f"objective.mask_prob must be in (0, 1], got {self.mask_prob!r}")
        for name in ("mask_token_prob", "random_token_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"objective.{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.mask_token_prob + self.random_token_prob > 1.0:
            raise ConfigError(
                "objective.mask_token_prob + objective.random_token_prob must be <= 1 "
                f"(the remainder keeps the original token), got {self.mask_token_prob} + {self.random_token_prob}"
            )
        if self.pair_weight < 0:
            raise ConfigError(f"objective.pair_weight must be >= 0, got {self.pair_weight!r}")
        if self.triple_weight < 0:
            raise ConfigError(f"objective.triple_weight must be >= 0, got {self.triple_weight!r}")
        if not self.triples_per_masked > 0:
            raise ConfigError(f"objective.triples_per_masked must be > 0, got {self.triples_per_masked!r}")

    @property
    def kind(self) -> Objective:
        """The registered objective ``name`` names: its heads, sample sizes and loss."""
        return objective_named(self.name)


def mask_tokens(tokens: Tensor, cfg: ObjectiveConfig, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Choose and corrupt masked positions.

    tokens: (B, L) int64. Returns ``(inputs, targets, masked)``: inputs (B, L) with the
    <mask> / random / kept replacements; targets (B, L) residue class 0..19 at masked
    standard residues, IGNORE_INDEX elsewhere; masked (B, L) bool, the selected positions.
    """
    B, L = tokens.shape
    gen_device = generator.device
    # fixed draw order and shapes: identical masks for identical seeds and batch shapes
    count_noise = torch.rand(B, generator=generator, device=gen_device)
    order_noise = torch.rand(B, L, generator=generator, device=gen_device)
    action = torch.rand(B, L, generator=generator, device=gen_device)
    random_class = torch.randint(NUM_RESIDUES, (B, L), generator=generator, device=gen_device)
    count_noise, order_noise, action, random_class = (
        t.to(tokens.device) for t in (count_noise, order_noise, action, random_class)
    )

    maskable = (tokens >= FIRST_RESIDUE_ID) & (tokens <= X_ID)  # (B, L) residues incl. X
    n_res = maskable.sum(dim=1)  # (B,)
    n_mask = torch.minimum(torch.floor(cfg.mask_prob * n_res + count_noise).long(), n_res)  # (B,)
    # a random permutation of the maskable positions per row: take the first n_mask
    order_noise = order_noise.masked_fill(~maskable, 2.0)  # non-maskable sort last
    rank = order_noise.argsort(dim=1).argsort(dim=1)  # (B, L)
    masked = rank < n_mask[:, None]

    classes = tokens - FIRST_RESIDUE_ID
    standard = (classes >= 0) & (classes < NUM_RESIDUES)
    targets = torch.where(masked & standard, classes, torch.full_like(tokens, IGNORE_INDEX))

    to_mask = masked & (action < cfg.mask_token_prob)
    to_random = masked & ~to_mask & (action < cfg.mask_token_prob + cfg.random_token_prob)
    inputs = torch.where(to_mask, torch.full_like(tokens, MASK_ID), tokens)
    inputs = torch.where(to_random, random_class + FIRST_RESIDUE_ID, inputs)
    return inputs, targets, masked


@dataclass
class MaskedBatch:
    """A batch masked for the objective: what one forward pass of the objective takes. Masks and triples are drawn
    for a whole optimizer step's batch at once (``mask_batch``) and the step's micro-batches are row ranges of it
    (``rows``), so a sequence gets the same masks whichever rank and micro-batch it lands on."""

    inputs: Tensor  # (B, L) token ids after masking
    targets: Tensor  # (B, L) residue class at masked standard residues, IGNORE_INDEX elsewhere
    triples: Tensor | None = None  # (T, 4) rows (b, i, j, k) of the Triple MLM, sorted by b; None otherwise

    def rows(self, start: int, stop: int, pad_to_multiple: int = 1) -> MaskedBatch:
        """Rows ``start:stop``, their columns cut to the longest of them (rounded up to ``pad_to_multiple``), the
        triples of those rows renumbered."""
        width = trimmed_width(self.inputs[start:stop], pad_to_multiple)
        triples = None
        if self.triples is not None:
            b = self.triples[:, 0]
            triples = self.triples[(b >= start) & (b < stop)] - torch.tensor([start, 0, 0, 0], device=b.device)
        return MaskedBatch(self.inputs[start:stop, :width], self.targets[start:stop, :width], triples)

    def step_inputs(
        self, cfg: ObjectiveConfig, layout: Layout, pair_vocab: PairVocab, static: StaticShape | None = None
    ) -> StepInputs:
        """What the device takes for this batch (``pmlm.model.step_inputs``), the encoder's inputs in ``layout``
        (``static``: the packed layout's fixed shapes)."""
        return step_inputs(self.inputs, self.targets, self.triples, cfg.kind, layout, pair_vocab, static)


def mask_batch(tokens: Tensor, cfg: ObjectiveConfig, generator: torch.Generator) -> MaskedBatch:
    """``mask_tokens`` and the objective's other draws (the Triple MLM's triples): every random draw it makes."""
    inputs, targets, _ = mask_tokens(tokens, cfg, generator)
    return MaskedBatch(inputs, targets, cfg.kind.draw_triples(targets, cfg, generator))


def sample_sizes(batch: MaskedBatch, cfg: ObjectiveConfig) -> Tensor:
    """(3,) int64, the examples of each term (token, pair, triple) in ``batch`` that the objective has
    (``Objective.sample_sizes``): masked standard residues, their ordered pairs i != j, sampled triples."""
    n = batch.targets.ne(IGNORE_INDEX).sum(dim=1)  # (B,) masked standard residues per row
    triples = batch.triples.shape[0] if batch.triples is not None else 0
    return cfg.kind.sample_sizes(torch.stack([n.sum(), (n * (n - 1)).sum(), n.new_tensor(triples)]))


def pretraining_losses(
    model: torch.nn.Module, tokens: Tensor, cfg: ObjectiveConfig, generator: torch.Generator
) -> ObjectiveOutputs:
    """Mask ``tokens`` (B, L) and return the objective's loss and counters with ``tokens`` as a whole update (its
    own sample sizes), as ``objective_outputs`` computes them."""
    return objective_outputs(model, mask_batch(tokens, cfg, generator), cfg)


def objective_outputs(
    model: torch.nn.Module, batch: MaskedBatch | StepInputs, cfg: ObjectiveConfig, sizes: Tensor | None = None
) -> ObjectiveOutputs:
    """Run the model once on ``batch`` and return its share of the update's loss and its counters.

    ``batch``: a ``MaskedBatch`` (its ``StepInputs`` are built here, where its tensors are, in the layout the encoder
    picks for them), or ``StepInputs`` built beforehand on the host (training: then nothing here reads a value back).
    ``sizes``: the update's ``sample_sizes`` (default: ``batch``'s own, the batch is the whole update). The loss is
    ``sum_t weight_t * CE_t(batch) / sizes_t`` over the objective's terms, so the losses of an update's
    micro-batches add up to the update's loss however its sequences are split into micro-batches and ranks.
    ``model`` may be wrapped (DistributedDataParallel, torch.compile): it is called, never bypassed, so gradient
    synchronisation hooks run.
    """
    core, objective = unwrap(model), cfg.kind
    objective.check_model(core)
    if isinstance(batch, MaskedBatch):
        sizes = sample_sizes(batch, cfg) if sizes is None else sizes
        batch = batch.step_inputs(cfg, core.encoder.layout(batch.inputs.device), core.cfg.pair_vocab)
    counts = batch.counts  # (3,) N, 2P, T
    if sizes is None:
        sizes = objective.sample_sizes(counts)
    # sum / max(n, 1): an empty term gives 0 with zero gradients, never NaN
    denominators = sizes.to(device=counts.device).clamp(min=1).to(torch.float32)
    return objective.outputs(model(batch), batch, cfg, denominators)
