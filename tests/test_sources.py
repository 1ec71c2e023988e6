"""Sources as published: nested archives, UniRef XML (both layouts), Pfam-A FASTA, format detection,
the fast FASTA reader against Biopython, and publisher checksum listings."""

import gzip
import io
from pathlib import Path

import pytest
from archives import tar_bytes, uniprot_release_archive
from Bio.SeqIO.FastaIO import SimpleFastaParser

from pmlm.cli import main
from pmlm.data.archive import extract_member
from pmlm.data.checksums import published_checksums
from pmlm.data.formats import detect_format, read_fasta_source, read_source
from pmlm.data.records import records_of
from pmlm.data.uniref import read_uniref_xml as uniref_blocks
from pmlm.errors import InputError

DATA = Path(__file__).parent / "data" / "sources"
OLD_XML = DATA / "uniref50_2018_03_excerpt.xml"
NEW_XML = DATA / "uniref50_2020_02_excerpt.xml"
PFAM = DATA / "pfam_a_31_excerpt.fasta"


# ------------------------------------------------------------------ nested archives


def test_member_of_a_nested_archive_is_streamed_out(tmp_path):
    archive = uniprot_release_archive(tmp_path / "uniref2018_03.tar.gz", OLD_XML.read_bytes())
    out = tmp_path / "uniref50.xml.gz"
    size = extract_member(archive, "uniref50.tar/uniref50.xml.gz", out)
    assert gzip.decompress(out.read_bytes()) == OLD_XML.read_bytes() and size == out.stat().st_size
    # TAPE's layout: a folder inside one archive, not a nested archive
    tape = tmp_path / "proteinnet.tar.gz"
    tape.write_bytes(
        tar_bytes({"proteinnet/proteinnet_train.json": b"[]", "proteinnet/proteinnet_test.json": b"[1]"}, "w:gz")
    )
    extract_member(tape, "proteinnet/proteinnet_test.json", tmp_path / "test.json")
    assert (tmp_path / "test.json").read_bytes() == b"[1]"


