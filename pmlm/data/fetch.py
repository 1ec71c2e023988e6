"""Download one source (http, https, ftp or file URL) to a local path, resuming and verifying checksums.

Data lands in ``DEST.part`` beside ``DEST`` and is renamed into place only once complete and verified,
so a failed or interrupted run never leaves a partial ``DEST`` and the next run resumes the ``.part``.
"""

from __future__ import annotations

import argparse
import email.utils
import ftplib
import hashlib
import http.client
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable
from urllib.parse import unquote, urlsplit, urlunsplit

from pmlm import __version__
from pmlm.errors import ConfigError, DownloadError
from pmlm.progress import Progress

# progress(bytes_in_part_file, total_bytes_or_None), called after every chunk
ProgressFn = Callable[[int, "int | None"], None]

SCHEMES = ("http", "https", "ftp", "file")
# hex digest length per supported algorithm, to reject a truncated or mistyped checksum up front
DIGEST_HEX_LEN = {"md5": 32, "sha256": 64}
# the digest always computed and logged, whether or not one was expected
LOGGED_DIGEST = "sha256"
# 4xx statuses that mean "try again later" rather than "this will never work"
RETRYABLE_4XX = frozenset({408, 429})
# FTP replies to REST from a server that cannot resume (command unknown / not implemented for that arg)
FTP_REST_UNSUPPORTED = ("500", "501", "502", "504")

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class FetchOptions:
    """How hard to try; one instance per :func:`fetch` call."""

    retries: int = 5
    """Failed attempts retried after the first; an attempt that extends the ``.part`` file resets the count."""
    backoff: float = 1.0
    """Seconds to wait before the first retry; doubles after each further consecutive failure."""
    max_backoff: float = 300.0
    """Upper bound on one wait, including a server's ``Retry-After``."""
    timeout: float = 60.0
    """Socket timeout in seconds for connecting and for each read."""
    chunk_size: int = 1 << 20
    """Bytes read and written per step."""

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"fetch retries must be an integer >= 0, got {self.retries!r}")
        if self.backoff < 0:
            raise ConfigError(f"fetch backoff must be >= 0 seconds, got {self.backoff!r}")
        if self.max_backoff < self.backoff:
            raise ConfigError(
                f"fetch max_backoff ({self.max_backoff!r}) must be >= backoff ({self.backoff!r})"
            )
        if not self.timeout > 0:
            raise ConfigError(f"fetch timeout must be > 0 seconds, got {self.timeout!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size <= 0:
            raise ConfigError(f"fetch chunk_size must be a positive integer, got {self.chunk_size!r}")


class _Transient(Exception):
    """A failure worth retrying; ``retry_after`` is the server's requested wait in seconds, if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


class _PartFile:
    """``DEST.part`` opened for appending, with running digests of every byte in it."""

    def __init__(self, path: Path, algorithms: list[str], chunk_size: int):
        self.path = path
        self._algorithms = algorithms
        self._hashers = {name: hashlib.new(name) for name in algorithms}
        self.size = 0
        if path.exists():
            # an interrupted earlier run: its bytes count towards the digests of the whole file
            with open(path, "rb") as fh:
                while block := fh.read(chunk_size):
                    self._update(block)
        self._fh: BinaryIO | None = open(path, "ab")

    def _update(self, data: bytes) -> None:
        for hasher in self._hashers.values():
            hasher.update(data)
        self.size += len(data)

    def write(self, data: bytes) -> None:
        assert self._fh is not None
        try:
            self._fh.write(data)
        except OSError as exc:
            # a local disk problem (full, read-only) is not a network hiccup: never retried
            raise DownloadError(f"{self.path}: cannot write: {exc.strerror or exc}") from None
        self._update(data)

    def restart(self) -> None:
        """Throw away everything received so far."""
        assert self._fh is not None
        self._fh.truncate(0)
        self._hashers = {name: hashlib.new(name) for name in self._algorithms}
        self.size = 0

    def hexdigests(self) -> dict[str, str]:
        return {name: hasher.hexdigest() for name, hasher in self._hashers.items()}

    def close(self) -> None:
        """Flush to disk so the rename that follows never exposes unwritten data."""
        if self._fh is None:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None

    def abandon(self, delete: bool) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if delete:
            self.path.unlink(missing_ok=True)


def _parse_digests(md5: str | None, sha256: str | None) -> dict[str, str]:
    expected: dict[str, str] = {}
    for name, value in (("md5", md5), ("sha256", sha256)):
        if value is None:
            continue
        value = value.strip().lower()
        if len(value) != DIGEST_HEX_LEN[name] or any(c not in "0123456789abcdef" for c in value):
            raise ConfigError(
                f"--{name} must be {DIGEST_HEX_LEN[name]} hexadecimal digits, got {value!r}"
            )
        expected[name] = value
    return expected


def _hash_file(path: Path, algorithms: list[str], chunk_size: int) -> dict[str, str]:
    hashers = {name: hashlib.new(name) for name in algorithms}
    with open(path, "rb") as fh:
        while block := fh.read(chunk_size):
            for hasher in hashers.values():
                hasher.update(block)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


def _mismatches(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    return [f"{name} expected {expected[name]}, got {actual[name]}"
            for name in sorted(expected) if actual[name] != expected[name]]


# ----------------------------------------------------------------------------------------- http(s)

def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _copy_stream(read: Callable[[int], bytes], part: _PartFile, total: int | None,
                 opts: FetchOptions, progress: ProgressFn | None) -> None:
    """Append ``read`` to ``part`` until EOF; a stream ending before ``total`` bytes is a short read."""
    while True:
        try:
            block = read(opts.chunk_size)
        except http.client.IncompleteRead as exc:
            if exc.partial:
                part.write(exc.partial)
            raise _Transient(f"connection closed early at byte {part.size} of {total}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(f"read failed at byte {part.size}: {exc}") from None
        if not block:
            break
        part.write(block)
        if progress is not None:
            progress(part.size, total)
    if total is not None and part.size < total:
        raise _Transient(f"short read: got {part.size} of {total} bytes")


def _fetch_http(url: str, part: _PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
    offset = part.size
    # identity encoding keeps byte offsets meaningful for Range and Content-Length
    headers = {"User-Agent": f"pmlm/{__version__}", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=opts.timeout)
    except urllib.error.HTTPError as exc:
        status, reason, reply_headers = exc.code, exc.reason, exc.headers
        exc.close()
        if status == 416 and offset:
            match = _UNSATISFIED_RANGE.match(reply_headers.get("Content-Range", "") or "")
            if match and int(match.group(1)) == offset:
                return  # the part file already holds the whole resource
            part.restart()
            raise _Transient(f"HTTP 416 for a resume at byte {offset}; restarting from zero") from None
        if status in RETRYABLE_4XX or status >= 500:
            raise _Transient(f"HTTP {status} {reason}", _retry_after(reply_headers)) from None
        raise DownloadError(f"{redact(url)}: HTTP {status} {reason}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            raise DownloadError(f"{redact(url)}: {exc.reason}") from None
        raise _Transient(f"cannot connect: {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Transient(f"request failed: {exc}") from None

    with response:
        status = response.status
        if status == 206:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", "") or "")
            if not match:
                part.restart()
                raise _Transient("HTTP 206 without a usable Content-Range; restarting from zero")
            start, end, size = match.groups()
            if int(start) != offset:
                part.restart()
                raise _Transient(f"server resumed at byte {start}, not {offset}; restarting from zero")
            total = int(size) if size != "*" else int(end) + 1
        elif status == 200:
            if offset:
                _log(f"{redact(url)}: server ignored the Range request; restarting from zero")
                part.restart()
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.strip().isdigit() else None
        else:
            raise DownloadError(f"{redact(url)}: unexpected HTTP {status} {response.reason}")
        # read1 returns whatever one socket read brings, so a timeout never discards buffered bytes
        _copy_stream(getattr(response, "read1", response.read), part, total, opts, progress)


# ----------------------------------------------------------------------------------------- ftp

def _fetch_ftp(url: str, part: _PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ConfigError(f"{redact(url)}: an ftp URL needs a host")
    # per RFC 1738 each path segment is a CWD from the login directory, the last one the file
    *dirs, name = [unquote(s) for s in parts.path.split("/")[1:]] or [""]
    if not name:
        raise ConfigError(f"{redact(url)}: the URL names a directory, not a file")
    user = unquote(parts.username) if parts.username else "anonymous"
    password = unquote(parts.password or "") if parts.username else "anonymous@"

    ftp = ftplib.FTP(timeout=opts.timeout)
    try:
        ftp.connect(parts.hostname, parts.port or ftplib.FTP_PORT)
        ftp.login(user, password)
        for directory in dirs:
            if directory:
                ftp.cwd(directory)
        ftp.voidcmd("TYPE I")  # SIZE and REST count bytes only in binary mode
        try:
            total = ftp.size(name)
        except ftplib.error_perm:
            total = None  # SIZE is an extension; a missing file is reported by RETR below
        if total is not None and part.size >= total:
            if part.size == total:
                return
            part.restart()
        offset = part.size

        def on_block(block: bytes) -> None:
            part.write(block)
            if progress is not None:
                progress(part.size, total)

        try:
            ftp.retrbinary(f"RETR {name}", on_block, blocksize=opts.chunk_size, rest=offset or None)
        except ftplib.error_perm as exc:
            if offset and str(exc)[:3] in FTP_REST_UNSUPPORTED:
                part.restart()
                raise _Transient(f"server cannot resume ({exc}); restarting from zero") from None
            raise
        if total is not None and part.size < total:
            raise _Transient(f"short read: got {part.size} of {total} bytes")
    except ftplib.error_perm as exc:
        raise DownloadError(f"{redact(url)}: FTP {exc}") from None
    except (ftplib.error_temp, ftplib.error_reply, ftplib.error_proto, EOFError, OSError) as exc:
        raise _Transient(f"FTP {type(exc).__name__}: {exc}") from None
    finally:
        ftp.close()


# ----------------------------------------------------------------------------------------- file

def _local_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(f"{url}: file URLs must name a local path (file:///abs/path or file:rel/path)")
    return Path(urllib.request.url2pathname(parts.path))


def _fetch_file(url: str, part: _PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
    source = _local_path(url)
    # a local copy is cheap, so never trust a leftover .part
    part.restart()
    try:
        fh = open(source, "rb")
    except OSError as exc:
        raise DownloadError(f"{url}: cannot read {source}: {exc.strerror or exc}") from None
    with fh:
        total = os.fstat(fh.fileno()).st_size
        try:
            while block := fh.read(opts.chunk_size):
                part.write(block)
                if progress is not None:
                    progress(part.size, total)
        except OSError as exc:
            raise DownloadError(f"{url}: read failed at byte {part.size}: {exc}") from None


_HANDLERS = {"http": _fetch_http, "https": _fetch_http, "ftp": _fetch_ftp, "file": _fetch_file}


# ----------------------------------------------------------------------------------------- driver

def _download(url: str, part: _PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
    """Run attempts until one completes; only consecutive attempts that add no new bytes use up retries."""
    handler = _HANDLERS[urlsplit(url).scheme.lower()]
    failures = 0
    furthest = part.size
    while True:
        try:
            handler(url, part, opts, progress)
            return
        except _Transient as exc:
            if part.size > furthest:
                furthest = part.size
                failures = 0
            failures += 1
            if failures > opts.retries:
                kept = f"; {part.size} bytes kept in {part.path} for a later resume" if part.size else ""
                raise DownloadError(
                    f"{redact(url)}: giving up after {failures} failed attempts in a row: {exc}{kept}"
                ) from None
            delay = min(opts.backoff * 2 ** (failures - 1), opts.max_backoff)
            if exc.retry_after is not None:
                delay = max(delay, min(exc.retry_after, opts.max_backoff))
            _log(f"{redact(url)}: {exc}; retry {failures}/{opts.retries} in {delay:.1f} s")
            time.sleep(delay)


def fetch(url: str, dest: str | os.PathLike, *, md5: str | None = None, sha256: str | None = None,
          retries: int = 5, backoff: float = 1.0, timeout: float = 60.0,
          progress: ProgressFn | None = None) -> Path:
    """Download ``url`` to ``dest`` atomically, resuming ``dest.part`` and checking the given digests.

    An existing ``dest`` is kept when it matches the given digests (or when none are given).
    Raises :class:`DownloadError` for a permanent failure, a checksum mismatch or exhausted retries.
    """
    opts = FetchOptions(retries=retries, backoff=backoff, timeout=timeout)
    expected = _parse_digests(md5, sha256)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"{redact(url)}: unsupported URL scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    if scheme == "file":
        _local_path(url)  # reject a remote file URL before touching anything
    dest = Path(dest)
    if dest.exists() and not dest.is_file():
        raise ConfigError(f"{dest}: the destination exists and is not a regular file")
    try:
        return _fetch_to(url, dest, expected, opts, progress)
    except OSError as exc:
        # local file-system trouble (permissions, missing mount): one line naming the path
        raise DownloadError(f"{exc.filename or dest}: {exc.strerror or exc}") from None


def _fetch_to(url: str, dest: Path, expected: dict[str, str], opts: FetchOptions,
              progress: ProgressFn | None) -> Path:
    algorithms = sorted({LOGGED_DIGEST, *expected})
    if dest.is_file():
        if not expected:
            _log(f"{dest} already present (no checksum given); not fetching")
            return dest
        problems = _mismatches(expected, _hash_file(dest, algorithms, opts.chunk_size))
        if not problems:
            _log(f"{dest} already present and verified; not fetching")
            return dest
        _log(f"{dest} exists but {'; '.join(problems)}; fetching again")

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _PartFile(dest.with_name(dest.name + ".part"), algorithms, opts.chunk_size)
    try:
        resumed = part.size > 0
        while True:
            _download(url, part, opts, progress)
            digests = part.hexdigests()
            problems = _mismatches(expected, digests)
            if not problems:
                break
            if resumed:
                # the earlier .part may belong to an older version of the file; one clean try decides
                _log(f"{redact(url)}: {'; '.join(problems)} after resuming {part.path}; "
                     "fetching again from zero")
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
    _log(f"fetched {redact(url)} -> {dest} ({part.size} bytes, {summary})")
    return dest


# ----------------------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = FetchOptions()
    parser.add_argument("url", help="source URL: http://, https://, ftp:// or file://")
    parser.add_argument("-o", "--output", dest="dest", required=True, type=Path,
                        help="destination file; data is staged in DEST.part and renamed when verified")
    parser.add_argument("--md5", help="expected MD5 digest (32 hex digits)")
    parser.add_argument("--sha256", help="expected SHA-256 digest (64 hex digits)")
    parser.add_argument("--checksums-from", metavar="URL",
                        help="the publisher's checksum listing (RELEASE.metalink or md5sum output) naming this file; "
                             "its digest is checked like --md5 / --sha256")
    parser.add_argument("--retries", type=int, default=defaults.retries,
                        help="retries after failed attempts that made no progress (default: %(default)s)")
    parser.add_argument("--backoff", type=float, default=defaults.backoff,
                        help="seconds before the first retry, doubling each time (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=defaults.timeout,
                        help="socket timeout in seconds (default: %(default)s)")
    parser.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                        help="off a terminal, a progress line this often (default: %(default)s)")


def _listed_digests(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """--md5 / --sha256, completed from the publisher's listing when --checksums-from is given."""
    if not args.checksums_from:
        return args.md5, args.sha256
    from pmlm.data.checksums import published_checksums

    listing = args.dest.with_name(args.dest.name + ".checksums")
    fetch(args.checksums_from, listing, retries=args.retries, backoff=args.backoff, timeout=args.timeout)
    try:
        entry = published_checksums(listing, Path(urlsplit(args.url).path).name)
    finally:
        listing.unlink(missing_ok=True)  # fetched fresh each time: it may change with the file
    for algo, given in (("md5", args.md5), ("sha256", args.sha256)):
        if given and entry.get(algo) and given.lower() != entry[algo]:
            raise ConfigError(f"--{algo} {given} differs from {redact(args.checksums_from)}: {entry[algo]}")
    _log(f"{redact(args.checksums_from)} lists {', '.join(f'{k} {v}' for k, v in sorted(entry.items()))}")
    return args.md5 or entry.get("md5"), args.sha256 or entry.get("sha256")


def run(args: argparse.Namespace) -> int:
    md5, sha256 = _listed_digests(args)
    with Progress(f"pmlm fetch {redact(args.url)}", unit="bytes", every_s=args.progress_every) as progress:
        fetch(args.url, args.dest, md5=md5, sha256=sha256, retries=args.retries,
              backoff=args.backoff, timeout=args.timeout, progress=progress.update)
    return 0
