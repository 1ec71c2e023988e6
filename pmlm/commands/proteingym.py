"""``pmlm proteingym``: zero-shot mutation effects on ProteinGym's substitution assays (engine: pmlm.proteingym)."""

from __future__ import annotations

import argparse

ENGINE = "pmlm.proteingym.cli"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="step", required=True, metavar="<step>")
    sel = sub.add_parser("select", help="the assays to score, from the reference file; checks the archive holds them")
    sel.add_argument("--reference", required=True, metavar="CSV",
                     help="ProteinGym's reference file (DMS_substitutions.csv)")
    sel.add_argument("--archive", required=True, metavar="ZIP",
                     help="the assays archive (DMS_ProteinGym_substitutions.zip)")
    sel.add_argument("--assays", default="all", metavar="all|ID,ID,...", help="DMS_id values, comma-separated, or all")
    sel.add_argument("--max-length", type=int, metavar="N", help="leave out assays whose target_seq is longer")
    sel.add_argument("-o", "--out", required=True, metavar="ASSAYS.tsv")

    score = sub.add_parser("score", help="score every mutant of one assay with one encoder, and the assay's metrics")
    score.add_argument("model", metavar="MODEL", help="encoder: model.safetensors (with model.json) or its folder")
    score.add_argument("--archive", required=True, metavar="ZIP")
    score.add_argument("--assays", required=True, metavar="ASSAYS.tsv", help="the selection written by select")
    score.add_argument("--assay", required=True, metavar="DMS_ID")
    score.add_argument("--out-prefix", required=True, help="writes PREFIX.tsv (per mutant) and PREFIX.json (summary)")
    score.add_argument("--double", choices=("auto", "pair", "additive"), default="auto",
                       help="double mutants from the pair head's joint (pair), the sum of the singles (additive), or "
                            "the joint where the encoder has a pair head (auto, default)")
    score.add_argument("--mismatch", choices=("skip", "error"), default="skip",
                       help="a mutant disagreeing with target_seq: skip and count it (default) or fail")
    score.add_argument("--permutations", type=int, default=1000,
                       help="permutations of Spearman's p-value (0: none; default %(default)s)")
    score.add_argument("--seed", type=int, default=0, help="seed of the permutations")
    score.add_argument("--label", help="the encoder's name in the summary (default: its path)")
    score.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")

    agg = sub.add_parser("aggregate", help="per UniProt ID, per function category, overall (ProteinGym's aggregation)")
    agg.add_argument("--assays", required=True, metavar="ASSAYS.tsv", help="the selection written by select")
    agg.add_argument("--encoder", action="append", required=True, metavar="LABEL=DIR",
                     help="an encoder's label and the folder of its <DMS_id>.json summaries; repeatable")
    agg.add_argument("--out-prefix", required=True, help="writes PREFIX.tsv (every level) and PREFIX_assays.tsv")

    tab = sub.add_parser("tables", help="tables beside the published models, and the figures")
    tab.add_argument("--summary", required=True, metavar="SUMMARY.tsv", help="aggregate's PREFIX.tsv")
    tab.add_argument("--assays-scored", required=True, metavar="SUMMARY_assays.tsv", help="aggregate's PREFIX_assays.tsv")
    tab.add_argument("--table-prefix", required=True,
                     help="writes PREFIX, PREFIX_categories, PREFIX_assays, PREFIX_doubles (.csv .md .tex .html)")
    tab.add_argument("--figure-prefix", required=True, help="writes PREFIX_categories and PREFIX_doubles (.png .svg)")
