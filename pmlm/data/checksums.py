"""Checksums a publisher lists beside its files, so a download is verified against the publisher's digest.

Two listing formats:

- Metalink (``RELEASE.metalink``, what UniProt puts in every release folder): ``<file name="...">``
  blocks with ``<size>`` and ``<verification><hash type="md5">...</hash></verification>``
  (Metalink 3, namespace ``http://www.metalinker.org/``; Metalink 4's ``<hash>`` directly under
  ``<file>`` is read too);
- md5sum / sha256sum output: one ``<hex digest>  <file name>`` per line.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

from pmlm.errors import InputError

_ALGORITHMS = {"md5": "md5", "sha-256": "sha256", "sha256": "sha256"}
_SUM_LINE = re.compile(r"^([0-9a-fA-F]{32}|[0-9a-fA-F]{64})\s+\*?(\S.*?)\s*$")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _from_metalink(path: str, text: bytes) -> dict[str, dict[str, str]]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise InputError(path, f"malformed metalink ({exc})", line=exc.position[0]) from None
    listing: dict[str, dict[str, str]] = {}
    for elem in root.iter():
        if _local(elem.tag) != "file" or not elem.get("name"):
            continue
        entry: dict[str, str] = {}
        for child in elem.iter():
            if _local(child.tag) == "hash" and (algo := _ALGORITHMS.get((child.get("type") or "").lower())):
                entry[algo] = (child.text or "").strip().lower()
            elif _local(child.tag) == "size" and (child.text or "").strip().isdigit():
                entry["size"] = child.text.strip()
        listing[os.path.basename(elem.get("name"))] = entry
    return listing


def _from_sums(text: bytes) -> dict[str, dict[str, str]]:
    listing: dict[str, dict[str, str]] = {}
    for line in text.decode("utf-8", "replace").splitlines():
        match = _SUM_LINE.match(line)
        if match:
            digest, name = match.group(1).lower(), os.path.basename(match.group(2))
            listing.setdefault(name, {})["md5" if len(digest) == 32 else "sha256"] = digest
    return listing


def published_checksums(listing_path: str | os.PathLike, filename: str) -> dict[str, str]:
    """The digests (``md5`` / ``sha256``) and ``size`` a listing gives for ``filename``.

    Raises InputError when the listing cannot be read or does not name the file.
    """
    path = str(listing_path)
    with open(path, "rb") as fh:
        text = fh.read()
    listing = _from_metalink(path, text) if text.lstrip().startswith(b"<") else _from_sums(text)
    entry = listing.get(os.path.basename(filename))
    if not entry or not ({"md5", "sha256"} & set(entry)):
        names = ", ".join(sorted(listing)[:8]) or "none"
        raise InputError(path, f"the checksum listing has no digest for {filename!r} (it lists: {names})")
    return entry
