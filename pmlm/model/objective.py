"""What a pre-training objective is: ``Objective``, the one type the model, the trainer, the plan, the importer and
the tables ask, never an objective's name. It owns the heads it trains (which the model builds, a micro-batch's
``StepInputs`` feed and ``pmlm plan`` costs), the count each loss term is divided by, its loss, the scores it
reports and the released layer recipe it takes. Adding one is one module defining an ``Objective`` and
``pmlm.model.objective_registry.register``; the built-in ones are ``mlm_objective``, ``pmlm_objective``,
``pair_only_objective`` and ``tmlm_objective``, each module's docstring its loss. What it hands the trainer for a
micro-batch is ``ObjectiveOutputs``, a dataclass as transformers' ``MaskedLMOutput``.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pmlm.alphabet import IGNORE_INDEX
from pmlm.errors import ConfigError
from pmlm.model.heads import loss_precision
from pmlm.model.triple import sample_triples


@dataclass(frozen=True)
class ObjectiveOutputs:
    """One micro-batch's share of an update's loss and its counters; every field a 0-dim tensor, the means and
    counts detached (int64 counts)."""

    loss: Tensor  # to backward: sum_t weight_t * CE_t / sample size_t over its terms t
    l_mlm: Tensor  # mean CE of the masked residues' classes over this micro-batch (0 without)
    l_pmlm: Tensor  # mean CE of the ordered pairs i != j of them
    l_tmlm: Tensor  # mean CE of the sampled triples
    mlm_correct: Tensor  # masked residues whose argmax class is right
    mlm_total: Tensor  # masked standard residues
    pair_correct: Tensor
    pair_total: Tensor  # ordered pairs i != j of them
    triple_correct: Tensor
    triple_total: Tensor  # sampled triples

    def scaled(self, factor) -> ObjectiveOutputs:
        """Every field times ``factor`` (0: a micro-batch that takes part in the collectives but counts nothing)."""
        return ObjectiveOutputs(*(getattr(self, f.name) * factor for f in dataclasses.fields(self)))


@dataclass(frozen=True)
class Term:
    """One loss term of a micro-batch: its cross-entropy summed over the term's examples, and how many of them the
    head's argmax gets right."""

    ce: Tensor
    correct: Tensor


def term_outputs(
    loss: Tensor, counts: Tensor, mlm: Term | None = None, pair: Term | None = None, triple: Term | None = None
) -> ObjectiveOutputs:
    """``loss`` and the counters of the terms an objective has (``counts``: the micro-batch's (3,) N, 2P, T); a term
    it lacks reads 0."""
    zero = torch.zeros((), dtype=torch.float32, device=counts.device)
    no_count = torch.zeros((), dtype=torch.long, device=counts.device)
    means, correct, totals = [], [], []
    # sum / max(n, 1): an empty term gives 0, never NaN
    for count, per_term, term in zip(counts.unbind(), counts.clamp(min=1).unbind(), (mlm, pair, triple)):
        means.append(zero if term is None else (term.ce / per_term).detach())
        correct.append(no_count if term is None else term.correct.detach())
        totals.append(no_count if term is None else count)
    return ObjectiveOutputs(loss, *means, correct[0], totals[0], correct[1], totals[1], correct[2], totals[2])


def token_term(out, step) -> Term:
    """The token head's term: its 20-class cross-entropy at the masked standard residues."""
    ce = F.cross_entropy(loss_precision(out.token_logits), step.targets, reduction="sum")
    return Term(ce, (out.token_logits.argmax(dim=-1) == step.targets).sum())


class Objective(abc.ABC):
    """A pre-training objective. Subclasses set ``name`` and ``layers`` and implement ``outputs``; the heads default
    to a token and a pair head (the class attributes)."""

    name: str  # as recipes' objective.name, sidecars and the workflow spell it
    layers: str  # the objective whose released layer recipe its encoder takes (pmlm.model.config.RELEASED_LAYERS)
    token_head = True  # the 20-class token head scores the masked standard residues
    pair_head = True  # the pair head scores every ordered pair i != j of them
    diagonal = False  # the pair head also scores (i, i), in the pair term
    triple_head = False  # the triple head scores sampled triples of them
    extra_scores: tuple[str, ...] = ()  # validation metrics its final scores record beside every objective's

    @property
    def table_scores(self) -> tuple[str, ...]:
        """The final scores the pre-training table shows for its encoders (the pair figures need a pair head)."""
        return ("l_mlm", "acc_mlm", *(("l_pmlm", "acc_pmlm", "dacc") if self.pair_head else ()))

    def check_model(self, model) -> None:
        """An error unless the PMLMModel ``model`` has every head this objective trains."""
        for uses, head, what in (
            (self.token_head, model.token_head, "token"),
            (self.pair_head, model.pair_head, "pair"),
            (self.triple_head, model.triple_head, "triple"),
        ):
            if uses and head is None:
                raise ConfigError(
                    f"objective {self.name!r} needs a {what} head; build the model with pmlm.pretrained.build_model()"
                )

    def draw_triples(self, targets: Tensor, cfg, generator: torch.Generator) -> Tensor | None:
        """(T, 4) rows (b, i, j, k) of the triples the triple head scores, drawn from ``generator`` after the masks
        (``targets`` (B, L), ``cfg`` the ObjectiveConfig); None without a triple head."""
        if not self.triple_head:
            return None
        return sample_triples(targets.ne(IGNORE_INDEX), cfg.triples_per_masked, generator)

    def sample_sizes(self, counts: Tensor) -> Tensor:
        """(3,) the examples each term (token, pair, triple) divides by, from a batch's counts (N, 2P, T): N masked
        standard residues, 2P ordered pairs i != j of them (with the N diagonal pairs under ``diagonal``), T
        triples; zero for a term the objective lacks."""
        n, ordered, triples = counts.unbind()
        zero = torch.zeros_like(n)
        pair = (ordered + n if self.diagonal else ordered) if self.pair_head else zero
        return torch.stack([n if self.token_head else zero, pair, triples if self.triple_head else zero])

    @abc.abstractmethod
    def outputs(self, out, step, cfg, denominators: Tensor) -> ObjectiveOutputs:
        """The loss and counters of one micro-batch: ``out`` the heads' PretrainingOutputs on ``step`` (its
        StepInputs), ``cfg`` the ObjectiveConfig (the terms' weights), ``denominators`` (3,) float32 the update's
        sample sizes (at least 1)."""
