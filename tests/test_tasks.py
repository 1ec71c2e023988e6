"""Contact maps, the structure JSONL reader, TAPE's JSON / LMDB files and contact sets."""

from __future__ import annotations

import gzip
import json
import os
import pickle

import numpy as np
import pytest

from pmlm.errors import InputError, PmlmError
from pmlm.tasks.pickles import safe_unpickle
from pmlm.tasks.raptorx import read_contact_set
from pmlm.tasks.structures import (
    ReadCounts,
    contact_map,
    dssp_to_ss3,
    read_structure_jsonl,
    ss3_to_labels,
)
from pmlm.tasks.tape import read_tape

CA_STEP = 3.8  # Angstrom between consecutive C-alpha atoms


def _line_coords(length: int, step: float = CA_STEP) -> list[list[float]]:
    return [[i * step, 0.0, 0.0] for i in range(length)]


def _structure(**overrides) -> dict:
    record = {
        "id": "1ABC",
        "chain": "A",
        "start_resnum": 5,
        "seq": "ACDEF",
        "dssp": "HGIEB",
        "ca": _line_coords(5),
        "cb": [[0, 0, 0], None, [7.0, 0, 0], [8.0, 0, 0], [0.0, 8.5, 0]],
    }
    record.update(overrides)
    return record


def _write_lines(path, lines, gz: bool = False):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- contact maps


def test_contact_map_with_unresolved_residue_and_threshold_inclusive():
    coords = np.array([[0.0, 0, 0], [8.0, 0, 0], [np.nan, np.nan, np.nan], [16.01, 0, 0]])
    contacts, valid = contact_map(coords)
    assert contacts[0, 1] and contacts[1, 0]  # exactly 8.0 A is a contact
    assert not contacts[0, 3] and not contacts[1, 3]  # 16.01 and 8.01 A
    assert not valid[0, 2] and not valid[2, 2] and not contacts[2].any()
    assert valid[0, 3] and valid[0, 0]
    contacts, _ = contact_map(coords, threshold=7.99)
    assert not contacts[0, 1]
    with pytest.raises(ValueError, match="shape"):
        contact_map(np.zeros((3, 2)))


def test_dssp_reduction():
    assert dssp_to_ss3("HGIEBTSC-") == "HHHEECCCC"
    assert ss3_to_labels("HEC").tolist() == [0, 1, 2]


# ---------------------------------------------------------------- structure JSONL


@pytest.mark.parametrize("gz", [False, True])
def test_read_structure_jsonl(tmp_path, gz):
    path = _write_lines(
        tmp_path / ("s.jsonl.gz" if gz else "s.jsonl"),
        [json.dumps(_structure()), "", json.dumps(_structure(id="2XYZ", cb=[[0, 0, 0]] * 5))],
        gz=gz,
    )
    records = list(read_structure_jsonl(path))
    assert [r.name for r in records] == ["1ABC_A", "2XYZ_A"]
    first = records[0]
    assert first.start_resnum == 5 and first.ss3 == "HHHEE"
    assert np.isnan(first.cb[1]).all() and not np.isnan(first.cb[0]).any()
    contacts, valid = first.contacts()  # C-beta by default
    assert not valid[0, 1] and valid[0, 3]
    assert contacts[0, 2] and contacts[0, 3] and not contacts[3, 4]  # 8.0 in, |(8,0)-(0,8.5)| out
    contacts_ca, _ = first.contacts("CA")
    assert contacts_ca[0, 2] and not contacts_ca[0, 3]  # 7.6 A vs 11.4 A


