"""Task data as published: TAPE's data_raw_pytorch tarballs, RaptorX's pickles, PDB coordinate files."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from archives import tar_bytes
from tiny_models import pdb_text

from pmlm.cli import main
from pmlm.data.archive import extract_member
from pmlm.errors import InputError
from pmlm.tasks.raptorx import read_contact_set
from pmlm.tasks.registry import detect_task_format
from pmlm.tasks.structures import ReadCounts
from pmlm.tasks.tape import read_tape


def test_tape_tarballs_as_distributed(tmp_path):
    """<task>/<task>_<split>.json inside data_raw_pytorch/<task>.tar.gz, read through the paper config's member paths."""
    seq = "MKTAYIAKQR"
    ca = [[3.8 * i, 0.0, 0.0] for i in range(len(seq))]
    proteinnet = [
        {
            "id": "1abc_d1",
            "primary": seq,
            "protein_length": len(seq),
            "tertiary": ca,
            "valid_mask": [True] * len(seq),
            "evolutionary": [[0.0] * 21 for _ in seq],
        }
    ]
    ss = [
        {
            "id": "cb513_1",
            "primary": seq,
            "protein_length": len(seq),
            "ss3": [0, 0, 1, 1, 2, 2, 0, 0, 1, 2],
            "ss8": [0, 1, 2, 3, 4, 5, 6, 7, 0, 1],
            "valid_mask": [True] * len(seq),
            "disorder": [0] * len(seq),
        }
    ]
    rh = [
        {
            "id": "d1a1xa_",
            "primary": seq,
            "protein_length": len(seq),
            "fold_label": 7,
            "superfamily_label": 70,
            "family_label": 700,
            "class_label": 1,
        }
    ]
    archives = {
        "proteinnet": ("proteinnet/proteinnet_test.json", proteinnet, "proteinnet"),
        "secondary_structure": ("secondary_structure/secondary_structure_cb513.json", ss, "secondary_structure"),
        "remote_homology": ("remote_homology/remote_homology_test_fold_holdout.json", rh, "remote_homology"),
    }
    for name, (member, records, task) in archives.items():
        archive = tmp_path / f"{name}.tar.gz"
        archive.write_bytes(
            tar_bytes({f"{task}/{task}_train.json": b"[]", member: json.dumps(records).encode()}, "w:gz")
        )
        out = tmp_path / "members" / member
        extract_member(archive, member, out)
        assert detect_task_format(out) == "tape"
        (record,) = read_tape(out, task)
        assert record.primary == seq and record.id == records[0]["id"]
    assert record.fold_label == 7


def test_raptorx_pickle_as_distributed(tmp_path):
    """RaptorX's list of per-protein dicts; atomDistMatrix['CbCb'] with -1 for unknown distances."""
    dist = np.array(
        [[0.0, 5.0, 9.0, -1.0], [5.0, 0.0, 7.5, -1.0], [9.0, 7.5, 0.0, -1.0], [-1.0, -1.0, -1.0, -1.0]],
        dtype=np.float32,
    )
    proteins = [
        {
            "name": "1abcA",
            "sequence": "MKVG",
            "PSSM": np.zeros((4, 20), np.float32),
            "atomDistMatrix": {"CbCb": dist, "CaCa": dist},
        },
        {"name": "2xyzB", "sequence": "AC", "atomDistMatrix": {"CbCb": np.array([[0.0, 12.0], [12.0, 0.0]])}},
    ]
    path = tmp_path / "raptorx_test.pkl"
    path.write_bytes(pickle.dumps(proteins, protocol=2))
    assert detect_task_format(path) == "raptorx"
    first, second = read_contact_set(path)
    assert first.id == "1abcA" and second.id == "2xyzB"
    assert first.contacts[0, 1] and first.contacts[1, 2] and not first.contacts[0, 2]
    assert not first.valid[3].any() and first.valid[0, 2]
    assert not second.contacts[0, 1]
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps([{"name": "x", "sequence": "MK", "atomDistMatrix": {"CaCa": dist}}], protocol=2))
    with pytest.raises(InputError, match=r"bad\.pkl: protein 0: no atomDistMatrix\['CbCb'\]"):
        list(read_contact_set(bad))
    counts = ReadCounts()
    assert list(read_contact_set(bad, on_error="skip", counts=counts)) == [] and counts.skipped


def test_contacts_from_pdb_coordinates(tmp_path, capsys):
    pdb_dir = tmp_path / "pdb"
    pdb_dir.mkdir()
    (pdb_dir / "1abc.pdb").write_text(pdb_text())
    chains = tmp_path / "test_list.txt"
    chains.write_text("# RaptorX-style chain list\n1abcA\n")
    out = tmp_path / "raptorx_test.jsonl"
    assert main(["contacts-from-pdb", "--chains", str(chains), "--pdb-dir", str(pdb_dir), "-o", str(out)]) == 0
    (obj,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert obj["id"] == "1abcA" and obj["seq"] == "AGKMW"
    assert obj["cb"][0] == [3.8, -0.8, 1.3] and obj["cb"][4] is None  # C-alpha only: no C-beta to build
    gly = np.array(obj["cb"][1])
    assert abs(np.linalg.norm(gly - np.array([7.6, 0.0, 0.0])) - 1.53) < 0.01  # the ideal C-beta bond
    assert detect_task_format(out) == "raptorx"
    (record,) = read_contact_set(out)
    assert not record.valid[4].any() and record.contacts[0, 1]
    chains.write_text("1abcC\n")
    assert main(["contacts-from-pdb", "--chains", str(chains), "--pdb-dir", str(pdb_dir), "-o", str(out)]) == 2
    assert "no chain 'C' in the first model (chains: A, B)" in capsys.readouterr().err
