"""Files as every floor writes and identifies them: outputs that appear whole or not at all, the digest of a file,
the digest of a JSON value in one canonical form, and a run's record: its settings and their digest."""

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


def file_digests(path: str | os.PathLike, algorithms: list[str], chunk: int = 1 << 20) -> dict[str, str]:
    """Hex digests of a file by each of ``algorithms``, in one read."""
    hashers = {name: hashlib.new(name) for name in algorithms}
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            for hasher in hashers.values():
                hasher.update(block)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
    return file_digests(path, [algorithm], chunk)[algorithm]


def canonical_sha256(obj, *, default: Callable | None = None) -> str:
    """sha256 (hex) of a JSON value with sorted keys and no spaces: identical settings give identical digests.
    ``default`` is json.dumps' own (how values JSON has no form for are written, e.g. ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=default).encode()).hexdigest()


def flatten(values: dict, prefix: str = "") -> dict:
    """Nested dicts -> one level of dotted keys (``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``)."""
    flat = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def run_record(config: dict, excluded: tuple[str, ...], **inputs) -> dict:
    """What determines a run's result: ``config`` (a config tree's ``to_dict()``) without its ``excluded`` keys
    (a key excludes the keys under it), plus ``inputs`` (content hashes, the precision); and its fingerprint."""
    settings = {k: v for k, v in flatten(config).items() if not any(k == x or k.startswith(x + ".") for x in excluded)}
    settings.update(inputs)
    return {"fingerprint": canonical_sha256(settings, default=str), "settings": settings}
