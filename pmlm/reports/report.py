"""``pmlm report``: the figures and pages of the workflow report (curves, contact maps, precision by
separation, run information); arguments in pmlm/commands/report.py."""

from __future__ import annotations

import sys

from pmlm.errors import InputError
from pmlm.reports.contact_maps import write_contact_maps
from pmlm.reports.curves import write_curves
from pmlm.reports.figures import labelled_paths
from pmlm.reports.run_info import write_run_info
from pmlm.reports.separation import write_precision_by_separation


def run(args) -> int:
    if args.item == "curves":
        paths = write_curves(args.kind, labelled_paths(args.run, "--run"), args.out_prefix)
    elif args.item == "contact-maps":
        paths = write_contact_maps(args.head, args.encoder, args.test, args.chains, args.label, args.out_prefix)
    elif args.item == "separation":
        pairs = []
        for item in args.result:
            kind, sep, path = item.partition("=")
            if not sep:
                raise InputError(item, "expected TABLE=TSV")
            pairs.append((kind, path))
        paths = write_precision_by_separation(pairs, args.out_prefix)
    else:
        paths = write_run_info(args.config_json, args.snakemake_version, args.out_prefix)
    print(f"pmlm report {args.item}: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return 0
