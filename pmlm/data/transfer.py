"""The byte transfer behind ``pmlm fetch``: HTTP(S) with Range resume, FTP with REST, local files, and the
retry loop around them, appending to a ``DEST.part`` file that keeps running digests of its bytes.

What to fetch, the checksums to expect and the rename into place are :mod:`pmlm.data.fetch`'s.
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit, urlunsplit

from pmlm.errors import ConfigError, DownloadError
from pmlm.version import __version__

# progress(bytes_in_part_file, total_bytes_or_None), called after every chunk
ProgressFn = Callable[[int, "int | None"], None]

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
            raise ConfigError(f"fetch max_backoff ({self.max_backoff!r}) must be >= backoff ({self.backoff!r})")
        if not self.timeout > 0:
            raise ConfigError(f"fetch timeout must be > 0 seconds, got {self.timeout!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size <= 0:
            raise ConfigError(f"fetch chunk_size must be a positive integer, got {self.chunk_size!r}")


class _Transient(Exception):
    """A failure worth retrying; ``retry_after`` is the server's requested wait in seconds, if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def log(message: str) -> None:
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


class PartFile:
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


def _copy_stream(
    read: Callable[[int], bytes], part: PartFile, total: int | None, opts: FetchOptions, progress: ProgressFn | None
) -> None:
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


def _fetch_http(url: str, part: PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
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
                log(f"{redact(url)}: server ignored the Range request; restarting from zero")
                part.restart()
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.strip().isdigit() else None
        else:
            raise DownloadError(f"{redact(url)}: unexpected HTTP {status} {response.reason}")
        # read1 returns whatever one socket read brings, so a timeout never discards buffered bytes
        _copy_stream(getattr(response, "read1", response.read), part, total, opts, progress)


# ----------------------------------------------------------------------------------------- ftp


def _fetch_ftp(url: str, part: PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
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


def local_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(f"{url}: file URLs must name a local path (file:///abs/path or file:rel/path)")
    return Path(urllib.request.url2pathname(parts.path))


def _fetch_file(url: str, part: PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
    source = local_path(url)
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


def download(url: str, part: PartFile, opts: FetchOptions, progress: ProgressFn | None) -> None:
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
            log(f"{redact(url)}: {exc}; retry {failures}/{opts.retries} in {delay:.1f} s")
            time.sleep(delay)