def test_structure_jsonl_bad_json_names_line(tmp_path):
    path = _write_lines(tmp_path / "s.jsonl", [json.dumps(_structure()), '{"id": "X", ', json.dumps(_structure())])
    with pytest.raises(InputError) as info:
        list(read_structure_jsonl(path))
    assert info.value.line == 2 and str(path) in str(info.value) and "bad JSON" in str(info.value)
    assert f"{path}:2:" in str(info.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"dssp": "HHH"}, "'dssp' length 3 != 'seq' length 5"),
        ({"seq": "AC1EF"}, "non-residue letter '1' at position 3"),
        ({"dssp": "HHQHH"}, "outside the 8 DSSP states"),
        ({"ca": _line_coords(4)}, "'ca' has 4 entries"),
        ({"cb": [[0, 0]] * 5}, "'cb' entry 1 must be"),
    ],
)
def test_structure_jsonl_record_errors(tmp_path, override, message):
    path = _write_lines(tmp_path / "s.jsonl", [json.dumps(_structure()), json.dumps(_structure(**override))])
    with pytest.raises(InputError, match=message) as info:
        list(read_structure_jsonl(path))
    assert info.value.line == 2


def test_structure_jsonl_skip_counts(tmp_path):
    lines = [
        json.dumps(_structure()),
        "not json",
        json.dumps(_structure(dssp="H")),
        json.dumps([1, 2]),
        json.dumps(_structure(id="OK2")),
    ]
    path = _write_lines(tmp_path / "s.jsonl.gz", lines, gz=True)
    counts = ReadCounts()
    records = list(read_structure_jsonl(path, on_error="skip", counts=counts))
    assert [r.id for r in records] == ["1ABC", "OK2"]
    assert counts.read == 2 and counts.n_skipped == 3
    assert counts.skipped == {"bad JSON": 1, "length mismatch": 1, "not an object": 1}
    assert counts.first_skip.startswith(f"{path}:2:")


