"""Where a command writes: one rule for every ``pmlm`` command that writes results, so that none ever removes or
changes a file it did not write.

A command writes one of three shapes, fixed by the command, never guessed from what is on disk:

* **a file** (``pmlm embed -o OUT.parquet``, ``pmlm score -o SCORES.tsv``): the name must end with one of the
  command's formats (``.parquet``, ``.tsv``, ...). An existing file of that name is the previous result and is
  replaced when its content is of that format (a Parquet file, UTF-8 text, a PNG, ...); a folder, ``.``, or a file
  of another format is refused.
* **files with a prefix** (``--out-prefix PREFIX`` writes ``PREFIX.csv``, ``PREFIX.md``, ...): each is a file
  target as above, the suffixes being the command's.
* **a folder** (``pmlm contacts -o DIR``, ``pmlm export -o DIR``): the command records the files it wrote in
  ``DIR/.pmlm-outputs.json``. An existing folder is used only when everything in it is listed there by the same
  command (or it is empty); a folder holding anything else is refused, and ``--overwrite`` replaces only the
  command's own files, leaving the others as they are. A file where a folder is expected is refused.

Refusals are :class:`OutputError` (one line, exit 2), raised before any work. Results are written under temporary
names beside their targets and renamed into place when the command succeeds (a new folder appears whole; in an
existing one each file appears whole), with the mode every other new file gets (group and others may read).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from pmlm.errors import PmlmError

MANIFEST = ".pmlm-outputs.json"
PARQUET_MAGIC = b"PAR1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT_SUFFIXES = (".tsv", ".csv", ".md", ".tex", ".html", ".json", ".svg", ".txt", ".fasta", ".jsonl", ".yaml")
OVERWRITE_HELP = (
    "replace the command's own earlier files even where the target holds files it did not write (those are kept)"
)


class OutputError(PmlmError):
    """An output target the command will not write to (exit 2, before any work)."""


def _mode(directory: bool) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def _is_format(path: Path, suffix: str) -> bool:
    """Whether the existing file ``path`` holds what a ``suffix`` file holds (checked from its first bytes)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if suffix == ".parquet":
        return head.startswith(PARQUET_MAGIC) or not head
    if suffix == ".png":
        return head.startswith(PNG_MAGIC) or not head
    if suffix == ".npz":
        return head.startswith(b"PK") or not head
    if suffix in TEXT_SUFFIXES:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as exc:  # a multi-byte character cut by the 4096-byte read is still text
            return exc.start >= len(head) - 3 and b"\0" not in head
        return b"\0" not in head
    return False


def _is_cwd_or_above(path: Path) -> bool:
    here = Path.cwd().resolve()
    target = path.resolve()
    return target == here or target in here.parents


def file_target(
    path: str | os.PathLike,
    *,
    suffixes: Sequence[str],
    option: str = "-o",
    what: str = "output",
    overwrite: bool = False,
) -> Path:
    """Check one file target before any work (module docstring); returns it as a Path."""
    text = os.fspath(path)
    p = Path(text)
    if not text or text.endswith(os.sep) or p.is_dir() or _is_cwd_or_above(p):
        raise OutputError(
            f"{option} {text or repr(text)}: is a folder; {option} names the {what} file to write "
            f"(a name ending {' or '.join(suffixes)})"
        )
    suffix = next((s for s in suffixes if p.name.endswith(s) and len(p.name) > len(s)), None)
    if suffix is None:
        raise OutputError(f"{option} {text}: the {what} is written as {' or '.join(suffixes)}; name it so")
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise OutputError(f"{option} {text}: exists and is not a regular file; choose another name")
        if not overwrite and not _is_format(p, suffix):
            raise OutputError(
                f"{option} {text}: exists and is not a {suffix} file, so it was not written by this command; "
                "choose another name (or --overwrite to replace it)"
            )
    return p


