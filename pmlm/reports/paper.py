"""The paper's reported numbers (He et al., ICLR 2022 submission), printed beside ours in every table.

Accuracies are fractions (0.480 = 48.0 %); None where the paper reports no value. ``features`` is what a
downstream row's head read: M (encoder outputs) or M+ (the pair head's first block), as the paper's source
marks its rows ("+" and 2M more parameters in the rows it comments out beside the printed ones; the
printed numbers are those rows' values); None where it does not say.
"""

from __future__ import annotations

from pmlm.vocabulary import FEATURES_M, FEATURES_M_PLUS

SOURCE = "He et al., Pre-training Co-evolutionary Protein Representation via a Pairwise Masked Language Model"

# Table "Validation Losses and Accuracy Scores": model, data, params, L_mlm, L_pmlm, Acc_mlm, Acc_pmlm, dAcc
PRETRAIN_SCORES = [
    {
        "model": "MLM-base",
        "data": "Pfam",
        "params": "85M",
        "l_mlm": 1.6475,
        "l_pmlm": None,
        "acc_mlm": 0.480,
        "acc_pmlm": None,
        "dacc": None,
    },
    {
        "model": "PMLM-base",
        "data": "Pfam",
        "params": "87M",
        "l_mlm": 1.6728,
        "l_pmlm": 3.3446,
        "acc_mlm": 0.471,
        "acc_pmlm": 0.224,
        "dacc": 0.0022,
    },
    {
        "model": "MLM-base",
        "data": "UR50",
        "params": "85M",
        "l_mlm": 2.2725,
        "l_pmlm": None,
        "acc_mlm": 0.320,
        "acc_pmlm": None,
        "dacc": None,
    },
    {
        "model": "PMLM-base",
        "data": "UR50",
        "params": "87M",
        "l_mlm": 2.2784,
        "l_pmlm": 4.5557,
        "acc_mlm": 0.318,
        "acc_pmlm": 0.109,
        "dacc": 0.0079,
    },
    {
        "model": "PMLM-large",
        "data": "UR50",
        "params": "250M",
        "l_mlm": 2.1710,
        "l_pmlm": 4.3419,
        "acc_mlm": 0.351,
        "acc_pmlm": 0.132,
        "dacc": 0.0088,
    },
    {
        "model": "PMLM-xl",
        "data": "UR50",
        "params": "713M",
        "l_mlm": None,
        "l_pmlm": 3.9746,
        "acc_mlm": 0.373,
        "acc_pmlm": 0.169,
        "dacc": 0.0295,
    },
]

# TAPE-Contact: precision at L/5, medium + long range (s >= 12), linear head; percent
TAPE_CONTACT_P_L5 = [
    {"model": "TAPE Transformer", "data": "Pfam", "p_l5_s12": 36.0, "features": FEATURES_M},
    {"model": "MLM-base", "data": "Pfam", "p_l5_s12": 37.3, "features": FEATURES_M},
    {"model": "PMLM-base", "data": "Pfam", "p_l5_s12": 47.2, "features": FEATURES_M_PLUS},
    {"model": "PMLM-base", "data": "UR50", "p_l5_s12": 57.7, "features": FEATURES_M},
    {"model": "PMLM-large", "data": "UR50", "p_l5_s12": 66.7, "features": FEATURES_M_PLUS},
    {"model": "PMLM-xl", "data": "UR50", "p_l5_s12": 71.7, "features": None},
    {"model": "MSA baseline", "data": "-", "p_l5_s12": 64.0, "features": None},
]

# RaptorX-Contact: long-range (s >= 24) precision at L; percent
RAPTORX_LONG_P_L = [
    {"model": "TAPE Transformer", "p_l_long": 23.2, "features": None},
    {"model": "UniRep", "p_l_long": 21.9, "features": None},
    {"model": "SeqVec", "p_l_long": 29.0, "features": None},
    {"model": "ESM T12", "p_l_long": 37.7, "features": None},
    {"model": "PMLM-base", "p_l_long": 41.6, "features": FEATURES_M_PLUS},
    {"model": "ESM T34", "p_l_long": 50.2, "features": None},
    {"model": "ESM-1b", "p_l_long": 56.9, "features": None},
    {"model": "PMLM-xl", "p_l_long": 59.9, "features": None},
]

# Ablation on RaptorX long-range P@L; percent
ABLATION_LONG_P_L = [
    {"model": "MLM-base", "head": "linear", "data": "Pfam", "p_l_long": 19.8, "features": FEATURES_M},
    {"model": "PMLM-base", "head": "linear", "data": "Pfam", "p_l_long": 25.2, "features": FEATURES_M},
    {"model": "MLM-base", "head": "linear", "data": "UR50", "p_l_long": 36.9, "features": FEATURES_M},
    {"model": "PMLM-base", "head": "linear", "data": "UR50", "p_l_long": 39.2, "features": FEATURES_M_PLUS},
    {"model": "PMLM-base", "head": "resnet", "data": "UR50", "p_l_long": 41.6, "features": FEATURES_M_PLUS},
    {"model": "PMLM-large", "head": "resnet", "data": "UR50", "p_l_long": 54.1, "features": FEATURES_M_PLUS},
    {"model": "PMLM-xl", "head": "resnet", "data": "UR50", "p_l_long": 59.9, "features": None},
]

# Secondary structure Q3 (CB513 / CASP12 / TS115)
SECONDARY_STRUCTURE_Q3 = [
    {
        "model": "TAPE Transformer",
        "data": "Pfam",
        "cb513": 0.730,
        "casp12": 0.710,
        "ts115": 0.770,
        "features": FEATURES_M,
    },
    {"model": "PMLM-base", "data": "Pfam", "cb513": 0.728, "casp12": 0.706, "ts115": 0.771, "features": FEATURES_M},
]

# Remote homology top-1 accuracy (fold / superfamily / family holdouts)
REMOTE_HOMOLOGY = [
    {
        "model": "TAPE Transformer",
        "data": "Pfam",
        "fold": 0.210,
        "superfamily": 0.340,
        "family": 0.880,
        "features": FEATURES_M,
    },
    {
        "model": "PMLM-base",
        "data": "Pfam",
        "fold": 0.199,
        "superfamily": 0.446,
        "family": 0.946,
        "features": FEATURES_M,
    },
]
