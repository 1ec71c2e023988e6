"""Tests for ``pmlm fetch``: resume, retries, checksums and atomic output against real loopback servers."""

from __future__ import annotations

import hashlib
import random

import pytest
from loopback_servers import Behaviour, ftp_server, http_server

from pmlm import cli
from pmlm.data.fetch import fetch, redact
from pmlm.errors import ConfigError, DownloadError

PAYLOAD = random.Random(0).randbytes(200_000)
SHA = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()
FAST = {"backoff": 0.01, "timeout": 5.0}  # tiny back-off keeps retry tests quick


def _part(dest):
    return dest.with_name(dest.name + ".part")


# ----------------------------------------------------------------------------------------- http


def test_http_resumes_after_dropped_connections(tmp_path):
    dest = tmp_path / "out" / "data.bin"
    cut = 30_000
    seen = []
    with http_server(Behaviour(PAYLOAD, drop_first=3, cut_after=cut)) as srv:
        fetch(srv.url, dest, sha256=SHA, progress=lambda done, total: seen.append((done, total)), **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert not _part(dest).exists()
    assert [r.get("Range") for r in srv.requests] == [None, f"bytes={cut}-", f"bytes={2 * cut}-", f"bytes={3 * cut}-"]
    assert srv.bytes_served == len(PAYLOAD)  # nothing sent twice
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD))


