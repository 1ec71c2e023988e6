"""The PMLM encoder, its token and pair heads, the task heads put on it, and the pre-training objectives.
Models are built and loaded through pmlm.pretrained."""

from pmlm.model.config import PRESETS, ModelConfig, model_config
from pmlm.model.objectives import ObjectiveConfig, mask_tokens, pretraining_losses
from pmlm.model.pmlm_model import PMLMModel, unwrap

__all__ = [
    "PRESETS",
    "ModelConfig",
    "ObjectiveConfig",
    "PMLMModel",
    "mask_tokens",
    "model_config",
    "pretraining_losses",
    "unwrap",
]