def test_missing_member_lists_the_closest_names(tmp_path):
    archive = uniprot_release_archive(tmp_path / "uniref2018_03.tar.gz", OLD_XML.read_bytes())
    with pytest.raises(
        InputError,
        match=r"no member 'uniref50.tar/uniref50.fasta.gz'; closest names found: "
        r"uniref50.tar/uniref50.xml.gz",
    ):
        extract_member(archive, "uniref50.tar/uniref50.fasta.gz", tmp_path / "out")
    with pytest.raises(InputError, match=r"no member 'uniref50.fasta.gz'; closest names found: uniref50.tar"):
        extract_member(archive, "uniref50.fasta.gz", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uniref2018_03.tar.gz"]


@pytest.mark.parametrize("cut", [0.4, 0.9])
def test_truncated_archive_is_one_line_and_leaves_nothing(tmp_path, cut):
    xml = OLD_XML.read_bytes() * 40  # big enough that the cut lands inside uniref50.tar
    full = uniprot_release_archive(tmp_path / "full.tar.gz", xml).read_bytes()
    archive = tmp_path / "uniref2018_03.tar.gz"
    archive.write_bytes(full[: int(len(full) * cut)])
    with pytest.raises(InputError, match=r"uniref2018_03\.tar\.gz: cannot read tar archive.*is the download complete"):
        extract_member(archive, "uniref50.tar/uniref50.xml.gz", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_cli_extract(tmp_path, capsys):
    archive = uniprot_release_archive(tmp_path / "u.tar.gz", NEW_XML.read_bytes())
    assert main(["extract", str(archive), "uniref50.tar/uniref50.xml.gz", "-o", str(tmp_path / "x.gz")]) == 0
    assert main(["extract", str(archive), "uniref50.tar/nope", "-o", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1].startswith("pmlm extract: error:") and "closest names found" in err[1]


# ------------------------------------------------------------------ UniRef XML


@pytest.mark.parametrize("path", [OLD_XML, NEW_XML], ids=["2018_03-wrapped", "2020_02-one-line"])
def test_uniref_xml_layouts_read_the_same(tmp_path, path):
    gz = tmp_path / "uniref50.xml.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert detect_format(gz) == "uniref_xml"
    records = list(records_of(uniref_blocks(gz)))
    assert [r[0] for r in records] == [b"UniRef50_Q6GZX4", b"UniRef50_Q6GZX3", b"UniRef50_P0DMW5"]
    assert [len(r[1]) for r in records] == [256, 71, 24]
    assert records[0][1].startswith(b"MAFSAEDVLKEYDRRRRMEALLLSLYYPNDRKLLDYKEWSPPRVQVECPKAPVEWNNPPSEKGL")  # lines joined
    assert [r[3] for r in records] == [b"members=3 taxon=10492", b"members=1 taxon=654924", b"members=2 taxon=2759"]
    entry_lines = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("<entry ")]
    assert [r[2] for r in records] == entry_lines and entry_lines[0] == 6


def test_uniref_entry_split_across_blocks(tmp_path):
    whole = list(records_of(uniref_blocks(OLD_XML)))
    for block in (7, 64, 333):
        assert list(records_of(uniref_blocks(OLD_XML, block_size=block))) == whole


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda x: x[: x.index(b'<entry id="UniRef50_Q6GZX3"') + 200], r":\d+: malformed XML .*truncated: re-download"),
        (lambda x: x.replace(b"</name>", b"</nam>", 1), r":7: malformed XML \(mismatched tag"),
        (
            lambda x: x.replace(b'length="71"', b'length="70"'),
            r":54: entry UniRef50_Q6GZX3: sequence has 71 residues but length=\"70\"",
        ),
        (
            lambda x: x.replace(b"Ranavirus", b"Ranavir\xe9", 1).replace(b"ISO-8859-1", b"UTF-8"),
            r":9: malformed XML \(not well-formed",
        ),
        (
            lambda x: x.replace(
                b'<UniRef50 xmlns="http://uniprot.org/uniref"', b'<uniprot xmlns="http://uniprot.org/uniprot"'
            ).replace(b"</UniRef50>", b"</uniprot>"),
            r": XML with root element <uniprot> is not UniRef XML",
        ),
    ],
    ids=["truncated", "mismatched-tag", "length-mismatch", "wrong-encoding", "not-uniref"],
)
def test_bad_uniref_xml_is_one_line_naming_file_and_line(tmp_path, edit, match):
    bad = tmp_path / "uniref50.xml"
    bad.write_bytes(edit(OLD_XML.read_bytes()))
    with pytest.raises(InputError, match=r"uniref50\.xml" + match):
        list(read_source(bad))  # a generator of blocks: the error comes while reading


def test_forced_uniref_format_checks_the_root(tmp_path):
    bad = tmp_path / "uniprot.xml"
    bad.write_bytes(
        b'<?xml version="1.0"?>\n<uniprot xmlns="http://uniprot.org/uniprot">\n<entry id="x"/>\n</uniprot>\n'
    )
    with pytest.raises(InputError, match=r"uniprot\.xml:1: not UniRef XML: root element <uniprot>"):
        list(read_source(bad, "uniref_xml"))


def test_latin1_text_is_read_as_declared(tmp_path):
    xml = tmp_path / "latin1.xml"
    xml.write_bytes(OLD_XML.read_bytes().replace(b"Ranavirus", b"Ranavir\xe9", 1))
    assert len(list(records_of(uniref_blocks(xml)))) == 3


# ------------------------------------------------------------------ FASTA, Pfam-A, detection


def test_pfam_headers_detected_and_family_kept():
    assert detect_format(PFAM) == "pfam_fasta"
    records = list(records_of(read_source(PFAM)))
    assert [r[0] for r in records][:2] == [b"A0A0A0MT78_9CAUL/22-94", b"F0S5U5_PSESL/156-195"]
    assert [r[3] for r in records] == [b"family=PF10417.8"] * 2 + [b"family=PF00085.19"] * 2 + [b"family=PF00578.20"]
    assert len(records[0][1]) == 73 and [r[2] for r in records] == [1, 4, 6, 9, 12]


