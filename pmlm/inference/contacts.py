"""``pmlm contacts``: a contact map per FASTA sequence, from a fine-tuned contact head or, without one, from the
pair head's unsupervised read-out.

* ``--head``: the head's contact probability, sigmoid of its (symmetrised) logit, for every pair.
* no head: the read-out of ``pmlm evaluate --head pair-kl``: KL(P(x_i) P(x_j) || P(x_i, x_j)) of the pair
  head's joint on the unmasked sequence, symmetrised, with average-product correction. A ranking score,
  not a probability (it can be negative after APC).

Sequences longer than the window are read as overlapping windows (``pmlm.tokens.window_starts``) and a
pair's value is the mean over the windows that hold both residues (``WindowMean``, per window after APC);
a pair no window holds (farther apart than about half a window) has no value: NaN in the NPZ, ``nan`` in
the TSV, ranked last.

Out folder (written under a temporary name, renamed at the end), per sequence ``NAME`` (its id, characters
other than letters, digits, ``._-`` replaced by ``_``): ``NAME.tsv`` with every pair i < j, 1-based, by
score (highest first): ``i j residue_i residue_j score`` (+ ``contact`` 1/0, empty where unresolved, with
``--structure``); ``NAME.npz`` with ``scores`` (L, L) float32, ``sequence``, ``id``, ``score_kind``, ``precision``
(the forward passes' arithmetic: the head's recorded one, or the encoder's without a head, unless asked
otherwise; ``pmlm.train.runtime.evaluation_precision``); with
``--png`` ``NAME.png``: the map, and with ``--structure`` the true contacts in the lower triangle against
the predicted top L pairs in the upper one.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import numpy as np
import torch

from pmlm.artefacts import recorded_precision
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.metrics import contact_precision
from pmlm.evaluation.pair_readout import unsupervised_contact_scores
from pmlm.figures import draw_contact_map, pyplot
from pmlm.files import atomic_output
from pmlm.inference.sequences import Sequence, read_fasta_sequences
from pmlm.pretrained import load_encoder, load_head, pick_device
from pmlm.progress import Progress
from pmlm.tasks.structures import CONTACT_ATOMS, CONTACT_THRESHOLD, read_structure_jsonl
from pmlm.tokens import WindowMean, batch_tokens, max_residues, window_starts
from pmlm.train.runtime import evaluation_precision
from pmlm.vocabulary import TASK_CONTACT

PROBABILITY, READOUT = "probability", "pair_kl_apc"
LONG_RANGE = 24  # |i - j| of the precision printed with --structure (the paper's long range, P@L/5)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


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
def readout_map(model, residues: np.ndarray, device: torch.device) -> np.ndarray:
    """(L, L) unsupervised contact scores of the pair head (APC per window), windows averaged."""
    room = max_residues(model.cfg.max_len)
    length = int(residues.size)
    mean = WindowMean(length, pairs=True)
    for start in window_starts(length, room):
        window = residues[start : start + room]
        mean.add(start, unsupervised_contact_scores(model, window, "kl", device=device))
    return mean.mean()


def file_names(records: list[Sequence], fasta: str) -> list[str]:
    names, seen = [], {}
    for r in records:
        name = _UNSAFE.sub("_", r.id)
        if name in seen:
            raise InputError(fasta, f"ids {seen[name]!r} and {r.id!r} give the same file name {name!r}", line=r.line)
        seen[name] = r.id
        names.append(name)
    return names


def true_contacts(path: str | None, records: list[Sequence]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{sequence id: (contacts, valid)} for the FASTA records found in a structure JSONL (by ``id_chain`` or
    ``id``, with the same sequence); C-beta, 8 A."""
    if path is None:
        return {}
    wanted = {r.id: r for r in records}
    found = {}
    for record in read_structure_jsonl(path):
        for key in (record.name, record.id):
            if key in wanted and key not in found:
                if record.seq != wanted[key].letters:
                    raise InputError(path, f"{record.name}: sequence differs from FASTA record {key!r}")
                found[key] = record.contacts(CONTACT_ATOMS["structure_jsonl"], CONTACT_THRESHOLD)
    return found


