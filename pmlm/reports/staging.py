"""The files a table or report command writes under its prefixes (``--out-prefix``: pmlm.outputs' prefix targets),
appearing together or not at all: the writers (``tables.write_table``, ``pmlm.figures.save_figure``) write them under
their own names into a staging folder beside the first, and ``pmlm.outputs.writing_files`` renames every one into
place once all are written."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from pmlm.outputs import writing_files


@contextlib.contextmanager
def staged_outputs(targets: Sequence[Path]) -> Iterator[Path]:
    """A staging folder for ``targets`` (checked prefix targets): the block writes each as ``folder / target.name``
    (the writers given ``folder / Path(prefix).name`` as their prefix). When it succeeds all appear together, none
    otherwise; a target the block did not write is an error of the command."""
    names = [t.name for t in targets]
    if len(set(names)) < len(names):
        raise ValueError(f"targets with the same file name cannot share a staging folder: {names}")
    # writing_files makes the targets' folders before the staging folder is made in the first
    with (
        writing_files(targets) as temps,
        tempfile.TemporaryDirectory(prefix=".pmlm-staging.", dir=targets[0].parent) as folder,
    ):
        yield Path(folder)
        missing = [name for name in names if not (Path(folder) / name).is_file()]
        if missing:
            raise RuntimeError(f"the command did not write {', '.join(missing)}")
        for name, tmp in zip(names, temps):
            shutil.move(Path(folder) / name, tmp)  # a rename where both are on one file system


def staged(folder: Path, prefix: str | Path) -> Path:
    """The prefix a writer is given inside ``staged_outputs``' folder for the files of ``prefix``."""
    return folder / Path(str(prefix)).name
