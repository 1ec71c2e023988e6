"""``pmlm score MODEL --sequence FASTA --mutations muts.csv -o scores.tsv``: mutant scores (see
pmlm.inference.mutations and pmlm.inference.mutant_table); ``pmlm score MODEL --saturation --sequence FASTA -o
OUT.parquet``: every single substitution of every sequence (see pmlm.inference.saturation)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import add_adapter, add_device, add_precision, add_unknown, print_repairs
from pmlm.errors import ConfigError
from pmlm.inference.options import DoubleScore, Marginal, TripleScore
from pmlm.outputs import OVERWRITE_HELP
from pmlm.tokens import DEFAULT_TOKENS_PER_BATCH


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Mutants (A23G, A23G:L40P, ...; 1-based, letters in either case) are scored against the wild type. "
        "Singles: the masked marginal log P(mut) - log P(wt), the site masked. Doubles: the pair head's joint with "
        "both sites masked, log P(a', b') - log P(a, b) (double_from pair_joint); encoders without a pair head "
        "(MLM) give the additive score, the sum of the singles. Triples: the Triple MLM's joint with the three "
        "sites masked (triple_joint), else the singles plus each of the three pairs' epistasis, its double score "
        "minus its singles (pairs), else additive. Four or more sites: the singles plus every pair's epistasis "
        "on an encoder with a pair head (multi_from pairs), else additive. pmlm proteingym score scores with the "
        "same rule. A joint needs its sites in one window of the model (max_len - 2 residues): under auto a "
        "mutant whose first and last sites are farther apart is scored additively, and stderr says how many; "
        "--double pair and --triple triple|pairs refuse it (file and line). "
        "Output TSV: every column of the CSV as given, then kind (single | double | triple | multiple), score, "
        "additive, epistasis (score - additive), double_from (pair_joint | additive), triple_from "
        "(triple_joint | pairs | additive), multi_from (pairs | additive), precision (fp32 | bf16); a CSV column "
        "with one of these names is refused. "
        "--saturation: every single substitution of every sequence of the FASTA, 19 rows per residue (none at "
        "X): id, mutant, position (1-based), wt, mut, score (float32), as Parquet (settings as JSON under the "
        "schema metadata key pmlm) or TSV by -o's suffix. --marginal masked (default): one masked row per site, "
        "equal to the singles above; wildtype: one unmasked pass per window, each site read from the window "
        "where it is most central. -o must name a file ending as its format: a folder, '.', or an existing file "
        "of another format is refused before anything runs; the file appears whole at the end."
    )
    p.add_argument(
        "model", metavar="MODEL", help="encoder: model.safetensors (with model.json), its folder or its model.json"
    )
    p.add_argument(
        "--sequence",
        required=True,
        metavar="FASTA",
        help="the wild-type sequence (one record); with --saturation, every sequence to scan",
    )
    p.add_argument(
        "--mutations",
        metavar="CSV",
        help="CSV with a header and a 'mutant' column: A23G, A23G:L40P, A23G:L40P:K51E, ... (1-based)",
    )
    p.add_argument(
        "--saturation",
        action="store_true",
        help="score every single substitution of every sequence of --sequence (no --mutations)",
    )
    p.add_argument("-o", "--out", required=True, metavar="SCORES.tsv|OUT.parquet")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument(
        "--double",
        type=DoubleScore.argument,
        choices=DoubleScore.values(),
        help="double mutants: from the pair head's joint (pair), the sum of the singles (additive), or "
        "the joint when the encoder has a pair head and the sites fit one window (auto, default)",
    )
    p.add_argument(
        "--triple",
        type=TripleScore.argument,
        choices=TripleScore.values(),
        help="mutants of three or more sites: from the triple head's joint (triple: three sites, a Triple MLM), "
        "the singles plus every pair's epistasis (pairs), the sum of the singles (additive), or the richest the "
        "encoder has where the sites fit one window (auto, default)",
    )
    p.add_argument(
        "--marginal",
        type=Marginal.argument,
        choices=Marginal.values(),
        help="--saturation: masked marginal, one masked row per site (masked, default), or the wild-type "
        "marginal, one unmasked pass per window (wildtype)",
    )
    p.add_argument(
        "--tokens-per-batch",
        type=int,
        metavar="N",
        help=f"--saturation: token budget of a forward pass, rows x padded width (default {DEFAULT_TOKENS_PER_BATCH})",
    )
    add_unknown(p)
    add_device(p)
    add_precision(p, "the encoder's")
    add_adapter(p)


def _check(args: argparse.Namespace) -> None:
    if args.saturation:
        if args.mutations is not None:
            raise ConfigError("--saturation scores every substitution: give --mutations or --saturation, not both")
        given = [o for o, v in (("--double", args.double), ("--triple", args.triple)) if v is not None]
        if given:
            raise ConfigError(f"{given[0]} applies to --mutations, not --saturation (its rows are singles)")
        return
    if args.mutations is None:
        raise ConfigError("give --mutations CSV (the mutants to score) or --saturation (every substitution)")
    given = [
        o for o, v in (("--marginal", args.marginal), ("--tokens-per-batch", args.tokens_per_batch)) if v is not None
    ]
    if given:
        raise ConfigError(f"{given[0]} applies to --saturation only")


def _saturation(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.saturation import score_saturation

    done = score_saturation(
        args.model,
        args.sequence,
        args.out,
        marginal=args.marginal or Marginal.MASKED,
        tokens_per_batch=DEFAULT_TOKENS_PER_BATCH if args.tokens_per_batch is None else args.tokens_per_batch,
        device=args.device,
        precision=args.precision,
        unknown=args.unknown,
        overwrite=args.overwrite,
        adapter=args.adapter,
    )
    print_repairs("pmlm score", done["report"])
    print(
        f"pmlm score: {done['sequences']} sequences, {done['residues']:,} residues, {done['rows']:,} substitutions "
        f"({done['marginal']} marginal, {done['precision']}) -> {args.out}",
        file=sys.stderr,
    )
    return 0


def run(args: argparse.Namespace) -> int:
    _check(args)
    if args.saturation:
        return _saturation(args)
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.mutant_table import score_fasta
    from pmlm.inference.mutations import SOURCE_COLUMN

    done = score_fasta(
        args.model,
        args.sequence,
        args.mutations,
        args.out,
        double=args.double or DoubleScore.AUTO,
        triple=args.triple or TripleScore.AUTO,
        device=args.device,
        precision=args.precision,
        unknown=args.unknown,
        overwrite=args.overwrite,
        adapter=args.adapter,
    )
    print_repairs("pmlm score", done["report"])
    for note in done["notes"]:
        print(f"pmlm score: {note}", file=sys.stderr)
    by_kind = {}
    for row in done["rows"]:
        by_kind.setdefault(row["kind"], []).append(row)
    parts = [f"{len(by_kind.get('single', ()))} single"]
    for kind, column in SOURCE_COLUMN.items():
        if kind in by_kind:
            sources = sorted({r[column] for r in by_kind[kind]})
            parts.append(f"{len(by_kind[kind])} {kind} ({column} {', '.join(sources)})")
    print(f"pmlm score: {done['id']}: {', '.join(parts)} mutants ({done['precision']}) -> {args.out}", file=sys.stderr)
    return 0
