"""Archives in their publishers' layouts, built in memory for the tests."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path


def tar_bytes(members: dict[str, bytes], mode: str = "w") -> bytes:
    """A tar archive (``mode`` "w" or "w:gz") holding ``members`` (path -> content) in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def uniprot_release_archive(path: Path, xml: bytes, release: str = "2018_03") -> Path:
    """UniProt's previous-release layout: uniref<REL>.tar.gz -> uniref100.tar, uniref90.tar, uniref50.tar,
    each holding README, a release note and uniref<NN>.xml.gz (only uniref50's carries ``xml``)."""
    inner = {
        n: tar_bytes(
            {
                "README": b"UniRef\n",
                f"{n}.release_note": f"{release}\n".encode(),
                f"{n}.xml.gz": gzip.compress(xml if n == "uniref50" else b"<UniRef100/>"),
            }
        )
        for n in ("uniref100", "uniref90", "uniref50")
    }
    path.write_bytes(tar_bytes({f"{n}.tar": data for n, data in inner.items()}, mode="w:gz"))
    return path
