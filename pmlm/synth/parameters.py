"""A family's Potts model as a file: ``params/<family>.safetensors`` beside the edge list, written by
``pmlm synth`` and read back (tensors only: nothing in the file is executed or unpickled).

Tensors: ``fields`` (L, 20) float64, ``edges`` (E, 2) int64 (i < j), ``couplings`` (E, 20, 20) float64,
``triplets`` (T, 3) int64 (i < j < k) and ``triple_couplings`` (T, 20, 20, 20) float64 (T = 0 for a pairwise
family); residue classes in the order of ``pmlm.alphabet.RESIDUES``; metadata ``format`` = ``pmlm-potts/1``
and ``residues``. The model is ``pmlm.synth.potts.PottsModel``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from pmlm.alphabet import RESIDUES
from pmlm.errors import InputError
from pmlm.synth.potts import PottsModel

PARAMS_DIR = "params"
POTTS_FORMAT = "pmlm-potts/1"
TENSORS = ("fields", "edges", "couplings", "triplets", "triple_couplings")


def write_potts(path: str | os.PathLike, model: PottsModel) -> None:
    """Write ``model`` to ``path`` (the caller makes it atomic)."""
    tensors = {name: np.ascontiguousarray(getattr(model, name)) for name in TENSORS}
    tensors["edges"] = tensors["edges"].astype(np.int64).reshape(-1, 2)
    tensors["triplets"] = tensors["triplets"].astype(np.int64).reshape(-1, 3)
    save_file(tensors, str(path), metadata={"format": POTTS_FORMAT, "residues": RESIDUES})


def read_potts(path: str | os.PathLike) -> PottsModel:
    """The Potts model in ``path``; a damaged file, another format or inconsistent shapes are one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "no such file (written by pmlm synth into its params/ folder)")
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
            missing = [name for name in TENSORS if name not in handle.keys()]  # noqa: SIM118 (safe_open has no __contains__)
            if missing:
                raise InputError(path, f"missing tensor(s) {', '.join(missing)}")
            tensors = {name: handle.get_tensor(name) for name in TENSORS}
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(path, f"unreadable Potts parameters: {exc}") from None
    if metadata.get("format") != POTTS_FORMAT:
        raise InputError(path, f"format {metadata.get('format')!r}, expected {POTTS_FORMAT!r}")
    if metadata.get("residues") != RESIDUES:
        raise InputError(path, f"residue order {metadata.get('residues')!r}, expected {RESIDUES!r}")
    fields, edges, couplings = tensors["fields"], tensors["edges"], tensors["couplings"]
    triplets, triple = tensors["triplets"], tensors["triple_couplings"]
    q = len(RESIDUES)
    length = fields.shape[0] if fields.ndim == 2 else -1
    checks = (
        (fields.ndim == 2 and fields.shape[1] == q, f"fields must be (L, {q}), got {fields.shape}"),
        (edges.ndim == 2 and edges.shape[1] == 2, f"edges must be (E, 2), got {edges.shape}"),
        (couplings.shape == (len(edges), q, q), f"couplings must be ({len(edges)}, {q}, {q}), got {couplings.shape}"),
        (triplets.ndim == 2 and triplets.shape[1] == 3, f"triplets must be (T, 3), got {triplets.shape}"),
        (
            triple.shape == (len(triplets), q, q, q),
            f"triple_couplings must be ({len(triplets)}, {q}, {q}, {q}), got {triple.shape}",
        ),
    )
    for ok, message in checks:
        if not ok:
            raise InputError(path, message)
    for name, sites in (("edges", edges), ("triplets", triplets)):
        if len(sites) and not ((sites >= 0).all() and (sites < length).all() and (np.diff(sites, axis=1) > 0).all()):
            raise InputError(path, f"{name} need increasing positions in [0, {length})")
    if not all(np.isfinite(t).all() for t in (fields, couplings, triple)):
        raise InputError(path, "non-finite parameters")
    return PottsModel(
        fields=fields.astype(np.float64),
        edges=edges.astype(np.int64),
        couplings=couplings.astype(np.float64),
        triplets=triplets.astype(np.int64),
        triple_couplings=triple.astype(np.float64),
    )