def prefix_targets(
    prefix: str | os.PathLike,
    suffixes: Sequence[str],
    *,
    option: str = "--out-prefix",
    overwrite: bool = False,
) -> list[Path]:
    """The files ``PREFIX<suffix>`` a command writes, each checked as :func:`file_target`."""
    text = os.fspath(prefix)
    if not text or text.endswith(os.sep) or Path(text).name in ("", ".", ".."):
        raise OutputError(
            f"{option} {text or repr(text)}: a prefix names files (e.g. tables/run writes tables/run.csv)"
        )
    return [
        file_target(text + s, suffixes=(s,), option=option, what=f"{s[1:]} output", overwrite=overwrite)
        for s in suffixes
    ]


@contextlib.contextmanager
def writing_files(paths: Sequence[str | os.PathLike]) -> Iterator[list[str]]:
    """Temporary names beside each of ``paths`` (yielded in order); all are renamed into place together when the
    block succeeds, none otherwise (the temporaries are removed)."""
    targets = [Path(p) for p in paths]
    if len({t.resolve() for t in targets}) < len(targets):
        raise OutputError(f"two outputs have the same name: {', '.join(map(str, targets))}")
    temps: list[str] = []
    try:
        for t in targets:
            t.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{t.name}.", suffix=".tmp", dir=t.parent)
            os.close(fd)
            temps.append(tmp)
        yield temps
        mode = _mode(directory=False)
        for tmp in temps:
            os.chmod(tmp, mode)  # mkstemp and some writers (safetensors) make private files
        for tmp, t in zip(temps, targets):
            os.replace(tmp, t)
    finally:
        for tmp in temps:
            if os.path.lexists(tmp):
                os.unlink(tmp)


def _manifest(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    return data


def _own_files(folder: Path, command: str) -> set[str]:
    data = _manifest(folder)
    if data is None or data.get("command") != command:
        return set()
    return {f for f in data["files"] if isinstance(f, str) and "/" not in f and f not in (".", "..")}


def folder_target(path: str | os.PathLike, *, command: str, option: str = "-o", overwrite: bool = False) -> Path:
    """Check a folder target before any work (module docstring); returns it as a Path."""
    text = os.fspath(path)
    p = Path(text)
    if not text:
        raise OutputError(f"{option} '': name the folder to write")
    if p.exists() and not p.is_dir():
        raise OutputError(f"{option} {text}: exists and is a file; {option} names the folder {command} writes")
    if p.is_dir():
        own = _own_files(p, command)
        foreign = sorted(e.name for e in p.iterdir() if e.name != MANIFEST and e.name not in own)
        if _is_cwd_or_above(p) and not overwrite:
            raise OutputError(
                f"{option} {text}: is the working folder (or one above it); {command} writes a folder of its own, "
                "so name a new one"
            )
        if foreign and not overwrite:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise OutputError(
                f"{option} {text}: the folder holds files {command} did not write ({shown}); name a new folder, "
                f"or pass --overwrite to replace only the files {command} wrote there"
            )
    return p


@contextlib.contextmanager
def writing_folder(path: str | os.PathLike, *, command: str, overwrite: bool = False) -> Iterator[Path]:
    """A staging folder beside ``path`` to write the results into (flat: files only). When the block succeeds, a
    new folder is renamed into place whole; into an existing one each file is moved (renamed) and the command's
    earlier files it did not write again are removed. On failure nothing changes."""
    target = folder_target(path, command=command, overwrite=overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield staging
        written = sorted(e.name for e in staging.iterdir())
        if any(not (staging / n).is_file() for n in written):
            raise RuntimeError(f"{command} staged a non-file output in {staging}")
        (staging / MANIFEST).write_text(json.dumps({"command": command, "files": written}, indent=1) + "\n")
        file_mode = _mode(directory=False)
        for name in [*written, MANIFEST]:
            os.chmod(staging / name, file_mode)
        if not target.exists():
            os.chmod(staging, _mode(directory=True))
            os.replace(staging, target)
            return
        previous = _own_files(target, command)
        for name in written:
            os.replace(staging / name, target / name)
        for name in sorted(previous - set(written)):
            old = target / name
            if old.is_file() or old.is_symlink():
                old.unlink()
        os.replace(staging / MANIFEST, target / MANIFEST)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
