"""Where a command writes: one rule for every ``pmlm`` command that writes results, so that none ever removes or
changes a file it did not write. The four shapes (a file, files with a prefix, a folder of its own listed in
``DIR/.pmlm-outputs.json``, a run folder), each fixed by the command and never guessed from what is on disk:
docs/cli.md, "Where results are written".

Refusals are :class:`OutputError` (one line, exit 2), raised before any work. Results are written under temporary
names beside their targets and renamed into place when the command succeeds (a new folder appears whole; in an
existing one each file appears whole), with the mode every other new file gets (group and others may read).
"""

from __future__ import annotations

import contextlib
import fnmatch
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
TEXT_SUFFIXES = (
    *(".tsv", ".csv", ".md", ".tex", ".html", ".json", ".svg", ".txt", ".fasta", ".fa", ".faa", ".jsonl", ".yaml"),
    *(".yml", ".xml", ".log"),
)
# the first bytes of binary formats a command may write or copy (pmlm extract, pmlm fetch), after MAGIC_OFFSET's
MAGIC = {
    ".safetensors": b"{",  # an 8-byte little-endian header length, then the JSON header
    ".parquet": PARQUET_MAGIC,
    ".png": PNG_MAGIC,
    ".npz": b"PK",
    ".zip": b"PK",
    ".pt": b"PK",
    ".gz": b"\x1f\x8b",
    ".bz2": b"BZh",
    ".xz": b"\xfd7zXZ\x00",
    ".zst": b"\x28\xb5\x2f\xfd",
}
MAGIC_OFFSET = {".safetensors": 8}
OVERWRITE_HELP = (
    "replace the command's own earlier files even where the target holds files it did not write (those are kept)"
)
FILE_OVERWRITE_HELP = "replace an existing output file even where it is not of the command's format"


class OutputError(PmlmError):
    """An output target the command will not write to (exit 2, before any work)."""


def _mode(directory: bool) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def _is_format(path: Path, suffix: str) -> bool:
    """Whether the existing file ``path`` holds what a ``suffix`` file holds (checked from its first bytes; a
    suffix is known by its last extension: ``_assays.tsv`` is a ``.tsv``)."""
    kind = "." + suffix.rsplit(".", 1)[-1] if "." in suffix else suffix
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if not head:
        return True  # an empty file holds nothing to lose
    if kind in MAGIC:
        return head[MAGIC_OFFSET.get(kind, 0) :].startswith(MAGIC[kind])
    if kind in TEXT_SUFFIXES:
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


