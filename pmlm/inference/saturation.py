"""``pmlm score --saturation``: every single substitution of every sequence of a FASTA file, scored as
log P(mut) - log P(wt) at its site (19 rows per residue); the marginals and the file are docs/cli.md's.

``masked`` uses the same rows, windows and read-out as ``pmlm score``'s singles (``pmlm.inference.mutations``), so a
site's 19 scores are the singles ``pmlm score`` gives them. ``wildtype`` reads each site from the window in which it
is most central (the first such window on a tie), so every value comes from one forward pass. Rows of all sequences
are batched together under a token budget and written sequence by sequence, so memory follows the budget, not the
FASTA's size. A site whose residue is X (unknown) has no wild-type class and gets no rows.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from pmlm import alphabet
from pmlm.artefacts import recorded_precision
from pmlm.choices import Precision
from pmlm.errors import ConfigError, InputError
from pmlm.files import file_digest
from pmlm.inference.embedding import plan_batches
from pmlm.inference.mutations import masked_rows, token_log_probs
from pmlm.inference.options import Marginal
from pmlm.inference.sequences import UNKNOWN_ERROR, UNKNOWN_OPTION, Sequence, SequenceReport, read_fasta_sequences
from pmlm.model.pmlm_model import PMLMModel
from pmlm.outputs import file_target, writing_files
from pmlm.pretrained import adapter_record, load_encoder, pick_device
from pmlm.progress import Progress
from pmlm.tokens import DEFAULT_TOKENS_PER_BATCH, RESIDUE_OFFSET, batch_tokens, max_residues, window_starts
from pmlm.train.runtime import autocast, evaluation_precision
from pmlm.version import __version__

SUFFIXES = (".parquet", ".tsv")
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("mutant", pa.string()),
        ("position", pa.int32()),
        ("wt", pa.string()),
        ("mut", pa.string()),
        ("score", pa.float32()),
    ]
)
# forward rows planned and batched together: enough batches that sorting by width pays, few enough that a
# chunk's results stay small in memory before they are written
CHUNK_BATCHES = 16
ROW_GROUP_ROWS = 1 << 17  # substitutions gathered into one Parquet row group (or one TSV write)
_LETTERS = np.array(list(alphabet.RESIDUES))


@dataclass(frozen=True)
class Row:
    """One forward row: a window of sequence ``seq`` and the sites it gives values for."""

    seq: int  # index of the sequence
    start: int  # first residue of the window
    length: int  # residues in the window
    sites: tuple[int, ...]  # masked: the one masked site; wildtype: the sites most central in this window


def _classes(residues: np.ndarray) -> np.ndarray:
    """(L,) residue class 0..19 of each site, -1 for X."""
    return alphabet.residue_class(residues)


def plan_rows(chunk: list[np.ndarray], room: int, marginal: Marginal) -> list[Row]:
    """The forward rows of the sequences of ``chunk`` (``Row.seq`` indexes the chunk; module docstring)."""
    rows = []
    for k, residues in enumerate(chunk):
        n = int(residues.size)
        known = np.flatnonzero(_classes(residues) >= 0)
        if marginal.masks:
            rows += [Row(k, 0, min(n, room), (int(p),)) for p in known]  # the window is masked_rows' to place
            continue
        starts = window_starts(n, room)
        centres = np.array([s + (min(room, n - s) - 1) / 2 for s in starts])
        owner = np.abs(known[:, None] - centres[None, :]).argmin(axis=1)  # the first on a tie
        owned = [tuple(int(p) for p in known[owner == w]) for w in range(len(starts))]
        rows += [Row(k, s, min(room, n - s), sites) for s, sites in zip(starts, owned) if sites]
    return rows


def _chunks(sequences: Iterable[np.ndarray], room: int, marginal: Marginal, tokens: int) -> Iterator[list[np.ndarray]]:
    """Consecutive runs of sequences, read as they come, whose forward rows hold about ``tokens`` tokens (one
    sequence at least)."""
    chunk, total = [], 0
    for residues in sequences:
        n = int(residues.size)
        rows = n if marginal.masks else len(window_starts(n, room))
        chunk.append(residues)
        total += rows * (min(n, room) + 2)
        if total >= tokens:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def _batch_inputs(batch: list[Row], sequences: list[np.ndarray], room: int, marginal: Marginal):
    """(B, T) token rows, and the (row, token position, sequence, site) of every value the batch gives."""
    if marginal.masks:
        tokens, positions = masked_rows([sequences[r.seq] for r in batch], room, [r.sites for r in batch])
        return tokens, torch.arange(len(batch)), positions[:, 0], [(r.seq, r.sites[0]) for r in batch]
    tokens = torch.from_numpy(
        batch_tokens([sequences[r.seq] for r in batch], [r.start for r in batch], max_residues=room).tokens
    )
    which = [(b, p - r.start + RESIDUE_OFFSET, r.seq, p) for b, r in enumerate(batch) for p in r.sites]
    return (
        tokens,
        torch.tensor([w[0] for w in which], dtype=torch.int64),
        torch.tensor([w[1] for w in which], dtype=torch.int64),
        [(w[2], w[3]) for w in which],
    )


@torch.no_grad()
def saturation_scores(
    model: PMLMModel,
    sequences: Iterable[np.ndarray],
    *,
    marginal: Marginal = Marginal.MASKED,
    tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
    device="cpu",
    autocast=nullcontext,
) -> Iterator[tuple[int, np.ndarray]]:
    """For each sequence (token ids, no specials; read from ``sequences`` a chunk at a time), in order: (its
    index, (L, 20) float32 log P(a) - log P(wt) at every site, classes in ``alphabet.RESIDUES`` order, 0 at the
    wild type, NaN rows at X), by ``marginal`` (module docstring); ``autocast`` makes a forward pass's precision
    context."""
    marginal = Marginal.parse(marginal, "--marginal")  # the Python API's
    if tokens_per_batch < 1:
        raise ConfigError(f"--tokens-per-batch must be >= 1, got {tokens_per_batch}")
    room = max_residues(model.cfg.max_len)
    done = 0
    for chunk in _chunks(sequences, room, marginal, CHUNK_BATCHES * tokens_per_batch):
        out = [np.full((s.size, alphabet.NUM_RESIDUES), np.nan, dtype=np.float32) for s in chunk]
        wild = [_classes(s) for s in chunk]
        for batch in plan_batches(plan_rows(chunk, room, marginal), tokens_per_batch):
            tokens, rows, positions, sites = _batch_inputs(batch, chunk, room, marginal)
            with autocast():
                reps = model.encode(tokens.to(device))  # (B, T, C)
                log_p = token_log_probs(model, reps, rows.to(device), positions.to(device))  # (N, 20)
            for values, (k, p) in zip(log_p.double().cpu().numpy(), sites):
                out[k][p] = values - values[wild[k][p]]
        yield from enumerate(out, start=done)
        done += len(chunk)


def substitution_table(seq_id: str, residues: np.ndarray, scores: np.ndarray) -> pa.Table:
    """The 19 substitutions of every known site of one sequence (module docstring's columns and order)."""
    wt = _classes(residues)
    keep = (wt[:, None] >= 0) & (np.arange(alphabet.NUM_RESIDUES)[None, :] != wt[:, None])  # (L, 20)
    sites, muts = np.nonzero(keep)  # row-major: by site, then mutant class
    wt_letters = pa.array(_LETTERS[wt[sites]])
    mut_letters = pa.array(_LETTERS[muts])
    positions = pa.array((sites + 1).astype(np.int32))
    mutant = pc.binary_join_element_wise(wt_letters, pc.cast(positions, pa.string()), mut_letters, "")
    return pa.table(
        [
            pa.array([seq_id] * len(sites), pa.string()),
            mutant,
            positions,
            wt_letters,
            mut_letters,
            pa.array(scores[sites, muts], pa.float32()),
        ],
        schema=SCHEMA,
    )


class _TsvWriter:
    def __init__(self, path: str):
        self.fh = open(path, "w", newline="")
        self.writer = csv.writer(self.fh, delimiter="\t", lineterminator="\n")
        self.writer.writerow(SCHEMA.names)

    def write_table(self, table: pa.Table) -> None:
        columns = table.to_pydict()  # the float32 scores come back as the Python floats they are exactly
        columns["score"] = [repr(v) for v in columns["score"]]
        self.writer.writerows(zip(*(columns[name] for name in SCHEMA.names)))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.fh.close()


def score_saturation(
    model: str,
    fasta: str,
    out: str,
    *,
    marginal: Marginal = Marginal.MASKED,
    tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
    device: str = "auto",
    precision: Precision = Precision.AUTO,
    unknown: str = UNKNOWN_ERROR,
    overwrite: bool = False,
    adapter: str | None = None,
) -> dict:
    """Every substitution of every sequence of ``fasta`` scored by encoder ``model`` into ``out`` (.parquet or
    .tsv), with ``adapter``'s adapters in it (``--adapter``); ``unknown`` as ``--unknown`` (pmlm.inference.sequences: a letter read as X gets no rows). Returns the
    counts (sequences, residues, rows), the marginal, the precision and the SequenceReport of what was read and
    repaired as ``report``."""
    target = file_target(out, suffixes=SUFFIXES, what="saturation scores", overwrite=overwrite)
    marginal = Marginal.parse(marginal, "--marginal")  # the Python API's
    if tokens_per_batch < 1:
        raise ConfigError(f"--tokens-per-batch must be >= 1, got {tokens_per_batch}")
    report = SequenceReport()
    # all checked before anything is computed
    records: list[Sequence] = read_fasta_sequences(fasta, unknown=unknown, report=report, repair_option=UNKNOWN_OPTION)
    if not records:
        left_out = f" ({UNKNOWN_OPTION} skip left out {report.skipped_sequences})" if report.skipped_sequences else ""
        raise InputError(fasta, f"no sequences{left_out}")
    dev = pick_device(device)
    encoder, info, weights = load_encoder(model, dev, adapter=adapter)
    arithmetic = evaluation_precision(
        dev, recorded_precision(info, weights), precision, trained="the encoder", command="pmlm score"
    )
    settings = {
        "model": str(weights),
        "model_sha256": file_digest(weights),
        **adapter_record(adapter),
        "objective": info["objective"]["name"],
        "window": max_residues(encoder.cfg.max_len),
        "marginal": marginal,
        "precision": arithmetic,
        "unknown": unknown,
        "pmlm_version": __version__,
    }
    rows = 0
    with (
        Progress("pmlm score", len(records), unit="sequences", rates=("residues",)) as progress,
        writing_files([target]) as (tmp,),
        (
            pq.ParquetWriter(tmp, SCHEMA.with_metadata({"pmlm": json.dumps(settings)}), compression="zstd")
            if Path(target).name.endswith(".parquet")
            else _TsvWriter(tmp)
        ) as writer,
    ):
        residues, pending = 0, []
        scores = saturation_scores(
            encoder,
            (r.residues for r in records),
            marginal=marginal,
            tokens_per_batch=tokens_per_batch,
            device=dev,
            autocast=autocast(arithmetic, dev),
        )
        for k, values in scores:
            pending.append(substitution_table(records[k].id, records[k].residues, values))
            rows += pending[-1].num_rows
            if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS or k == len(records) - 1:
                writer.write_table(pa.concat_tables(pending))
                pending = []
            residues += len(records[k].letters)
            progress.advance(1, residues=residues)
    return {
        "sequences": len(records),
        "residues": sum(len(r.letters) for r in records),
        "rows": rows,
        "marginal": marginal,
        "precision": arithmetic,
        "report": report,
    }
