"""``pmlm gather OUTPUT --shards DIR --parts DIR -o OUT.parquet``: an encoder's shard outputs gathered into one
Parquet file in input order, after checking they are the shards' and were computed alike (see
pmlm.inference.gather)."""

from __future__ import annotations

import argparse
import sys

from pmlm.outputs import FILE_OVERWRITE_HELP
from pmlm.vocabulary import INFERENCE_OUTPUTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "Every shard of --shards (a folder pmlm shard-fasta wrote) must have its part in --parts, named <shard>.parquet "
        "(embeddings: also <shard>.per_sequence.parquet, gathered into OUT's .per_sequence.parquet); every part must "
        "hold its shard's records in order and have the same settings (schema metadata key pmlm: model sha256, "
        "layer, window, precision, ...). OUT records those settings and, under 'inference', the input FASTA's path "
        "and sha256, the sharding strategy, the shard count and the rows."
    )
    p.add_argument("output", choices=INFERENCE_OUTPUTS, metavar="OUTPUT", help=f"one of {', '.join(INFERENCE_OUTPUTS)}")
    p.add_argument("--shards", required=True, metavar="DIR", help="the shards' folder (manifest.json, <shard>.fasta)")
    p.add_argument("--parts", required=True, metavar="DIR", help="the shards' outputs: <shard>.parquet each")
    p.add_argument("-o", "--out", required=True, metavar="OUT.parquet", help="the gathered file")
    p.add_argument(
        "--model",
        metavar="MODEL",
        help="the encoder (model.safetensors, its folder or its model.json): every part must have been computed by "
        "its weights (their sha256)",
    )
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)


def run(args: argparse.Namespace) -> int:
    # engine imports on use, so that the parsers stay light (pmlm/commands/__init__.py)
    from pmlm.inference.gather import gather
    from pmlm.pretrained import encoder_weights

    model = encoder_weights(args.model) if args.model else None  # the weights, their folder or model.json
    done = gather(args.output, args.shards, args.parts, args.out, model=model, overwrite=args.overwrite)
    rows = " + ".join(f"{n:,}" for n in done["rows"])
    files = ", ".join(map(str, done["files"]))
    print(
        f"pmlm gather: {args.output} of {done['sequences']:,} sequences from {done['shards']} shard(s), {rows} rows "
        f"-> {files}",
        file=sys.stderr,
    )
    return 0
