"""Artefact formats: weights + sidecar, format versions, the head's encoder path, the shard manifest."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from pmlm.artefacts import (
    ENCODER_FORMAT,
    HEAD_FORMAT,
    SHARDS_FORMAT,
    head_encoder_path,
    read_encoder_info,
    read_head,
    read_manifest,
    read_weights,
    save_weights,
    write_encoder,
    write_head,
    write_manifest,
)
from pmlm.errors import InputError
from pmlm.files import file_digest


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"encoder.w": torch.randn(4, 3, generator=g), "head.b": torch.randn(5, generator=g)}


def test_final_weights_and_sidecar(tmp_path):
    target = tmp_path / "results" / "model.safetensors"
    save_weights(target, _weights(3), {"model": {"hidden": 4}})
    assert all(torch.equal(load_file(target)[k], v) for k, v in _weights(3).items())
    assert json.loads(target.with_suffix(".json").read_text()) == {"model": {"hidden": 4}}
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.json", "model.safetensors"]


def test_encoder_round_trip_records_the_format(tmp_path):
    path = tmp_path / "model.safetensors"
    write_encoder(path, _weights(1), {"model": {"hidden": 4}, "objective": {"name": "pmlm"}})
    info, state = read_encoder_info(path), read_weights(path)  # as pretrained.load_encoder reads them
    assert info["format"] == ENCODER_FORMAT and info["model"] == {"hidden": 4}
    assert all(torch.equal(state[k], v) for k, v in _weights(1).items())


def test_a_sidecar_without_its_format_is_refused(tmp_path):
    """One format per artefact: no release shipped sidecars without the field."""
    path = tmp_path / "model.safetensors"
    save_weights(path, _weights(1), {"model": {"hidden": 4}, "objective": {"name": "mlm"}})
    with pytest.raises(InputError, match=r"model.json: no format field: it is not the 'pmlm-encoder/3' this pmlm"):
        read_encoder_info(path)


def test_unknown_format_and_missing_sections_are_one_line_errors(tmp_path):
    path = tmp_path / "model.safetensors"
    save_weights(path, _weights(1), {"format": "pmlm-encoder/9", "model": {}, "objective": {}})
    with pytest.raises(
        InputError,
        match=r"model.json: format 'pmlm-encoder/9' is not the 'pmlm-encoder/3'",
    ):
        read_encoder_info(path)
    save_weights(path, _weights(1), {"format": ENCODER_FORMAT, "model": {}})
    with pytest.raises(InputError, match=r"model.json: incomplete model description \(no 'objective' section\)"):
        read_encoder_info(path)
    path.with_suffix(".json").unlink()
    with pytest.raises(InputError, match=r"model.json: missing"):
        read_encoder_info(path)


def test_head_records_its_encoder_relative_to_its_folder(tmp_path, monkeypatch):
    encoder = tmp_path / "results" / "pretrain" / "model.safetensors"
    save_weights(encoder, _weights(1), {})
    head = tmp_path / "results" / "finetune" / "head.safetensors"
    info = {"config": {}, "encoder": {"sha256": file_digest(encoder), "objective": "pmlm"}}
    write_head(head, _weights(2), info, encoder)
    saved, _ = read_head(head)
    assert saved["format"] == HEAD_FORMAT
    assert saved["encoder"]["path"] == os.path.join("..", "pretrain", "model.safetensors")
    monkeypatch.chdir(tmp_path / "results")  # the working directory plays no part
    assert head_encoder_path(head, saved).resolve() == encoder.resolve()
    moved = tmp_path / "moved"
    (tmp_path / "results").rename(moved)  # the folder moves whole
    monkeypatch.chdir(moved)
    assert (
        head_encoder_path(moved / "finetune" / "head.safetensors", saved).resolve()
        == (moved / "pretrain" / "model.safetensors").resolve()
    )


def test_head_encoder_digest_is_checked(tmp_path):
    encoder = tmp_path / "model.safetensors"
    save_weights(encoder, _weights(1), {})
    head = tmp_path / "head.safetensors"
    write_head(head, _weights(2), {"config": {}, "encoder": {"sha256": "0" * 64}}, encoder)
    with pytest.raises(InputError, match=r"head.json: the head was fine-tuned on an encoder with sha256 000000000000"):
        head_encoder_path(head, read_head(head)[0])


def test_manifest_round_trip_and_format_check(tmp_path):
    manifest = {"format": SHARDS_FORMAT, "splits": {"train": {"files": []}}}
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "pmlm-shards/1", "splits": {}}))
    with pytest.raises(InputError, match=r"manifest.json: format 'pmlm-shards/1' is not the 'pmlm-shards/2'"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"splits": {}}))
    with pytest.raises(InputError, match=r"manifest.json: no format field: it is not the 'pmlm-shards/2'"):
        read_manifest(tmp_path)
