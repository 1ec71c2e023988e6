"""The paper config's sources, as published, through the workflow's data stage end to end.

config/paper.yaml with its URLs pointed at a loopback HTTP server (HTTPS for UniProt and Pfam, HTTP for TAPE, as
in the config; the same client code reads both) serving small files in the publishers' layouts: UniProt's nested
release archive with a RELEASE.metalink, Pfam-A FASTA, TAPE's tarballs. Snakemake then fetches (checking the
listed MD5), extracts uniref50.tar/uniref50.xml.gz without unpacking the outer archive, ingests UniRef XML and
Pfam-A FASTA, clusters with MMseqs2 and writes the shards. The FTP fallback (config/paper_ftp.yaml added after the
paper config) fetches the same UniProt and Pfam files from a loopback FTP server, checked the same way.
"""

import gzip
import hashlib
import json
import random
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd
import yaml
from archives import tar_bytes, uniprot_release_archive
from conftest import REPO, snakemake
from loopback_servers import ftp_server, static_http_server

from pmlm.data.uniref import document_head, document_tail, format_entry
from pmlm.tasks.tape import read_tape

RESIDUES = "ACDEFGHIKLMNPQRSTVWY"


def _families(rng: random.Random, families: int, per_family: int) -> list[str]:
    """Mutated copies (10 %) of a few templates, so MMseqs2 finds clusters."""
    out = []
    for _ in range(families):
        template = [rng.choice(RESIDUES) for _ in range(rng.randint(60, 160))]
        for _ in range(per_family):
            out.append("".join(c if rng.random() > 0.1 else rng.choice(RESIDUES) for c in template))
    return out


def publish(root: Path) -> dict:
    """Write the sources in their published layouts; returns what the test checks against."""
    rng = random.Random(7)
    seqs = _families(rng, 12, 10)
    seqs.append(seqs[0])  # an exact duplicate: dropped by ingest, counted
    xml = (
        document_head("2018_03")
        + "".join(format_entry(f"A{i:05d}", s, members=1 + i % 4, taxon=1000 + i % 3) for i, s in enumerate(seqs))
        + document_tail()
    )
    archive = uniprot_release_archive(root / "uniref2018_03.tar.gz", xml.encode()).read_bytes()
    (root / "RELEASE.metalink").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<metalink version="3.0" xmlns="http://www.metalinker.org/"><files>\n'
        f'<file name="uniref2018_03.tar.gz"><size>{len(archive)}</size><verification><hash type="md5">'
        f"{hashlib.md5(archive).hexdigest()}</hash></verification></file>\n</files></metalink>\n"
    )
    domains = _families(rng, 8, 12)
    pfam = "".join(
        f">D{i:04d}_BACSU/{1 + i}-{len(s) + i} D{i:04d}.1 PF{10000 + i % 8:05d}.{1 + i % 3};Fam{i % 8};\n"
        + "\n".join(s[k : k + 60] for k in range(0, len(s), 60))
        + "\n"
        for i, s in enumerate(domains)
    )
    (root / "Pfam-A.fasta.gz").write_bytes(gzip.compress(pfam.encode()))
    seq = "MKTAYIAKQR"
    tasks = {
        "proteinnet": ["train", "valid", "test"],
        "secondary_structure": ["train", "valid", "cb513", "casp12", "ts115"],
        "remote_homology": ["train", "valid", "test_fold_holdout", "test_superfamily_holdout", "test_family_holdout"],
    }
    record = {
        "primary": seq,
        "protein_length": len(seq),
        "tertiary": [[3.8 * i, 0, 0] for i in range(len(seq))],
        "valid_mask": [True] * len(seq),
        "ss3": [0, 1, 2] * 3 + [2],
        "fold_label": 3,
    }
    for task, splits in tasks.items():
        members = {f"{task}/{task}_{s}.json": json.dumps([dict(record, id=f"{task}_{s}")]).encode() for s in splits}
        (root / f"{task}.tar.gz").write_bytes(tar_bytes(members, "w:gz"))
    return {"entries": len(seqs), "domains": len(domains)}


def local_config(name: str, ftp: str, http: str, path: Path) -> Path:
    """config/<name> with each source's URLs pointed at the loopback server of their scheme (FTP, or HTTP for http
    and https), the same file names kept."""
    config = yaml.safe_load((REPO / "config" / name).read_text())
    for source in config["sources"].values():
        for key in ("url", "checksums_from"):
            if source.get(key):
                scheme = urlsplit(source[key]).scheme
                assert scheme in ("ftp", "http", "https"), source[key]
                base = ftp if scheme == "ftp" else http
                source[key] = f"{base}/{Path(urlsplit(source[key]).path).name}"
    for dataset in config.get("datasets", {}).values():
        dataset["shards"]["num_shards"] = 2
    if "run" in config:
        config["run"] = "paper_sources"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_publishers_archives_are_fetched_over_https_and_ftp_is_the_fallback():
    """UniProt's and EBI's archives over HTTPS (clusters block FTP far more often); config/paper_ftp.yaml names the
    same paths over FTP and nothing else."""
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["sources"]
    ftp = yaml.safe_load((REPO / "config" / "paper_ftp.yaml").read_text())["sources"]
    publishers = {"uniref50_2018_03": "ftp.uniprot.org", "pfam_a_31": "ftp.ebi.ac.uk"}
    assert ftp.keys() == publishers.keys()
    for name, host in publishers.items():
        assert set(ftp[name]) == {k for k in ("url", "checksums_from") if k in paper[name]}, name
        for key, url in ftp[name].items():
            https, fallback = urlsplit(paper[name][key]), urlsplit(url)
            assert (https.scheme, https.netloc) == ("https", host) and (fallback.scheme, fallback.netloc) == (
                "ftp",
                host,
            )
            assert https.path == fallback.path and https.path.startswith("/pub/databases/"), (https, fallback)
    assert not [s["url"] for s in paper.values() if s.get("url", "").startswith("ftp:")]