def test_pfam_format_forced_on_other_headers_names_the_line(tmp_path):
    fasta = tmp_path / "x.fa"
    fasta.write_text(PFAM.read_text().replace("F0S5U5.1 PF10417.8;1-cysPrx_C;", "no family here"))
    with pytest.raises(InputError, match=r"x\.fa:4: record 'F0S5U5_PSESL/156-195': not a Pfam-A FASTA header"):
        list(read_source(fasta, "pfam_fasta"))
    assert detect_format(fasta) == "pfam_fasta"  # the first header decides
    assert len(list(records_of(read_source(fasta, "fasta")))) == 5  # an override reads it as plain FASTA


TRICKY = [
    ">a desc\nMKV\nLA\n\n>b\r\nAC DE\r\n",
    "\n\n>x\nM\n>y\n>z\nKK",
    ">p one\nA>B\n>q\n  MK  \n",
]


@pytest.mark.parametrize("text", TRICKY)
@pytest.mark.parametrize("block", [3, 1 << 22])
def test_fast_fasta_reader_reads_what_biopython_reads(tmp_path, text, block, monkeypatch):
    path = tmp_path / "t.fa"
    path.write_text(text)
    monkeypatch.setattr("pmlm.data.formats.BLOCK_SIZE", block)
    ours = [(rid.decode(), seq.decode()) for rid, seq, _, _ in records_of(read_fasta_source(path))]
    theirs = [(title.split()[0], seq) for title, seq in SimpleFastaParser(io.StringIO(text))]
    assert ours == theirs


def test_fasta_lines_survive_block_boundaries(tmp_path, monkeypatch):
    path = tmp_path / "t.fa"
    path.write_text("".join(f">s{i}\n{'MKV' * (i % 7 + 1)}\nLA\n" for i in range(50)))
    monkeypatch.setattr("pmlm.data.formats.BLOCK_SIZE", 5)
    assert [line for _, _, line, _ in records_of(read_fasta_source(path))] == list(range(1, 150, 3))


# ------------------------------------------------------------------ publisher checksum listings


def test_metalink_and_md5sum_listings(tmp_path):
    metalink = tmp_path / "RELEASE.metalink"
    metalink.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<metalink version="3.0" xmlns="http://www.metalinker.org/">\n'
        '<files>\n<file name="uniref2018_03.tar.gz"><size>123</size><verification>'
        '<hash type="md5">0123456789ABCDEF0123456789abcdef</hash></verification>'
        '<resources><url type="ftp">ftp://example/uniref2018_03.tar.gz</url></resources></file>\n'
        '<file name="README"><size>5</size></file>\n</files>\n</metalink>\n'
    )
    assert published_checksums(metalink, "uniref2018_03.tar.gz") == {
        "md5": "0123456789abcdef0123456789abcdef",
        "size": "123",
    }
    with pytest.raises(InputError, match="no digest for 'uniref50.tar.gz'"):
        published_checksums(metalink, "uniref50.tar.gz")
    sums = tmp_path / "md5sums"
    sums.write_text("0123456789abcdef0123456789abcdef  Pfam-A.fasta.gz\n")
    assert published_checksums(sums, "Pfam-A.fasta.gz") == {"md5": "0123456789abcdef0123456789abcdef"}


