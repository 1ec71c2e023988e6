"""The package's version, in one place: pyproject.toml reads it from here, and every record of provenance
(sidecars, embeddings, run information) and ``pmlm --version`` quote it, with the checkout's commit and the
versions of the libraries a result depends on (``versions``). Standard library only at import time: ``import
pmlm`` and the command parsers read the version from here."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

__version__ = "0.1.0"


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
        # imported by name when a record is written, never at import time: this module stays standard library only,
        # and a package that is not installed is recorded as None
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out
