"""Every figure's plumbing: a headless pyplot, and PNG + SVG written atomically (the KL histogram, the
co-evolution figure, contact maps of `pmlm contacts --png`, the report's figures)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pmlm.files import atomic_output

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


def draw_contact_map(ax, scores, contacts=None, valid=None, *, min_sep: int = 6, label: str = "score") -> None:
    """One predicted-vs-true contact map on ``ax`` (every contact-map figure: ``pmlm contacts --png`` and the
    report's). Upper triangle: ``scores`` (L, L) shaded relative to their maximum (a small model's probabilities
    are small everywhere; NaN, a pair no window held, is blank). With the true ``contacts`` and ``valid``
    (L, L) bool: the lower triangle shows the true contacts, and the top-L pairs at separation >= ``min_sep``
    (the ones P@L counts) are marked as hits (blue) or misses (red)."""
    length = scores.shape[0]
    upper = np.triu(np.ones((length, length), dtype=bool), k=1)
    finite = upper & ~np.isnan(scores)
    top_score = float(scores[finite].max()) if finite.any() else 1.0
    shown = np.where(finite, scores / max(top_score, 1e-12), np.nan)
    ax.imshow(np.ma.masked_invalid(shown), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlim(-0.5, length - 0.5)
    ax.set_ylim(length - 0.5, -0.5)
    ax.set_xlabel("residue j", fontsize=7)
    ax.set_ylabel("residue i", fontsize=7)
    ax.tick_params(labelsize=7)
    if contacts is None:
        ax.text(0.02, 0.02, f"upper: {label} (max {top_score:.2g})", transform=ax.transAxes, fontsize=7)
        return
    truth = np.where(valid, contacts.astype(float), np.nan)
    ax.imshow(
        np.ma.masked_where(upper | np.isnan(truth), truth), cmap="Greys", vmin=0, vmax=1.4, interpolation="nearest"
    )
    separation = np.subtract.outer(np.arange(length), np.arange(length))
    i, j = np.nonzero(finite & valid & (separation <= -min_sep))
    top = np.argsort(-scores[i, j], kind="stable")[:length]
    hit = contacts[i[top], j[top]] > 0
    ax.scatter(j[top][hit], i[top][hit], s=6, c="tab:blue", marker="o", linewidths=0, label="top-L hit")
    ax.scatter(j[top][~hit], i[top][~hit], s=6, c="tab:red", marker="o", linewidths=0, label="top-L miss")
    ax.legend(loc="lower left", fontsize=7, markerscale=2)
