"""``pmlm contacts``: the contact pairs of every FASTA sequence, from a fine-tuned contact head or, without one,
from an unsupervised read-out of the encoder (``pmlm.evaluation.pair_readout``, ``pmlm.evaluation.jacobian``).

The scores, the windows, the rows and the output files (``-o DIR`` per sequence or ``-o NAME.parquet``) are
docs/contacts.md's. A pair no window holds (farther apart than about half a window) has no value: NaN in the NPZ,
no row in the tables (the summary counts them).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import numpy as np
import torch

from pmlm.artefacts import recorded_precision
from pmlm.choices import Precision
from pmlm.errors import ConfigError
from pmlm.evaluation.jacobian import jacobian_contact_scores
from pmlm.evaluation.metrics import contact_precision
from pmlm.evaluation.pair_readout import unsupervised_contact_scores
from pmlm.files import file_digest
from pmlm.inference.contact_tables import ContactWriter, Pairs, file_names, true_contacts
from pmlm.inference.options import Readout
from pmlm.inference.sequences import UNKNOWN_ERROR, UNKNOWN_OPTION, SequenceReport, read_fasta_sequences
from pmlm.pretrained import adapter_record, load_encoder, load_head, pick_device
from pmlm.progress import Progress
from pmlm.tokens import DEFAULT_TOKENS_PER_BATCH, WindowMean, batch_tokens, max_residues, padded_width, window_starts
from pmlm.train.runtime import autocast, evaluation_precision
from pmlm.version import __version__
from pmlm.vocabulary import TASK_CONTACT

PROBABILITY = "probability"  # the score kind of a contact head's maps


# what an encoder without the head a read-out reads is told
MISSING_HEAD = {
    Readout.PAIR: "this encoder has no pair head; --readout jacobian (or auto) reads its token head, --head a "
    "fine-tuned contact head",
    Readout.JACOBIAN: "this encoder has no token head for the categorical Jacobian; --readout pair",
}
# one window's (n, n) APC-corrected scores by read-out; the Jacobian's substituted copies go ``tokens`` at a time
WINDOW_SCORES = {
    Readout.PAIR: lambda model, window, device, tokens: unsupervised_contact_scores(model, window, "kl", device=device),
    Readout.JACOBIAN: lambda model, window, device, tokens: jacobian_contact_scores(
        model, window, rows_per_batch=max(1, tokens // padded_width(len(window))), device=device
    ),
}

MIN_SEPARATION = 6  # the field's short range starts here (short 6-11, medium 12-23, long >= 24)
LONG_RANGE = 24  # |i - j| of the precision printed with --structure (the paper's long range)
_TOP = re.compile(r"L(?:/([1-9][0-9]*))?|([1-9][0-9]*)")


def top_count(top: str | None, length: int) -> int | None:
    """Rows ``--top`` keeps of a sequence of ``length`` residues: ``L``, ``L/K`` (floor(L / K)), ``N``; None: all."""
    if top is None:
        return None
    match = _TOP.fullmatch(top.strip())
    if match is None:
        raise ConfigError(f"--top {top!r}: expected L, L/K or a number of pairs N (K and N positive integers)")
    divisor, count = match.groups()
    if count is not None:
        return int(count)
    return length // int(divisor or 1)


def choose_readout(encoder, readout: Readout, where) -> Readout:
    """``readout`` on ``encoder``, auto resolved (its pair head's, else its token head's); a one-line error where
    the encoder lacks the head it reads."""
    if readout is Readout.AUTO:
        readout = Readout.PAIR if encoder.pair_head is not None else Readout.JACOBIAN
    if readout.head(encoder) is None:
        raise ConfigError(f"{where}: {MISSING_HEAD[readout]}")
    return readout


@torch.no_grad()
def head_map(task_model, residues: np.ndarray, device: torch.device) -> np.ndarray:
    """(L, L) contact probabilities of a contact TaskModel, windows averaged."""
    room = max_residues(task_model.encoder.cfg.max_len)
    length = int(residues.size)
    mean = WindowMean(length, pairs=True)
    for start in window_starts(length, room):
        rows = batch_tokens([residues], [start], max_residues=room)
        n = int(rows.lengths[0])
        mask = torch.ones(1, n, dtype=torch.bool, device=device)
        logits = task_model(torch.from_numpy(rows.tokens).to(device), mask)[0]  # (n, n)
        mean.add(start, torch.sigmoid(logits.float()).double().cpu().numpy())
    return mean.mean()


@torch.no_grad()
def readout_map(
    model,
    residues: np.ndarray,
    device: torch.device,
    readout: Readout = Readout.PAIR,
    tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
) -> np.ndarray:
    """(L, L) unsupervised contact scores of ``readout`` (pair or jacobian: ``WINDOW_SCORES``), windows averaged."""
    room = max_residues(model.cfg.max_len)
    length = int(residues.size)
    mean = WindowMean(length, pairs=True)
    for start in window_starts(length, room):
        mean.add(start, WINDOW_SCORES[readout](model, residues[start : start + room], device, tokens_per_batch))
    return mean.mean()


def ranked_pairs(scores: np.ndarray, min_separation: int, top: str | None) -> Pairs:
    """The rows of one map (module docstring): pairs j - i >= ``min_separation`` that a window holds, highest score
    first (float32, ties by i then j), the first ``top``; with the count of pairs left out as beyond the windows."""
    length = scores.shape[0]
    i, j = np.triu_indices(length, k=min_separation)
    values = scores[i, j].astype(np.float32)
    held = ~np.isnan(values)
    i, j, values = i[held], j[held], values[held]
    order = np.lexsort((j, i, -values))[: top_count(top, length)]
    return Pairs(i=i[order], j=j[order], score=values[order], beyond_windows=int((~held).sum()))


def _mean(values: list[float]) -> float | None:
    """The mean of the defined values (a chain shorter than K residues has no P@L/K), None if there are none."""
    defined = [v for v in values if not np.isnan(v)]
    return float(np.mean(defined)) if defined else None


@dataclass
class Model:
    """What computes a map: the function, its score kind, and the settings it records."""

    compute: object
    kind: str
    autocast: object
    settings: dict


def _model(model, head, readout, device, precision, tokens_per_batch, adapter=None) -> Model:
    """Loads the head (with its encoder) or the encoder (with ``adapter``'s adapters), and picks the read-out and
    the arithmetic."""
    if head is not None:
        if readout is not Readout.AUTO:
            raise ConfigError(f"--readout {readout} reads the encoder without a head; drop --head or --readout")
        if adapter is not None:
            raise ConfigError("--head brings its own run's adapters (if it has any); drop --adapter")
        fine_tuned = load_head(head, device, encoder=model, task=TASK_CONTACT)
        kind, trained, recorded = PROBABILITY, "the head", recorded_precision(fine_tuned.info, fine_tuned.path)
        weights, encoder = fine_tuned.encoder_path, fine_tuned.model.encoder
        extra = {"head": str(fine_tuned.path), "head_sha256": file_digest(fine_tuned.path)}

        def compute(residues):
            return head_map(fine_tuned.model, residues, device)
    else:
        encoder, info, weights = load_encoder(model, device, adapter=adapter)
        chosen = choose_readout(encoder, readout, weights)
        kind = chosen.score_kind
        trained, recorded, extra = "the encoder", recorded_precision(info, weights), adapter_record(adapter)

        def compute(residues):
            return readout_map(encoder, residues, device, chosen, tokens_per_batch)

    arithmetic = evaluation_precision(device, recorded, precision, trained=trained, command="pmlm contacts")
    settings = {"model": str(weights), "model_sha256": file_digest(weights), **extra, "score_kind": kind}
    settings |= {"window": max_residues(encoder.cfg.max_len), "precision": arithmetic}
    return Model(compute, kind, autocast(arithmetic, device), settings)


def predict_contacts(
    model: str,
    fasta: str,
    out: str,
    *,
    head: str | None = None,
    readout: Readout = Readout.AUTO,
    structure: str | None = None,
    png: bool = False,
    device: str = "auto",
    precision: Precision = Precision.AUTO,
    min_separation: int = MIN_SEPARATION,
    top: str | None = None,
    tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
    unknown: str = UNKNOWN_ERROR,
    overwrite: bool = False,
    adapter: str | None = None,
) -> dict:
    """The contact pairs of every sequence of ``fasta`` into ``out`` (a folder, or a ``.parquet`` table; module
    docstring), from the contact ``head`` fine-tuned on encoder ``model``, or from ``model``'s ``readout`` without
    one (with ``adapter``'s adapters in it, ``--adapter``); ``precision`` as ``--precision``, ``unknown`` as ``--unknown`` (pmlm.inference.sequences). The target is
    checked before anything is read. Returns the counts of sequences, rows, pairs beyond the windows and sequences
    without a structure, the score kind, the precision, the mean long-range P@L and P@L/5 over the sequences with a
    structure (None without), and the SequenceReport of what was read and repaired as ``report``."""
    writer = ContactWriter(out, overwrite=overwrite, png=png, structure=structure is not None)
    top_count(top, 1)  # the form of --top, checked before any work
    if min_separation < 1:
        raise ConfigError(f"--min-separation {min_separation}: must be at least 1 (pairs j - i >= S)")
    if tokens_per_batch < 1:
        raise ConfigError(f"--tokens-per-batch {tokens_per_batch}: must be positive")
    report = SequenceReport()
    records = read_fasta_sequences(fasta, unknown=unknown, report=report, repair_option=UNKNOWN_OPTION)
    names = file_names(records, fasta) if writer.folder else None
    truth = true_contacts(structure, records)
    dev = pick_device(device)
    used = _model(model, head, readout, dev, precision, tokens_per_batch, adapter)
    settings = used.settings | {"min_separation": min_separation, "top": top, "unknown": unknown}
    settings["pmlm_version"] = __version__
    rows = beyond = 0
    precisions = []
    with writer.open(settings) as write, Progress("pmlm contacts", len(records), unit="sequences") as progress:
        for k, record in enumerate(records):
            with used.autocast():
                scores = used.compute(record.residues)
            pairs = ranked_pairs(scores, min_separation, top)
            known = truth.get(record.id)
            write(record, None if names is None else names[k], scores, pairs, known)
            rows, beyond = rows + len(pairs.i), beyond + pairs.beyond_windows
            if known is not None:
                ranked = np.nan_to_num(scores, nan=-np.inf)
                at = [contact_precision(ranked, *known, min_sep=LONG_RANGE, k_divisor=d) for d in (1, 5)]
                precisions.append(at)
                print(
                    f"pmlm contacts: {record.id}: long range (|i-j| >= {LONG_RANGE}) P@L {at[0]:.3f}, P@L/5 {at[1]:.3f}",
                    file=sys.stderr,
                )
            progress.advance()
    means = [_mean([at[k] for at in precisions]) for k in (0, 1)]
    return {
        "sequences": len(records),
        "rows": rows,
        "beyond_windows": beyond,
        "kind": used.kind,
        "precision": used.settings["precision"],
        "without_structure": sum(r.id not in truth for r in records) if structure else 0,
        "with_structure": len(precisions),
        "p_at_l": means[0],
        "p_at_l5": means[1],
        "report": report,
    }
