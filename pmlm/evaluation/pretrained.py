"""Rebuild a pre-trained encoder from its artefact (``model.safetensors`` + ``model.json``, see pmlm.artefacts)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pmlm.artefacts import read_encoder, sidecar_path
from pmlm.errors import InputError
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig, build_model
from pmlm.model.pmlm_model import PMLMModel


def encoder_configs(info: dict, weights: str | Path) -> tuple[ModelConfig, ObjectiveConfig]:
    """The model and objective an encoder sidecar describes; fields this version does not know are ignored."""
    try:
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        model_cfg = ModelConfig(**{k: v for k, v in info["model"].items() if k in known})
        objective = ObjectiveConfig(**info["objective"])
    except (KeyError, TypeError) as exc:
        raise InputError(sidecar_path(weights), f"incomplete model description ({exc})") from None
    return model_cfg, objective


def load_pretrained(weights: str | Path, device: str = "cpu") -> tuple[PMLMModel, dict]:
    """Return (model in eval mode, info dict from the sidecar JSON); callers choose the grad mode."""
    info, state = read_encoder(weights)
    model = build_model(*encoder_configs(info, weights))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # tensors of other shapes than the sidecar's model has
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise InputError(weights, f"weights do not match the model in {sidecar_path(weights).name} ({first})") from None
    if missing or unexpected:
        raise InputError(weights, f"weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.to(device).eval()
    return model, info
