"""The malformed-input corpus: every case is a one-line error naming file and line, or a counted repair."""

import gzip
import json
import os

import pytest

from pmlm.cli import main
from pmlm.data.fasta import read_fasta
from pmlm.data.ingest import IngestPolicy, ingest
from pmlm.errors import ConfigError, InputError


def write(path, text, *, gz=False, binary=False):
    data = text if binary else text.encode()
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def run_ingest(tmp_path, text, policy=None, **kw):
    src = write(tmp_path / ("in.fa.gz" if kw.get("gz") else "in.fa"), text, **kw)
    out, stats = tmp_path / "clean.fa", tmp_path / "stats.json"
    result = ingest([src], str(out), str(stats), policy or IngestPolicy())
    records = [(r.id, r.sequence) for r in read_fasta(out)]
    return result, records


def assert_no_output(tmp_path):
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("in.fa", "in.fa.gz")]
    assert leftovers == [], f"half-written outputs left behind: {leftovers}"


def test_clean_input_accounting(tmp_path):
    stats, recs = run_ingest(tmp_path, ">a desc\nMKV\nLA\n>b\nACDE\n")
    assert recs == [("a", "MKVLA"), ("b", "ACDE")]
    assert stats["read"] == 2 and stats["kept"] == 2 and stats["dropped"] == {}
    assert json.loads((tmp_path / "stats.json").read_text()) == stats


def test_gzip_detected_by_content_not_name(tmp_path):
    src = write(tmp_path / "in.fa", ">a\nMKV\n", gz=True)  # gzip bytes behind a .fa name
    assert [r.sequence for r in read_fasta(src)] == ["MKV"]


def test_no_header_is_an_error_naming_the_line(tmp_path):
    with pytest.raises(InputError, match=r"in\.fa:2: expected a FASTA header"):
        run_ingest(tmp_path, "\nMKVLA\n>a\nMK\n")
    assert_no_output(tmp_path)


def test_binary_junk(tmp_path):
    with pytest.raises(InputError, match="binary data"):
        run_ingest(tmp_path, b">a\nMK\x00\x01\x02\n", binary=True)
    with pytest.raises(InputError, match="binary data"):
        run_ingest(tmp_path, b">a\nMK\xff\xfe\x80\n", binary=True)
    assert_no_output(tmp_path)


def test_latin1_header_is_decoded_and_counted(tmp_path):
    """Old tools write Latin-1 names into headers: read as Latin-1 (every byte is a character), counted."""
    text = ">P1 M\xfcller lab\nMKV\n>\xe9t\xe9 protein\nACDE\n>P3 caf\xc3\xa9\nWY\n".encode("latin-1")
    stats, recs = run_ingest(tmp_path, text, binary=True, gz=True)
    assert recs == [("P1", "MKV"), ("\u00e9t\u00e9", "ACDE"), ("P3", "WY")]  # the id keeps its letters, now UTF-8
    assert stats["repaired"] == {"header_latin1": 2}  # P3's header is valid UTF-8 (caf\u00e9): no repair
    titles = [r.title for r in read_fasta(write(tmp_path / "raw.fa", text, binary=True))]
    assert titles == ["P1 M\u00fcller lab", "\u00e9t\u00e9 protein", "P3 caf\u00e9"]


def test_latin1_in_a_sequence_line_is_binary_junk(tmp_path):
    with pytest.raises(InputError, match=r"in\.fa:4: binary data \(not UTF-8 text\)"):
        run_ingest(tmp_path, b">a\nMK\n>b caf\xe9\nMK\xe9\n", binary=True)
    assert_no_output(tmp_path)


def test_truncated_gzip(tmp_path):
    data = gzip.compress(("".join(f">s{i}\n{'MKVLA' * 40}\n" for i in range(2000))).encode())
    src = tmp_path / "in.fa.gz"
    src.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"in\.fa\.gz:\d+: corrupt or truncated gzip"):
        ingest([str(src)], str(tmp_path / "clean.fa"), str(tmp_path / "stats.json"), IngestPolicy())
    assert_no_output(tmp_path)