def test_block_parser_matches_biopython_on_wrapped_records(tmp_path):
    """The numpy block parser (taken for plain wrapped FASTA) reads what Biopython reads."""
    import random

    from pmlm.data.columns import fasta_columns

    rng = random.Random(5)
    parts = []
    for i in range(300):
        seq = "".join(rng.choice("ACDEFGHIKLMNPQRSTVWYXBUZ*-acd") for _ in range(rng.randint(0, 150)))
        width = rng.choice([10, 60, 1000])
        lines = [seq[k : k + width] for k in range(0, len(seq), width)]
        blank = "\n" if rng.random() < 0.1 else ""
        desc = rng.choice(["", " desc", " n=3 Tax=Homo sapiens", " a>b"])
        parts.append(f">id{i}{desc}\n" + "".join(f"{line}\n{blank}" for line in lines))
    text = "".join(parts)
    path = tmp_path / "w.fa"
    path.write_text(text)
    assert fasta_columns(text.encode()) is not None  # the fast path is the one under test
    ours = [(rid.decode(), seq.decode()) for rid, seq, _, _ in records_of(read_fasta_source(path))]
    theirs = [(title.split()[0], seq) for title, seq in SimpleFastaParser(io.StringIO(text))]
    assert ours == theirs


def test_clean_block_cut_matches_biopython():
    """Ingest's bulk cut of an all-clean plain FASTA block writes '>ID' and the residues Biopython reads,
    and declines (for the normaliser) every block with a record it would have to repair or drop."""
    import random

    from pmlm.data.columns import clean_one_line_fasta
    from pmlm.data.normalise import STANDARD

    rng = random.Random(11)
    parts = []
    for i in range(300):
        seq = "".join(rng.choice("ACDEFGHIKLMNPQRSTVWYX") for _ in range(rng.randint(1, 150)))
        width = rng.choice([7, 60, 1000])
        rid = rng.choice([f"id{i}", f"UniRef50_{'A' * 40}{i}", f"a>b{i}"])  # longer than the 32-byte window too
        desc = rng.choice(["", " desc", " n=3 Tax=Homo sapiens", "   ", " a>b"])
        parts.append(f">{rid}{desc}\n" + "".join(f"{seq[k : k + width]}\n" for k in range(0, len(seq), width)))
    text = "".join(parts)
    for body in (text.encode(), text.encode().rstrip(b"\n")):  # a block ends with or without its newline
        cut = clean_one_line_fasta(body, 1, 1000, STANDARD)
        assert cut is not None
        theirs = list(SimpleFastaParser(io.StringIO(text)))
        assert cut[0].decode() == "".join(f">{title.split()[0]}\n{seq}\n" for title, seq in theirs)
        assert [i.decode() for i in cut[1]] == [title.split()[0] for title, _ in theirs]
        assert [s.decode() for s in cut[2]] == [seq for _, seq in theirs]
        assert cut[3].tolist() == [len(seq) for _, seq in theirs]
    for bad in ("ACDa", "AC*", "AC-D", "A CD", "ACU", "AC>D"):
        assert clean_one_line_fasta(f">x\nMK\n>y d\n{bad}\n".encode(), 1, 1000, STANDARD) is None, bad
    for body in (b">x\nMK\n", b">x\nMKV\n>y\n", b"> x\nMKV\n", b">x\nMKV\n\nMKV\n", b">x\r\nMKV\n"):
        assert clean_one_line_fasta(body, 3, 1000, STANDARD) is None, body
    assert clean_one_line_fasta(b">x\nMKVL\n", 1, 3, STANDARD) is None


def test_one_line_columns_match_the_record_path():
    """Tokenize's bulk parser gives the columns its record-by-record parser gives."""
    import numpy as np

    from pmlm.data.columns import one_line_columns
    from pmlm.data.shards import _record_columns

    body = b"".join(
        b">UniRef50_A%d members=%d taxon=%d cluster=UniRef50_A%d\n%s\n"
        % (i, 1 + i % 5, 9606 + i % 2, i - i % 3, b"MKVLAGC"[: 1 + i % 7] * 9)
        for i in range(500)
    )
    fast = one_line_columns(body)
    slow = _record_columns("x", body[1:].split(b"\n>"), 1)
    assert fast is not None and fast.from_header == slow.from_header == 500
    for a, b in zip(fast, slow):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
        else:
            assert a == b or a.equals(b)
