"""Learning curves of planted-coupling recovery: how an encoder's double-mutant epistasis approaches the exact
Potts values as it trains, for one or more variants of a pre-training recipe.

Samples a family with ``pmlm synth``, splits it with ``pmlm coevolution split``, tokenizes it, then trains each
variant with ``pmlm pretrain``'s own loop and reads it out every ``--eval-every`` steps on the same held-out
sequences (``pmlm.coevolution.epistasis``: Spearman of predicted against exact epistasis on planted pairs,
mean |epistasis| on planted and on unplanted pairs, conditional pair log-loss gap to the exact entropy).
Training time per variant (wall and process CPU time) is measured without the read-outs. One JSON object per
read-out is appended to ``--out``.

    .venv/bin/python scripts/coupling_curves.py --out curves.jsonl --steps 1500 --eval-every 250 \\
        --variant base --variant mask30:objective.mask_prob=0.3 --variant wide:model.overrides.hidden=128

A variant is NAME or NAME:KEY=VALUE,KEY=VALUE (``--set`` keys of ``pmlm pretrain``, applied after ``--set``).
With ``--families N`` every read-out is the mean over the N families (each family's shard mixed into one run,
as the study trains).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pmlm.cli import main as pmlm_main  # noqa: E402
from pmlm.coevolution.epistasis import family_readouts, summarise_readouts  # noqa: E402
from pmlm.coevolution.heldout import StudyConfig, load_families  # noqa: E402
from pmlm.config.pretraining import TrainConfig  # noqa: E402
from pmlm.synth.parameters import PARAMS_DIR, read_potts  # noqa: E402
from pmlm.train.pretrain import TrainHooks, train  # noqa: E402
from pmlm.vocabulary import PMLM  # noqa: E402


def arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON lines appended here")
    p.add_argument("--work", help="working folder (default: a temporary one)")
    p.add_argument("--families", type=int, default=1, help="families sampled (read-outs are averaged over them)")
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--sequences", type=int, default=4000)
    p.add_argument("--edges", type=int, default=None)
    p.add_argument("--coupling-strength", type=float, default=2.0)
    p.add_argument("--triplets", type=int, default=0)
    p.add_argument("--triplet-strength", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1, help="family seed (pmlm synth --seed)")
    p.add_argument("--recipe", default=str(ROOT / "config" / "train" / "coevolution_tiny.yaml"))
    p.add_argument("--objective", default=PMLM)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-sequences", type=int, default=8)
    p.add_argument("--set", action="append", default=[], help="recipe override for every variant")
    p.add_argument("--variant", action="append", default=[], help="NAME or NAME:KEY=VALUE,KEY=VALUE")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def prepare(work: Path, args) -> Path:
    synth = work / "synth"
    if not (synth / "params.json").exists():
        flags = [
            "synth",
            "--out",
            str(synth),
            "--families",
            str(args.families),
            "--length",
            str(args.length),
            "--sequences",
            str(args.sequences),
            "--coupling-strength",
            str(args.coupling_strength),
            "--seed",
            str(args.seed),
            "--triplets",
            str(args.triplets),
            "--triplet-strength",
            str(args.triplet_strength),
        ]
        if args.edges is not None:
            flags += ["--edges", str(args.edges)]
        assert pmlm_main(flags) == 0
        assert (
            pmlm_main(
                [
                    "coevolution",
                    "split",
                    "--synth",
                    str(synth),
                    "--train",
                    str(work / "train.fasta"),
                    "--valid",
                    str(work / "valid.fasta"),
                ]
            )
            == 0
        )
        assert (
            pmlm_main(
                [
                    "tokenize",
                    "--input",
                    f"train={work / 'train.fasta'}",
                    "--input",
                    f"valid={work / 'valid.fasta'}",
                    "--out-dir",
                    str(work / "shards"),
                    "--num-shards",
                    str(args.families),
                    "--row-group-size",
                    "64",
                ]
            )
            == 0
        )
    return synth


def run_variant(name: str, overrides: list[str], synth: Path, work: Path, args, out) -> None:
    families = load_families(synth, StudyConfig())
    potts = [read_potts(synth / PARAMS_DIR / f"{family.name}.safetensors") for family in families]
    rows = [family.heldout[: args.eval_sequences].astype(np.int64) for family in families]
    sets = [
        f"objective.name={args.objective}",
        f"optim.total_steps={args.steps}",
        "save_every=0",
        "eval_batches=5",
        "log_every=50",
        *args.set,
        *overrides,
    ]
    cfg = TrainConfig.from_yaml(args.recipe, sets)
    clock = {"train": 0.0, "mark": time.perf_counter(), "cpu": 0.0, "cpu_mark": time.process_time()}

    def after_step(step: int, model) -> None:
        if step % args.eval_every and step != args.steps:
            return
        clock["train"] += time.perf_counter() - clock["mark"]
        clock["cpu"] += time.process_time() - clock["cpu_mark"]
        was_training = model.training
        model.eval()
        result = summarise_readouts(
            [
                family_readouts({name: model}, m, r, substitution=model.token_head is not None)
                for m, r in zip(potts, rows)
            ]
        )
        model.train(was_training)
        eps = result["epistasis"][name]
        loss = result["pair_logloss"][name]
        record = {
            "variant": name,
            "overrides": overrides,
            "step": step,
            "train_s": round(clock["train"], 1),
            "train_cpu_s": round(clock["cpu"], 1),
            "spearman_planted": eps["score"].get("spearman_planted"),
            "spearman_planted_joint": eps["joint"].get("spearman_planted"),
            "spearman_all": eps["score"].get("spearman_all"),
            "mean_abs_planted": eps["score"].get("mean_abs_planted"),
            "mean_abs_unplanted": eps["score"].get("mean_abs_unplanted"),
            "exact_mean_abs_planted": eps["score"].get("exact_mean_abs_planted"),
            "substitution": eps.get("substitution"),
            "pair_logloss": loss,
            "family": {
                "families": args.families,
                "length": args.length,
                "sequences": args.sequences,
                "coupling_strength": args.coupling_strength,
                "triplets": args.triplets,
                "seed": args.seed,
            },
        }
        if "triple_epistasis" in result and name in result["triple_epistasis"]:
            record["triple_epistasis"] = result["triple_epistasis"][name]
            record["triple_logloss"] = result["triple_logloss"][name]
        out.write(json.dumps(record) + "\n")
        out.flush()
        print(
            f"{name} step {step}: spearman planted {record['spearman_planted']:.3f} (joint "
            f"{record['spearman_planted_joint']:.3f}), |eps| planted {record['mean_abs_planted']:.3f} unplanted "
            f"{record['mean_abs_unplanted']:.3f} (exact {record['exact_mean_abs_planted']:.3f}), substitution "
            f"{(record['substitution'] or {}).get('spearman_planted', float('nan')):.3f}, "
            f"train {clock['train']:.0f} s ({clock['cpu']:.0f} CPU-s)",
            file=sys.stderr,
            flush=True,
        )
        clock["mark"], clock["cpu_mark"] = time.perf_counter(), time.process_time()

    run_dir = work / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a left-over run would be resumed
    train(cfg, work / "shards", run_dir, hooks=TrainHooks(after_step=after_step))


def main(argv=None) -> int:
    args = arguments(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        work.mkdir(parents=True, exist_ok=True)
        synth = prepare(work, args)
        with open(args.out, "a") as out:
            for spec in args.variant or ["base"]:
                name, _, rest = spec.partition(":")
                run_variant(name, [s for s in rest.split(",") if s], synth, work, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
