"""Every figure's plumbing: a headless pyplot, and PNG + SVG written atomically (the KL histogram, the
co-evolution figure, contact maps of `pmlm contacts --png`, the report's figures)."""

from __future__ import annotations

from pathlib import Path

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
