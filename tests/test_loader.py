"""The shard stream: determinism, rank sharding, token budget, padding, resumable position, bad input."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import make_sequences, write_shards

from pmlm.alphabet import CLS_ID, EOS_ID, PAD_ID, decode
from pmlm.errors import ConfigError, InputError
from pmlm.train.loader import ShardStream


def _stream(shards, **kw) -> ShardStream:
    args = {"tokens_per_batch": 256, "max_len": 40, "buffer_rows": 48, "seed": 7}
    args.update(kw)
    return ShardStream(shards, "train", **args)


def _residues(tokens: torch.Tensor) -> list[tuple[int, ...]]:
    """The residue content of each row (between <cls> and <eos>)."""
    rows = []
    for row in tokens.tolist():
        end = row.index(EOS_ID)
        rows.append(tuple(row[1:end]))
    return rows


def _take(stream: ShardStream, n: int) -> list[torch.Tensor]:
    return [stream.next_batch().tokens for _ in range(n)]


def test_batches_are_well_formed_and_within_budget(shard_dir):
    stream = _stream(shard_dir, pad_to_multiple=8)
    for batch in stream.epoch_batches(0):
        t = batch.tokens
        assert t.dtype == torch.int64 and t.dim() == 2
        assert t.numel() <= 256 and t.shape[1] <= 40 and t.shape[1] % 8 == 0
        assert (t[:, 0] == CLS_ID).all()
        for row in t.tolist():
            end = row.index(EOS_ID)
            assert all(x == PAD_ID for x in row[end + 1 :])
            assert all(4 <= x <= 24 for x in row[1:end])
        assert batch.residues == int((t > EOS_ID).sum())


def test_epoch_covers_every_sequence_once_and_crops_long_ones(tmp_path):
    seqs = make_sequences(100, seed=3, min_len=5, max_len=90)
    shards = write_shards(tmp_path / "s", {"train": seqs})
    stream = _stream(shards, max_len=40)
    seen = [r for b in stream.epoch_batches(0) for r in _residues(b.tokens)]
    assert len(seen) == len(seqs)
    originals = [tuple(s.tolist()) for s in seqs]
    short = sorted(o for o in originals if len(o) <= 38)
    assert sorted(r for r in seen if len(r) < 38) == sorted(o for o in short if len(o) < 38)
    # every cropped row is a contiguous window of some long original
    long_ones = [o for o in originals if len(o) >= 38]
    cropped = [r for r in seen if len(r) == 38]
    starts = set()
    for r in cropped:
        hits = [(o, i) for o in long_ones for i in range(len(o) - 37) if o[i : i + 38] == r]
        assert hits, "a cropped row is not a window of any input sequence"
        starts.add(hits[0][1])
    assert len(starts) > 1, "crops should start at random offsets"


def test_stream_is_deterministic_for_a_seed_and_differs_across_seeds_and_epochs(shard_dir):
    a = _take(_stream(shard_dir), 30)
    b = _take(_stream(shard_dir), 30)
    c = _take(_stream(shard_dir, seed=8), 30)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, c))
    e0 = [b.tokens for b in _stream(shard_dir).epoch_batches(0)]
    e1 = [b.tokens for b in _stream(shard_dir).epoch_batches(1)]
    assert sorted(map(tuple, (r for t in e0 for r in _residues(t)))) != [r for t in e1 for r in _residues(t)]


def test_worker_threads_give_the_same_stream(shard_dir):
    plain = _take(_stream(shard_dir), 40)
    threaded = _stream(shard_dir, num_workers=2)
    try:
        assert all(torch.equal(x, y) for x, y in zip(plain, _take(threaded, 40)))
    finally:
        threaded.close()


@pytest.mark.parametrize("world", [2, 3])
def test_rank_shards_are_disjoint_and_cover_the_epoch(tmp_path, world):
    # unique sequences shorter than the crop, so each row identifies one input record
    seqs = [np.array([4 + (i % 20), 4 + (i // 20) % 20, 4 + i // 400] + [5] * (i % 7), np.uint8) for i in range(300)]
    shards = write_shards(tmp_path / "s", {"train": seqs}, files=3, rows_per_group=10)
    everything = sorted(tuple(s.tolist()) for s in seqs)
    for epoch in (0, 1):
        per_rank = [
            [r for b in _stream(shards, rank=r, world_size=world).epoch_batches(epoch) for r in _residues(b.tokens)]
            for r in range(world)
        ]
        flat = [row for rows in per_rank for row in rows]
        assert sorted(flat) == everything  # covering, and no row on two ranks
        assert all(len(rows) > 0 for rows in per_rank)


def test_token_budget_and_small_padding_on_skewed_lengths(tmp_path):
    rng = np.random.default_rng(0)
    # heavy-tailed lengths: mostly short, some long (cropped at 254 residues)
    lengths = np.clip(rng.lognormal(np.log(80), 0.8, size=3000), 10, 1000).astype(int)
    seqs = [rng.integers(4, 24, size=n).astype(np.uint8) for n in lengths]
    shards = write_shards(tmp_path / "s", {"train": seqs}, files=2, rows_per_group=256)
    # a shuffle buffer of the whole set: buffers of a few thousand rows are what real runs use
    stream = ShardStream(shards, "train", tokens_per_batch=4096, max_len=256, buffer_rows=4096, seed=1)
    padded = residues = specials = 0
    for batch in stream.epoch_batches(0):
        assert batch.tokens.numel() <= 4096
        padded += batch.tokens.numel()
        residues += batch.residues
        specials += 2 * batch.tokens.shape[0]
    pad_fraction = 1 - (residues + specials) / padded
    print(f"padding fraction {pad_fraction:.4f} over {padded} padded tokens")
    assert residues == int(np.minimum(lengths, 254).sum())
    assert pad_fraction < 0.03
    # the same data in arrival order (no bucketing) would pad far more: the bucketing is what helps
    unsorted = np.minimum(lengths, 254)[:1000] + 2
    per_batch = [unsorted[i : i + 16] for i in range(0, len(unsorted), 16)]
    naive = 1 - sum(b.sum() for b in per_batch) / sum(len(b) * b.max() for b in per_batch)
    assert naive > 4 * pad_fraction


def test_position_restores_the_stream_exactly(shard_dir):
    reference = _take(_stream(shard_dir), 60)  # several epochs of this small set
    for cut in (0, 1, 7, 23, 41):
        first = _stream(shard_dir)
        _take(first, cut)
        state = json.loads(json.dumps(first.state_dict()))  # plain ints survive serialisation
        resumed = _stream(shard_dir, num_workers=1 if cut % 2 else 0)
        resumed.load_state_dict(state)
        rest = _take(resumed, 60 - cut)
        resumed.close()
        assert all(torch.equal(x, y) for x, y in zip(reference[cut:], rest)), f"diverged after resuming at {cut}"
    assert _stream(shard_dir).state_dict()["epoch"] == 0


def test_list_encoded_tokens_give_the_same_stream(tmp_path):
    seqs = make_sequences(80, seed=9)
    as_binary = write_shards(tmp_path / "b", {"train": seqs}, encoding="binary")
    as_list = write_shards(tmp_path / "l", {"train": seqs}, encoding="list")
    assert all(torch.equal(x, y) for x, y in zip(_take(_stream(as_binary), 12), _take(_stream(as_list), 12)))


def test_reads_what_pmlm_tokenize_writes(tmp_path):
    from pmlm.data.shards import tokenize

    seqs = make_sequences(300, seed=4, max_len=120)
    fasta = tmp_path / "train.fasta"
    fasta.write_text("".join(f">seq{i} cluster=c{i % 37}\n{decode(s)}\n" for i, s in enumerate(seqs)))
    tokenize({"train": [str(fasta)], "valid": [str(fasta)]}, str(tmp_path / "shards"), num_shards=4, row_group_size=32)
    stream = ShardStream(tmp_path / "shards", "train", tokens_per_batch=512, max_len=128, buffer_rows=64, seed=0)
    seen = sorted(r for b in stream.epoch_batches(0) for r in _residues(b.tokens))
    assert seen == sorted(tuple(s.tolist()) for s in seqs)


def test_budget_smaller_than_one_sequence_is_a_config_error(shard_dir):
    with pytest.raises(ConfigError, match="tokens_per_step"):
        _stream(shard_dir, tokens_per_batch=30, max_len=40)


def test_missing_manifest_and_missing_split(tmp_path, shard_dir):
    with pytest.raises(InputError, match="manifest.json: manifest not found"):
        _stream(tmp_path / "nowhere")
    with pytest.raises(InputError, match="split 'test' not in manifest"):
        ShardStream(shard_dir, "test", tokens_per_batch=256, max_len=40, buffer_rows=48, seed=0)


def test_manifest_json_error_names_the_line(shard_dir):
    (shard_dir / "manifest.json").write_text('{\n "splits": {\n  "train": [,]\n}}')
    with pytest.raises(InputError, match=r"manifest.json:3: not valid JSON"):
        _stream(shard_dir)


def test_row_count_mismatch_and_bad_tokens_are_reported(tmp_path):
    shards = write_shards(tmp_path / "s", {"train": make_sequences(40, seed=1)}, files=1)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["splits"]["train"]["files"][0]["rows"] = 41
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="has 40 rows, the manifest says 41"):
        _stream(shards)

    bad = [np.array([5, 6, 7], np.uint8), np.array([5, 1, 7], np.uint8)]  # <pad> inside a sequence
    shards = write_shards(tmp_path / "b", {"train": bad * 20}, files=1, rows_per_group=40)
    stream = _stream(shards)
    message = r"part-00000-of-00001.parquet: row group 0, row 1: token id 1 is not a residue"
    with pytest.raises(InputError, match=message):
        stream.next_batch()

    table = pa.table({"tokens": pa.array([[5, 6]], pa.list_(pa.uint8())), "length": pa.array([3], pa.int32())})
    pq.write_table(table, shards / "train" / "part-00000-of-00001.parquet")
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["splits"]["train"]["files"][0]["rows"] = 1
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="row 0: length 3 but 2 tokens"):
        _stream(shards).next_batch()


def test_fewer_row_groups_than_ranks(tmp_path):
    shards = write_shards(tmp_path / "s", {"train": make_sequences(10, seed=1)}, files=1, rows_per_group=16)
    with pytest.raises(InputError, match="1 row group"):
        _stream(shards, rank=0, world_size=2)
