"""``tmlm``, the Triple MLM the paper's Discussion proposes: ``L = L_mlm + pair_weight * L_pmlm + triple_weight *
L_tmlm``, the last the triple head's cross-entropy (``pmlm.model.triple``) over ``ceil(triples_per_masked * n)``
sampled triples i < j < k of each sequence's n masked standard residues. It trains with PMLM's layers, so the two
differ in their objective only."""

from __future__ import annotations

from pmlm.model.objective import ObjectiveOutputs, Term, term_outputs, token_term
from pmlm.model.pmlm_objective import PairedMLM
from pmlm.model.triple import triple_loss
from pmlm.vocabulary import PMLM, TMLM


class TripleMLM(PairedMLM):
    name, layers = TMLM, PMLM
    triple_head = True
    extra_scores = ("l_tmlm", "acc_tmlm", "triple_total")

    def outputs(self, out, step, cfg, denominators) -> ObjectiveOutputs:
        mlm, pair = token_term(out, step), Term(out.pair_ce, out.pair_correct)
        triple_ce, _, triple_correct = triple_loss(out.triple_logits, step.triple_labels)
        loss = self.paired_loss(mlm, pair, cfg, denominators) + cfg.triple_weight * triple_ce / denominators[2]
        return term_outputs(loss, step.counts, mlm, pair, Term(triple_ce, triple_correct))


TMLM_OBJECTIVE = TripleMLM()
