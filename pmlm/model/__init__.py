"""The PMLM encoder, its token and pair heads, and the pre-training objectives."""

from pmlm.model.config import PRESETS, ModelConfig, model_config
from pmlm.model.objectives import ObjectiveConfig, build_model, mask_tokens, pretraining_losses
from pmlm.model.pmlm_model import PMLMModel, unwrap

__all__ = [
    "PRESETS",
    "ModelConfig",
    "ObjectiveConfig",
    "PMLMModel",
    "build_model",
    "mask_tokens",
    "model_config",
    "pretraining_losses",
    "unwrap",
]
