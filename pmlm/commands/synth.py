"""``pmlm synth``: sample synthetic protein families from Potts models with planted couplings."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from pmlm.outputs import OVERWRITE_HELP
from pmlm.synth.potts import PottsConfig
from pmlm.synth.synth_config import SynthConfig

# CLI flag -> (PottsConfig field, type, help); the field is the option's dest, flags left out keep the dataclass default
_POTTS_FLAGS = {
    "length": ("length", int, "residues per sequence"),
    "sequences": ("num_sequences", int, "sequences per family"),
    "edges": ("edges", int, "planted couplings per family (default: one per residue)"),
    "coupling_strength": ("coupling_strength", float, "J bonus in nats of each favoured residue pair"),
    "compatible_pairs": ("compatible_pairs", int, "residue pairs each coupling favours"),
    "coupling_noise": ("coupling_noise", float, "std of Gaussian noise on every J entry"),
    "short_range_fraction": ("short_range_fraction", float, "share of edges with 6 <= |i-j| < 12"),
    "max_degree": ("max_degree", int, "most couplings at one site"),
    "field_concentration": ("field_concentration", float, "Dirichlet concentration of site profiles"),
    "chains": ("chains", int, "independent Gibbs chains"),
    "burn_in": ("burn_in", int, "sweeps discarded per chain"),
    "thinning": ("thinning", int, "sweeps between kept samples"),
    "triplets": ("triplets", int, "planted three-body terms per family (disjoint site triples)"),
    "triplet_strength": ("triplet_strength", float, "K bonus in nats of each favoured residue triple"),
    "compatible_triples": ("compatible_triples", int, "residue triples each three-body term favours"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = PottsConfig()
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="a folder of its own (created if missing; one holding files pmlm synth did not write is refused)",
    )
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument(
        "--families", type=int, default=SynthConfig.families, metavar="INT",
        help=f"number of families (default: {SynthConfig.families})",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=SynthConfig.seed, metavar="INT",
        help=f"master random seed (default: {SynthConfig.seed})",
    )  # fmt: skip
    parser.add_argument(
        "--prefix", default=SynthConfig.prefix, metavar="STR",
        help=f"family name prefix (default: {SynthConfig.prefix})",
    )  # fmt: skip
    for flag, (name, kind, help_text) in _POTTS_FLAGS.items():
        default = getattr(defaults, name) if name != "edges" else None
        suffix = f" (default: {default})" if default is not None else ""
        parser.add_argument(
            f"--{flag.replace('_', '-')}",
            dest=name,
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=help_text + suffix,
        )


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.synth.synthesize import synthesize

    # the options named after PottsConfig's fields that were given; the rest keep their defaults
    given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(PottsConfig)}
    potts = PottsConfig(**{name: value for name, value in given.items() if value is not None})
    config = SynthConfig(families=args.families, seed=args.seed, prefix=args.prefix, potts=potts)
    start = time.perf_counter()
    families = synthesize(config, args.out, overwrite=args.overwrite)
    total = sum(len(f.sequences) for f in families)
    print(
        f"pmlm synth: {len(families)} {'family' if len(families) == 1 else 'families'}, {total} sequences "
        f"of length {config.potts.length} sampled and written in {time.perf_counter() - start:.1f} s -> {args.out}",
        file=sys.stderr,
    )
    return 0
