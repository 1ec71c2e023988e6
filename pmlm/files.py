"""Files as every floor writes and identifies them: outputs that appear whole or not at all, the digest of a file,
and the digest of a JSON value in one canonical form."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator

from pmlm.outputs import writing_files


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary path next to the file ``path``; move it into place only if the block succeeds.

    A failure (exception, including KeyboardInterrupt) removes the temporary, so a reader never sees a
    half-written file under the final name: ``pmlm.outputs.writing_files`` of one path. A folder is written
    with ``pmlm.outputs.writing_folder``, which replaces only the files the command wrote there.
    """
    with writing_files([path]) as (tmp,):
        yield tmp


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def canonical_sha256(obj, *, default: Callable | None = None) -> str:
    """sha256 (hex) of a JSON value with sorted keys and no spaces: identical settings give identical digests.
    ``default`` is json.dumps' own (how values JSON has no form for are written, e.g. ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=default).encode()).hexdigest()
