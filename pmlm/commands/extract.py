"""``pmlm extract``: copy one member out of a (compressed, possibly nested) tar archive."""

from __future__ import annotations

import argparse

ENGINE = "pmlm.data.archive"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("archive", help="tar, tar.gz, tar.bz2 or tar.xz archive")
    p.add_argument("member", help="member path; a nested tar on the way is opened in place (uniref50.tar/uniref50.xml.gz)")
    p.add_argument("-o", "--output", required=True)
