"""``pmlm extract``: copy one member out of a (compressed) tar archive, streaming and atomically."""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile

from pmlm.errors import InputError
from pmlm.utils import atomic_output


def extract_member(archive: str, member: str, output: str) -> int:
    """Write the member whose path ends with ``member`` to ``output``; returns its size in bytes."""
    try:
        with tarfile.open(archive, mode="r|*") as tar:  # stream mode: no seeking, constant memory
            for info in tar:
                if info.isfile() and (info.name == member or info.name.endswith("/" + member)):
                    src = tar.extractfile(info)
                    with atomic_output(output) as tmp, open(tmp, "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    return info.size
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InputError(archive, f"cannot read tar archive ({exc})") from None
    raise InputError(archive, f"archive has no member named {member!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("archive", help="tar, tar.gz, tar.bz2 or tar.xz archive")
    p.add_argument("member", help="member path, or its trailing file name")
    p.add_argument("-o", "--output", required=True)


def run(args) -> int:
    size = extract_member(args.archive, args.member, args.output)
    print(f"extract: {args.member} ({size} bytes) -> {args.output}", file=sys.stderr)
    return 0
