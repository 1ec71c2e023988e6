"""Plain data from pickles without running code: numpy arrays, dicts, lists, numbers and strings only (TAPE's LMDB
records, RaptorX's pickled contact sets), and TAPE's LMDB files record by record."""

from __future__ import annotations

import codecs
import functools
import io
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pmlm.errors import InputError, PmlmError


@functools.cache
def _unpickle_allow_list() -> dict[tuple[str, str], object]:
    # numpy 2 pickles name numpy._core, numpy 1 pickles numpy.core: both resolve to the
    # installed module without importing the deprecated alias
    multiarray = getattr(getattr(np, "_core", None), "multiarray", None) or np.core.multiarray
    allowed: dict[tuple[str, str], object] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    allowed[("_codecs", "encode")] = codecs.encode  # protocol-2 pickles of bytes
    return allowed


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy's array / dtype / scalar constructors."""

    def find_class(self, module: str, name: str):
        obj = _unpickle_allow_list().get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only plain data and numpy arrays)")
        return obj


def safe_unpickle(data: bytes):
    """Unpickle plain data and numpy arrays; anything else raises pickle.UnpicklingError.

    Python 2 pickles (RaptorX's cPickle files) store array data and text as 8-bit ``str``: they are
    read as Latin-1, which gives numpy the original bytes.
    """
    return _AllowListUnpickler(io.BytesIO(data), encoding="latin1").load()


def lmdb_items(path: Path) -> Iterator[tuple[int, object]]:
    try:
        import lmdb  # optional dependency: only TAPE's LMDB archives need it
    except ImportError:
        raise PmlmError(
            f"{path}: reading TAPE LMDB files needs the optional package 'lmdb' (pip install lmdb); "
            "or use TAPE's JSON archives"
        ) from None
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, meminit=False, subdir=path.is_dir())
    except lmdb.Error as exc:
        raise InputError(path, f"cannot open LMDB: {exc}") from None
    try:
        with env.begin(write=False) as txn:
            raw = txn.get(b"num_examples")
            if raw is None:
                raise InputError(path, "LMDB has no 'num_examples' key (not a TAPE LMDB file)")
            num = _unpickle(path, raw, "num_examples")
            for index in range(int(num)):
                raw = txn.get(str(index).encode())
                if raw is None:
                    raise InputError(path, f"record {index} missing (num_examples is {num})")
                yield index, _unpickle(path, raw, f"record {index}")
    finally:
        env.close()


def _unpickle(path: Path, raw: bytes, what: str):
    try:
        return safe_unpickle(raw)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise InputError(path, f"{what}: cannot decode: {exc}") from None
