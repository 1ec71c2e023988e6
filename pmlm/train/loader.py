"""Streaming, resumable, token-budget batches of pre-training sequences from Parquet shards.

The stream for one rank is a pure function of (seed, epoch, rank, world size): row groups are
shuffled per epoch and dealt round-robin to ranks, consecutive row groups form shuffle buffers,
and each buffer is cropped, bucketed by length and cut into batches whose padded size fits the
token budget. A position (epoch, buffer, batch) therefore restores the stream exactly. Reads the layout
`pmlm tokenize` writes (``tokens`` as one byte per residue) and list<uint8> token columns.
"""

from __future__ import annotations

import itertools
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, PAD_ID, X_ID
from pmlm.artefacts import MANIFEST, read_manifest
from pmlm.errors import ConfigError, InputError
from pmlm.tokens import SPECIALS_PER_SEQUENCE, batch_tokens, crop_room, max_residues, padded_width, round_up

_STATE_VERSION = 1


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: the unit dealt to ranks and read from disk."""

    file: Path
    index: int  # row-group index inside the file
    rows: int


@dataclass
class Batch:
    """A padded batch: <cls> residues <eos> <pad>..., ready for the model."""

    tokens: torch.Tensor  # (B, L) int64
    epoch: int
    residues: int  # non-special, non-pad tokens in the batch


def split_row_groups(shards_dir: str | Path, split: str) -> list[RowGroup]:
    """Row groups of one split, checked against the manifest (files present, row counts agree)."""
    shards_dir = Path(shards_dir)
    path = shards_dir / MANIFEST
    splits = read_manifest(shards_dir)["splits"]
    if split not in splits:
        raise InputError(path, f"split {split!r} not in manifest (splits: {', '.join(sorted(splits)) or 'none'})")
    files = splits[split].get("files") if isinstance(splits[split], dict) else None
    if not isinstance(files, list) or not files:
        raise InputError(path, f"split {split!r} lists no files")

    groups: list[RowGroup] = []
    for entry in files:
        if not isinstance(entry, dict) or "path" not in entry:
            raise InputError(path, f"split {split!r}: file entry without a 'path': {entry!r}")
        file = shards_dir / entry["path"]
        if not file.is_file():
            raise InputError(path, f"split {split!r}: listed file {entry['path']} does not exist")
        try:
            meta = pq.ParquetFile(file).metadata
        except (pa.ArrowException, OSError) as exc:
            raise InputError(file, f"not a readable Parquet file: {exc}") from None
        if meta.num_rows != entry.get("rows", meta.num_rows):
            raise InputError(path, f"{entry['path']} has {meta.num_rows} rows, the manifest says {entry['rows']}")
        groups += [RowGroup(file, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    groups = [g for g in groups if g.rows > 0]  # empty row groups carry no sequences
    if not groups:
        raise InputError(path, f"split {split!r} has no rows")
    return groups


def _read_sequences(group: RowGroup) -> tuple[np.ndarray, np.ndarray]:
    """Flat residue ids (uint8) and row offsets (int64, rows + 1) of one row group, validated."""
    try:
        table = pq.ParquetFile(group.file).read_row_group(group.index, columns=["tokens", "length"])
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise InputError(group.file, f"row group {group.index}: cannot read columns tokens, length: {exc}") from None
    tokens = table.column("tokens").combine_chunks()
    if tokens.null_count:
        raise InputError(group.file, f"row group {group.index}: {tokens.null_count} null token value(s)")
    if pa.types.is_binary(tokens.type) or pa.types.is_large_binary(tokens.type):
        # `pmlm tokenize` layout: one byte per residue in a binary value; read the Arrow buffers directly
        _, offset_buf, data = tokens.buffers()
        width = np.int64 if pa.types.is_large_binary(tokens.type) else np.int32
        offsets = np.frombuffer(offset_buf, dtype=width)[tokens.offset : tokens.offset + len(tokens) + 1]
        flat = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    elif pa.types.is_list(tokens.type) and pa.types.is_uint8(tokens.type.value_type):
        offsets = tokens.offsets.to_numpy()
        flat = tokens.values.to_numpy(zero_copy_only=False)  # the child array, offsets index into it
    else:
        raise InputError(group.file, f"column tokens has type {tokens.type}; expected binary or list<uint8>")
    offsets = offsets.astype(np.int64)  # (rows + 1,) into flat
    values = flat[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0]
    lengths = table.column("length").to_numpy(zero_copy_only=False)
    mismatch = np.flatnonzero(np.diff(offsets) != lengths)
    if mismatch.size:
        row = int(mismatch[0])
        found = offsets[row + 1] - offsets[row]
        raise InputError(group.file, f"row group {group.index}, row {row}: length {lengths[row]} but {found} tokens")
    bad = np.flatnonzero((values < FIRST_RESIDUE_ID) | (values > X_ID))
    if bad.size:
        row = int(np.searchsorted(offsets, bad[0], side="right") - 1)
        raise InputError(group.file, f"row group {group.index}, row {row}: token id {values[bad[0]]} is not a residue")
    return values, offsets


class ShardStream:
    """An endless, resumable stream of token-budget batches for one rank.

    ``next_batch()`` returns the batch at the current position and advances it;
    ``state_dict()`` / ``load_state_dict()`` save and restore the position.
    ``epoch_batches(epoch)`` yields one whole epoch from its start (used for validation).
    """

    def __init__(
        self,
        shards_dir: str | Path,
        split: str,
        *,
        tokens_per_batch: int,
        max_len: int,
        buffer_rows: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        pad_to_multiple: int = 1,
        num_workers: int = 0,
    ):
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside world size {world_size}")
        if max_len <= SPECIALS_PER_SEQUENCE:
            raise ConfigError(f"data.max_len must exceed {SPECIALS_PER_SEQUENCE} (room for <cls>/<eos>), got {max_len}")
        if round_up(max_len, pad_to_multiple) > tokens_per_batch:
            raise ConfigError(
                f"a batch of {tokens_per_batch} tokens (tokens_per_step) must hold one sequence of max_len {max_len} "
                f"padded to a multiple of {pad_to_multiple}"
            )
        self.split = split
        self.groups = split_row_groups(shards_dir, split)
        if len(self.groups) < world_size:
            raise InputError(
                Path(shards_dir) / MANIFEST,
                f"split {split!r} has {len(self.groups)} row group(s) for {world_size} ranks; "
                "write smaller row groups or use fewer ranks",
            )
        self.tokens_per_batch = tokens_per_batch
        self.max_len = max_len
        self.buffer_rows = buffer_rows
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.pad_to_multiple = pad_to_multiple
        self.num_workers = num_workers
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="pmlm-loader") if num_workers > 0 else None
        # position of the next batch: the buffer's batches are cached once computed
        self.epoch = 0
        self.buffer = 0
        self.batch = 0
        self._plan: tuple[int, list[list[RowGroup]]] = (-1, [])
        self._cached: tuple[int, int, list[np.ndarray]] | None = None
        self._ahead: deque[tuple[int, int, Future]] = deque()

    # -- the deterministic plan ------------------------------------------------------------------

    def buffers_of_epoch(self, epoch: int) -> list[list[RowGroup]]:
        """This rank's row groups for ``epoch``, grouped into shuffle buffers (no I/O)."""
        # the permutation is global (same on every rank) so the round-robin deal is disjoint and covering
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.groups))
        mine = [self.groups[i] for i in order[self.rank :: self.world_size]]
        buffers: list[list[RowGroup]] = [[]]
        rows = 0
        for group in mine:
            if rows >= self.buffer_rows:
                buffers.append([])
                rows = 0
            buffers[-1].append(group)
            rows += group.rows
        return buffers

    def _buffers(self, epoch: int) -> list[list[RowGroup]]:
        plan = self._plan
        if plan[0] != epoch:
            # one tuple assignment, so reader threads never see an epoch paired with another's plan
            plan = (epoch, self.buffers_of_epoch(epoch))
            self._plan = plan
        return plan[1]

    def make_buffer_batches(self, epoch: int, buffer: int) -> list[np.ndarray]:
        """All batches (uint8 token ids, (B, L)) of one shuffle buffer, in the order the stream yields them."""
        rng = np.random.default_rng([self.seed, epoch, self.rank, self.world_size, buffer])
        values, offsets = [], []
        base = 0
        for group in self._buffers(epoch)[buffer]:
            v, o = _read_sequences(group)
            values.append(v)
            offsets.append(o[:-1] + base)
            base += len(v)
        values = np.concatenate(values)
        starts = np.concatenate(offsets)
        lengths = np.diff(np.append(starts, base))

        # random crop of long sequences to the residues that fit between <cls> and <eos>
        window = max_residues(self.max_len)
        starts = starts + rng.integers(0, crop_room(lengths, window))
        lengths = np.minimum(lengths, window)

        # bucket by length: shuffle first so equal lengths are in random order, then stable sort
        order = rng.permutation(len(lengths))
        order = order[np.argsort(lengths[order], kind="stable")]
        cuts = self._cut_by_budget(lengths[order])
        batches = [order[a:b] for a, b in itertools.pairwise(cuts)]
        # batch order shuffled, so a buffer does not run from short to long sequences
        shuffled = (batches[i] for i in rng.permutation(len(batches)))
        return [self._materialise(values, starts[idx], lengths[idx]) for idx in shuffled]

    def _cut_by_budget(self, sorted_lengths: np.ndarray) -> list[int]:
        """Boundaries of consecutive runs whose count * padded(longest) fits tokens_per_batch."""
        cuts = [0]
        for i, length in enumerate(sorted_lengths.tolist()):
            width = padded_width(length, self.pad_to_multiple)
            # lengths ascend, so the current sequence sets the batch's padded width
            if (i - cuts[-1] + 1) * width > self.tokens_per_batch:
                cuts.append(i)
        cuts.append(len(sorted_lengths))
        return cuts

    def _materialise(self, values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        # uint8 while buffered (8x smaller than the int64 the model takes); widened when handed out
        windows = [values[start : start + length] for start, length in zip(starts.tolist(), lengths.tolist())]
        return batch_tokens(windows, pad_to_multiple=self.pad_to_multiple, dtype=np.uint8).tokens  # (B, L)

    # -- iteration -------------------------------------------------------------------------------

    def _buffer_batches(self, epoch: int, buffer: int) -> list[np.ndarray]:
        if self._cached is not None and self._cached[:2] == (epoch, buffer):
            return self._cached[2]
        if self._pool is None:
            batches = self.make_buffer_batches(epoch, buffer)
        else:
            # discard read-ahead that does not match (after load_state_dict), then keep num_workers in flight
            while self._ahead and self._ahead[0][:2] != (epoch, buffer):
                self._ahead.popleft()[2].cancel()
            if not self._ahead:
                self._ahead.append((epoch, buffer, self._pool.submit(self.make_buffer_batches, epoch, buffer)))
            while len(self._ahead) < self.num_workers + 1:
                nxt = self._following(*self._ahead[-1][:2])
                self._ahead.append((*nxt, self._pool.submit(self.make_buffer_batches, *nxt)))
            batches = self._ahead.popleft()[2].result()
        self._cached = (epoch, buffer, batches)
        return batches

    def _following(self, epoch: int, buffer: int) -> tuple[int, int]:
        n = len(self._buffers(epoch))
        return (epoch, buffer + 1) if buffer + 1 < n else (epoch + 1, 0)

    def next_batch(self) -> Batch:
        """The batch at the current position; the position moves past it."""
        while True:
            buffers = self._buffers(self.epoch)
            if self.buffer >= len(buffers):
                self.epoch, self.buffer, self.batch = self.epoch + 1, 0, 0
                continue
            batches = self._buffer_batches(self.epoch, self.buffer)
            if self.batch >= len(batches):
                self.buffer, self.batch = self.buffer + 1, 0
                continue
            tokens = torch.from_numpy(batches[self.batch]).long()  # (B, L)
            epoch = self.epoch
            self.batch += 1
            return Batch(tokens=tokens, epoch=epoch, residues=count_residues(tokens))

    def epoch_batches(self, epoch: int = 0):
        """One epoch of this rank's batches from its start; does not move the stream position."""
        for buffer in range(len(self.buffers_of_epoch(epoch))):
            for array in self.make_buffer_batches(epoch, buffer):
                tokens = torch.from_numpy(array).long()  # (B, L)
                yield Batch(tokens=tokens, epoch=epoch, residues=count_residues(tokens))

    # -- resumption ------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Position of the next batch plus what the stream depends on (plain ints)."""
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "buffer": self.buffer,
            "batch": self.batch,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "row_groups": len(self.groups),
        }

    def load_state_dict(self, state: dict) -> None:
        expect = {"seed": self.seed, "world_size": self.world_size, "row_groups": len(self.groups), "rank": self.rank}
        changed = {k: (state.get(k), v) for k, v in expect.items() if state.get(k) != v}
        if changed:
            # the saved position indexes a different stream; the nearest honest restart is its epoch's start
            what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            print(
                f"pmlm: data stream changed ({what}); restarting epoch {state['epoch']} of {self.split}",
                file=sys.stderr,
            )
            self.epoch, self.buffer, self.batch = int(state["epoch"]), 0, 0
        else:
            self.epoch, self.buffer, self.batch = int(state["epoch"]), int(state["buffer"]), int(state["batch"])
        self._cached = None

    def close(self) -> None:
        if self._pool is not None:
            for *_, fut in self._ahead:
                fut.cancel()
            self._ahead.clear()
            self._pool.shutdown(wait=True)
            self._pool = None


def count_residues(tokens: torch.Tensor) -> int:
    return int(((tokens != PAD_ID) & (tokens != CLS_ID) & (tokens != EOS_ID)).sum())
