"""Checks of the workflow configuration that report one actionable line naming the offending key.

The JSON schema (workflow/schemas/config.schema.yaml) is the single description of the keys;
this module turns its first violation into ``config.<path>: <message>`` and adds the
cross-references a schema cannot express (a dataset naming an undefined source).
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from pmlm.errors import ConfigError


def _where(path) -> str:
    return "config" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def check_config(config: dict, schema_path: str | Path) -> None:
    """Raise ConfigError with one line for the most relevant problem; return silently when valid."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    if not isinstance(config, dict) or not config:
        raise ConfigError("config is empty: pass --configfile config/config.yaml (demo) or config/paper.yaml")
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        message = error.message
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            if allowed:
                message += f"; allowed keys: {', '.join(allowed)}"
        raise ConfigError(f"{_where(error.absolute_path)}: {message}")
    sources = config["sources"]
    for name, dataset in config["datasets"].items():
        for key in ("sources", "decontaminate"):
            for i, ref in enumerate(dataset.get(key) or []):
                if ref not in sources:
                    raise ConfigError(
                        f"config.datasets.{name}.{key}[{i}]: unknown source {ref!r}; defined sources: "
                        f"{', '.join(sorted(sources))}"
                    )
    pretrain = config.get("pretrain") or {}
    recipes = pretrain.get("recipes") or {}
    seen = set()
    for i, model in enumerate(pretrain.get("models") or []):
        where = f"config.pretrain.models[{i}]"
        if model["dataset"] not in config["datasets"]:
            raise ConfigError(f"{where}.dataset: unknown dataset {model['dataset']!r}; defined: {', '.join(sorted(config['datasets']))}")
        if model["preset"] not in recipes:
            raise ConfigError(f"{where}.preset: no recipe for {model['preset']!r} in config.pretrain.recipes")
        key = (model["dataset"], model["objective"], model["preset"])
        if key in seen:
            raise ConfigError(f"{where}: duplicate model {'/'.join(key)}")
        seen.add(key)
