"""Errors a user can act on: printed as one line by the CLI, never as a traceback."""

from __future__ import annotations

import os


class PmlmError(Exception):
    """Base class for every error the CLI reports as a single line (exit code 2)."""


class InputError(PmlmError):
    """Bad input data: names the file and, where known, the 1-based line."""

    def __init__(self, path: str | os.PathLike, message: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ConfigError(PmlmError):
    """Invalid configuration: names the key and what is expected."""


class DownloadError(PmlmError):
    """A download failed for good (HTTP error, checksum mismatch, retries exhausted)."""