def named_file_target(
    path: str | os.PathLike,
    *,
    option: str = "-o",
    what: str = "output",
    like: str = "",
    existing: bool = False,
    overwrite: bool = False,
) -> Path:
    """A file target of no format fixed by the command (``pmlm fetch``'s download, ``pmlm extract``'s member): any
    name; a folder, ``.`` or a non-regular file is refused. An existing file is replaced when ``existing`` (the
    command checks it itself: fetch keeps a file matching its digests), when its first bytes are of the format its
    name shares with ``like`` (the member's name: ``.gz``, ``.fasta``, ...), or with ``overwrite``."""
    text = os.fspath(path)
    p = Path(text)
    if not text or text.endswith(os.sep) or p.is_dir() or _is_cwd_or_above(p):
        raise OutputError(f"{option} {text or repr(text)}: is a folder; {option} names the {what} file to write")
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise OutputError(f"{option} {text}: exists and is not a regular file; choose another name")
        kind = Path(like).suffix
        known = bool(kind) and p.name.endswith(kind) and _is_format(p, kind)
        if not (existing or overwrite or known):
            raise OutputError(
                f"{option} {text}: exists and is not "
                + (f"a {kind} file" if kind and p.name.endswith(kind) else "a file this command can tell it wrote")
                + "; choose another name (or --overwrite to replace it)"
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


def _relative(name: object) -> bool:
    """Whether a manifest entry is a relative name inside the folder (``a.tsv``, ``train/part-0.parquet``)."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        return False
    parts = name.split("/")
    return all(part not in ("", ".", "..") for part in parts) and parts[0] != MANIFEST


def _own_files(folder: Path, command: str) -> set[str]:
    data = _manifest(folder)
    if data is None or data.get("command") != command:
        return set()
    return {f for f in data["files"] if _relative(f)}


def _foreign(folder: Path, own: set[str], prefix: str = "") -> list[str]:
    """What ``folder`` holds that is not among ``own`` (relative names): files and folders the command did not
    write, a folder of its own searched for them too."""
    own_dirs = {"/".join(f.split("/")[:k]) for f in own for k in range(1, f.count("/") + 1)}
    found = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = prefix + entry.name
        if name == MANIFEST or (name in own and (entry.is_file() or entry.is_symlink())):
            continue
        if name in own_dirs and entry.is_dir() and not entry.is_symlink():
            found += _foreign(entry, own, name + "/")
        else:
            found.append(name)
    return found


def _folder_named(path: str | os.PathLike, option: str, what: str) -> tuple[str, Path]:
    """``path`` as given and as a Path; refused when empty or an existing file (``what``: the folder it names)."""
    text = os.fspath(path)
    if not text:
        raise OutputError(f"{option} '': name {what}")
    if Path(text).exists() and not Path(text).is_dir():
        raise OutputError(f"{option} {text}: exists and is a file; {option} names {what}")
    return text, Path(text)


def folder_target(path: str | os.PathLike, *, command: str, option: str = "-o", overwrite: bool = False) -> Path:
    """Check a folder target before any work (module docstring); returns it as a Path."""
    text, p = _folder_named(path, option, f"the folder {command} writes")
    if p.is_dir():
        foreign = _foreign(p, _own_files(p, command))
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
def writing_folder(
    path: str | os.PathLike, *, command: str, overwrite: bool = False, option: str = "-o"
) -> Iterator[Path]:
    """A staging folder beside ``path`` to write the results into (files, in subfolders too). When the block
    succeeds, a new folder is renamed into place whole; into an existing one each file is moved (renamed) and the
    command's earlier files it did not write again are removed (and its subfolders left empty). On failure nothing
    changes."""
    target = folder_target(path, command=command, option=option, overwrite=overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield staging
        entries = sorted(staging.rglob("*"))
        if any(e.is_symlink() or not (e.is_file() or e.is_dir()) for e in entries):
            raise RuntimeError(f"{command} staged a link or a special file in {staging}")
        written = sorted(e.relative_to(staging).as_posix() for e in entries if e.is_file())
        folders = sorted((e for e in entries if e.is_dir()), key=lambda e: len(e.parts), reverse=True)
        if MANIFEST in written:
            raise RuntimeError(f"{command} staged a file named {MANIFEST}")
        (staging / MANIFEST).write_text(json.dumps({"command": command, "files": written}, indent=1) + "\n")
        file_mode, dir_mode = _mode(directory=False), _mode(directory=True)
        for name in [*written, MANIFEST]:
            os.chmod(staging / name, file_mode)
        for folder in folders:
            os.chmod(folder, dir_mode)
        if not target.exists():
            os.chmod(staging, dir_mode)
            os.replace(staging, target)
            return
        previous = _own_files(target, command)
        for name in written:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, target / name)
        for name in sorted(previous - set(written)):
            old = target / name
            if old.is_file() or old.is_symlink():
                old.unlink()
        for name in sorted({n.rsplit("/", 1)[0] for n in previous if "/" in n}, key=len, reverse=True):
            with contextlib.suppress(OSError):  # only a folder of its own left empty
                (target / name).rmdir()
        os.replace(staging / MANIFEST, target / MANIFEST)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def run_folder_target(path: str | os.PathLike, *, command: str, names: Sequence[str], option: str = "--out") -> Path:
    """Check a run folder before any work (module docstring): new, empty, or holding only ``names`` (glob
    patterns of what the run writes there: ``checkpoints``, ``metrics.csv``, ...), so resumed; returns it."""
    text, p = _folder_named(path, option, f"the run folder {command} keeps")
    if _is_cwd_or_above(p):
        raise OutputError(
            f"{option} {text}: is the working folder (or one above it); {command} keeps a run folder of its own, "
            "so name a new one"
        )
    if p.is_dir():
        foreign = sorted(e.name for e in p.iterdir() if not any(fnmatch.fnmatchcase(e.name, n) for n in names))
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise OutputError(
                f"{option} {text}: the folder holds files {command} did not write ({shown}), so it is not a run "
                f"folder of {command}; name a new folder"
            )
    return p
