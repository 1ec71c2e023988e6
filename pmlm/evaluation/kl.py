"""``pmlm kl``: how far the pair head's joint P(x_i, x_j) departs from the product of the token
head's marginals, KL(P(x_i) P(x_j) || P(x_i, x_j)), on validation sequences (the paper's histogram).

For each sampled pair exactly the two positions i and j are masked (every other residue is
visible), so both distributions condition on the same context X_/{i,j}: the masked read-out of
``pmlm.evaluation.pair_readout``, one batch of sequence copies per sequence.

As in the paper's figure, every model is read on every validation set it is given (``--valid``; the
paper: PMLM-large on Pfam valid and on UR50 valid), one panel per set, side by side.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from pmlm import alphabet
from pmlm.artefacts import read_manifest as load_manifest
from pmlm.errors import ConfigError
from pmlm.evaluation.pair_readout import pair_dependence
from pmlm.figures import FORMATS, pyplot
from pmlm.outputs import prefix_targets, writing_files
from pmlm.pretrained import load_encoder
from pmlm.progress import Progress
from pmlm.tokens import max_residues as window_residues  # `max_residues` is kl's crop argument

KL_SUFFIXES = (*FORMATS, ".json")  # the histograms (pmlm.figures' forms), then the summary
SEPARATION_BINS = [(1, 6, "s < 6"), (6, 12, "6 <= s < 12"), (12, 24, "12 <= s < 24"), (24, None, "s >= 24")]


def read_shard_sequences(shards_dir: str | Path, split: str, limit: int, max_residues: int) -> list[np.ndarray]:
    """The first ``limit`` sequences of a split in manifest order (deterministic), cropped to ``max_residues``."""
    manifest = load_manifest(shards_dir)
    out: list[np.ndarray] = []
    for entry in manifest["splits"][split]["files"]:
        if len(out) >= limit:
            break
        table = pq.read_table(Path(shards_dir) / entry["path"], columns=["tokens"])
        for tokens in table.column("tokens").to_pylist():
            out.append(np.frombuffer(tokens, dtype=np.uint8)[:max_residues])
            if len(out) >= limit:
                break
    return out


def pair_kl(
    model, sequences: list[np.ndarray], pairs_per_sequence: int, seed: int, device: str = "cpu", progress=None
) -> dict:
    """KL and separation for sampled pairs (i < j, both standard residues) of each sequence;
    ``progress`` (a pmlm.progress.Progress) counts the sequences."""
    rng = np.random.default_rng(seed)
    kls, seps = [], []
    for residues in sequences:
        if progress is not None:
            progress.advance()
        standard = np.flatnonzero(alphabet.residue_class(residues) >= 0)
        if standard.size < 2:
            continue
        n_pairs = min(pairs_per_sequence, standard.size * (standard.size - 1) // 2)
        chosen: set[tuple[int, int]] = set()
        while len(chosen) < n_pairs:
            i, j = sorted(rng.choice(standard, size=2, replace=False).tolist())
            chosen.add((i, j))
        pairs = np.array(sorted(chosen), dtype=np.int64)  # (P, 2) residue indices
        with torch.inference_mode():
            out = pair_dependence(model, residues, pairs, mask_pairs=True, batch_pairs=len(pairs), device=device)
        kls.append(out["kl"].numpy())
        seps.append(pairs[:, 1] - pairs[:, 0])
    kl_all = np.concatenate(kls) if kls else np.zeros(0)
    sep_all = np.concatenate(seps) if seps else np.zeros(0, dtype=np.int64)
    return {"kl": kl_all, "separation": sep_all}


def summarise(kl: np.ndarray, sep: np.ndarray) -> dict:
    def stats(values):
        if values.size == 0:
            return {"pairs": 0}
        q = np.quantile(values, [0.1, 0.5, 0.9])
        return {
            "pairs": int(values.size),
            "mean": float(values.mean()),
            "p10": float(q[0]),
            "median": float(q[1]),
            "p90": float(q[2]),
            "max": float(values.max()),
        }

    out = {"all": stats(kl)}
    for lo, hi, label in SEPARATION_BINS:
        mask = (sep >= lo) & ((sep < hi) if hi is not None else True)
        out[label] = stats(kl[mask])
    return out


def plot_histogram(results: dict[str, dict[str, dict]], title: str):
    """The figure: one panel per validation set (``results[set][model]``), side by side, with one histogram per
    model on shared log-spaced KL bins and a shared y axis."""
    plt = pyplot()
    panels = list(results)
    fig, axes = plt.subplots(
        1, max(len(panels), 1), figsize=(6.4 * max(len(panels), 1), 4.0), sharey=True, squeeze=False
    )
    kls = [r["kl"] for models in results.values() for r in models.values() if r["kl"].size]
    all_kl = np.concatenate(kls) if kls else np.zeros(0)
    lo = max(float(all_kl[all_kl > 0].min()) if (all_kl > 0).any() else 1e-6, 1e-8)
    hi = max(float(all_kl.max()) if all_kl.size else 1.0, lo * 10)
    bins = np.logspace(np.log10(lo), np.log10(hi), 40)
    for ax, panel in zip(axes[0], panels):
        for name, r in results[panel].items():
            median = np.median(r["kl"]) if r["kl"].size else float("nan")
            ax.hist(
                np.clip(r["kl"], lo, None),
                bins=bins,
                histtype="step",
                linewidth=1.5,
                label=f"{name} (n={r['kl'].size}, median {median:.2e})",
            )
        ax.set_xscale("log")
        ax.set_xlabel(r"KL( P(x_i) P(x_j) || P(x_i, x_j) )  [nats]")
        ax.set_title(f"{panel} valid")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("masked pairs")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def kl_histograms(
    models: dict[str, str],
    valid: dict[str, str],
    shards: dict[str, str],
    out_prefix: str,
    *,
    split: str = "valid",
    sequences: int = 64,
    pairs: int = 16,
    max_residues: int = 254,
    seed: int = 0,
    overwrite: bool = False,
) -> dict[str, dict[str, dict]]:
    """Every model (label -> weights) read on every ``valid`` set (label -> shards folder), one panel each; a
    ``shards`` folder named after a model is that model's own ``validation`` panel. Writes PREFIX.png / .svg
    (the histograms) and PREFIX.json (the summary it returns: panel -> model -> statistics): prefix targets, checked
    before any model loads and appearing together (pmlm.outputs; ``overwrite`` as ``--overwrite``)."""
    targets = prefix_targets(out_prefix, KL_SUFFIXES, overwrite=overwrite)
    # (panel, model, shards): every model on every valid set, then each model's own shards
    readings = [(label, name, folder) for label, folder in valid.items() for name in models]
    readings += [("validation", name, folder) for name, folder in shards.items() if name in models]
    missing = sorted(set(models) - {name for _, name, _ in readings})
    if missing:
        raise ConfigError(
            f"no validation set for model(s) {', '.join(missing)}: give --valid LABEL=DIR or --shards NAME=DIR"
        )
    results: dict[str, dict[str, dict]] = {}
    summary: dict[str, dict[str, dict]] = {}
    for name, weights in models.items():
        model, info, _ = load_encoder(weights)
        if not model.cfg.pair_head:
            raise ConfigError(
                f"model {name!r} has no pair head (objective {info['objective']['name']}): KL needs a PMLM model"
            )
        max_res = min(max_residues, window_residues(model.cfg.max_len))
        for panel, _, folder in (r for r in readings if r[1] == name):
            seqs = read_shard_sequences(folder, split, sequences, max_res)
            with Progress(f"pmlm kl {name} on {panel}", len(seqs), unit="sequences") as progress:
                out = pair_kl(model, seqs, pairs, seed, progress=progress)
            results.setdefault(panel, {})[name] = out
            summary.setdefault(panel, {})[name] = {
                "weights": weights,
                "shards": folder,
                "sequences": len(seqs),
                **summarise(out["kl"], out["separation"]),
            }
    fig = plot_histogram(results, "Pair head vs independence on validation pairs")
    with writing_files(targets) as temps:
        for tmp, suffix in zip(temps, FORMATS):
            fig.savefig(tmp, format=suffix[1:], dpi=150)
        pyplot().close(fig)
        Path(temps[-1]).write_text(json.dumps(summary, indent=2) + "\n")
    return summary
