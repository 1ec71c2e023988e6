"""``pmlm fetch URL -o DEST``: download a source (http, https, ftp or file URL) with resume and checksum."""

from __future__ import annotations

import argparse
from pathlib import Path

from pmlm.data.transfer import FetchOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = FetchOptions()
    parser.add_argument("url", help="source URL: http://, https://, ftp:// or file://")
    parser.add_argument(
        "-o",
        "--output",
        dest="dest",
        required=True,
        type=Path,
        help="destination file; data is staged in DEST.part and renamed when verified",
    )
    parser.add_argument("--md5", help="expected MD5 digest (32 hex digits)")
    parser.add_argument("--sha256", help="expected SHA-256 digest (64 hex digits)")
    parser.add_argument(
        "--checksums-from",
        metavar="URL",
        help="the publisher's checksum listing (RELEASE.metalink or md5sum output) naming this file; "
        "its digest is checked like --md5 / --sha256",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=defaults.retries,
        help="retries after failed attempts that made no progress (default: %(default)s)",
    )
    parser.add_argument(
        "--backoff",
        type=float,
        default=defaults.backoff,
        help="seconds before the first retry, doubling each time (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=defaults.timeout, help="socket timeout in seconds (default: %(default)s)"
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="off a terminal, a progress line this often (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.fetch import fetch
    from pmlm.data.transfer import redact
    from pmlm.outputs import named_file_target
    from pmlm.progress import Progress

    # an existing DEST is fetch's to judge: kept when it matches the digests (or none are given), else fetched again
    named_file_target(args.dest, what="destination", existing=True)

    with Progress(f"pmlm fetch {redact(args.url)}", unit="bytes", every_s=args.progress_every) as progress:
        fetch(
            args.url,
            args.dest,
            md5=args.md5,
            sha256=args.sha256,
            checksums_from=args.checksums_from,
            retries=args.retries,
            backoff=args.backoff,
            timeout=args.timeout,
            progress=progress.update,
        )
    return 0
