"""``pmlm``: ``L = L_mlm + pair_weight * L_pmlm``, the token head's term and the pair head's over every ordered pair
i != j of masked standard residues within one sequence, each divided by its number."""

from __future__ import annotations

from torch import Tensor

from pmlm.model.objective import Objective, ObjectiveOutputs, Term, term_outputs, token_term
from pmlm.vocabulary import PMLM


class PairedMLM(Objective):
    name = layers = PMLM

    def outputs(self, out, step, cfg, denominators) -> ObjectiveOutputs:
        mlm, pair = token_term(out, step), Term(out.pair_ce, out.pair_correct)
        return term_outputs(self.paired_loss(mlm, pair, cfg, denominators), step.counts, mlm, pair)

    @staticmethod
    def paired_loss(mlm: Term, pair: Term, cfg, denominators: Tensor) -> Tensor:
        """``L_mlm + pair_weight * L_pmlm`` of the terms ``mlm`` and ``pair``."""
        return mlm.ce / denominators[0] + cfg.pair_weight * pair.ce / denominators[1]


PMLM_OBJECTIVE = PairedMLM()
