"""``pmlm proteingym select | score | aggregate | tables``: zero-shot mutation effects on ProteinGym's substitution
assays (pmlm.proteingym: reference, scoring, summary, report)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import add_device
from pmlm.inference.options import DoubleScore
from pmlm.outputs import FILE_OVERWRITE_HELP

TABLE = (".csv", ".md", ".tex", ".html")
FIGURE = (".png", ".svg")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="step", required=True, metavar="<step>")
    sel = sub.add_parser("select", help="the assays to score, from the reference file; checks the archive holds them")
    sel.add_argument(
        "--reference", required=True, metavar="CSV", help="ProteinGym's reference file (DMS_substitutions.csv)"
    )
    sel.add_argument(
        "--archive", required=True, metavar="ZIP", help="the assays archive (DMS_ProteinGym_substitutions.zip)"
    )
    sel.add_argument("--assays", default="all", metavar="all|ID,ID,...", help="DMS_id values, comma-separated, or all")
    sel.add_argument("--max-length", type=int, metavar="N", help="leave out assays whose target_seq is longer")
    sel.add_argument("-o", "--out", required=True, metavar="ASSAYS.tsv")
    sel.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)

    score = sub.add_parser("score", help="score every mutant of one assay with one encoder, and the assay's metrics")
    score.add_argument("model", metavar="MODEL", help="encoder: model.safetensors (with model.json) or its folder")
    score.add_argument("--archive", required=True, metavar="ZIP")
    score.add_argument("--assays", required=True, metavar="ASSAYS.tsv", help="the selection written by select")
    score.add_argument("--assay", required=True, metavar="DMS_ID")
    score.add_argument("--out-prefix", required=True, help="writes PREFIX.tsv (per mutant) and PREFIX.json (summary)")
    score.add_argument(
        "--double",
        type=DoubleScore.argument,
        choices=DoubleScore.values(),
        default=DoubleScore.AUTO,
        help="double mutants from the pair head's joint (pair), the sum of the singles (additive), or "
        "the joint where the encoder has a pair head (auto, default)",
    )
    score.add_argument(
        "--mismatch",
        choices=("skip", "error"),
        default="skip",
        help="a mutant disagreeing with target_seq: skip and count it (default) or fail",
    )
    score.add_argument(
        "--permutations",
        type=int,
        default=1000,
        help="permutations of Spearman's p-value (0: none; default %(default)s)",
    )
    score.add_argument("--seed", type=int, default=0, help="seed of the permutations")
    score.add_argument("--label", help="the encoder's name in the summary (default: its path)")
    add_device(score)
    score.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)

    agg = sub.add_parser("aggregate", help="per UniProt ID, per function category, overall (ProteinGym's aggregation)")
    agg.add_argument("--assays", required=True, metavar="ASSAYS.tsv", help="the selection written by select")
    agg.add_argument(
        "--encoder",
        action="append",
        required=True,
        metavar="LABEL=DIR",
        help="an encoder's label and the folder of its <DMS_id>.json summaries; repeatable",
    )
    agg.add_argument("--out-prefix", required=True, help="writes PREFIX.tsv (every level) and PREFIX_assays.tsv")
    agg.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)

    tab = sub.add_parser("tables", help="tables beside the published models, and the figures")
    tab.add_argument("--summary", required=True, metavar="SUMMARY.tsv", help="aggregate's PREFIX.tsv")
    tab.add_argument(
        "--assays-scored", required=True, metavar="SUMMARY_assays.tsv", help="aggregate's PREFIX_assays.tsv"
    )
    tab.add_argument(
        "--table-prefix",
        required=True,
        help="writes PREFIX, PREFIX_categories, PREFIX_assays, PREFIX_doubles (.csv .md .tex .html)",
    )
    tab.add_argument("--figure-prefix", required=True, help="writes PREFIX_categories and PREFIX_doubles (.png .svg)")
    tab.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)


def targets(args: argparse.Namespace) -> None:
    """Check the step's output targets before any work (pmlm.outputs: files of the step's formats)."""
    # on use, as the engines: building the parsers stays light (pmlm/commands/__init__.py)
    from pmlm.outputs import file_target, prefix_targets

    if args.step == "select":
        file_target(args.out, suffixes=(".tsv",), what="assay selection", overwrite=args.overwrite)
    elif args.step == "score":
        prefix_targets(args.out_prefix, (".tsv", ".json"), overwrite=args.overwrite)
    elif args.step == "aggregate":
        prefix_targets(args.out_prefix, (".tsv", "_assays.tsv"), overwrite=args.overwrite)
    else:
        tables = [s + t for s in ("", "_categories", "_assays", "_doubles") for t in TABLE]
        figures = [s + f for s in ("_categories", "_doubles") for f in FIGURE]
        prefix_targets(args.table_prefix, tables, option="--table-prefix", overwrite=args.overwrite)
        prefix_targets(args.figure_prefix, figures, option="--figure-prefix", overwrite=args.overwrite)


def run(args: argparse.Namespace) -> int:
    targets(args)
    return STEPS[args.step](args)


def _select(args: argparse.Namespace) -> int:
    # engine imports on use, in each step: selecting the assays or writing the tables does not wait for torch
    from pmlm.proteingym.reference import select

    assays = select(args.reference, args.archive, args.out, assays=args.assays, max_length=args.max_length)
    proteins = len({a.uniprot for a in assays})
    print(f"pmlm proteingym select: {len(assays)} assays of {proteins} proteins -> {args.out}", file=sys.stderr)
    return 0


def _score(args: argparse.Namespace) -> int:
    # engine imports on use (torch)
    from pmlm.inference.mutations import ADDITIVE, PAIR_JOINT
    from pmlm.proteingym.assay_scoring import score

    summary = score(
        args.model,
        args.archive,
        args.assays,
        args.assay,
        args.out_prefix,
        double=args.double,
        mismatch=args.mismatch,
        permutations=args.permutations,
        seed=args.seed,
        label=args.label,
        device=args.device,
    )
    use_pair = args.double.joint(has_pair=summary["encoder"]["pair_head"], fits=True)
    main = summary["metrics"][PAIR_JOINT if use_pair else ADDITIVE]["all"]
    rho = "nan" if main.get("spearman") is None else f"{main['spearman']:.3f}"
    depths = summary["counts"]["depth"]
    by_depth = ", ".join(f"{n} with {d} site{'s' if int(d) > 1 else ''}" for d, n in depths.items())
    cost = summary["cost"]
    print(
        f"pmlm proteingym score: {args.assay}: {summary['counts']['scored']} mutants ({by_depth}) in "
        f"{cost['forward_passes']} forward passes, {cost['seconds']:.1f} s; Spearman {rho} -> {args.out_prefix}.tsv",
        file=sys.stderr,
    )
    return 0


def _aggregate(args: argparse.Namespace) -> int:
    # engine imports on use (pandas)
    from pmlm.commands import labelled_paths
    from pmlm.proteingym.summary import aggregate_scores

    encoders = labelled_paths(args.encoder, "--encoder")
    counts = aggregate_scores(encoders, args.assays, args.out_prefix)
    print(
        f"pmlm proteingym aggregate: {len(encoders)} encoder(s) x {counts['DMS_id'].nunique()} assays -> "
        f"{args.out_prefix}.tsv",
        file=sys.stderr,
    )
    return 0


def _tables(args: argparse.Namespace) -> int:
    # engine imports on use (pandas, matplotlib)
    from pmlm.proteingym.tabulate import write_tables

    paths = write_tables(args.summary, args.assays_scored, args.table_prefix, args.figure_prefix)
    print(
        f"pmlm proteingym tables: wrote {len(paths)} files ({args.table_prefix}.*, {args.figure_prefix}_*)",
        file=sys.stderr,
    )
    return 0


STEPS = {"select": _select, "score": _score, "aggregate": _aggregate, "tables": _tables}