def test_structure_jsonl_truncated_gzip(tmp_path):
    full = gzip.compress(("\n".join(json.dumps(_structure()) for _ in range(200)) + "\n").encode())
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(full[: len(full) // 2])
    with pytest.raises(InputError, match="unreadable"):
        list(read_structure_jsonl(path))
    with pytest.raises(InputError, match="cannot open"):
        list(read_structure_jsonl(tmp_path / "missing.jsonl"))


# ---------------------------------------------------------------- TAPE


def _write_tape(root, task, split, records):
    path = root / task / f"{task}_{split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return path


def test_tape_proteinnet_json(tmp_path):
    ca = _line_coords(6)
    ca[5] = [3 * CA_STEP, 7.0, 0.0]  # folds back next to residue 3
    records = [
        {
            "id": "1abc_A",
            "primary": "MKTAYI",
            "protein_length": 6,
            "tertiary": ca,
            "valid_mask": [True, True, True, False, True, True],
        },
        {"primary": "mkU", "tertiary": [v for row in _line_coords(3) for v in row]},  # flat alias, repairs
    ]
    path = _write_tape(tmp_path, "proteinnet", "test", records)
    counts = ReadCounts()
    first, second = read_tape(path, "proteinnet", counts=counts)
    assert first.id == "1abc_A" and second.id == "1" and second.primary == "MKC"
    assert counts.repaired == {"lowercase residues uppercased": 2, "non-standard residues mapped": 1}
    contacts, valid = contact_map(first.tertiary)  # C-alpha, as the contact task reads ProteinNet
    assert not valid[3].any() and np.isnan(first.tertiary[3]).all()
    assert contacts[2, 5] and contacts[0, 1] and not contacts[0, 5]  # C-alpha distances
    assert second.tertiary.shape == (3, 3)


def test_tape_proteinnet_units_and_errors(tmp_path):
    hundredths = [[x * 100 for x in row] for row in _line_coords(6)]
    path = _write_tape(tmp_path, "proteinnet", "valid", [{"primary": "AAAAAA", "tertiary": hundredths}])
    counts = ReadCounts()
    (record,) = read_tape(path, "proteinnet", counts=counts)
    assert np.allclose(record.tertiary[1], [CA_STEP, 0, 0])
    assert counts.repaired["coordinates rescaled from hundredths of Angstrom"] == 1
    bad = _write_tape(tmp_path, "proteinnet", "train", [{"primary": "AAAAAA", "tertiary": _line_coords(6, 20.0)}])
    with pytest.raises(InputError, match="record 0 .*consecutive C-alpha"):
        list(read_tape(bad, "proteinnet"))
    short = _write_tape(tmp_path, "proteinnet", "test", [{"primary": "AAAA", "tertiary": _line_coords(3)}])
    with pytest.raises(InputError, match=r"'tertiary' has shape \(3, 3\)"):
        list(read_tape(short, "proteinnet"))


def test_tape_secondary_structure_and_remote_homology(tmp_path):
    ss = _write_tape(
        tmp_path,
        "secondary_structure",
        "cb513",
        [
            {"id": "a", "primary": "ACDE", "ss3": [0, 1, 2, 2], "ss8": [1, 4, 7, 6], "valid_mask": [1, 1, 0, 1]},
            {"id": "b", "primary": "AC", "ss3": "HE"},
        ],
    )
    a, b = read_tape(ss, "secondary_structure")
    assert a.ss3.tolist() == [0, 1, 2, 2] and a.valid_mask.tolist() == [True, True, False, True]
    assert b.ss3.tolist() == [0, 1] and b.valid_mask.all() and b.ss8 is None
    rh = _write_tape(
        tmp_path,
        "remote_homology",
        "test_fold_holdout",
        [
            {"id": "d1", "primary": "ACDEF", "fold_label": 7, "superfamily_label": 3, "family_label": 11},
            {"id": "d2", "primary": "ACDEF", "fold_label": [1194]},
        ],
    )
    r1, r2 = read_tape(rh, "remote_homology")
    assert (r1.fold_label, r1.superfamily_label, r1.family_label, r1.class_label) == (7, 3, 11, None)
    assert r2.fold_label == 1194


@pytest.mark.parametrize(
    "task, record, message",
    [
        ("secondary_structure", {"primary": "ACD", "ss3": [0, 1]}, r"'ss3' has shape \(2,\)"),
        ("secondary_structure", {"primary": "ACD", "ss3": [0, 1, 3]}, "'ss3' labels must be 0..2"),
        ("secondary_structure", {"primary": "AC*", "ss3": [0, 1, 2]}, "non-residue letter"),
        ("remote_homology", {"primary": "ACD"}, "missing key 'fold_label'"),
        ("remote_homology", {"primary": "ACD", "fold_label": 1, "protein_length": 4}, "'protein_length' 4"),
    ],
)
def test_tape_record_errors_name_file_and_record(tmp_path, task, record, message):
    path = _write_tape(tmp_path, task, "valid", [record])
    with pytest.raises(InputError, match=message) as info:
        list(read_tape(path, task))
    assert str(path) in str(info.value) and "record 0" in str(info.value)
    counts = ReadCounts()
    assert list(read_tape(path, task, on_error="skip", counts=counts)) == []
    assert counts.n_skipped == 1


def test_tape_file_errors(tmp_path):
    not_list = tmp_path / "x.json"
    not_list.write_text('{"primary": "A"}')
    with pytest.raises(InputError, match="one list of records"):
        list(read_tape(not_list, "remote_homology"))
    broken = tmp_path / "y.json"
    broken.write_text('[{"primary": "A",\n  "fold_label": }]')
    with pytest.raises(InputError) as info:
        list(read_tape(broken, "remote_homology"))
    assert info.value.line == 2


class _Exploit:
    def __reduce__(self):
        return (os.system, ("true",))


def test_safe_unpickle_refuses_code():
    item = {"primary": "AC", "tertiary": np.zeros((2, 3), np.float32), "valid_mask": np.ones(2, bool), "n": np.int64(2)}
    back = safe_unpickle(pickle.dumps(item))
    assert back["primary"] == "AC" and back["tertiary"].shape == (2, 3) and back["n"] == 2
    assert safe_unpickle(pickle.dumps(item, protocol=2))["valid_mask"].all()
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        safe_unpickle(pickle.dumps(_Exploit()))


def test_tape_lmdb(tmp_path):
    lmdb = pytest.importorskip("lmdb")
    path = tmp_path / "proteinnet_test.lmdb"
    items = [
        {
            "id": "p0",
            "primary": "ACDEF",
            "protein_length": 5,
            "tertiary": np.array(_line_coords(5)),
            "valid_mask": np.array([True] * 5),
        },
        {
            "primary": "ACDE",
            "protein_length": 4,
            "tertiary": np.array(_line_coords(4)),
            "valid_mask": np.array([True, False, True, True]),
        },
    ]
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        txn.put(b"num_examples", pickle.dumps(len(items)))
        for i, item in enumerate(items):
            txn.put(str(i).encode(), pickle.dumps(item))
    env.close()
    p0, p1 = read_tape(path, "proteinnet")
    assert p0.id == "p0" and p1.id == "1" and p1.valid_mask.tolist() == [True, False, True, True]
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        txn.put(b"1", pickle.dumps(_Exploit()))
    env.close()
    with pytest.raises(InputError, match="record 1: cannot decode"):
        list(read_tape(path, "proteinnet"))


def test_lmdb_missing_dependency_is_a_clear_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_lmdb(name, *args, **kwargs):
        if name == "lmdb":
            raise ImportError("no lmdb")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_lmdb)
    (tmp_path / "x.lmdb").mkdir()
    with pytest.raises(PmlmError, match="optional package 'lmdb'"):
        list(read_tape(tmp_path / "x.lmdb", "proteinnet"))


# ---------------------------------------------------------------- RaptorX / ESM-style sets


def test_contact_set_formats(tmp_path):
    cb = np.array(_line_coords(5, 4.5))
    cb[2] = np.nan
    folder = tmp_path / "set"
    folder.mkdir()
    np.savez_compressed(folder / "t1.npz", id=np.array("T1"), seq=np.array("ACDEF"), cb=cb)  # the NPZ layout
    dist = np.array([[0.0, 9.0, np.nan], [9.0, 0.0, 3.0], [np.nan, 3.0, 0.0]])
    with open(folder / "t2.pkl", "wb") as fh:
        pickle.dump({"seq": "ACD", "ssp": "HHE", "dist": dist, "coords": np.zeros((3, 3))}, fh)
    np.savez(
        folder / "t3.npz",
        seq=np.array("ACDE"),
        contacts=np.array([[-1, 1, 0, 0], [1, -1, 0, 0], [0, 0, -1, 1], [0, 0, 1, -1]]),
    )
    t1, t2, t3 = read_contact_set(folder)
    assert (t1.id, t2.id, t3.id) == ("T1", "t2", "t3")
    assert t1.contacts[0, 1] and not t1.contacts[0, 3] and not t1.valid[1, 2]
    # ESM's layout: the distance matrix wins over coords
    assert t2.contacts[1, 2] and not t2.contacts[0, 1] and not t2.valid[0, 2]
    assert t3.contacts[0, 1] and not t3.valid[0, 0] and t3.valid[0, 2]

    jsonl = _write_lines(
        tmp_path / "set.jsonl.gz",
        [
            json.dumps({"id": "J1", "seq": "ACD", "cb": [[0, 0, 0], None, [7.9, 0, 0]]}),
            json.dumps({"id": "J2", "seq": "ACD"}),
        ],
        gz=True,
    )
    with pytest.raises(InputError, match="needs one of") as info:
        list(read_contact_set(jsonl))
    assert info.value.line == 2
    counts = ReadCounts()
    (j1,) = read_contact_set(jsonl, on_error="skip", counts=counts)
    assert j1.contacts[0, 2] and not j1.valid[0, 1] and counts.skipped == {"missing key": 1}


def test_contact_set_errors(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    np.savez(folder / "a.npz", seq=np.array("ACD"), cb=np.zeros((4, 3)))
    with pytest.raises(InputError, match=r"'cb' has shape \(4, 3\)"):
        list(read_contact_set(folder))
    with open(folder / "b.pkl", "wb") as fh:
        pickle.dump(_Exploit(), fh)
    counts = ReadCounts()
    assert list(read_contact_set(folder, on_error="skip", counts=counts)) == []
    assert counts.skipped == {"length mismatch": 1, "unreadable": 1}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no .npz or .pkl"):
        read_contact_set(empty)
