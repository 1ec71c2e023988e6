"""The names every layer agrees on, from the config files to the tables: the pre-training objectives, the
features a task head reads, the devices a run or command computes on and the precisions it computes in. Standard
library only, so the command layer and the workflow can import it."""

from __future__ import annotations

# pre-training objectives, as recipes, sidecars and the workflow config spell them
MLM = "mlm"  # cross-entropy of the token head on masked residues
PMLM = "pmlm"  # L_mlm + lambda * L_pmlm over every ordered pair of masked residues
PMLM_PAIR_ONLY = "pmlm_pair_only"  # the pair loss alone, with the diagonal; no token head
TMLM = "tmlm"  # PMLM plus a factorised triple-joint loss on sampled triples of masked residues
OBJECTIVES = (MLM, PMLM, PMLM_PAIR_ONLY, TMLM)

# the features a task head reads, named as in the paper
FEATURES_M = "M"  # encoder outputs (pairs: concat(h_i * h_j, h_i - h_j))
FEATURES_M_PLUS = "M+"  # the pair head's first block on those pair features (contact heads of PMLM encoders)
FEATURES_PAIR_JOINT = "pair joint"  # no head: the pair head's joint read out as unsupervised contact scores

# where a run or command computes (recipes' ``device``, commands' ``--device``): auto = CUDA when available
DEVICES = ("auto", "cpu", "cuda")

# the arithmetic of a run's forward passes, as model.json and head.json record it (``precision``; absent: fp32), and
# the choices of the commands that evaluate, score or embed with a trained model (``--precision``; auto = the record)
FP32 = "fp32"
BF16 = "bf16"
PRECISIONS = ("auto", FP32, BF16)
