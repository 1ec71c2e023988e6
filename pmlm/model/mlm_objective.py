"""``mlm``: the token head's cross-entropy on the masked standard residues, divided by their number."""

from __future__ import annotations

from pmlm.model.objective import Objective, ObjectiveOutputs, term_outputs, token_term
from pmlm.vocabulary import MLM


class MaskedLM(Objective):
    name = layers = MLM
    pair_head = False

    def outputs(self, out, step, cfg, denominators) -> ObjectiveOutputs:
        mlm = token_term(out, step)
        return term_outputs(mlm.ce / denominators[0], step.counts, mlm)


MLM_OBJECTIVE = MaskedLM()
