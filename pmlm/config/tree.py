"""The YAML -> dataclass machinery every typed config tree of pmlm shares (pre-training and fine-tuning
recipes): strict keys, one-line errors naming the file, line and dotted key, ``a.b=value`` overrides."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import yaml

from pmlm.choices import Choice
from pmlm.errors import ConfigError


class YamlConfig:
    """``to_dict`` / ``from_dict`` / ``from_yaml`` for a tree of config dataclasses.

    Unknown keys, unreadable files and bad YAML are one-line ConfigErrors naming the file (and the
    line, for YAML syntax errors) and the dotted key.
    """

    def to_dict(self) -> dict:
        return to_plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, values: dict):
        """Build from nested dicts (YAML, a sidecar); unknown keys are an error that names them."""
        return build_dataclass(cls, values, "")

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] = ()):
        """Load ``path`` and apply ``key.sub=value`` overrides (values parsed as YAML scalars)."""
        path = Path(path)
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
        section = getattr(cls, "section", None)  # a config that may sit in a section of a larger file
        if section and isinstance(values, dict) and isinstance(values.get(section), dict):
            values = values[section]
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of settings at the top level")
        for item in overrides:
            apply_override(values, item)
        try:
            return cls.from_dict(values)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def apply_override(values: dict, item: str) -> None:
    """Set ``a.b.c=value`` inside nested dicts ``values`` (creating levels as needed)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. optim.lr=1e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    *parents, leaf = key.strip().split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part} is not a section")
    node[leaf] = value


def require(ok: bool, key: str, what: str, value) -> None:
    """The one-line ConfigError of every config check: ``key what, got value``."""
    if not ok:
        raise ConfigError(f"{key} {what}, got {value!r}")


def to_plain(value):
    """Tuples -> lists and choices -> their names, recursively, so the dict round-trips through JSON / YAML
    unchanged."""
    if isinstance(value, Choice):
        return value.value
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def build_dataclass(cls, values, prefix: str):
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    retired = sorted(set(values) & set(getattr(cls, "RETIRED", {})))
    if retired:
        raise ConfigError(f"{prefix}{retired[0]} {cls.RETIRED[retired[0]]}")
    unknown = sorted(set(values) - set(known))
    if unknown:
        names = ", ".join(prefix + k for k in unknown)
        raise ConfigError(f"unknown key(s) {names}; valid keys here: {', '.join(prefix + k for k in known)}")
    kwargs = {name: _coerce(values[name], hints[name], prefix + name) for name in known if name in values}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        # a wrong type that slipped past coercion, reported against the section rather than as a traceback
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {exc}") from None


def _coerce(value, hint, key: str):
    """Check ``value`` against a field's type; numbers written as YAML strings ('3e-4') are accepted."""
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, key + ".")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} is not a valid value")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if origin is tuple:
        items = typing.get_args(hint)
        if len(items) == 2 and items[1] is Ellipsis:  # tuple[X, ...]: a list of any length
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{key} must be a list, got {value!r}")
            return tuple(_coerce(v, items[0], f"{key}[{i}]") for i, v in enumerate(value))
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            raise ConfigError(f"{key} must be a list of {len(items)} values, got {value!r}")
        return tuple(_coerce(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(value, items)))
    if hint is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key} must be a mapping, got {value!r}")
    return value
