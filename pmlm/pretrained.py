"""Every way pmlm builds or loads a model, in one place: an encoder from its config (``build_model``), a
pre-trained encoder artefact (``load_encoder``), a fine-tuned head with the encoder it was trained on
(``load_head``), and the device they run on (``pick_device``). ``encoder_from_state`` is the one place where
weights meet the model a description builds. The importer of released checkpoints (pmlm.fairseq_checkpoint)
plugs in here: it checks every tensor it converts against ``build_model``'s names and shapes (on the meta
device) before writing an encoder artefact, which then loads like any other. An ESM checkpoint imported from a
``transformers`` folder (``model.architecture: esm`` in its sidecar) is loaded by pmlm.hf_esm, which wraps
``transformers``' own module behind the same interface.

Artefacts are given as the weights file or the folder holding it (``model.safetensors`` / ``head.safetensors``
with their JSON sidecars, see pmlm.artefacts). Loading reads tensors and JSON only, never pickled code.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import NamedTuple

import torch

from pmlm.adapters import attach
from pmlm.artefacts import head_encoder_path, read_encoder_info, read_head, read_head_info, read_weights, sidecar_path
from pmlm.choices import Device
from pmlm.config.finetuning import FinetuneConfig
from pmlm.errors import ConfigError, InputError
from pmlm.files import file_digest
from pmlm.model.config import ModelConfig
from pmlm.model.encoder import position_table
from pmlm.model.objectives import ObjectiveConfig
from pmlm.model.pmlm_model import PMLMModel
from pmlm.model.task_heads import TaskModel
from pmlm.tasks.registry import task_named

ENCODER_FILE = "model.safetensors"
ESM = "esm"  # model.architecture in the sidecar of an ESM encoder (pmlm.hf_esm)
HEAD_FILE = "head.safetensors"


def pick_device(choice: Device | str, local_rank: int = 0, *, option: str = "--device") -> torch.device:
    """``device_for`` of a Device or its name (the Python API's, checked here)."""
    return device_for(Device.parse(choice, option), local_rank, option=option)


def device_for(choice: Device, local_rank: int = 0, *, option: str = "--device") -> torch.device:
    """CUDA when asked for or (auto) available, on GPU ``local_rank`` (torchrun's; made the current device), else
    the CPU. ``option`` names the setting in errors (``--device`` for commands, ``device:`` for recipes)."""
    if choice is Device.CUDA and not torch.cuda.is_available():
        raise ConfigError(f"{option} cuda was requested but no CUDA device is visible; use auto or cpu")
    if choice is Device.CPU or not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def build_model(model_cfg: ModelConfig, objective: ObjectiveConfig) -> PMLMModel:
    """A PMLMModel carrying exactly the heads ``objective`` trains (randomly initialised)."""
    heads = objective.kind
    cfg = dataclasses.replace(
        model_cfg, token_head=heads.token_head, pair_head=heads.pair_head, triple_head=heads.triple_head
    )
    return PMLMModel(cfg)


def encoder_configs(info: dict, weights: str | Path) -> tuple[ModelConfig, ObjectiveConfig]:
    """The model and objective an encoder sidecar describes; fields this version does not know are ignored. An ESM
    encoder's sidecar describes no model of ours (``load_encoder`` builds it with transformers)."""
    if is_esm(info):
        raise InputError(sidecar_path(weights), "an ESM encoder (transformers' module), not a pmlm encoder")
    try:
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        model_cfg = ModelConfig(**{k: v for k, v in info["model"].items() if k in known})
        objective = ObjectiveConfig(**info["objective"])
    except (KeyError, TypeError) as exc:
        raise InputError(sidecar_path(weights), f"incomplete model description ({exc})") from None
    except ConfigError as exc:  # values the model config refuses: the sidecar is what is wrong
        raise InputError(sidecar_path(weights), f"incompatible model description: {exc}") from None
    return model_cfg, objective


def encoder_from_state(
    model_cfg: ModelConfig,
    objective: ObjectiveConfig,
    state: dict,
    source: str | Path,
    described_by: str = "its description",
) -> PMLMModel:
    """The model ``model_cfg`` and ``objective`` describe, holding ``state`` (name -> tensor) exactly: every
    parameter present with its shape, nothing left over. A mismatch is a one-line error naming ``source``.

    The model is built on the meta device and takes the tensors of ``state`` as its own (no random initialisation,
    no second copy): loading peaks at the size of the weights, 2.7 GB rather than 5.4 GB for a 650M encoder."""
    with torch.device("meta"):
        model = build_model(model_cfg, objective)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # tensors of other shapes than the described model has
        lines = str(exc).splitlines()
        first = lines[1].strip() if len(lines) > 1 else str(exc)
        raise InputError(source, f"weights do not match the model in {described_by} ({first})") from None
    if missing or unexpected:
        raise InputError(source, f"weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    # the one tensor no file holds, the position table, is computed from the config
    model.encoder.positions = position_table(model.cfg)
    return model


def artefact_file(path: str | os.PathLike, name: str) -> Path:
    """``path`` itself, or ``path/name`` when ``path`` is a folder."""
    path = Path(path)
    return path / name if path.is_dir() else path


def is_head(path: str | os.PathLike) -> bool:
    """Whether ``path`` (file or folder) is a fine-tuned head rather than an encoder."""
    path = Path(path)
    if path.is_dir():
        return (path / HEAD_FILE).is_file() and not (path / ENCODER_FILE).is_file()
    return path.name == HEAD_FILE or sidecar_path(path).name == "head.json"


def encoder_weights(path: str | os.PathLike) -> Path:
    """The one reading of MODEL wherever a command takes an encoder: its ``model.safetensors``, the folder holding
    it, or its ``model.json`` all name the same weights (returned), checked before any work; a fine-tuned head (file
    or folder) is refused in one line naming the encoder it records, a transformers folder with how to import it."""
    path = Path(path)
    if path.name == "model.json" and path.is_file():
        path = path.parent
    weights = artefact_file(path, ENCODER_FILE)
    if is_head(path):
        raise InputError(path, _head_not_encoder(path))
    if weights.is_file() and weights.suffix != ".safetensors":
        raise InputError(
            weights,
            f"not encoder weights: MODEL is {ENCODER_FILE} (with model.json beside it), its folder or its model.json",
        )
    if not weights.is_file():
        raise InputError(
            weights,
            "no encoder weights here (model.safetensors with its model.json, written by pmlm pretrain or pmlm import)",
        )
    if not sidecar_path(weights).is_file() and (weights.parent / "config.json").is_file():
        raise InputError(
            weights.parent, "a transformers folder, not a pmlm encoder: pmlm import it first (docs/huggingface.md)"
        )
    return weights


def load_encoder(
    path: str | os.PathLike, device: str | torch.device = "cpu", *, adapter: str | os.PathLike | None = None
) -> tuple[PMLMModel, dict, Path]:
    """(model in eval mode on ``device``, sidecar info, weights path) of a pre-trained encoder given as
    ``encoder_weights`` reads MODEL; callers choose the grad mode. ``adapter``: a fine-tuned run with adapters
    (its head file or folder), trained on this encoder, whose adapters are put in (``with_adapter``)."""
    weights = encoder_weights(path)
    info = read_encoder_info(weights)
    if is_esm(info):
        # transformers is needed by ESM encoders only (the optional `hf` extra), not by pmlm's own
        from pmlm.hf_esm import load_esm_encoder

        model = load_esm_encoder(weights, info)
    else:
        model_cfg, objective = encoder_configs(info, weights)
        model = encoder_from_state(model_cfg, objective, read_weights(weights), weights, sidecar_path(weights).name)
    if adapter is not None:
        with_adapter(model, adapter, weights)
    return model.to(device).eval(), info, weights


def adapter_record(run: str | os.PathLike | None) -> dict:
    """What an output's settings say of ``--adapter``: the run's head file and its sha256 ({} without)."""
    if run is None:
        return {}
    head = artefact_file(run, HEAD_FILE)
    return {"adapter": str(head), "adapter_sha256": file_digest(head)}


def with_adapter(model: PMLMModel, run: str | os.PathLike, weights: Path) -> PMLMModel:
    """``model`` (the encoder at ``weights``) with the adapters of the fine-tuned ``run`` (head file or folder) put
    in and loaded; a run without adapters, or trained on another encoder, is refused in one line."""
    head = artefact_file(run, HEAD_FILE)
    if not head.is_file():
        raise InputError(head, "no fine-tuned run here (head.safetensors with its head.json, written by pmlm finetune)")
    info, state, cfg = _read_run(head)
    if cfg.adapter is None:
        trained = "the whole encoder" if not cfg.freeze_encoder else "the head only"
        raise InputError(head, f"this run has no adapters (it trained {trained}); --adapter takes a run with adapter:")
    head_encoder_path(head, info, override=weights)  # the encoder it was trained on, by sha256
    adapter = attach(model, cfg.adapter)
    prefix = "adapter."
    try:
        adapter.load_state_dict({k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)})
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise InputError(head, f"adapter weights do not match the adapters in the sidecar: {first}") from None
    return model


def _read_run(head: Path) -> tuple[dict, dict, FinetuneConfig]:
    """(sidecar, weights, recipe) of a fine-tuned run's head file; a recipe this version cannot read is one line."""
    info, state = read_head(head)
    try:
        return info, state, FinetuneConfig.from_dict(info["config"])
    except ConfigError as exc:
        raise InputError(sidecar_path(head), f"incompatible head description: {exc}") from None


def _head_not_encoder(path: str | os.PathLike) -> str:
    """What to say where an encoder was expected and a fine-tuned head was given: the command that reads heads,
    and the encoder this head records."""
    head = artefact_file(path, HEAD_FILE)
    try:
        encoder = os.path.normpath(head.parent / read_head_info(head)["encoder"]["path"])
    except (InputError, KeyError, TypeError):
        encoder = "the encoder it was fine-tuned on"
    return (
        f"a fine-tuned head ({HEAD_FILE}), not an encoder; a head is used with its encoder: pmlm contacts MODEL FASTA "
        f"--head HEAD, MODEL being the encoder the head records, here {encoder}"
    )


def is_esm(info: dict) -> bool:
    """Whether an encoder sidecar describes an ESM checkpoint imported from a transformers folder (pmlm.hf_esm)."""
    return info["model"].get("architecture") == ESM


def encoder_parameters(info: dict, weights: str | Path) -> int:
    """Parameters of the encoder an artefact describes, without reading its tensors: the described model built on
    the meta device, or (ESM) the tensors listed in the weights file's header, tied ones stored once."""
    if is_esm(info):
        # safetensors' header reader, as artefacts.read_weights uses it: with the weights only
        from safetensors import safe_open

        with safe_open(str(weights), "pt") as fh:
            return sum(math.prod(fh.get_slice(name).get_shape()) for name in fh.keys())  # noqa: SIM118 (safe_open handles are not iterable)
    model_cfg, objective = encoder_configs(info, weights)
    with torch.device("meta"):
        model = build_model(model_cfg, objective)
    return sum(p.numel() for p in model.parameters())


class FineTuned(NamedTuple):
    """A fine-tuned head loaded back: the TaskModel (encoder + head, eval mode), its recipe, its sidecar, and
    the files it came from."""

    model: TaskModel
    config: FinetuneConfig
    info: dict
    path: Path
    encoder_path: Path


def load_head(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    *,
    encoder: str | os.PathLike | None = None,
    task: str | None = None,
) -> FineTuned:
    """A fine-tuned head (``head.safetensors`` or its folder) on the encoder it was trained on. The encoder is
    the one the head records (relative to the head's folder); ``encoder`` overrides it (a file or folder),
    checked by sha256 either way. With ``task`` the head must be one of that task."""
    head = artefact_file(path, HEAD_FILE)
    if not head.is_file():
        raise InputError(head, "no head weights here (head.safetensors with its head.json, written by pmlm finetune)")
    if task is not None:
        recorded = read_head_info(head)["config"]
        found = recorded.get("task") if isinstance(recorded, dict) else None
        if found != task:
            raise InputError(sidecar_path(head), f"a {found} head, not a {task} head")
    info, state, cfg = _read_run(head)
    override = None if encoder is None else artefact_file(encoder, ENCODER_FILE)
    encoder_path = head_encoder_path(head, info, override)
    encoder_model, _, _ = load_encoder(encoder_path)
    head_module = task_named(cfg.task).build_head(cfg, encoder_model.cfg.hidden)
    adapter = attach(encoder_model, cfg.adapter) if cfg.adapter is not None else None
    model = TaskModel(encoder_model, head_module, cfg.task, cfg.head.features, cfg.freeze_encoder, adapter)
    try:
        model.trainable().load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise InputError(head, f"weights do not match the head in the sidecar: {first}") from None
    return FineTuned(model.to(device).eval(), cfg, info, head, Path(encoder_path))
