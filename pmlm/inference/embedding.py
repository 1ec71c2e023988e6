"""``pmlm embed``: per-residue and per-sequence (mean over residues) embeddings of a FASTA file, as Parquet.

Layers, files and settings are docs/cli.md's (``pmlm embed``). A sequence longer than the window is read as
overlapping windows (``pmlm.tokens.window_starts``), each residue's embedding the mean over the windows that hold
it (``pmlm.tokens.WindowMean``); windows are batched by a token budget (rows x padded width <=
``--tokens-per-batch``), longest first within a chunk of the input, so padding stays small; rows come out in input
order. The FASTA is read twice, streamed (``pmlm.inference.sequences``): a first pass checks every record before the
model loads, the second computes a chunk at a time, so memory is set by the budget, not the number of sequences.
Both files are written under temporary names and renamed together at the end (``pmlm.outputs``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pmlm.artefacts import recorded_precision
from pmlm.choices import Precision
from pmlm.errors import ConfigError
from pmlm.files import file_digest
from pmlm.inference.sequences import UNKNOWN_ERROR, UNKNOWN_OPTION, Sequence, check_fasta, iter_fasta_sequences
from pmlm.model.layout import Layout
from pmlm.model.pmlm_model import PMLMModel
from pmlm.outputs import file_target, writing_files
from pmlm.pretrained import adapter_record, load_encoder, pick_device
from pmlm.progress import Progress
from pmlm.tokens import (
    DEFAULT_TOKENS_PER_BATCH,
    RESIDUE_OFFSET,
    WindowMean,
    batch_tokens,
    max_residues,
    padded_width,
    window_starts,
)
from pmlm.train.runtime import autocast, evaluation_precision
from pmlm.version import __version__

# windows planned and batched together: enough batches that sorting by length pays, few enough that the
# chunk's embeddings stay small in memory before they are written
CHUNK_BATCHES = 16
PER_SEQUENCE_SUFFIX = ".per_sequence.parquet"


@dataclass(frozen=True)
class Window:
    seq: int  # index of the sequence in its chunk
    start: int  # first residue
    length: int  # residues


class _Reached(Exception):
    """Raised by the forward hook once the requested layer has run: the layers above it are not needed."""

    def __init__(self, output: torch.Tensor):
        self.output = output


def layer_index(layer: int, num_layers: int) -> int:
    """``--layer`` (negative counts from the end) -> 0..num_layers."""
    if not -(num_layers + 1) <= layer <= num_layers:
        raise ConfigError(
            f"--layer must be in [{-(num_layers + 1)}, {num_layers}] for this {num_layers}-layer encoder, got {layer}"
        )
    return layer % (num_layers + 1)


def representations(model: PMLMModel, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """(B, T) token ids -> (B, T, C) representations after ``layer`` (0..num_layers, see the module docstring)."""
    encoder = model.encoder
    if layer == model.cfg.num_layers:
        return model.encode(tokens)
    module = encoder.dropout if layer == 0 else encoder.layers[layer - 1]

    def hook(_module, _inputs, output):
        raise _Reached(output)

    handle = module.register_forward_hook(hook)
    layout = encoder.attention
    encoder.attention = Layout.PADDED  # the packed layout would hand the hook (tokens, C) rows, not (B, T, C)
    try:
        model.encode(tokens)
    except _Reached as reached:
        return reached.output
    finally:
        handle.remove()
        encoder.attention = layout
    raise RuntimeError("the forward pass did not reach the requested layer")


def plan_windows(lengths: list[int], room: int) -> list[Window]:
    return [Window(k, start, min(room, n - start)) for k, n in enumerate(lengths) for start in window_starts(n, room)]


def plan_batches(windows: list[Window], tokens_per_batch: int) -> list[list[Window]]:
    """Longest first; a batch's rows x padded width stays within the budget (one row at least)."""
    batches: list[list[Window]] = []
    for w in sorted(windows, key=lambda w: -w.length):
        if batches and (len(batches[-1]) + 1) * padded_width(batches[-1][0].length) <= tokens_per_batch:
            batches[-1].append(w)
        else:
            batches.append([w])
    return batches


def batch_inputs(batch: list[Window], sequences: list[np.ndarray], room: int) -> torch.Tensor:
    """(B, T) int64 token rows of the batch's windows."""
    rows = batch_tokens([sequences[w.seq] for w in batch], [w.start for w in batch], max_residues=room)
    return torch.from_numpy(rows.tokens)


