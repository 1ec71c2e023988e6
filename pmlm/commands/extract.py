"""``pmlm extract ARCHIVE MEMBER -o OUT``: copy one member out of a (compressed, possibly nested) tar archive."""

from __future__ import annotations

import argparse
import sys

from pmlm.outputs import FILE_OVERWRITE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("archive", help="tar, tar.gz, tar.bz2 or tar.xz archive")
    p.add_argument(
        "member", help="member path; a nested tar on the way is opened in place (uniref50.tar/uniref50.xml.gz)"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="the member's copy; an existing file is replaced when it is of the member's format (its last "
        "extension, checked by content: .gz, .fasta, ...)",
    )
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.data.archive import extract_member
    from pmlm.outputs import named_file_target

    named_file_target(args.output, what="member", like=args.member, overwrite=args.overwrite)

    size = extract_member(args.archive, args.member, args.output)
    print(f"extract: {args.member} ({size} bytes) -> {args.output}", file=sys.stderr)
    return 0
