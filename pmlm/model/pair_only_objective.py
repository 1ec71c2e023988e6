"""``pmlm_pair_only`` (the paper's speed variant): no token head; the loss is the pair head's cross-entropy alone,
over the ordered pairs i != j of masked standard residues **and** the diagonal pairs (i, i), divided by their
number (``pair_weight`` is unused). ``l_mlm`` and the MLM accuracy come from the pair head's marginal on the
diagonal, ``P(x_i) = sum_y softmax(pair_logits(i, i))[x_i, y]``; ``l_pmlm`` and the pair accuracy are those of the
off-diagonal pairs only, so they compare with the ``pmlm`` objective's figures."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from pmlm.alphabet import NUM_RESIDUES
from pmlm.model.config import PairVocab
from pmlm.model.heads import loss_precision
from pmlm.model.objective import Objective, ObjectiveOutputs, Term, term_outputs
from pmlm.vocabulary import PMLM_PAIR_ONLY


class PairOnlyMLM(Objective):
    name = layers = PMLM_PAIR_ONLY
    token_head = False
    diagonal = True

    def outputs(self, out, step, cfg, denominators) -> ObjectiveOutputs:
        diagonal_ce = F.cross_entropy(loss_precision(out.diagonal_logits), step.diagonal_labels, reduction="sum")
        loss = (out.pair_ce + diagonal_ce) / denominators[1]
        log_marginal = marginal_log_probs(out.diagonal_logits, step.pair_vocab)  # (N, 20)
        nll = F.nll_loss(log_marginal, step.targets, reduction="sum")
        mlm = Term(nll, (log_marginal.argmax(dim=-1) == step.targets).sum())
        return term_outputs(loss, step.counts, mlm, Term(out.pair_ce, out.pair_correct))


def marginal_log_probs(pair_logits: Tensor, pair_vocab: PairVocab) -> Tensor:
    """log P(x_i) over residue classes (N, 20) from diagonal pair logits (N, K); under the full vocabulary only
    standard residues are scored (mass on other tokens counts as wrong)."""
    side, first = pair_vocab.side, pair_vocab.offset
    joint = loss_precision(pair_logits).view(-1, side, side)  # (N, first, second)
    log_marginal = joint.logsumexp(dim=2) - joint.flatten(1).logsumexp(dim=1, keepdim=True)  # (N, side)
    return log_marginal[:, first : first + NUM_RESIDUES]


PAIR_ONLY_OBJECTIVE = PairOnlyMLM()