def test_empty_file_and_file_without_records(tmp_path):
    with pytest.raises(InputError, match="file is empty"):
        run_ingest(tmp_path, "")
    with pytest.raises(InputError, match="no FASTA records"):
        run_ingest(tmp_path, "\n\n")


def test_empty_records_are_counted(tmp_path):
    stats, recs = run_ingest(tmp_path, ">a\n>b\nMK\n>c\n\n>d\nAC\n")
    assert [r[0] for r in recs] == ["b", "d"]
    assert stats["dropped"] == {"empty": 2} and stats["read"] == 4


def test_crlf_line_endings(tmp_path):
    _stats, recs = run_ingest(tmp_path, ">a x\r\nMKV\r\nLA\r\n>b\r\nAC\r\n")
    assert recs == [("a", "MKVLA"), ("b", "AC")]


def test_duplicate_ids(tmp_path):
    text = ">a\nMK\n>b\nAC\n>a\nWW\n"
    with pytest.raises(InputError, match=r"in\.fa:5: record 'a': duplicate id \(first seen at line 1\)"):
        run_ingest(tmp_path, text)
    assert_no_output(tmp_path)
    stats, recs = run_ingest(tmp_path, text, IngestPolicy(duplicate_ids="drop"))
    assert [r[0] for r in recs] == ["a", "b"] and stats["dropped"] == {"duplicate_id": 1}
    stats, recs = run_ingest(tmp_path, text, IngestPolicy(duplicate_ids="rename"))
    assert [r[0] for r in recs] == ["a", "b", "a_dup2"] and stats["repaired"] == {"id_renamed": 1}


def test_huge_record(tmp_path):
    text = ">small\nMKV\n>huge\n" + "A" * 100_001 + "\n>after\nWW\n"
    stats, recs = run_ingest(tmp_path, text, IngestPolicy(max_length=100_000))
    assert [r[0] for r in recs] == ["small", "after"] and stats["dropped"] == {"too_long": 1}
    with pytest.raises(InputError, match=r"in\.fa:3: record 'huge': 100001 residues exceeds"):
        run_ingest(tmp_path, text, IngestPolicy(max_length=100_000, too_long="error"))


def test_normalisation_repairs_are_counted(tmp_path):
    text = ">low\nmkvLA\n>stop\nMKV*\n>gap\nMK--V.A\n>ns\nUOBZJ\n>dup\nMKVLA\n"
    stats, recs = run_ingest(tmp_path, text)
    assert recs == [("low", "MKVLA"), ("stop", "MKV"), ("gap", "MKVA"), ("ns", "CKXXX")]
    assert stats["repaired"] == {"gaps_removed": 1, "nonstandard_mapped": 1, "stop_stripped": 1, "uppercased": 1}
    assert stats["dropped"] == {"duplicate_sequence": 1}
    assert stats["kept"] + stats["dropped_total"] == stats["read"] == 5


@pytest.mark.parametrize(
    "policy, match",
    [
        (IngestPolicy(case="error"), r"in\.fa:1: record 'low': lowercase"),
        (IngestPolicy(stop="error"), r"in\.fa:3: record 'stop': trailing '\*'"),
        (IngestPolicy(gaps="error"), r"in\.fa:5: record 'gap': alignment gap"),
        (IngestPolicy(nonstandard="error"), r"in\.fa:7: record 'ns': non-standard residue 'U'"),
    ],
)
def test_strict_policies_fail_with_file_and_line(tmp_path, policy, match):
    with pytest.raises(InputError, match=match):
        run_ingest(tmp_path, ">low\nmkvLA\n>stop\nMKV*\n>gap\nMK--V.A\n>ns\nUOBZJ\n", policy)


