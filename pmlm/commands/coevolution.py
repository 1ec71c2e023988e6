"""``pmlm coevolution``: the co-evolution study on exact ground truth. ``curves`` samples Potts families, trains one
encoder per arm (MLM, PMLM, ...) with the same recipe and reads every one out at every budget (one budget: at the
end of training only), ``curves-report`` makes the tables, figure and documentation block from its ``curves.tsv``.
The workflow's ``coevolution`` target runs the same study one unit per job (``--prepare``, ``--unit``,
``--collect``). Engines: ``pmlm.coevolution.curves`` and ``pmlm.coevolution.curve_report``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pmlm.errors import ConfigError
from pmlm.outputs import FILE_OVERWRITE_HELP

FIGURE = (".png", ".svg")
# what `coevolution curves --out DIR` keeps there (pmlm.coevolution.curves): its data, runs, units, results
CURVES_RUN_NAMES = ("data", "runs", "units", "curves.tsv", "sequences.tsv", "curves.md", "curves.png", "curves.svg")
CURVES_RUN_NAMES += ("*.log",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Subcommands: 'curves' runs the study (config/coevolution*.yaml: MLM and PMLM arms at equal compute, read "
        "out at every budget); 'curves-report' remakes its tables, figure and documentation block from curves.tsv."
    )
    sub = p.add_subparsers(dest="action", metavar="{curves,curves-report}", required=True)
    c = sub.add_parser("curves", help="learning curves of MLM and PMLM at equal compute on exact ground truth")
    given = c.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--config",
        metavar="YAML",
        help="the study (config/coevolution*.yaml): its keys, or a workflow config with a coevolution: section",
    )
    given.add_argument("--config-json", metavar="JSON", help="the study as one JSON object (the workflow's rules)")
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
    step = c.add_mutually_exclusive_group()
    step.add_argument(
        "--prepare", type=int, metavar="SEED", help="only sample, split and tokenize the families of one seed"
    )
    step.add_argument(
        "--unit",
        metavar="NAME",
        help="only run one unit (seed1-L40-pmlm: one arm of one seed; seed1-baseline), its seed prepared before",
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
    from pmlm.outputs import prefix_targets, run_folder_target

    figure = () if args.no_figure else FIGURE
    if args.action == "curves":
        run_folder_target(args.out, command="pmlm coevolution curves", names=CURVES_RUN_NAMES)
    else:
        prefix_targets(args.out_prefix, (".md", *figure), overwrite=args.overwrite)
    if args.figure and figure:
        prefix_targets(args.figure, figure, option="--figure", overwrite=args.overwrite)


def study_config(args: argparse.Namespace):
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.coevolution.curves_config import CurvesConfig
    from pmlm.config.tree import apply_override

    if args.config:
        return CurvesConfig.from_yaml(args.config, args.set)
    try:
        values = json.loads(args.config_json)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config-json: not valid JSON: {exc.msg}") from None
    if not isinstance(values, dict):
        raise ConfigError("--config-json: expected one JSON object of study settings")
    for item in args.set:
        apply_override(values, item)
    return CurvesConfig.from_dict(values)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.coevolution.curve_report import Results, markdown, plot_curves, write_doc
    from pmlm.coevolution.curves import (
        collect_rows,
        prepare_seed,
        read_rows,
        run_curves,
        run_unit,
        write_results,
    )
    from pmlm.files import atomic_output

    targets(args)
    if args.action == "curves":
        cfg = study_config(args)
        out = Path(args.out)
        if args.prepare is not None:
            if args.prepare not in cfg.seeds:
                raise ConfigError(f"--prepare {args.prepare}: not one of the study's seeds {cfg.seeds}")
            prepare_seed(cfg, args.prepare, out)
            print(f"coevolution curves: seed {args.prepare} prepared in {out / 'data'}", file=sys.stderr)
            return 0
        if args.unit:
            unit = cfg.unit(args.unit)
            prepare_seed(cfg, unit.seed, out)
            done = run_unit(cfg.to_dict(), unit, str(out), ".")
            print(f"coevolution curves: unit {unit.name} -> {done}", file=sys.stderr)
            return 0
        if args.collect:
            rows, states = collect_rows(cfg, out)
            for name, state in states.items():
                print(f"coevolution curves: {name}: {state}", file=sys.stderr)
            if not rows:
                raise ConfigError(f"{args.out}: no unit of this config has reached a budget yet")
            results = write_results(cfg, out, rows)
        else:
            results = run_curves(cfg, out)
        prefix = out / "curves"
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
