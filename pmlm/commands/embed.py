"""``pmlm embed MODEL FASTA -o OUT.parquet``: per-residue and per-sequence embeddings (see pmlm.inference.embedding)."""

from __future__ import annotations

import argparse
import sys

from pmlm.commands import UNKNOWN_CHOICES, add_adapter, add_device, add_precision, add_unknown, print_repairs
from pmlm.outputs import OVERWRITE_HELP
from pmlm.tokens import DEFAULT_TOKENS_PER_BATCH

__all__ = ["UNKNOWN_CHOICES", "add_arguments", "run"]  # UNKNOWN_CHOICES: pmlm shard-fasta's --unknown takes them


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "OUT: one row per residue (id, position 1-based, residue, embedding list<float32>); the per-sequence "
        "file: id, length, embedding (mean over the residues). Sequences longer than the model's window are "
        "read as overlapping windows, each residue averaged over the windows holding it. Both files' schema "
        "metadata (key pmlm) holds the settings, among them the precision the forward passes used. Lowercase "
        "letters are read as uppercase. Both outputs are checked before any work and appear together at the end."
    )
    p.add_argument(
        "model", metavar="MODEL", help="encoder: model.safetensors (with model.json), its folder or its model.json"
    )
    p.add_argument(
        "fasta",
        metavar="FASTA",
        help="protein sequences (FASTA or FASTA.gz; residues ACDEFGHIKLMNPQRSTVWY or X, either case)",
    )
    p.add_argument("-o", "--out", required=True, metavar="OUT.parquet", help="per-residue embeddings")
    p.add_argument(
        "--per-sequence", metavar="PATH.parquet", help="per-sequence means (default: OUT with .per_sequence.parquet)"
    )
    p.add_argument(
        "--layer",
        type=int,
        default=-1,
        help="0 = token embeddings, k = output of layer k, -1 (default) = the final output after the "
        "last LayerNorm; negative values count from the end",
    )
    p.add_argument(
        "--tokens-per-batch",
        type=int,
        default=DEFAULT_TOKENS_PER_BATCH,
        help="token budget of a forward pass: rows x padded width (default %(default)s)",
    )
    add_unknown(p)
    add_device(p)
    add_precision(p, "the encoder's")
    add_adapter(p)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.embedding import embed_fasta

    done = embed_fasta(
        args.model,
        args.fasta,
        args.out,
        per_sequence=args.per_sequence,
        layer=args.layer,
        tokens_per_batch=args.tokens_per_batch,
        device=args.device,
        precision=args.precision,
        unknown=args.unknown,
        overwrite=args.overwrite,
        adapter=args.adapter,
    )
    print_repairs("pmlm embed", done["report"])
    print(
        f"pmlm embed: {done['sequences']} sequences, {done['residues']:,} residues, layer {done['layer']} "
        f"of {done['num_layers']}, {done['precision']} -> {args.out}, {done['per_sequence']}",
        file=sys.stderr,
    )
    return 0
