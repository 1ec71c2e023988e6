"""Atomic, pickle-free training checkpoints (``checkpoints/step-N/``) and what goes into them.

A checkpoint folder holds ``model.safetensors`` (weights), ``state.pt`` (optimizer, schedule,
RNG states, data position and step; tensors and plain containers only, read back with
``torch.load(weights_only=True)`` so loading never runs pickled code), ``config.json``,
``versions.json`` and ``run.json`` (what determines the run's result: ``train.run_folder``). It is written as ``step-N.tmp/`` and renamed, so a folder named ``step-N``
is always complete; a crash leaves at most a ``.tmp`` folder, removed on the next save.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from pmlm.errors import InputError
from pmlm.version import versions

CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
CONFIG_FILE = "config.json"
VERSIONS_FILE = "versions.json"
RUN_FILE = "run.json"
REQUIRED = (MODEL_FILE, STATE_FILE, CONFIG_FILE, VERSIONS_FILE)
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_SUFFIX = ".tmp"


@dataclass
class Checkpoint:
    """A loaded checkpoint: CPU weights, the training state and the config it was written with."""

    path: Path
    step: int
    model: dict[str, torch.Tensor]
    state: dict
    config: dict


def checkpoint_root(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / CHECKPOINTS


def list_checkpoints(out_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir() and all((child / name).is_file() for name in REQUIRED):
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    model_state: dict[str, torch.Tensor],
    state: dict,
    config: dict,
    keep_last: int,
    run_record: dict | None = None,
) -> Path:
    """Write ``checkpoints/step-<step>/`` atomically (with ``run_record`` as ``run.json``), then delete all but the
    newest ``keep_last``."""
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"step-*{_TMP_SUFFIX}"):  # left by a run killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step}"
    tmp = root / f"step-{step}{_TMP_SUFFIX}"
    tmp.mkdir()
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model_state.items()}
    save_file(tensors, str(tmp / MODEL_FILE), metadata={"step": str(step)})
    torch.save(state, tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (tmp / VERSIONS_FILE).write_text(json.dumps(versions(), indent=2) + "\n")
    if run_record is not None:
        (tmp / RUN_FILE).write_text(json.dumps(run_record, indent=2) + "\n")
    _fsync_tree(tmp)
    if final.exists():  # same step saved before (e.g. a rerun of a finished run): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for _, old in list_checkpoints(out_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint folder; nothing in it can execute code."""
    path = Path(path)
    m = _STEP_DIR.match(path.name)
    if not m:
        raise InputError(path, "not a checkpoint folder (expected a name like step-1000)")
    for name in REQUIRED:
        if not (path / name).is_file():
            raise InputError(path / name, "missing from the checkpoint")
    try:
        model = load_file(str(path / MODEL_FILE))
    except (SafetensorError, OSError) as exc:
        raise InputError(path / MODEL_FILE, f"unreadable weights: {exc}") from None
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError / RuntimeError / EOFError on damaged files
        raise InputError(path / STATE_FILE, f"unreadable training state: {_load_failure(exc)}") from None
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise InputError(path / CONFIG_FILE, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    return Checkpoint(path=path, step=int(m.group(1)), model=model, state=state, config=config)


def _load_failure(exc: Exception) -> str:
    """torch.load's reason in one line. A refused pickled object gets torch's name for it instead of torch's
    multi-paragraph advice (which suggests loading with weights_only=False, i.e. running the file's code)."""
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    if refused:
        return (
            f"it holds a pickled {refused.group(1)} object, which loading without running code refuses "
            "(not a file pmlm wrote?)"
        )
    first = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else 'no details'}"


def capture_rng() -> dict:
    """This process's global RNG states (python, numpy, torch CPU and CUDA) as tensors / plain values."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Inverse of ``capture_rng``."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_states(fsdp_module, model: nn.Module, optimizer) -> tuple[dict, dict | None]:
    """Unsharded model weights (keys of PMLMModel) and optimizer state keyed by parameter name.

    ``fsdp_module`` is the FSDP-sharded objective module holding ``model`` as ``.model``, or None.

    FSDP gathers through torch.distributed.checkpoint (collective: every rank calls it, rank 0 gets
    the tensors); otherwise the module's own state dicts are already complete and only the
    optimizer's positional keys are renamed, so both layouts are the same on disk.
    """
    if fsdp_module is None:
        if optimizer is None:
            return model.state_dict(), None
        names = optimizer_param_names(model, optimizer)
        plain = optimizer.state_dict()
        optim = {
            "state": {names[i]: v for i, v in plain["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in plain["param_groups"]],
        }
        return model.state_dict(), optim
    # imported here, only where FSDP state is gathered: torch.distributed.checkpoint costs every process ~0.7 s of
    # CPU at import, and single-process runs (every test subprocess, the demo's jobs) never call it
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = {k.removeprefix("model."): v for k, v in get_model_state_dict(fsdp_module, options=opts).items()}
    optim = get_optimizer_state_dict(fsdp_module, optimizer, options=opts) if optimizer is not None else None
    return weights, optim


def load_states(fsdp_module, model: nn.Module, optimizer, weights: dict, optim_state: dict) -> None:
    """Inverse of ``gather_states``; every rank loads the full state it read from disk."""
    if fsdp_module is None:
        model.load_state_dict(weights)
        index = {name: i for i, name in enumerate(optimizer_param_names(model, optimizer))}
        optimizer.load_state_dict(
            {
                "state": {index[name]: v for name, v in optim_state["state"].items()},
                "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in optim_state["param_groups"]],
            }
        )
        return
    # imported here for the reason gather_states gives
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(fsdp_module, {f"model.{k}": v for k, v in weights.items()}, options=full)
    set_optimizer_state_dict(fsdp_module, optimizer, optim_state, options=full)


def optimizer_param_names(model: nn.Module, optimizer) -> list[str]:
    """Names (as torch.distributed.checkpoint spells them from the objective module) in the
    optimizer's positional order."""
    name_of = {id(p): f"model.{n}" for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _fsync_tree(folder: Path) -> None:
    for child in folder.iterdir():
        with open(child, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
