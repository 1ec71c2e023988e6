"""Shared plumbing of the report's figures: a headless pyplot and PNG + SVG written atomically."""

from __future__ import annotations

from pathlib import Path

from pmlm.errors import ConfigError
from pmlm.utils import atomic_output

FORMATS = (".png", ".svg")


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on a cluster node or in CI)."""
    # imported here: matplotlib is optional where only training runs (the GPU image), and the
    # backend must be chosen before pyplot is imported
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, prefix: str | Path, dpi: int = 130) -> list[Path]:
    """Write ``prefix``.png and .svg (each to a temp name, renamed when complete); closes the figure."""
    paths = []
    for ext in FORMATS:
        path = Path(str(prefix) + ext)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp:
            fig.savefig(tmp, format=ext[1:], dpi=dpi)
        paths.append(path)
    pyplot().close(fig)
    return paths


def labelled_paths(items: list[str], option: str) -> list[tuple[str, str]]:
    """``LABEL=PATH`` command-line items -> (label, path); labels unique."""
    out, seen = [], set()
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"{option} expects LABEL=PATH, got {item!r}")
        if label in seen:
            raise ConfigError(f"{option} {label} given twice")
        seen.add(label)
        out.append((label, path))
    return out
