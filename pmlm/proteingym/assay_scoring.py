"""``pmlm proteingym score``: every mutant of one assay scored by one encoder, and the assay's metrics.

A mutant's score is its log-likelihood ratio against the wild type (``target_seq``), by the one rule ``pmlm score``
uses (``pmlm.inference.mutations.mutant_scores``), with ``additive`` beside every score so the joints can be
compared with additive scoring on the same mutants; the rule and the batched forward passes: docs/proteingym.md,
"How it works". Masked marginals need one masked site per row: masking several sites in one row would condition
each on the others' masks, so no fewer rows give the same scores.

Outputs: ``PREFIX.tsv`` (one row per kept mutant, in file order: ``mutant``, ``depth``, ``DMS_score``,
``DMS_score_bin``, ``score``, ``additive``, ``double_from``, ``triple_from``, ``multi_from``) and
``PREFIX.json`` (counts, skips, costs and the metrics of ``pmlm.evaluation.fitness`` per scorer and mutational
depth, a permutation p-value of the Spearman on all mutants, and the doubles' epistasis against the measured one
where both singles are in the assay).
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from pmlm import alphabet
from pmlm.data.ziparchive import ZipMembers
from pmlm.errors import ConfigError
from pmlm.evaluation.fitness import fitness_metrics, spearman, spearman_permutation_p
from pmlm.files import atomic_output
from pmlm.inference import mutations
from pmlm.inference.mutations import (
    ADDITIVE,
    PAIR_JOINT,
    SOURCE_COLUMN,
    DoubleScore,
    far_apart_notes,
    mutant_scores,
)
from pmlm.model.pmlm_model import PMLMModel
from pmlm.pretrained import load_encoder, pick_device
from pmlm.proteingym.assays import AssayMutant, read_assay
from pmlm.proteingym.reference import find_assay, read_selection
from pmlm.version import versions

SOURCES = tuple(SOURCE_COLUMN.values())  # double_from, triple_from, multi_from
SCORE_COLUMNS = ("mutant", "depth", "DMS_score", "DMS_score_bin", "score", "additive", *SOURCES)
# subsets of an assay's mutants by number of sites (ProteinGym's Depth_1, Depth_2, ...; 3+ pooled here)
SUBSETS = {"all": lambda d: d >= 1, "depth1": lambda d: d == 1, "depth2": lambda d: d == 2, "depth3+": lambda d: d >= 3}


def score_assay(
    model: PMLMModel,
    residues: np.ndarray,
    mutants: list[AssayMutant],
    *,
    double: DoubleScore = DoubleScore.AUTO,
    device="cpu",
    where: str = "assay",
) -> dict:
    """Per mutant (arrays in the order of ``mutants``): ``score``, ``additive``, ``depth``, ``double_from``,
    ``triple_from``, ``multi_from`` ('' where it does not apply); the mutants scored additively because their
    sites do not fit one window (``far_apart``, and ``notes`` saying so); and the cost: forward rows and passes,
    seconds. ``where`` names the assay file in errors."""
    double = DoubleScore.parse(double, "--double")  # the Python API's
    if model.pair_head is None and double.joint(has_pair=False, fits=True):
        raise ConfigError("--double pair needs an encoder with a pair head (PMLM); this one has none (MLM)")
    start = time.perf_counter()
    scored = mutant_scores(model, residues, mutants, double=double, device=device, path=where)
    seconds = time.perf_counter() - start
    rows = scored.rows
    return {
        "score": np.array([r["score"] for r in rows], dtype=np.float64),
        "additive": np.array([r["additive"] for r in rows], dtype=np.float64),
        "depth": np.array([len(m.sites) for m in mutants], dtype=np.int64),
        **{column: [r[column] or "" for r in rows] for column in SOURCES},
        "use_pair": double.joint(has_pair=model.pair_head is not None, fits=True),
        "far_apart": dict(scored.far_apart),
        "notes": far_apart_notes(scored),
        "forward_rows": scored.forward_rows,
        "forward_passes": sum(-(-n // mutations.ROWS_PER_PASS) for n in scored.forward_rows.values()),
        "seconds": seconds,
    }


def _finite(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def assay_metrics(mutants: list[AssayMutant], scored: dict, *, permutations: int, seed: int) -> dict:
    """{scorer: {subset: {spearman, auc, mcc, ndcg, n}}} for the encoder's scores (``pair_joint``, when it scores
    doubles from the pair head) and the additive scores; on all mutants also ``spearman_p``, a permutation p-value
    (every scorer tested on the same shuffles)."""
    dms = np.array([m.dms_score for m in mutants])
    labels = np.array([m.dms_bin for m in mutants], dtype=np.float64)
    scorers = (
        {PAIR_JOINT: scored["score"], ADDITIVE: scored["additive"]}
        if scored["use_pair"]
        else {ADDITIVE: scored["additive"]}
    )
    out = {name: {} for name in scorers}
    for subset, keep in SUBSETS.items():
        mask = keep(scored["depth"])
        for name, values in scorers.items():
            entry = {"n": int(mask.sum())}
            if entry["n"]:
                entry.update({k: _finite(v) for k, v in fitness_metrics(dms[mask], labels[mask], values[mask]).items()})
            out[name][subset] = entry
    if permutations and len(mutants) >= 2:
        p = spearman_permutation_p(dms, np.stack(list(scorers.values()), axis=1), permutations, seed)
        for name, value in zip(scorers, p):
            out[name]["all"]["spearman_p"] = float(value)
    return out


def epistasis_summary(mutants: list[AssayMutant], scored: dict) -> dict:
    """Doubles whose two singles are measured too: Spearman of the predicted epistasis (score - additive) with
    the measured one (DMS(double) - DMS(single 1) - DMS(single 2)); None without the pair joint or such doubles."""
    single = {(m.sites[0].pos, m.sites[0].mut): m.dms_score for m in mutants if len(m.sites) == 1}
    measured, predicted = [], []
    for k, m in enumerate(mutants):
        if scored["double_from"][k] != PAIR_JOINT:
            continue
        parts = [single.get((s.pos, s.mut)) for s in m.sites]
        if None not in parts:
            measured.append(m.dms_score - sum(parts))
            predicted.append(scored["score"][k] - scored["additive"][k])
    rho = spearman(measured, predicted) if len(measured) >= 2 else float("nan")
    return {"n": len(measured), "spearman": _finite(rho)}


def write_scores(path, mutants: list[AssayMutant], scored: dict) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(SCORE_COLUMNS)
        for k, m in enumerate(mutants):
            writer.writerow(
                [
                    m.text,
                    int(scored["depth"][k]),
                    repr(m.dms_score),
                    m.dms_bin,
                    repr(float(scored["score"][k])),
                    repr(float(scored["additive"][k])),
                    *(scored[column][k] for column in SOURCES),
                ]
            )


def write_summary(path, summary: dict) -> None:
    with atomic_output(path) as tmp, open(tmp, "w") as fh:
        json.dump(summary, fh, indent=1, sort_keys=True, allow_nan=False)
        fh.write("\n")


def score(
    model: str | Path,
    archive: str | Path,
    assays: str | Path,
    assay_id: str,
    out_prefix: str | Path,
    *,
    double: str = "auto",
    mismatch: str = "skip",
    permutations: int = 1000,
    seed: int = 0,
    label: str | None = None,
    device: str = "auto",
) -> dict:
    """Score every mutant of assay ``assay_id`` (of the selection ``assays``, in the zip ``archive``) with the encoder
    ``model``: writes PREFIX.tsv (per mutant) and PREFIX.json (the summary, returned)."""
    device = pick_device(device)
    assay = find_assay(read_selection(assays), assay_id, assays)
    with ZipMembers(archive) as members:
        where = members.where(assay.filename)
        with members.open_text(assay.filename) as fh:
            read = read_assay(fh, where, assay.target_seq, mismatch=mismatch)
    if read.skipped:
        skipped = ", ".join(
            f"{reason} {n} (first at {read.first_skipped[reason]})" for reason, n in sorted(read.skipped.items())
        )
        print(
            f"pmlm proteingym score: {where}: skipped {sum(read.skipped.values())} of {read.rows} mutants: {skipped}",
            file=sys.stderr,
        )
    encoder, _, weights = load_encoder(model, device)
    scored = score_assay(
        encoder, alphabet.encode(assay.target_seq), read.mutants, double=double, device=device, where=where
    )
    for note in scored["notes"]:
        print(f"pmlm proteingym score: {where}: {note}", file=sys.stderr)
    depths = Counter(int(d) for d in scored["depth"])
    summary = {
        "assay": assay.row(),
        "encoder": {
            "label": label or str(weights),
            "weights": str(weights),
            "bytes": weights.stat().st_size,
            "max_len": encoder.cfg.max_len,
            "pair_head": encoder.pair_head is not None,
            "triple_head": getattr(encoder, "triple_head", None) is not None,
        },
        "double": double,
        "counts": {
            "rows": read.rows,
            "scored": len(read.mutants),
            "skipped": dict(read.skipped),
            "first_skipped": read.first_skipped,
            "depth": {str(d): n for d, n in sorted(depths.items())},
            "doubles_from": dict(Counter(f for f in scored["double_from"] if f)),
            "triples_from": dict(Counter(f for f in scored["triple_from"] if f)),
            "multi_from": dict(Counter(f for f in scored["multi_from"] if f)),
            "far_apart": scored["far_apart"],
        },
        "cost": {
            "forward_rows": scored["forward_rows"],
            "forward_passes": scored["forward_passes"],
            "rows_per_pass": mutations.ROWS_PER_PASS,
            "seconds": round(scored["seconds"], 3),
            "mutants_per_s": round(len(read.mutants) / max(scored["seconds"], 1e-9), 2),
            "device": str(device),
        },
        "metrics": assay_metrics(read.mutants, scored, permutations=permutations, seed=seed),
        "permutations": permutations,
        "epistasis": epistasis_summary(read.mutants, scored),
        "versions": versions(),
    }
    prefix = str(out_prefix)
    write_scores(prefix + ".tsv", read.mutants, scored)
    write_summary(prefix + ".json", summary)
    return summary