@torch.no_grad()
def embed_residues(
    model: PMLMModel,
    sequences: list[np.ndarray],
    *,
    layer: int,
    tokens_per_batch: int,
    device: torch.device,
    autocast=nullcontext,
    on_batch=None,
) -> list[np.ndarray]:
    """(L, C) float32 embeddings of each sequence (token ids, no specials), windows averaged; ``autocast`` makes a
    forward pass's precision context."""
    room = max_residues(model.cfg.max_len)
    lengths = [int(s.size) for s in sequences]
    windows = plan_windows(lengths, room)
    out: list[np.ndarray | None] = [None] * len(sequences)
    means = {k: WindowMean(n, (model.cfg.hidden,)) for k, n in enumerate(lengths) if n > room}
    for batch in plan_batches(windows, tokens_per_batch):
        with autocast():
            reps = representations(model, batch_inputs(batch, sequences, room).to(device), layer)
        reps = reps.float().cpu().numpy()  # (B, T, C)
        for row, w in enumerate(batch):
            values = reps[row, RESIDUE_OFFSET : RESIDUE_OFFSET + w.length]  # (n, C)
            if w.seq in means:
                means[w.seq].add(w.start, values)
            else:
                out[w.seq] = values
        if on_batch is not None:
            on_batch(batch)
    for k, mean in means.items():
        out[k] = mean.mean().astype(np.float32)
    return out


def _vectors(values: np.ndarray) -> pa.Array:
    """(N, C) float32 -> list<float32> array of N rows (offsets over the flat values, no per-row objects)."""
    n, c = values.shape
    offsets = pa.array(np.arange(0, (n + 1) * c, c, dtype=np.int32))  # chunks stay below 2**31 values
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(values, dtype=np.float32).reshape(-1)))


def residue_table(records: list[Sequence], embeddings: list[np.ndarray]) -> pa.Table:
    ids = np.repeat(np.array([r.id for r in records], dtype=object), [len(r.letters) for r in records])
    positions = np.concatenate([np.arange(1, len(r.letters) + 1, dtype=np.int32) for r in records])
    residues = [c for r in records for c in r.letters]
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "position": pa.array(positions, pa.int32()),
            "residue": pa.array(residues, pa.string()),
            "embedding": _vectors(np.concatenate(embeddings)),
        }
    )


def sequence_table(records: list[Sequence], embeddings: list[np.ndarray]) -> pa.Table:
    means = np.stack([e.mean(axis=0, dtype=np.float64) for e in embeddings]).astype(np.float32)
    return pa.table(
        {
            "id": pa.array([r.id for r in records], pa.string()),
            "length": pa.array([len(r.letters) for r in records], pa.int32()),
            "embedding": _vectors(means),
        }
    )


def schema(settings: dict) -> tuple[pa.Schema, pa.Schema]:
    meta = {b"pmlm": json.dumps(settings).encode()}
    vec = pa.field("embedding", pa.list_(pa.float32()))
    residues = pa.schema([("id", pa.string()), ("position", pa.int32()), ("residue", pa.string()), vec], metadata=meta)
    per_sequence = pa.schema([("id", pa.string()), ("length", pa.int32()), vec], metadata=meta)
    return residues, per_sequence


def chunks(records: Iterable[Sequence], residues_per_chunk: int) -> Iterator[list[Sequence]]:
    """Consecutive runs of records of about ``residues_per_chunk`` residues each, read from ``records`` as they come."""
    chunk: list[Sequence] = []
    total = 0
    for record in records:
        chunk.append(record)
        total += len(record.letters)
        if total >= residues_per_chunk:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def default_per_sequence(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name.removesuffix(".parquet") + PER_SEQUENCE_SUFFIX)


