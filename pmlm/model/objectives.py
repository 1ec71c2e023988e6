"""Pre-training objectives: BERT-style masking, masked-pair construction and the MLM / PMLM losses.

Objectives (``ObjectiveConfig.name``):

* ``mlm``: cross-entropy of the token head on masked standard residues (mean over them).
* ``pmlm``: ``L = L_mlm + pair_weight * L_pmlm``. ``L_pmlm`` is the mean cross-entropy of
  the pair head over all ordered pairs (i, j), i != j, of masked positions within one
  sequence, ``|M|^2 - |M|`` per sequence; the label of (i, j) is ``20 * x_i + x_j`` over
  residue classes (``FULL_PAIR_SIDE * id_i + id_j`` over token ids with ``pair_vocab="full"``, the
  released code's dictionary squared, see ``pmlm.alphabet``).
* ``pmlm_pair_only`` (the paper's speed variant): no token head; the loss is the pair
  cross-entropy alone, averaged over the off-diagonal pairs **and** the diagonal pairs
  (i, i). ``pair_weight`` is unused. ``l_mlm`` and the MLM accuracy then come from the
  pair head's marginal on the diagonal, ``P(x_i) = sum_y softmax(pair_logits(i, i))[x_i, y]``;
  ``l_pmlm`` and the pair accuracy are reported on the off-diagonal pairs only, so they
  compare with the ``pmlm`` objective's figures.
* ``tmlm`` (the Triple MLM the paper's Discussion proposes): ``L = L_mlm + pair_weight * L_pmlm +
  triple_weight * L_tmlm``, ``L_tmlm`` the mean cross-entropy of the triple head (``pmlm.model.triple``) over
  ``ceil(triples_per_masked * n)`` sampled triples i < j < k of each sequence's n masked standard residues, the
  label of (i, j, k) ``400 x_i + 20 x_j + x_k``.

Normalisation: each term's cross-entropy is summed over its examples and divided by their number in the whole
optimizer step, every micro-batch of every rank (``sample_sizes``, ``objective_outputs``'s ``sizes``), so "mean"
above is the mean over the step, however it is split (docs/training.md, "The objective", cites the released code).
``mask_batch`` draws a step's masks (and triples) at once; ``MaskedBatch.rows`` is one micro-batch of it.

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
import torch.nn.functional as F
from torch import Tensor

from pmlm.alphabet import FIRST_RESIDUE_ID, FULL_PAIR_SIDE, IGNORE_INDEX, MASK_ID, NUM_RESIDUES, X_ID
from pmlm.errors import ConfigError
from pmlm.model.heads import loss_precision
from pmlm.model.layout import Layout, StaticShape
from pmlm.model.pmlm_model import unwrap
from pmlm.model.step_inputs import StepInputs, pair_classes, step_inputs, upper_pair_indices
from pmlm.model.triple import sample_triples, triple_loss
from pmlm.tokens import trimmed_width
from pmlm.vocabulary import MLM, OBJECTIVES, PMLM, PMLM_PAIR_ONLY, TMLM


@dataclass
class ObjectiveConfig:
    """Which pre-training loss to use and how tokens are masked."""

    name: str = PMLM  # one of OBJECTIVES
    mask_prob: float = 0.15  # expected fraction of residue positions selected per sequence
    mask_token_prob: float = 0.8  # of the selected: replaced by <mask>
    random_token_prob: float = 0.1  # of the selected: replaced by a random standard residue
    pair_weight: float = 1.0  # lambda in L = L_mlm + lambda * L_pmlm
    triple_weight: float = 1.0  # tmlm: weight of L_tmlm in L = L_mlm + pair_weight * L_pmlm + triple_weight * L_tmlm
    triples_per_masked: float = 1.0  # tmlm: triples sampled per sequence = ceil(this * its masked residues)

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ConfigError(f"objective.name must be one of {', '.join(OBJECTIVES)}, got {self.name!r}")
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


def upper_pairs(valid: Tensor) -> Tensor:
    """Unordered pairs of flagged positions within each row: (P, 3) rows (b, i, j) with i < j.

    valid: (B, L) bool. Rows are sorted by (b, i, j). Vectorised: no (B, L, L) intermediate.
    """
    pos = valid.nonzero()  # (N, 2) row-major
    first, second = upper_pair_indices(valid)
    return torch.stack([pos[first, 0], pos[first, 1], pos[second, 1]], dim=1)


def swap_pairs(pair_index: Tensor) -> Tensor:
    """(b, i, j) -> (b, j, i)."""
    return pair_index[:, [0, 2, 1]]


def diagonal_pairs(valid: Tensor) -> Tensor:
    """(N, 3) rows (b, i, i) for the flagged positions."""
    pos = valid.nonzero()
    return torch.stack([pos[:, 0], pos[:, 1], pos[:, 1]], dim=1)


def pair_labels(pair_index: Tensor, targets: Tensor, pair_vocab: str = "standard") -> Tensor:
    """Class of each ordered pair from residue-class targets; every row must have valid targets."""
    ti = targets[pair_index[:, 0], pair_index[:, 1]]
    tj = targets[pair_index[:, 0], pair_index[:, 2]]
    return pair_classes(ti, tj, pair_vocab)


def _marginal_log_probs(pair_logits: Tensor, pair_vocab: str) -> Tensor:
    """log P(x_i) over residue classes (N, 20) from diagonal pair logits (N, K)."""
    side = NUM_RESIDUES if pair_vocab == "standard" else FULL_PAIR_SIDE
    joint = loss_precision(pair_logits).view(-1, side, side)  # (N, first, second)
    log_marginal = joint.logsumexp(dim=2) - joint.flatten(1).logsumexp(dim=1, keepdim=True)  # (N, side)
    if pair_vocab == "full":
        # only standard residues are scored; mass on other tokens counts as wrong
        log_marginal = log_marginal[:, FIRST_RESIDUE_ID : FIRST_RESIDUE_ID + NUM_RESIDUES]
    return log_marginal


def mirrored_pair_labels(upper: Tensor, targets: Tensor, pair_vocab: str = "standard") -> Tensor:
    """Labels in the mirrored head's row order: (b, i, j) rows of ``upper``, then their swaps."""
    return torch.cat([pair_labels(upper, targets, pair_vocab), pair_labels(swap_pairs(upper), targets, pair_vocab)])


