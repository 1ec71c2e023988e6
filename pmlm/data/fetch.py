"""Download one source (http, https, ftp or file URL) to a local path, resuming and verifying checksums.

Data lands in ``DEST.part`` beside ``DEST`` and is renamed into place only once complete and verified,
so a failed or interrupted run never leaves a partial ``DEST`` and the next run resumes the ``.part``.
The transfer itself (protocols, resume, retries) is :mod:`pmlm.data.transfer`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pmlm.data.checksums import published_checksums
from pmlm.data.transfer import FetchOptions, PartFile, ProgressFn, download, local_path, log, redact
from pmlm.errors import ConfigError, DownloadError
from pmlm.files import file_digests

SCHEMES = ("http", "https", "ftp", "file")
# hex digest length per supported algorithm, to reject a truncated or mistyped checksum up front
DIGEST_HEX_LEN = {"md5": 32, "sha256": 64}
# the digest always computed and logged, whether or not one was expected
LOGGED_DIGEST = "sha256"


def _parse_digests(md5: str | None, sha256: str | None) -> dict[str, str]:
    expected: dict[str, str] = {}
    for name, value in (("md5", md5), ("sha256", sha256)):
        if value is None:
            continue
        value = value.strip().lower()
        if len(value) != DIGEST_HEX_LEN[name] or any(c not in "0123456789abcdef" for c in value):
            raise ConfigError(f"--{name} must be {DIGEST_HEX_LEN[name]} hexadecimal digits, got {value!r}")
        expected[name] = value
    return expected


def _mismatches(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    return [
        f"{name} expected {expected[name]}, got {actual[name]}"
        for name in sorted(expected)
        if actual[name] != expected[name]
    ]


def fetch(
    url: str,
    dest: str | os.PathLike,
    *,
    md5: str | None = None,
    sha256: str | None = None,
    checksums_from: str | None = None,
    retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 60.0,
    progress: ProgressFn | None = None,
) -> Path:
    """Download ``url`` to ``dest`` atomically, resuming ``dest.part`` and checking the given digests.

    ``checksums_from``: the publisher's checksum listing (RELEASE.metalink or md5sum output) naming this file;
    its digests are checked like ``md5`` / ``sha256`` (and must agree with them where both are given).
    An existing ``dest`` is kept when it matches the given digests (or when none are given).
    Raises :class:`DownloadError` for a permanent failure, a checksum mismatch or exhausted retries.
    """
    opts = FetchOptions(retries=retries, backoff=backoff, timeout=timeout)
    if checksums_from:
        md5, sha256 = _listed_digests(url, Path(dest), checksums_from, md5, sha256, opts)
    expected = _parse_digests(md5, sha256)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"{redact(url)}: unsupported URL scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    if scheme == "file":
        local_path(url)  # reject a remote file URL before touching anything
    dest = Path(dest)
    if dest.exists() and not dest.is_file():
        raise ConfigError(f"{dest}: the destination exists and is not a regular file")
    try:
        return _fetch_to(url, dest, expected, opts, progress)
    except OSError as exc:
        # local file-system trouble (permissions, missing mount): one line naming the path
        raise DownloadError(f"{exc.filename or dest}: {exc.strerror or exc}") from None


def _fetch_to(url: str, dest: Path, expected: dict[str, str], opts: FetchOptions, progress: ProgressFn | None) -> Path:
    algorithms = sorted({LOGGED_DIGEST, *expected})
    if dest.is_file():
        if not expected:
            log(f"{dest} already present (no checksum given); not fetching")
            return dest
        problems = _mismatches(expected, file_digests(dest, algorithms, opts.chunk_size))
        if not problems:
            log(f"{dest} already present and verified; not fetching")
            return dest
        log(f"{dest} exists but {'; '.join(problems)}; fetching again")

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = PartFile(dest.with_name(dest.name + ".part"), algorithms, opts.chunk_size)
    try:
        resumed = part.size > 0
        while True:
            download(url, part, opts, progress)
            digests = part.hexdigests()
            problems = _mismatches(expected, digests)
            if not problems:
                break
            if resumed:
                # the earlier .part may belong to an older version of the file; one clean try decides
                log(f"{redact(url)}: {'; '.join(problems)} after resuming {part.path}; fetching again from zero")
                part.restart()
                resumed = False
                continue
            part.abandon(delete=True)
            raise DownloadError(f"{redact(url)}: checksum mismatch: {'; '.join(problems)}")
        part.close()
        os.replace(part.path, dest)
    except BaseException:
        # keep received bytes for a later resume, but leave no empty .part behind
        part.abandon(delete=part.size == 0)
        raise
    summary = ", ".join(f"{name} {digests[name]}" for name in algorithms)
    log(f"fetched {redact(url)} -> {dest} ({part.size} bytes, {summary})")
    return dest


def _listed_digests(
    url: str, dest: Path, checksums_from: str, md5: str | None, sha256: str | None, opts: FetchOptions
) -> tuple[str | None, str | None]:
    """``md5`` / ``sha256`` completed from the publisher's listing at ``checksums_from`` (fetched fresh beside
    ``dest`` each time, as it may change with the file); a given digest must agree with the listed one."""
    listing = dest.with_name(dest.name + ".checksums")
    fetch(checksums_from, listing, retries=opts.retries, backoff=opts.backoff, timeout=opts.timeout)
    try:
        entry = published_checksums(listing, Path(urlsplit(url).path).name)
    finally:
        listing.unlink(missing_ok=True)
    for algo, given in (("md5", md5), ("sha256", sha256)):
        if given and entry.get(algo) and given.lower() != entry[algo]:
            raise ConfigError(f"--{algo} {given} differs from {redact(checksums_from)}: {entry[algo]}")
    log(f"{redact(checksums_from)} lists {', '.join(f'{k} {v}' for k, v in sorted(entry.items()))}")
    return md5 or entry.get("md5"), sha256 or entry.get("sha256")