def write_embeddings(
    model: PMLMModel,
    records: Iterable[Sequence],
    count: int,
    out: Path,
    per_sequence: Path,
    *,
    layer: int,
    tokens_per_batch: int,
    device: torch.device,
    autocast,
    settings: dict,
) -> None:
    residue_schema, sequence_schema = schema(settings)
    """Embeddings of ``records`` (``count`` of them, for the progress line) into ``out`` and ``per_sequence``, both
    appearing together when every chunk is written (pmlm.outputs.writing_files)."""
    label = "pmlm embed"
    with (
        Progress(label, count, unit="sequences", rates=("residues",)) as progress,
        writing_files([out, per_sequence]) as (tmp_out, tmp_seq),
        pq.ParquetWriter(
            tmp_out,
            residue_schema,
            compression={"id": "zstd", "position": "zstd", "residue": "zstd", "embedding": "none"},
        ) as rw,
        pq.ParquetWriter(tmp_seq, sequence_schema, compression="zstd") as sw,
    ):
        done_residues = 0
        # int32 list offsets: a chunk holds fewer than 2**31 embedding values
        residues_per_chunk = max(1, min(CHUNK_BATCHES * tokens_per_batch, (2**31 - 1) // (2 * model.cfg.hidden)))
        for chunk in chunks(records, residues_per_chunk):
            embeddings = embed_residues(
                model,
                [r.residues for r in chunk],
                layer=layer,
                tokens_per_batch=tokens_per_batch,
                device=device,
                autocast=autocast,
            )
            rw.write_table(residue_table(chunk, embeddings).cast(residue_schema))
            sw.write_table(sequence_table(chunk, embeddings).cast(sequence_schema))
            done_residues += sum(len(r.letters) for r in chunk)
            progress.advance(len(chunk), residues=done_residues)


def embed_fasta(
    model: str,
    fasta: str,
    out: str,
    *,
    per_sequence: str | None = None,
    layer: int = -1,
    tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
    device: str = "auto",
    precision: Precision = Precision.AUTO,
    unknown: str = UNKNOWN_ERROR,
    overwrite: bool = False,
    adapter: str | None = None,
) -> dict:
    """Embeddings of every sequence of ``fasta`` by encoder ``model`` (file or folder): per residue into ``out``,
    per sequence into ``per_sequence`` (default: OUT with .per_sequence.parquet); ``layer`` as ``--layer``,
    ``precision`` as ``--precision``, ``unknown`` as ``--unknown`` (pmlm.inference.sequences), ``overwrite`` as
    ``--overwrite`` (pmlm.outputs), ``adapter`` as ``--adapter`` (pmlm.pretrained.with_adapter). Returns what was written (sequences, residues, layer, num_layers, per_sequence,
    precision, and the SequenceReport of what was read and repaired as ``report``)."""
    if tokens_per_batch < 1:
        raise ConfigError(f"--tokens-per-batch must be >= 1, got {tokens_per_batch}")
    out = file_target(out, suffixes=(".parquet",), overwrite=overwrite)
    per_sequence = file_target(
        per_sequence or default_per_sequence(out), suffixes=(".parquet",), option="--per-sequence", overwrite=overwrite
    )
    if per_sequence.resolve() == out.resolve():
        raise ConfigError("--per-sequence must differ from -o")
    # the first pass: every record checked before the model is loaded; only ids are kept
    report = check_fasta(fasta, unknown=unknown, repair_option=UNKNOWN_OPTION)
    dev = pick_device(device)
    encoder, info, weights = load_encoder(model, dev, adapter=adapter)
    arithmetic = evaluation_precision(
        dev, recorded_precision(info, weights), precision, trained="the encoder", command="pmlm embed"
    )
    layer = layer_index(layer, encoder.cfg.num_layers)
    settings = {
        "model": str(weights),
        "model_sha256": file_digest(weights),
        **adapter_record(adapter),
        "objective": info["objective"]["name"],
        "layer": layer,
        "num_layers": encoder.cfg.num_layers,
        "window": max_residues(encoder.cfg.max_len),
        "window_stride": max_residues(encoder.cfg.max_len) // 2,
        "precision": arithmetic,
        "unknown": unknown,
        "pmlm_version": __version__,
    }
    write_embeddings(
        encoder,
        iter_fasta_sequences(fasta, unknown=unknown, repair_option=UNKNOWN_OPTION),  # the second pass, streamed
        report.sequences,
        out,
        per_sequence,
        layer=layer,
        tokens_per_batch=tokens_per_batch,
        device=dev,
        autocast=autocast(arithmetic, dev),
        settings=settings,
    )
    return {
        "sequences": report.sequences,
        "residues": report.residues,
        "layer": layer,
        "num_layers": encoder.cfg.num_layers,
        "per_sequence": per_sequence,
        "precision": arithmetic,
        "report": report,
    }