def test_invalid_characters_dropped_or_error(tmp_path):
    text = ">ok\nMKV\n>digits\nMK1V\n>star\nMK*V\n"
    stats, recs = run_ingest(tmp_path, text)
    assert recs == [("ok", "MKV")] and stats["dropped"] == {"invalid_character": 2}
    with pytest.raises(InputError, match=r"in\.fa:3: record 'digits': invalid character '1' at residue 3"):
        run_ingest(tmp_path, text, IngestPolicy(invalid="error"))


def test_nonstandard_x_and_drop_policies(tmp_path):
    stats, recs = run_ingest(tmp_path, ">a\nMUO\n>b\nMK\n", IngestPolicy(nonstandard="x"))
    assert recs[0] == ("a", "MXX")
    stats, recs = run_ingest(tmp_path, ">a\nMUO\n>b\nMK\n", IngestPolicy(nonstandard="drop"))
    assert recs == [("b", "MK")] and stats["dropped"] == {"nonstandard_residue": 1}


def test_header_without_identifier(tmp_path):
    with pytest.raises(InputError, match=r"in\.fa:3: header has no identifier"):
        run_ingest(tmp_path, ">a\nMK\n>\nAC\n")


def test_everything_dropped_is_an_error(tmp_path):
    with pytest.raises(InputError, match="no record survived"):
        run_ingest(tmp_path, ">a\nMK\n", IngestPolicy(min_length=5))
    assert_no_output(tmp_path)


def test_policy_validation():
    with pytest.raises(ConfigError, match="ingest.case"):
        IngestPolicy(case="lower")
    with pytest.raises(ConfigError, match="unknown key"):
        IngestPolicy.from_dict({"max_lenght": 5})
    with pytest.raises(ConfigError, match="max_length"):
        IngestPolicy(min_length=10, max_length=5)


