"""Command-line plumbing of the report's steps: ``LABEL=PATH`` items (the figures themselves: ``pmlm.figures``)."""

from __future__ import annotations

from pmlm.errors import ConfigError


def labelled_paths(items: list[str], option: str, *, unique: bool = True) -> list[tuple[str, str]]:
    """``LABEL=PATH`` command-line items -> (label, path), in order; with ``unique`` a label may appear once
    (a run's curves), without it several paths may share one (the TSVs of one result table)."""
    out, seen = [], set()
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"{option} expects LABEL=PATH, got {item!r}")
        if unique and label in seen:
            raise ConfigError(f"{option} {label} given twice")
        seen.add(label)
        out.append((label, path))
    return out
