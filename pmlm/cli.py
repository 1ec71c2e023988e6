"""Command-line entry point: ``pmlm <subcommand> ...`` (also ``python -m pmlm``).

``pmlm X`` is the command module ``pmlm/commands/X.py`` (dashes become underscores): its ``add_arguments``
builds the parser, its ``run(args) -> int`` does the work. Command modules import their engines only when
they run, so building the parser never imports torch, ``pmlm fetch`` never pays for it, and ``pmlm pretrain``
/ ``finetune`` / ``evaluate`` run where the data stage's dependencies (Biopython, Snakemake) are not installed,
e.g. on a bare GPU image.
"""

from __future__ import annotations

import argparse
import importlib
import keyword
import os
import sys

from pmlm.errors import PmlmError
from pmlm.version import __version__

# name -> one-line help, in the order `pmlm --help` lists them; the code of `pmlm X` is command_module(X)
SUBCOMMANDS: dict[str, str] = {
    "fetch": "download a source (http/https/ftp/file) with resume and checksum",
    "extract": "extract one member of a (nested) tar archive (e.g. uniref50.tar/uniref50.xml.gz)",
    "ingest": "normalise FASTA, Pfam-A FASTA or UniRef XML into clean FASTA plus a stats JSON",
    "split": "cluster with MMseqs2, decontaminate, split train/valid by cluster",
    "split-structures": "train/valid/test split of a structure set by sequence identity",
    "split-table": "train/valid/test files of a labelled table (your own task), by its split column or identity",
    "contacts-from-pdb": "C-beta contact set (JSONL) of listed PDB chains from coordinate files",
    "tokenize": "write tokenized Parquet shards and a manifest",
    "pretrain": "pre-train an encoder (MLM, PMLM, pair-only PMLM or Triple MLM) from Parquet shards",
    "plan": "steps, tokens, GPU-hours, time-limit segments and peak GPU memory of a config's pre-training jobs",
    "throughput": "a GPU check's measured pre-training rates as the throughput file pmlm plan prices with",
    "launch": "run a command once per GPU across the nodes of a SLURM allocation (torchrun rendezvous from SLURM's environment)",
    "kl": "histogram of KL(P(x_i)P(x_j) || P(x_i,x_j)) of a PMLM model on validation pairs",
    "tables": "assemble result tables (CSV, Markdown, LaTeX, HTML) with the paper's rows",
    "report": "figures and pages of the workflow report: training curves, contact maps, precision by separation, run information",
    "summary": "a run's last screen: its tables and where they are, headline numbers beside the paper's, the report command",
    "synth": "sample synthetic protein families from Potts models with planted couplings",
    "coevolution": "the co-evolution study: MLM vs PMLM encoders read out on planted couplings at equal compute",
    "finetune": "fine-tune a task head on a pre-trained encoder",
    "evaluate": "evaluate a fine-tuned head or the pair head's unsupervised contacts",
    "embed": "per-residue and per-sequence embeddings of a FASTA file (Parquet)",
    "contacts": "contact maps of FASTA sequences from a contact head or the pair head",
    "score": "mutant scores: listed single, double and triple mutants (masked marginals, the pair and triple heads' joints) or every single substitution (--saturation)",
    "import": "a released fairseq PMLM / MLM checkpoint (e.g. pmlm_650m.pt), a transformers ESM folder or an exported folder as an encoder",
    "export": "an encoder as a folder transformers loads (config.json, model.safetensors, tokenizer)",
    "proteingym": "zero-shot mutation effects on ProteinGym's assays: select, score, aggregate, tables",
    "shard-fasta": "check a FASTA file once and cut it into shards balanced by residues, one inference job each",
    "gather": "an encoder's shard outputs (embeddings, substitutions, contacts) as one Parquet file in input order",
}


def command_module(name: str) -> str:
    """The module of ``pmlm name``: ``pmlm.commands.<name>``, dashes as underscores, and a Python keyword with a
    trailing underscore (``pmlm import`` is ``pmlm/commands/import_.py``)."""
    module = name.replace("-", "_")
    return "pmlm.commands." + (module + "_" if keyword.iskeyword(module) else module)


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
    for name, help_text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or name == command:
            # command modules are light; the engine (torch etc.) loads when the command runs
            importlib.import_module(command_module(name)).add_arguments(p)
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
    module = importlib.import_module(command_module(args.command))
    try:
        return int(module.run(args) or 0)
    except PmlmError as exc:
        print(f"pmlm {args.command}: error: {exc}", file=sys.stderr)
        if getattr(exc, "exit_at_once", False):  # no teardown (pmlm.train.step_layout.LostRanks says why)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2)
        return 2
    except KeyboardInterrupt:
        print(f"pmlm {args.command}: interrupted", file=sys.stderr)
        return 130
