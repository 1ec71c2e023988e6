"""Load a pre-trained encoder from its declared output: ``model.safetensors`` plus ``model.json`` beside it.

Only tensors (safetensors) and JSON are read, so loading never executes code.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pmlm.errors import InputError


def load_pretrained(weights: str | Path, device: str = "cpu"):
    """Return (model in eval mode, info dict from the sidecar JSON); callers choose the grad mode."""
    from safetensors.torch import load_file

    from pmlm.model.config import ModelConfig
    from pmlm.model.objectives import ObjectiveConfig, build_model

    weights = Path(weights)
    sidecar = weights.with_suffix(".json")
    try:
        info = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise InputError(sidecar, "missing: pre-trained weights need their .json sidecar (written by pmlm pretrain)") from None
    except json.JSONDecodeError as exc:
        raise InputError(sidecar, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    try:
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        model_cfg = ModelConfig(**{k: v for k, v in info["model"].items() if k in known})
        objective = ObjectiveConfig(**info["objective"])
    except (KeyError, TypeError) as exc:
        raise InputError(sidecar, f"incomplete model description ({exc})") from None
    model = build_model(model_cfg, objective)
    try:
        state = load_file(str(weights), device="cpu")
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise InputError(weights, f"unreadable weights: {exc}") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(weights, f"weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.to(device).eval()
    return model, info
