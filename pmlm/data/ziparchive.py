"""Members of a zip archive found by file name and read as text, with one-line errors naming the archive
(ProteinGym publishes its assays as one zip of CSV files; tar archives are :mod:`pmlm.data.archive`'s).

A zip keeps its table of contents at the end, so one member is read without inflating the others, and a
truncated download fails on opening (no table of contents) rather than half-way through a member.
"""

from __future__ import annotations

import difflib
import io
import os
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath

from pmlm.errors import InputError

_MAX_SUGGESTIONS = 5
# what a damaged member raises while it is read (a bad CRC is a BadZipFile, a broken deflate stream zlib.error)
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError)


class ZipMembers:
    """An open zip archive whose files are addressed by their base name (the folder inside the archive,
    e.g. ``DMS_ProteinGym_substitutions/``, differs between releases)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise InputError(self.path, "no such file")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except zipfile.BadZipFile as exc:
            raise InputError(self.path, f"not a readable zip archive ({exc}); is the download complete?") from None
        self._by_name: dict[str, list[str]] = {}
        for info in self._zip.infolist():
            if not info.is_dir():
                self._by_name.setdefault(PurePosixPath(info.filename).name, []).append(info.filename)

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> ZipMembers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def names(self) -> list[str]:
        """Base names of the files in the archive."""
        return sorted(self._by_name)

    def member(self, name: str) -> str:
        """The full member path of the file called ``name``; InputError naming the closest names when it is
        missing, or when two folders of the archive hold a file of that name."""
        found = self._by_name.get(name, [])
        if len(found) == 1:
            return found[0]
        if found:
            raise InputError(self.path, f"{len(found)} members are called {name!r} ({', '.join(found)})")
        close = difflib.get_close_matches(name, self._by_name, n=_MAX_SUGGESTIONS, cutoff=0.6)
        hint = f"closest names: {', '.join(close)}" if close else f"it holds {len(self._by_name)} files, none similar"
        raise InputError(self.path, f"archive has no file {name!r}; {hint}")

    def where(self, name: str) -> str:
        """How errors name a member: ``ARCHIVE/member/path`` (as nested tar members are named)."""
        return f"{self.path}/{self.member(name)}"

    @contextmanager
    def open_text(self, name: str) -> Iterator[io.TextIOBase]:
        """The member called ``name`` as UTF-8 text (a leading BOM dropped); a damaged member is an InputError."""
        member = self.member(name)
        try:
            with self._zip.open(member) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
                yield text
        except UnicodeDecodeError:
            raise InputError(f"{self.path}/{member}", "not UTF-8 text") from None
        except _READ_ERRORS as exc:
            raise InputError(
                f"{self.path}/{member}", f"cannot read the member ({exc}); is the download complete?"
            ) from None