def test_cli_one_line_error_and_success(tmp_path, capsys):
    bad = write(tmp_path / "bad.fa", "MKV\n")
    rc = main(["ingest", bad, "-o", str(tmp_path / "o.fa"), "--stats", str(tmp_path / "s.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "bad.fa:1:" in err[0] and "Traceback" not in err[0]
    good = write(tmp_path / "good.fa", ">a\nmkv\n")
    rc = main(
        [
            "ingest",
            good,
            "-o",
            str(tmp_path / "o.fa"),
            "--stats",
            str(tmp_path / "s.json"),
            "--set",
            "case=upper",
            "--set",
            "min_length=2",
        ]
    )
    assert rc == 0 and (tmp_path / "o.fa").read_text() == ">a\nMKV\n"
    rc = main(["ingest", good, "-o", str(tmp_path / "o.fa"), "--stats", str(tmp_path / "s.json"), "--set", "nope=1"])
    assert rc == 2 and "unknown key(s) nope" in capsys.readouterr().err
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))


# ------------------------------------------------------------------ sources as published, bounded-memory dedup

SOURCES = os.path.join(os.path.dirname(__file__), "data", "sources")


def test_uniref_xml_and_pfam_sources(tmp_path):
    xml = tmp_path / "uniref50.xml.gz"
    xml.write_bytes(gzip.compress(open(os.path.join(SOURCES, "uniref50_2018_03_excerpt.xml"), "rb").read()))
    stats = ingest([str(xml)], str(tmp_path / "u.fa"), str(tmp_path / "u.json"), IngestPolicy())
    assert stats["formats"] == ["uniref_xml"] and stats["read"] == stats["kept"] == 3
    assert stats["repaired"] == {"nonstandard_mapped": 1}  # U -> C in the selenoprotein
    headers = [r.title for r in read_fasta(tmp_path / "u.fa")]
    assert headers == [
        "UniRef50_Q6GZX4 members=3 taxon=10492",
        "UniRef50_Q6GZX3 members=1 taxon=654924",
        "UniRef50_P0DMW5 members=2 taxon=2759",
    ]
    pfam = os.path.join(SOURCES, "pfam_a_31_excerpt.fasta")
    stats = ingest([pfam], str(tmp_path / "p.fa"), str(tmp_path / "p.json"), IngestPolicy())
    assert stats["formats"] == ["pfam_fasta"] and stats["dropped"] == {"duplicate_sequence": 1}
    titles = [r.title for r in read_fasta(tmp_path / "p.fa")]
    assert "Q9X0V2_THEMA/3-120 family=PF00085.19" in titles  # the first of two identical domains is kept
    assert not any(t.startswith("B1XQJ1_SYNP2") for t in titles)


def test_first_occurrence_across_inputs_is_kept(tmp_path):
    one = write(tmp_path / "one.fa", ">x\nMKV\n>y\nAAA\n")
    two = write(tmp_path / "two.fa", ">z\nAAA\n>w\nMKV\n>v\nCC\n")
    stats = ingest([two, one], str(tmp_path / "o.fa"), str(tmp_path / "s.json"), IngestPolicy())
    assert [r.id for r in read_fasta(tmp_path / "o.fa")] == ["z", "w", "v"]
    assert stats["dropped"] == {"duplicate_sequence": 2} and stats["kept"] + stats["dropped_total"] == 5
    assert stats["length_min"] == 2 and stats["residues_kept"] == 8


def test_hash_candidates_are_confirmed_by_content(tmp_path):
    """Records whose 64-bit hashes collide but whose sequences differ are never merged."""
    import numpy as np

    from pmlm.data import dedup

    fasta = write(tmp_path / "p.fa", ">a\nMKV\n>b\nMKW\n>c\nMKV\n>d\nMKW\n")
    reason = bytearray(4)
    marked = dedup.mark_duplicate_sequences(fasta, np.arange(4), reason, str(tmp_path), mean_length=3)
    assert marked == 2 and list(reason) == [0, 0, dedup.DUPLICATE_SEQUENCE, dedup.DUPLICATE_SEQUENCE]
    reason = bytearray(4)
    assert dedup.mark_duplicate_sequences(fasta, np.array([0, 1]), reason, str(tmp_path), 3) == 0


def test_renamed_ids_never_clash_with_input_ids(tmp_path):
    _, recs = run_ingest(tmp_path, ">a\nMKV\n>a\nAAA\n>a_dup2\nCC\n>a\nDD\n", IngestPolicy(duplicate_ids="rename"))
    assert [r[0] for r in recs] == ["a", "a_dup3", "a_dup2", "a_dup4"]


def test_duplicate_id_in_another_input_names_both_files(tmp_path):
    one = write(tmp_path / "one.fa", ">x\nMKV\n")
    two = write(tmp_path / "two.fa", ">y\nAA\n>x\nCC\n")
    with pytest.raises(InputError, match=r"two\.fa:3: record 'x': duplicate id \(first seen at .*one\.fa:1\)"):
        ingest([one, two], str(tmp_path / "o.fa"), str(tmp_path / "s.json"), IngestPolicy())
    assert sorted(os.listdir(tmp_path)) == ["one.fa", "two.fa"]


def test_malformed_xml_leaves_no_output(tmp_path):
    xml = tmp_path / "in.fa"  # the name says FASTA, the content decides
    xml.write_bytes(open(os.path.join(SOURCES, "uniref50_2020_02_excerpt.xml"), "rb").read()[:-40])
    with pytest.raises(InputError, match=r"in\.fa:\d+: malformed XML"):
        ingest([str(xml)], str(tmp_path / "clean.fa"), str(tmp_path / "stats.json"), IngestPolicy())
    assert_no_output(tmp_path)


def test_duplicate_id_lines_counted_again_across_blocks(tmp_path, monkeypatch):
    """Clean blocks do not keep their lines; an error counts them again from the input, exactly."""
    monkeypatch.setattr("pmlm.data.formats.BLOCK_SIZE", 64)
    text = "".join(f">r{i}\nMKV{'A' * i}\nGG\n" for i in range(200)) + ">r150\nCCCC\n"
    with pytest.raises(InputError, match=r"in\.fa:601: record 'r150': duplicate id \(first seen at line 451\)"):
        run_ingest(tmp_path, text)