def test_progress_resets_the_retry_budget(tmp_path):
    # more drops than retries, but each one moves the download forward
    dest = tmp_path / "data.bin"
    with http_server(Behaviour(PAYLOAD, drop_first=4, cut_after=10_000)) as srv:
        fetch(srv.url, dest, sha256=SHA, retries=1, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert len(srv.requests) == 5


def test_http_server_ignoring_range_restarts_from_zero(tmp_path):
    dest = tmp_path / "data.bin"
    with http_server(Behaviour(PAYLOAD, drop_first=1, cut_after=50_000, ignore_range=True)) as srv:
        fetch(srv.url, dest, sha256=SHA, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert srv.requests[1].get("Range") == "bytes=50000-"
    assert srv.bytes_served == 50_000 + len(PAYLOAD)


def test_no_progress_gives_up_after_retries_and_keeps_the_part(tmp_path):
    dest = tmp_path / "data.bin"
    with (
        http_server(Behaviour(PAYLOAD, drop_first=100, cut_after=1_000, ignore_range=True)) as srv,
        pytest.raises(DownloadError, match="giving up after 3 failed attempts"),
    ):
        fetch(srv.url, dest, retries=2, **FAST)
    assert len(srv.requests) == 3
    assert not dest.exists()
    assert _part(dest).read_bytes() == PAYLOAD[:1_000]


def test_http_wrong_bytes_fail_checksum_and_leave_nothing(tmp_path):
    dest = tmp_path / "data.bin"
    with http_server(Behaviour(PAYLOAD, wrong_bytes=True)) as srv, pytest.raises(DownloadError) as info:
        fetch(srv.url, dest, sha256=SHA, **FAST)
    actual = hashlib.sha256(bytes(x ^ 0xFF for x in PAYLOAD)).hexdigest()
    message = str(info.value)
    assert srv.url in message and SHA in message and actual in message
    assert not dest.exists() and not _part(dest).exists()
    assert len(srv.requests) == 1


def test_http_404_fails_at_once(tmp_path):
    dest = tmp_path / "data.bin"
    with http_server(Behaviour(PAYLOAD)) as srv, pytest.raises(DownloadError, match="HTTP 404"):
        fetch(srv.url + ".missing", dest, retries=5, backoff=10.0)
    assert len(srv.requests) == 1
    assert not dest.exists() and not _part(dest).exists()


def test_http_5xx_is_retried(tmp_path):
    dest = tmp_path / "data.bin"
    with http_server(Behaviour(PAYLOAD, statuses=[500, 503])) as srv:
        fetch(srv.url, dest, md5=MD5, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert len(srv.requests) == 3


def test_existing_part_from_an_interrupted_run_is_resumed(tmp_path):
    dest = tmp_path / "data.bin"
    have = 123_456
    _part(dest).write_bytes(PAYLOAD[:have])
    with http_server(Behaviour(PAYLOAD)) as srv:
        fetch(srv.url, dest, sha256=SHA, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert srv.requests[0].get("Range") == f"bytes={have}-"
    assert srv.bytes_served == len(PAYLOAD) - have


def test_complete_part_answered_416_is_verified_without_download(tmp_path):
    dest = tmp_path / "data.bin"
    _part(dest).write_bytes(PAYLOAD)
    with http_server(Behaviour(PAYLOAD)) as srv:
        fetch(srv.url, dest, sha256=SHA, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert len(srv.requests) == 1 and srv.bytes_served == 0


def test_stale_part_with_bad_checksum_is_fetched_again_from_zero(tmp_path):
    dest = tmp_path / "data.bin"
    _part(dest).write_bytes(b"\0" * 5_000)  # left over from an older version of the file
    with http_server(Behaviour(PAYLOAD)) as srv:
        fetch(srv.url, dest, sha256=SHA, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert [r.get("Range") for r in srv.requests] == ["bytes=5000-", None]


def test_misplaced_content_range_restarts(tmp_path):
    dest = tmp_path / "data.bin"
    with http_server(Behaviour(PAYLOAD, drop_first=1, cut_after=40_000, misplaced_ranges=1)) as srv:
        fetch(srv.url, dest, sha256=SHA, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert [r.get("Range") for r in srv.requests] == [None, "bytes=40000-", None]


def test_stalled_response_times_out_and_resumes(tmp_path):
    dest = tmp_path / "data.bin"
    with http_server(Behaviour(PAYLOAD, stall_first=1, cut_after=70_000, stall_s=5.0)) as srv:
        fetch(srv.url, dest, sha256=SHA, backoff=0.01, timeout=0.3)
    assert dest.read_bytes() == PAYLOAD
    assert srv.requests[1].get("Range") == "bytes=70000-"


def test_existing_dest_is_kept_when_it_matches_and_replaced_when_not(tmp_path):
    dest = tmp_path / "data.bin"
    dest.write_bytes(PAYLOAD)
    with http_server(Behaviour(PAYLOAD)) as srv:
        fetch(srv.url, dest, sha256=SHA, **FAST)
        assert srv.requests == []
        dest.write_bytes(b"old contents")
        fetch(srv.url, dest, sha256=SHA, **FAST)
        assert len(srv.requests) == 1
        fetch(srv.url, dest, **FAST)  # no checksum: an existing file counts as done
        assert len(srv.requests) == 1
    assert dest.read_bytes() == PAYLOAD


# ----------------------------------------------------------------------------------------- file


def test_file_url_with_checksums(tmp_path):
    src = tmp_path / "src dir" / "data.bin"
    src.parent.mkdir()
    src.write_bytes(PAYLOAD)
    url = src.as_uri()
    dest = tmp_path / "a.bin"
    assert fetch(url, dest, sha256=SHA) == dest
    assert dest.read_bytes() == PAYLOAD
    both = tmp_path / "b.bin"
    fetch(url, both, md5=MD5.upper(), sha256=SHA)
    assert both.read_bytes() == PAYLOAD

    for kwargs in ({"sha256": "0" * 64}, {"md5": "0" * 32}):
        bad = tmp_path / "bad.bin"
        with pytest.raises(DownloadError, match="checksum mismatch"):
            fetch(url, bad, **kwargs)
        assert not bad.exists() and not _part(bad).exists()


def test_file_url_missing_source(tmp_path):
    dest = tmp_path / "x.bin"
    with pytest.raises(DownloadError, match="cannot read"):
        fetch((tmp_path / "nope.bin").as_uri(), dest)
    assert not dest.exists() and not _part(dest).exists()


def test_bad_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unsupported URL scheme"):
        fetch("gopher://example/x", tmp_path / "x")
    with pytest.raises(ConfigError, match="64 hexadecimal"):
        fetch("file:///x", tmp_path / "x", sha256="abc")
    with pytest.raises(ConfigError, match="retries"):
        fetch("file:///x", tmp_path / "x", retries=-1)


def test_redact_hides_passwords():
    assert redact("ftp://me:secret@host:21/a/b") == "ftp://me:***@host:21/a/b"
    assert redact("https://host/a") == "https://host/a"


# ----------------------------------------------------------------------------------------- ftp


def test_ftp_download_and_resume_with_rest(tmp_path):
    served = tmp_path / "served" / "pub"
    served.mkdir(parents=True)
    (served / "data.bin").write_bytes(PAYLOAD)
    with ftp_server(tmp_path / "served") as ftp:
        url = f"{ftp.url}/pub/data.bin"
        full = tmp_path / "full.bin"
        fetch(url, full, sha256=SHA, **FAST)
        assert full.read_bytes() == PAYLOAD
        assert not any(cmd == "REST" for cmd, _ in ftp.commands)

        ftp.commands.clear()
        resumed = tmp_path / "resumed.bin"
        _part(resumed).write_bytes(PAYLOAD[:77_777])
        fetch(url, resumed, sha256=SHA, **FAST)
        assert resumed.read_bytes() == PAYLOAD
        assert ("REST", "77777") in ftp.commands

        ftp.commands.clear()
        missing = tmp_path / "missing.bin"
        with pytest.raises(DownloadError, match="550"):
            fetch(f"{ftp.url}/pub/nope.bin", missing, **FAST)
        assert sum(cmd == "RETR" for cmd, _ in ftp.commands) == 1
        assert not missing.exists() and not _part(missing).exists()


# ----------------------------------------------------------------------------------------- CLI


def test_cli_bad_checksum_is_one_line(tmp_path, capsys):
    src = tmp_path / "data.bin"
    src.write_bytes(PAYLOAD)
    dest = tmp_path / "out.bin"
    code = cli.main(["fetch", src.as_uri(), "-o", str(dest), "--sha256", "f" * 64])
    err = capsys.readouterr().err
    assert code == 2
    # progress lines may come first (the whole file arrived); the error itself is the last line, and one line
    *progress, last = err.splitlines()
    assert last.startswith("pmlm fetch: error:") and "checksum mismatch" in last and "Traceback" not in err, err
    assert all(line.startswith("pmlm fetch file://") for line in progress), err
    assert not dest.exists() and not _part(dest).exists()


def test_cli_success(tmp_path, capsys):
    src = tmp_path / "data.bin"
    src.write_bytes(PAYLOAD)
    dest = tmp_path / "out.bin"
    assert cli.main(["fetch", src.as_uri(), "-o", str(dest), "--sha256", SHA, "--md5", MD5]) == 0
    assert dest.read_bytes() == PAYLOAD
    assert f"({len(PAYLOAD)} bytes, md5 {MD5}, sha256 {SHA})" in capsys.readouterr().err


@pytest.mark.parametrize("listed, code", [(MD5, 0), ("0" * 32, 2)])
def test_cli_publisher_checksum_listing(tmp_path, capsys, listed, code):
    """--checksums-from: the digest of the file as the publisher's RELEASE.metalink lists it."""
    src = tmp_path / "uniref2018_03.tar.gz"
    src.write_bytes(PAYLOAD)
    metalink = tmp_path / "RELEASE.metalink"
    metalink.write_text(
        f'<?xml version="1.0"?>\n<metalink version="3.0" xmlns="http://www.metalinker.org/"><files>'
        f'<file name="uniref2018_03.tar.gz"><size>{len(PAYLOAD)}</size><verification>'
        f'<hash type="md5">{listed}</hash></verification></file></files></metalink>\n'
    )
    dest = tmp_path / "out" / "uniref2018_03.tar.gz"
    assert cli.main(["fetch", src.as_uri(), "-o", str(dest), "--checksums-from", metalink.as_uri()]) == code
    err = capsys.readouterr().err
    assert f"lists md5 {listed}" in err
    assert dest.exists() == (code == 0) and sorted(p.name for p in dest.parent.iterdir()) == (
        ["uniref2018_03.tar.gz"] if code == 0 else []
    )
    if code:
        assert err.strip().splitlines()[-1].startswith("pmlm fetch: error:") and "checksum mismatch" in err
