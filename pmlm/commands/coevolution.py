"""``pmlm coevolution``: planted-coupling read-outs of an MLM and a PMLM encoder on held-out sequences of
synthetic Potts families, and the supervised contact head on held-out families (``split`` makes the
training / held-out FASTAs, ``report`` aggregates seeds; ``curves`` runs the learning curves at equal compute and
``curves-report`` makes their tables, figure and documentation block). Engines: ``pmlm.coevolution.evaluate`` (split,
read-outs), ``pmlm.coevolution.report``, ``pmlm.coevolution.curves`` and ``pmlm.coevolution.curve_report``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pmlm.errors import ConfigError
from pmlm.outputs import FILE_OVERWRITE_HELP

TABLE = (".csv", ".md", ".tex", ".html")
FIGURE = (".png", ".svg")
# what `coevolution curves --out DIR` keeps there (pmlm.coevolution.curves): its data, runs, units, results
CURVES_RUN_NAMES = ("data", "runs", "units", "curves.tsv", "sequences.tsv", "curves.md", "curves.png", "curves.svg")
CURVES_RUN_NAMES += ("*.log",)

# StudyConfig field -> (type, help); defaults live in pmlm.coevolution.heldout.StudyConfig (run()
# fills every flag left out), so they are stated once
STUDY_FLAGS: dict[str, tuple[type, str]] = {
    "seed": (int, "study seed, recorded with the results; orders the contact head's family folds and seeds its fit"),
    "valid_fraction": (float, "share of each family's sequences held out; must match the split step"),
    "split_seed": (int, "seed of the held-out draw; must match the split step"),
    "sequences": (int, "held-out sequences per family, the same ones for every read-out (default 8)"),
    "chain_rule": (int, "1: also the token head's chain-rule joint (41 forwards per pair); 0 skips it (default 1)"),
    "min_separation": (int, "pairs with |i-j| below this are not scored (default 6)"),
    "k_divisor": (int, "P@L/k (default 5)"),
    "head_steps": (int, "full-batch Adam steps of the supervised contact head (default 300)"),
    "head_lr": (float, "learning rate of the supervised contact head (default 0.01)"),
    "head_dropout": (float, "dropout on the supervised head's pair features (default 0)"),
    "batch_rows": (int, "sequences per forward pass, bounds memory (default 4096)"),
    "exact": (
        int,
        "1: epistasis and conditional log-loss against the families' exact Potts values; 0 skips it (default 1)",
    ),
    "substitution": (int, "1: also the token heads' epistasis by substitution (40 forwards per pair) (default 0)"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Subcommands: 'split' writes the training / held-out FASTAs; 'report' aggregates seeds; 'curves' runs the "
        "learning curves of MLM and PMLM at equal compute (config/coevolution_curves.yaml); 'curves-report' "
        "remakes their tables, figure and documentation block from curves.tsv."
    )
    p.add_argument("--synth", metavar="DIR", help="pmlm synth output (families.fasta, contacts/)")
    p.add_argument("--mlm", metavar="WEIGHTS", help="MLM encoder (model.safetensors with its .json, or its folder)")
    p.add_argument("--pmlm", metavar="WEIGHTS", help="PMLM encoder (model.safetensors with its .json, or its folder)")
    p.add_argument("--tmlm", metavar="WEIGHTS", help="optional Triple MLM encoder, read out beside the two")
    p.add_argument("--out-prefix", metavar="PREFIX", help="writes PREFIX.json and PREFIX.tsv")
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the encoders run: auto (CUDA when available), cpu or cuda (default: auto)",
    )
    for name, (kind, help_text) in STUDY_FLAGS.items():
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=help_text,
        )
    sub = p.add_subparsers(dest="action", metavar="{split,report,curves,curves-report}")
    s = sub.add_parser("split", help="split pmlm synth sequences into training and held-out FASTAs")
    s.add_argument("--synth", required=True, metavar="DIR", help="pmlm synth output folder")
    s.add_argument("--train", required=True, metavar="FASTA", help="training sequences (cluster=family headers)")
    s.add_argument("--valid", required=True, metavar="FASTA", help="held-out sequences")
    for name in ("valid_fraction", "split_seed"):
        kind, help_text = STUDY_FLAGS[name]
        s.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"{help_text} (default: 0.1 and 0)",
        )
    s.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)
    r = sub.add_parser("report", help="aggregate per-seed results into tables and a figure")
    r.add_argument("--results", required=True, nargs="+", metavar="JSON", help="per-seed results of pmlm coevolution")
    r.add_argument(
        "--out-prefix",
        required=True,
        metavar="PREFIX",
        help="writes PREFIX.{csv,md,tex,html,png,svg}, PREFIX_supervised.{csv,md,tex,html} and "
        "PREFIX_exact.{csv,md,tex,html}",
    )
    r.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)

    c = sub.add_parser("curves", help="learning curves of MLM and PMLM at equal compute on exact ground truth")
    c.add_argument("--config", required=True, metavar="YAML", help="the study (config/coevolution_curves.yaml)")
    c.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="work and results folder (curves.tsv, curves.md, ...), a run folder of its own that a rerun resumes "
        "(one holding anything else is refused)",
    )
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    c.add_argument(
        "--collect",
        action="store_true",
        help="train nothing: report the units that ended and the budgets the others reached (a run stopped by a "
        "time limit), each unit's state on stderr",
    )
    _report_flags(c)
    cr = sub.add_parser("curves-report", help="tables, figure and documentation block from a curves.tsv")
    cr.add_argument("--results", required=True, metavar="TSV", help="curves.tsv of pmlm coevolution curves")
    cr.add_argument("--out-prefix", required=True, metavar="PREFIX", help="writes PREFIX.md, PREFIX.png, PREFIX.svg")
    _report_flags(cr)


def _report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--doc", metavar="MARKDOWN", help="replace the block between the markers of this page")
    p.add_argument(
        "--doc-block",
        default="coevolution-curves",
        metavar="NAME",
        help="which block of --doc: the lines <!-- NAME:begin --> and <!-- NAME:end --> (default: coevolution-curves; "
        "the GPU-length run's: coevolution-curves-gpu-length)",
    )
    p.add_argument("--figure", metavar="PREFIX", help="also write the figure to PREFIX.png and PREFIX.svg")
    p.add_argument(
        "--no-figure", action="store_true", help="tables only (curves-report makes the figure later from curves.tsv)"
    )
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)


def targets(args: argparse.Namespace) -> None:
    """Check the action's output targets before any work (pmlm.outputs); ``--doc`` is a page whose marked block
    is replaced in place, by design (pmlm.coevolution.curve_report.write_doc)."""
    # on use, as the engines: building the parsers stays light (pmlm/commands/__init__.py)
    from pmlm.outputs import file_target, prefix_targets, run_folder_target

    if args.action == "split":
        for option, path in (("--train", args.train), ("--valid", args.valid)):
            file_target(path, suffixes=(".fasta",), option=option, what="FASTA", overwrite=args.overwrite)
        return
    if args.action == "report":
        suffixes = [*TABLE, *FIGURE, *(f"_supervised{t}" for t in TABLE), *(f"_exact{t}" for t in TABLE)]
        prefix_targets(args.out_prefix, suffixes, overwrite=args.overwrite)
        return
    if args.action is None:
        if args.out_prefix:
            prefix_targets(args.out_prefix, (".json", ".tsv"), overwrite=args.overwrite)
        return
    figure = () if args.no_figure else FIGURE
    if args.action == "curves":
        run_folder_target(args.out, command="pmlm coevolution curves", names=CURVES_RUN_NAMES)
    else:
        prefix_targets(args.out_prefix, (".md", *figure), overwrite=args.overwrite)
    if args.figure and figure:
        prefix_targets(args.figure, figure, option="--figure", overwrite=args.overwrite)


def _curves(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.coevolution.curve_report import Results, markdown, plot_curves, write_doc
    from pmlm.coevolution.curves import collect_rows, read_rows, run_curves, write_results
    from pmlm.coevolution.curves_config import CurvesConfig
    from pmlm.files import atomic_output

    if args.action == "curves":
        cfg = CurvesConfig.from_yaml(args.config, args.set)
        if args.collect:
            rows, states = collect_rows(cfg, args.out)
            for name, state in states.items():
                print(f"coevolution curves: {name}: {state}", file=sys.stderr)
            if not rows:
                raise ConfigError(f"{args.out}: no unit of this config has reached a budget yet")
            results = write_results(cfg, Path(args.out), rows)
        else:
            results = run_curves(cfg, args.out)
        prefix = Path(args.out) / "curves"
    else:
        results, prefix = Path(args.results), Path(args.out_prefix)
    res = Results(read_rows(results), results)
    block = markdown(res)
    with atomic_output(prefix.with_suffix(".md")) as tmp:
        Path(tmp).write_text(block)
    paths = [prefix.with_suffix(".md")]
    if not args.no_figure:
        paths += plot_curves(res, prefix)
        if args.figure:
            paths += plot_curves(res, args.figure)
    if args.doc:
        changed = write_doc(args.doc, block, args.doc_block)
        paths.append(f"{args.doc} ({'updated' if changed else 'unchanged'})")
    print(f"coevolution {args.action}: {results} -> {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.coevolution.heldout import StudyConfig

    # the study flags given; a flag left out keeps the StudyConfig default
    given = {k: getattr(args, k, None) for k in StudyConfig.__dataclass_fields__}
    cfg = StudyConfig(**{k: v for k, v in given.items() if v is not None})
    targets(args)
    if args.action in ("curves", "curves-report"):
        return _curves(args)
    if args.action == "split":
        from pmlm.coevolution.evaluate import split_study

        counts = split_study(args.synth, args.train, args.valid, cfg)
        print(f"coevolution split: {counts['train']} training, {counts['valid']} held-out sequences", file=sys.stderr)
        return 0
    if args.action == "report":
        from pmlm.coevolution.exact_report import write_exact_table
        from pmlm.coevolution.report import (
            MIN_SEEDS,
            load_results,
            plot_report,
            write_report_table,
            write_supervised_table,
        )

        prefix = args.out_prefix
        docs = load_results(args.results)
        paths = (
            write_report_table(docs, prefix)
            + write_supervised_table(docs, prefix)
            + write_exact_table(docs, prefix + "_exact")
            + plot_report(docs, prefix)
        )
        if len(docs) < MIN_SEEDS:
            print(
                f"coevolution report: note: {len(docs)} seed(s); the study calls for at least {MIN_SEEDS}",
                file=sys.stderr,
            )
        print(f"coevolution report: {len(docs)} seed(s) -> {', '.join(str(p) for p in paths)}", file=sys.stderr)
        return 0
    missing = [
        flag
        for flag, value in (
            ("--synth", args.synth),
            ("--mlm", args.mlm),
            ("--pmlm", args.pmlm),
            ("--out-prefix", args.out_prefix),
        )
        if not value
    ]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)} (or give a subcommand: split, report)")
    from pmlm.coevolution.evaluate import evaluate_study
    from pmlm.coevolution.study import headline
    from pmlm.pretrained import encoder_weights

    # each encoder's weights, their folder or model.json: one reading everywhere, checked before any work
    mlm, pmlm = encoder_weights(args.mlm), encoder_weights(args.pmlm)
    tmlm = encoder_weights(args.tmlm) if args.tmlm else None
    document = evaluate_study(args.synth, mlm, pmlm, args.out_prefix, cfg, tmlm=tmlm, device=args.device)
    print(f"coevolution: seed {cfg.seed}: {headline(document['summary'])} -> {args.out_prefix}.json", file=sys.stderr)
    return 0