def test_paper_sources_through_the_data_stage(tmp_path):
    root = tmp_path / "published"
    root.mkdir()
    published = publish(root)
    work, fallback = tmp_path / "work", tmp_path / "fallback"
    members = [
        "resources/sources/tape_proteinnet/members/proteinnet/proteinnet_test.json",
        "resources/sources/tape_secondary_structure/members/secondary_structure/secondary_structure_cb513.json",
        "resources/sources/tape_remote_homology/members/remote_homology/remote_homology_test_fold_holdout.json",
    ]
    downloads = [
        "resources/sources/uniref50_2018_03/uniref2018_03.tar.gz",
        "resources/sources/pfam_a_31/Pfam-A.fasta.gz",
    ]
    with ftp_server(root) as ftp, static_http_server(root) as http:
        config = local_config("paper.yaml", ftp.url, http, tmp_path / "paper_local.yaml")
        over_ftp = local_config("paper_ftp.yaml", ftp.url, http, tmp_path / "paper_ftp_local.yaml")
        # the fallback: the same two archives over FTP, in a work folder of their own
        by_ftp = snakemake(*downloads, "--cores", "1", "-s", str(REPO / "Snakefile"), "--directory", str(fallback),
                           "--configfile", str(config), str(over_ftp))  # fmt: skip
        ftp_commands = [cmd for cmd in ftp.commands if cmd[0] == "RETR"]
        proc = snakemake(
            "data",
            *members,
            "--cores",
            "2",
            "-s",
            str(REPO / "Snakefile"),
            "--directory",
            str(work),
            "--configfile",
            str(config),
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert by_ftp.returncode == 0, by_ftp.stdout[-3000:] + by_ftp.stderr[-3000:]
    # the fallback fetched both archives (and the checksum listing) by FTP, checked the same way, to the same bytes
    assert sorted(Path(arg).name for _, arg in ftp_commands) == ["Pfam-A.fasta.gz", "RELEASE.metalink",
                                                                 "uniref2018_03.tar.gz"], ftp.commands  # fmt: skip
    assert "lists md5" in (fallback / "logs" / "fetch" / "uniref50_2018_03" / "uniref2018_03.tar.gz.log").read_text()
    for download in downloads:
        assert (
            (fallback / download).read_bytes()
            == (work / download).read_bytes()
            == (root / Path(download).name).read_bytes()
        )

    # only the member was written out of the nested archive; its download was checked against the listing
    uniref = work / "resources" / "sources" / "uniref50_2018_03"
    assert sorted(p.name for p in uniref.rglob("*") if p.is_file()) == ["uniref2018_03.tar.gz", "uniref50.xml.gz"]
    assert "lists md5" in (work / "logs" / "fetch" / "uniref50_2018_03" / "uniref2018_03.tar.gz.log").read_text()

    data = work / "results" / "paper_sources" / "data"
    stats = json.loads((data / "uniref50" / "ingest_stats.json").read_text())
    assert stats["formats"] == ["uniref_xml"] and stats["read"] == published["entries"]
    assert stats["dropped"] == {"duplicate_sequence": 1} and stats["kept"] + stats["dropped_total"] == stats["read"]
    shards = pd.concat([pd.read_parquet(data / "uniref50" / "shards" / side) for side in ("train", "valid")])
    assert len(shards) == stats["kept"] and shards["members"].between(1, 4).all()
    assert set(shards["taxon_id"]) <= {1000, 1001, 1002} and shards["family"].isna().all()
    assert shards["id"].str.startswith("UniRef50_A").all()

    pfam_stats = json.loads((data / "pfam" / "ingest_stats.json").read_text())
    assert pfam_stats["formats"] == ["pfam_fasta"] and pfam_stats["read"] == published["domains"]
    pfam = pd.concat([pd.read_parquet(data / "pfam" / "shards" / side) for side in ("train", "valid")])
    assert pfam["family"].str.fullmatch(r"PF1000[0-7]\.[1-3]").all() and pfam["members"].isna().all()

    for member, task in zip(members, ("proteinnet", "secondary_structure", "remote_homology")):
        (record,) = read_tape(work / member, task)
        assert record.primary == "MKTAYIAKQR"