def write_tsv(path: str, record: Sequence, scores: np.ndarray, truth) -> None:
    i, j = np.triu_indices(len(record.letters), k=1)
    values = scores[i, j]
    order = np.lexsort((j, i, np.where(np.isnan(values), np.inf, -values)))  # highest first, NaN last
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(["i", "j", "residue_i", "residue_j", "score"] + (["contact"] if truth else []))
        for k in order:
            a, b = int(i[k]), int(j[k])
            row = [a + 1, b + 1, record.letters[a], record.letters[b], repr(float(values[k]))]
            if truth:
                contacts, valid = truth
                row.append(int(contacts[a, b]) if valid[a, b] else "")
            writer.writerow(row)


def plot_map(path: str, record: Sequence, scores: np.ndarray, truth, kind: str) -> None:
    plt = pyplot()  # matplotlib loads only with --png (the GPU image may lack it)
    length = len(record.letters)
    fig, ax = plt.subplots(figsize=(5, 5))
    contacts, valid = truth if truth is not None else (None, None)
    draw_contact_map(ax, scores, contacts, valid, min_sep=6, label=kind)
    if truth is None:
        ax.set_title(f"{record.id} (L = {length}): {kind}", fontsize=9)
    else:
        ax.set_title(f"{record.id} (L = {length}): predicted (upper) vs true (lower), |i-j| >= 6", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)  # inside the output folder's temp name (run)
    plt.close(fig)


def predict_contacts(
    model: str,
    fasta: str,
    out: str,
    *,
    head: str | None = None,
    structure: str | None = None,
    png: bool = False,
    device: str = "auto",
    precision: str = "auto",
) -> dict:
    """Contact maps of every sequence of ``fasta`` into the folder ``out`` (module docstring), from the contact
    ``head`` fine-tuned on encoder ``model``, or from ``model``'s pair head without one; ``precision`` as
    ``--precision``. Returns the number of sequences, the score kind, the precision used and how many had no
    structure in ``structure``."""
    dev = pick_device(device)
    if head is not None:
        fine_tuned = load_head(head, dev, encoder=model, task=TASK_CONTACT)
        task_model, kind = fine_tuned.model, PROBABILITY
        trained, recorded = "the head", recorded_precision(fine_tuned.info, fine_tuned.path)

        def compute(residues):
            return head_map(task_model, residues, dev)
    else:
        encoder, info, weights = load_encoder(model, dev)
        if encoder.pair_head is None:
            raise ConfigError(
                f"{weights}: this encoder has no pair head (objective {info['objective']['name']}); "
                "pass --head with a fine-tuned contact head"
            )
        kind = READOUT
        trained, recorded = "the encoder", recorded_precision(info, weights)

        def compute(residues):
            return readout_map(encoder, residues, dev)

    arithmetic = evaluation_precision(dev, recorded, precision, trained=trained, command="pmlm contacts")

    records = read_fasta_sequences(fasta)
    names = file_names(records, fasta)
    truth = true_contacts(structure, records)
    with (
        atomic_output(out, directory=True) as tmp,
        Progress("pmlm contacts", len(records), unit="sequences") as progress,
    ):
        for record, name in zip(records, names):
            with arithmetic.autocast():
                scores = compute(record.residues)
            known = truth.get(record.id)
            write_tsv(str(Path(tmp) / f"{name}.tsv"), record, scores, known)
            np.savez(
                Path(tmp) / f"{name}.npz",
                scores=scores.astype(np.float32),
                sequence=np.array(record.letters),
                id=np.array(record.id),
                score_kind=np.array(kind),
                precision=np.array(arithmetic.name),
            )
            if png:
                plot_map(str(Path(tmp) / f"{name}.png"), record, scores, known, kind)
            if known is not None:
                precision = contact_precision(
                    np.nan_to_num(scores, nan=-np.inf), *known, min_sep=LONG_RANGE, k_divisor=5
                )
                print(f"pmlm contacts: {record.id}: P@L/5 long range {precision:.3f}", file=sys.stderr)
            progress.advance()
    missing = sum(r.id not in truth for r in records) if structure else 0
    return {"sequences": len(records), "kind": kind, "precision": arithmetic.name, "without_structure": missing}