def masked_pair_loss(
    pair_logits: Tensor, upper: Tensor, targets: Tensor, pair_vocab: str = "standard"
) -> tuple[Tensor, int, Tensor]:
    """The objective's pair term: ``(ce_sum, n_pairs, n_correct)`` over all ordered pairs i != j of masked
    residues.

    pair_logits (2P, K) in the mirrored head's row order: the rows of ``upper`` (P, 3), then their swaps;
    targets (B, L) from ``mask_tokens``.
    """
    labels = mirrored_pair_labels(upper, targets, pair_vocab)  # (2P,)
    ce_sum = F.cross_entropy(loss_precision(pair_logits), labels, reduction="sum")
    return ce_sum, labels.numel(), (pair_logits.argmax(dim=-1) == labels).sum()


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
        self, cfg: ObjectiveConfig, layout: Layout, pair_vocab: str, static: StaticShape | None = None
    ) -> StepInputs:
        """What the device takes for this batch (``pmlm.model.step_inputs``), the encoder's inputs in ``layout``
        (``static``: the packed layout's fixed shapes)."""
        return step_inputs(self.inputs, self.targets, self.triples, cfg.name, layout, pair_vocab, static)


def mask_batch(tokens: Tensor, cfg: ObjectiveConfig, generator: torch.Generator) -> MaskedBatch:
    """``mask_tokens`` and, for the Triple MLM, the sampled triples: every random draw the objective makes."""
    inputs, targets, _ = mask_tokens(tokens, cfg, generator)
    triples = None
    if cfg.name == TMLM:
        triples = sample_triples(targets.ne(IGNORE_INDEX), cfg.triples_per_masked, generator)  # (T, 4)
    return MaskedBatch(inputs, targets, triples)


# The loss is a weighted sum of terms, each a cross-entropy summed over its examples and divided by its sample size:
# the number of those examples in the whole optimizer step, all micro-batches of all ranks together (the released
# criterion's sample-size normalisation, docs/training.md "The objective"). TERMS orders sample_sizes' entries.
TERMS = ("mlm", "pair", "triple")


def sample_sizes(batch: MaskedBatch, cfg: ObjectiveConfig) -> Tensor:
    """(3,) int64, the examples of each of TERMS in ``batch``: masked standard residues for the token head; ordered
    pairs i != j of them for the pair head (plus the diagonal pairs (i, i) under ``pmlm_pair_only``, whose one term
    averages both); sampled triples for the triple head. Zero for a term the objective does not have."""
    n = batch.targets.ne(IGNORE_INDEX).sum(dim=1)  # (B,) masked standard residues per row
    triples = batch.triples.shape[0] if batch.triples is not None else 0
    return step_sizes(torch.stack([n.sum(), (n * (n - 1)).sum(), n.new_tensor(triples)]), cfg)


def pretraining_losses(
    model: torch.nn.Module, tokens: Tensor, cfg: ObjectiveConfig, generator: torch.Generator
) -> dict[str, Tensor]:
    """Mask ``tokens`` (B, L) and return the objective's loss and counters with ``tokens`` as a whole update (its
    own sample sizes), as ``objective_outputs`` computes them."""
    return objective_outputs(model, mask_batch(tokens, cfg, generator), cfg)


