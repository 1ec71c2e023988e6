"""Command-line entry point: ``pmlm <subcommand> ...`` (also ``python -m pmlm``).

Each subcommand's arguments live in a command module (``pmlm/commands/<name>.py``: ``add_arguments(parser)``
and ``ENGINE``, argparse and the standard library only); after parsing, the engine module ``ENGINE`` names
is imported and its ``run(args) -> int`` called. So building the parser never imports torch, ``pmlm fetch``
never pays for it, and ``pmlm pretrain`` / ``finetune`` / ``evaluate`` run where the data stage's
dependencies (Biopython, Snakemake) are not installed, e.g. on a bare GPU image. A command module
without ``ENGINE`` runs the command itself (its own ``run``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pmlm import __version__
from pmlm.errors import PmlmError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "fetch": ("pmlm.commands.fetch", "download a source (http/https/ftp/file) with resume and checksum"),
    "extract": ("pmlm.commands.extract", "extract one member of a (nested) tar archive (e.g. uniref50.tar/uniref50.xml.gz)"),
    "ingest": ("pmlm.commands.ingest", "normalise FASTA, Pfam-A FASTA or UniRef XML into clean FASTA plus a stats JSON"),
    "split": ("pmlm.commands.split", "cluster with MMseqs2, decontaminate, split train/valid by cluster"),
    "split-structures": ("pmlm.commands.split_structures", "train/valid/test split of a structure set by sequence identity"),
    "contacts-from-pdb": ("pmlm.commands.contacts_from_pdb", "C-beta contact set (JSONL) of listed PDB chains from coordinate files"),
    "tokenize": ("pmlm.commands.tokenize", "write tokenized Parquet shards and a manifest"),
    "pretrain": ("pmlm.commands.pretrain", "pre-train an MLM or PMLM encoder from Parquet shards"),
    "launch": ("pmlm.commands.launch", "run a command once per GPU across the nodes of a SLURM allocation (torchrun rendezvous from SLURM's environment)"),
    "kl": ("pmlm.commands.kl", "histogram of KL(P(x_i)P(x_j) || P(x_i,x_j)) of a PMLM model on validation pairs"),
    "tables": ("pmlm.commands.tables", "assemble result tables (CSV, Markdown, LaTeX, HTML) with the paper's rows"),
    "report": ("pmlm.commands.report", "figures and pages of the workflow report: training curves, contact maps, "
                                       "precision by separation, run information"),
    "synth": ("pmlm.commands.synth", "sample synthetic protein families from Potts models with planted couplings"),
    "coevolution": ("pmlm.commands.coevolution", "planted-coupling read-outs and supervised contacts of MLM vs PMLM encoders"),
    "finetune": ("pmlm.commands.finetune", "fine-tune a task head on a pre-trained encoder"),
    "evaluate": ("pmlm.commands.evaluate", "evaluate a fine-tuned head or the pair head's unsupervised contacts"),
    "embed": ("pmlm.commands.embed", "per-residue and per-sequence embeddings of a FASTA file (Parquet)"),
    "contacts": ("pmlm.commands.contacts", "contact maps of FASTA sequences from a contact head or the pair head"),
    "score": ("pmlm.commands.score", "single and double mutant scores (masked marginals, the pair head's joint)"),
    "proteingym": ("pmlm.commands.proteingym", "zero-shot mutation effects on ProteinGym's assays: select, score, "
                                               "aggregate, tables"),
}


class _OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one line (``pmlm split: error: ...``) instead of a usage block; --help still shows usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command`` only that subcommand's module is imported (all of them otherwise)."""
    parser = _OneLineErrors(
        prog="pmlm",
        description="Pairwise Masked Language Model: data preparation, pre-training and evaluation.",
    )
    parser.add_argument("--version", action="version", version=f"pmlm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=_OneLineErrors)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        if command is None or name == command:
            # command modules are argparse only; the engine (torch etc.) loads after parsing
            importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the first word that is not an option names the subcommand (options before it take no values)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    module = importlib.import_module(args._module)
    engine = importlib.import_module(module.ENGINE) if hasattr(module, "ENGINE") else module
    try:
        return int(engine.run(args) or 0)
    except PmlmError as exc:
        print(f"pmlm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pmlm {args.command}: interrupted", file=sys.stderr)
        return 130
