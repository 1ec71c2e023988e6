"""Small shared helpers: atomic outputs, file digests, run provenance, and the symmetrisation of pair maps
that contact heads and contact read-outs share."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pmlm.version import __version__


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, directory: bool = False) -> Iterator[str]:
    """Yield a temporary path next to ``path``; move it into place only if the block succeeds.

    A failure (exception, including KeyboardInterrupt) removes the temporary, so a reader never
    sees a half-written file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    else:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    try:
        yield tmp
        # mkstemp / mkdtemp (and some writers, e.g. safetensors) create private files: give the
        # result the mode any other new file would get
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (0o777 if directory else 0o666) & ~umask)
        if directory and path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.unlink(tmp)
        raise


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """The checkout's commit (with '-dirty' when modified), or None outside a git checkout."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def versions() -> dict:
    """Versions recorded into every checkpoint and results table."""
    out = {"pmlm": __version__, "python": platform.python_version(), "git_commit": git_commit()}
    for name in ("torch", "numpy", "pyarrow", "pandas"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out


def symmetrize(matrix):
    """(..., L, L) -> (M + M^T) / 2 over the last two axes (NumPy arrays or torch tensors)."""
    return (matrix + matrix.swapaxes(-1, -2)) / 2
