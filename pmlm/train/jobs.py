"""The pre-training jobs of a workflow config as ``pmlm plan`` reads them, before anything runs: the config as
Snakemake reads it from one or more ``--configfile`` files, each job's recipe with the overrides the workflow passes,
and the SLURM profile's GPUs and time limit for the pre-training rule."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from pmlm.config.pretraining import TrainConfig
from pmlm.errors import ConfigError

DEFAULT_WARNING_S = 600  # the profile's --signal=USR1@600: the trainers stop this long before the limit


@dataclass(frozen=True)
class Job:
    name: str  # dataset/objective-preset, as the workflow's results/<run>/pretrain/ folders
    preset: str
    recipe: Path
    config: TrainConfig


def read_yaml(path: str | Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    return data if isinstance(data, dict) else {}


def recipe_job(recipe: str | Path, objective: str, sets: list[str] = (), name: str | None = None) -> Job:
    """One recipe trained with ``objective`` (the workflow's own ``--set objective.name=...``, then ``sets``)."""
    cfg = TrainConfig.from_yaml(recipe, [f"objective.name={objective}", *sets])
    preset = cfg.model.preset
    return Job(name or f"{objective}-{preset}", preset, Path(recipe), cfg)


@dataclass(frozen=True)
class WorkflowConfig:
    """A workflow config as Snakemake reads it from one or more ``--configfile`` files (``name`` says which)."""

    values: dict
    name: str

    @classmethod
    def load(cls, paths: str | Path | list[str | Path]) -> WorkflowConfig:
        """The files merged in order, as Snakemake merges its ``--configfile`` files: a later file's mapping updates
        an earlier one key by key, recursively; any other value (a list, a number) replaces it."""
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        values: dict = {}
        for path in paths:
            values = merged(values, read_yaml(path))
        return cls(values, " + ".join(map(str, paths)))


def merged(base: dict, update: dict) -> dict:
    """``base`` updated by ``update`` (``WorkflowConfig.load``); neither is changed."""
    out = dict(base)
    for key, value in update.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def workflow_jobs(config: WorkflowConfig | str | Path, root: str | Path = ".") -> list[Job]:
    """The pre-training jobs of a workflow config (released checkpoints are imported, not trained), with the
    overrides the workflow passes them (``pretrain.set``); recipe paths are resolved against ``root``, the
    workflow directory, as the Snakefile resolves them."""
    config = config if isinstance(config, WorkflowConfig) else WorkflowConfig.load(config)
    pretrain = config.values.get("pretrain") or {}
    recipes = pretrain.get("recipes") or {}
    sets = [f"{key}={value}" for key, value in (pretrain.get("set") or {}).items()]
    jobs = []
    for i, model in enumerate(pretrain.get("models") or []):
        if model.get("release"):
            continue
        if model.get("preset") not in recipes:
            raise ConfigError(f"{config.name}: pretrain.models[{i}].preset: no recipe for {model.get('preset')!r}")
        recipe = Path(recipes[model["preset"]])
        recipe = recipe if recipe.is_absolute() else Path(root) / recipe
        name = f"{model['dataset']}/{model['objective']}-{model['preset']}"
        jobs.append(recipe_job(recipe, model["objective"], sets, name))
    if not jobs:
        raise ConfigError(f"{config.name}: pretrain.models names no encoder to pre-train")
    return jobs


def pretrain_resources(profile: str | Path) -> dict:
    """The pre-training job's GPUs, runtime (minutes) and time-limit warning (seconds) under a SLURM profile:
    ``set-resources: pretrain:`` of ``<profile>/config.yaml``. The one place that knows where they live."""
    path = Path(profile) / "config.yaml" if Path(profile).is_dir() else Path(profile)
    section = (read_yaml(path).get("set-resources") or {}).get("pretrain") or {}
    nodes = int(section.get("nodes", 1) or 1)
    per_node = re.fullmatch(r"gpu(?::[^:]+)?:(\d+)", str(section.get("gres", "") or ""))
    gpus = int(per_node.group(1)) * nodes if per_node else int(section.get("gpu", 0) or 0)
    warning = re.search(r"--signal=\w*@(\d+)", str(section.get("slurm_extra", "")))
    return {
        "source": str(path),
        "gpus": gpus or None,
        "runtime_min": int(section["runtime"]) if section.get("runtime") else None,
        "warning_s": int(warning.group(1)) if warning else DEFAULT_WARNING_S,
    }