def objective_outputs(
    model: torch.nn.Module, batch: MaskedBatch | StepInputs, cfg: ObjectiveConfig, sizes: Tensor | None = None
) -> dict[str, Tensor]:
    """Run the model once on ``batch`` and return its share of the update's loss and its counters.

    ``batch``: a ``MaskedBatch`` (its ``StepInputs`` are built here, where its tensors are, in the layout the encoder
    picks for them), or ``StepInputs`` built beforehand on the host (training: then nothing here reads a value back).
    ``sizes``: the update's ``sample_sizes`` (default: ``batch``'s own, the batch is the whole update). ``loss`` is
    ``sum_t weight_t * CE_t(batch) / sizes_t`` over TERMS, so the losses of an update's micro-batches add up to the
    update's loss however its sequences are split into micro-batches and ranks. ``model`` may be wrapped
    (DistributedDataParallel, torch.compile): it is called, never bypassed, so gradient synchronisation hooks run.
    Keys: ``loss`` (scalar to backward); ``l_mlm``, ``l_pmlm``, ``l_tmlm`` (detached mean CE over ``batch``,
    0-dim); ``mlm_correct``, ``mlm_total``, ``pair_correct``, ``pair_total``, ``triple_correct``, ``triple_total``
    (detached int64 sums).
    """
    core = unwrap(model)
    uses_token_head = cfg.name != PMLM_PAIR_ONLY
    uses_pair_head = cfg.name != MLM
    uses_triple_head = cfg.name == TMLM
    for uses, head, name in (
        (uses_token_head, core.token_head, "token"),
        (uses_pair_head, core.pair_head, "pair"),
        (uses_triple_head, core.triple_head, "triple"),
    ):
        if uses and head is None:
            raise ConfigError(
                f"objective {cfg.name!r} needs a {name} head; build the model with pmlm.pretrained.build_model()"
            )
    pair_vocab = core.cfg.pair_vocab
    if isinstance(batch, MaskedBatch):
        sizes = sample_sizes(batch, cfg) if sizes is None else sizes
        batch = batch.step_inputs(cfg, core.encoder.layout(batch.inputs.device), pair_vocab)
    counts = batch.counts  # (3,) N, 2P, T
    device = counts.device
    if sizes is None:
        sizes = step_sizes(counts, cfg)
    # sum / max(n, 1): an empty term gives 0 with zero gradients, never NaN
    denominators = sizes.to(device=device).clamp(min=1).to(torch.float32)
    per_term = counts.clamp(min=1)
    out = model(batch)  # PretrainingOutputs

    zero = torch.zeros((), dtype=torch.float32, device=device)
    no_count = torch.zeros((), dtype=torch.long, device=device)
    l_mlm, l_pmlm, l_tmlm, loss = zero, zero, zero, zero
    mlm_correct, pair_correct, pair_total, triple_correct, triple_total = (no_count,) * 5

    if uses_token_head:
        mlm_ce = F.cross_entropy(loss_precision(out.token_logits), batch.targets, reduction="sum")
        l_mlm = mlm_ce / per_term[0]
        mlm_correct = (out.token_logits.argmax(dim=-1) == batch.targets).sum()
        loss = mlm_ce / denominators[0]

    if uses_pair_head:
        off_ce, pair_correct, pair_total = out.pair_ce, out.pair_correct, counts[1]
        l_pmlm = off_ce / per_term[1]
        if cfg.name in (PMLM, TMLM):
            loss = loss + cfg.pair_weight * off_ce / denominators[1]
        else:
            diag_ce = F.cross_entropy(loss_precision(out.diagonal_logits), batch.diagonal_labels, reduction="sum")
            loss = (off_ce + diag_ce) / denominators[1]
            log_marginal = _marginal_log_probs(out.diagonal_logits, pair_vocab)  # (N, 20)
            l_mlm = F.nll_loss(log_marginal, batch.targets, reduction="sum") / per_term[0]
            mlm_correct = (log_marginal.argmax(dim=-1) == batch.targets).sum()

    if uses_triple_head:
        tri_ce, _, triple_correct = triple_loss(out.triple_logits, batch.triple_labels)
        triple_total = counts[2]
        l_tmlm = tri_ce / per_term[2]
        loss = loss + cfg.triple_weight * tri_ce / denominators[2]

    return {
        "loss": loss,
        "l_mlm": l_mlm.detach(),
        "l_pmlm": l_pmlm.detach(),
        "mlm_correct": mlm_correct.detach(),
        "mlm_total": counts[0],
        "pair_correct": pair_correct.detach(),
        "pair_total": pair_total,
        "l_tmlm": l_tmlm.detach(),
        "triple_correct": triple_correct.detach(),
        "triple_total": triple_total,
    }


def step_sizes(counts: Tensor, cfg: ObjectiveConfig) -> Tensor:
    """``sample_sizes`` from the counts (N, 2P, T) of a batch (``StepInputs.counts``): N masked standard residues,
    2P ordered pairs i != j of them (with the N diagonal pairs under ``pmlm_pair_only``), T triples."""
    n, ordered, triples = counts.unbind()
    zero = torch.zeros_like(n)
    mlm = zero if cfg.name == PMLM_PAIR_ONLY else n
    pair = zero if cfg.name == MLM else ordered + n if cfg.name == PMLM_PAIR_ONLY else ordered
    return torch.stack([mlm, pair, triples if cfg.name == TMLM else zero])
