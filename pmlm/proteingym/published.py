"""Published zero-shot results on ProteinGym's substitution benchmark, printed beside ours.

Source: ProteinGym v1.3 (217 assays), the summary files
``benchmarks/DMS_zero_shot/substitutions/{Spearman,AUC,MCC,NDCG}/Summary_performance_DMS_substitutions_*.csv``
of OATML-Markslab/ProteinGym at commit bb685245f8f4bb95a5b54b470396c23826cd6284 (July 2025); columns
``Average_<metric>``, ``Function_<category>`` and ``Depth_1`` / ``Depth_2`` (all 217 assays, aggregated per
UniProt ID, then per function category, then over categories; depth columns over (UniProt ID, category) groups,
as ``pmlm.proteingym.summary`` does). ESM-1b there includes Brandes et al.'s extension for proteins longer
than its window; "Tranception L" uses retrieval from an MSA, "no retrieval" is the single-sequence model.
"""

from __future__ import annotations

SOURCE = (
    "ProteinGym v1.3 zero-shot substitution benchmark, 217 assays (Notin et al., NeurIPS 2023; "
    "github.com/OATML-Markslab/ProteinGym benchmarks/DMS_zero_shot/substitutions/, commit bb68524)"
)
SOURCE_ASSAYS = 217
SOURCE_PROTEINS = 186  # UniProt IDs in the reference file
SOURCE_MUTANTS = 2465767  # DMS_total_number_mutants summed over the reference file
CATEGORIES = ("Activity", "Binding", "Expression", "OrganismalFitness", "Stability")
METRICS = ("spearman", "auc", "mcc", "ndcg")
# per metric: average, the five categories in the order of CATEGORIES, Depth_1 (singles), Depth_2 (doubles)
_COLUMNS = ("average", *CATEGORIES, "depth1", "depth2")

_VALUES = {
    ("Site-Independent", "MSA"): {
        "spearman": (0.359, 0.369, 0.344, 0.343, 0.383, 0.358, 0.337, 0.24),
        "auc": (0.696, 0.699, 0.684, 0.687, 0.716, 0.695, 0.691, 0.657),
        "mcc": (0.287, 0.291, 0.264, 0.274, 0.302, 0.301, 0.248, 0.177),
        "ndcg": (0.748, 0.751, 0.7, 0.76, 0.725, 0.802, 0.765, 0.691),
    },
    ("ESM-1b", "single sequence"): {
        "spearman": (0.394, 0.428, 0.287, 0.406, 0.349, 0.5, 0.383, 0.226),
        "auc": (0.719, 0.73, 0.662, 0.72, 0.699, 0.782, 0.715, 0.642),
        "mcc": (0.311, 0.328, 0.221, 0.32, 0.275, 0.41, 0.256, 0.126),
        "ndcg": (0.747, 0.767, 0.668, 0.767, 0.699, 0.832, 0.761, 0.679),
    },
    ("ESM-1v (ensemble)", "single sequence"): {
        "spearman": (0.407, 0.42, 0.32, 0.429, 0.386, 0.477, 0.403, 0.215),
        "auc": (0.724, 0.726, 0.674, 0.735, 0.718, 0.764, 0.725, 0.643),
        "mcc": (0.32, 0.323, 0.241, 0.345, 0.305, 0.387, 0.292, 0.144),
        "ndcg": (0.749, 0.74, 0.701, 0.776, 0.72, 0.811, 0.768, 0.669),
    },
    ("ESM2 (650M)", "single sequence"): {
        "spearman": (0.414, 0.425, 0.337, 0.415, 0.368, 0.523, 0.422, 0.248),
        "auc": (0.729, 0.73, 0.691, 0.725, 0.709, 0.789, 0.737, 0.664),
        "mcc": (0.327, 0.331, 0.262, 0.332, 0.29, 0.42, 0.309, 0.17),
        "ndcg": (0.747, 0.739, 0.705, 0.764, 0.694, 0.834, 0.764, 0.686),
    },
    ("Tranception L no retrieval", "single sequence"): {
        "spearman": (0.374, 0.401, 0.288, 0.413, 0.387, 0.381, 0.363, 0.171),
        "auc": (0.707, 0.717, 0.659, 0.727, 0.717, 0.714, 0.704, 0.62),
        "mcc": (0.296, 0.309, 0.229, 0.325, 0.303, 0.315, 0.27, 0.125),
        "ndcg": (0.752, 0.768, 0.692, 0.775, 0.748, 0.776, 0.772, 0.663),
    },
    ("Tranception L", "MSA"): {
        "spearman": (0.434, 0.465, 0.349, 0.45, 0.435, 0.471, 0.422, 0.254),
        "auc": (0.739, 0.752, 0.688, 0.747, 0.744, 0.764, 0.738, 0.671),
        "mcc": (0.341, 0.36, 0.266, 0.358, 0.342, 0.378, 0.312, 0.178),
        "ndcg": (0.779, 0.794, 0.724, 0.795, 0.759, 0.824, 0.793, 0.705),
    },
}


def rows() -> list[dict]:
    """One dict per published model: ``model``, ``type`` and ``values[metric][column]`` (columns: average, the
    categories, depth1, depth2)."""
    return [
        {"model": model, "type": kind, "values": {m: dict(zip(_COLUMNS, v)) for m, v in metrics.items()}}
        for (model, kind), metrics in _VALUES.items()
    ]
