"""Learning curves of planted-coupling recovery: how an encoder's double-mutant epistasis approaches the exact
Potts values as it trains, for one or more variants of a pre-training recipe.

Samples a family with ``pmlm synth``, splits it per sequence (``pmlm.coevolution.heldout``), tokenizes it, then
trains each variant with ``pmlm pretrain``'s own loop and reads it out every ``--eval-every`` steps on the same
held-out sequences with every zero-shot read-out of ``pmlm coevolution curves``
(``pmlm.coevolution.curve_readouts.encoder_records``). One JSON object per variant and read-out step is appended to
``--out``: three Spearman figures of the pair joint's epistasis against the exact values (as ``pmlm score``
computes it, at planted pairs and at every pair; the joint's own double difference at planted pairs; None without
a pair head), the size of its epistasis, every read-out's metrics under ``readouts``, and the training time so far
(wall and process CPU time, read-outs excluded).

    .venv/bin/python scripts/coupling_curves.py --out curves.jsonl --steps 1500 --eval-every 250 \\
        --variant base --variant mask30:objective.mask_prob=0.3 --variant wide:model.overrides.hidden=128

A variant is NAME or NAME:KEY=VALUE,KEY=VALUE (``--set`` keys of ``pmlm pretrain``, applied after ``--set``).
With ``--families N`` every figure is the mean over the N families (each family's shard mixed into one run, as
the study trains).
"""

from __future__ import annotations

import argparse
import json
import math
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
from pmlm.coevolution.curve_readouts import encoder_records, family_targets  # noqa: E402
from pmlm.coevolution.curves_config import CurveEvaluation  # noqa: E402
from pmlm.coevolution.heldout import SplitConfig, load_families, split_records  # noqa: E402
from pmlm.coevolution.measures import epistasis_measures  # noqa: E402
from pmlm.config.pretraining import TrainConfig  # noqa: E402
from pmlm.synth.synthesize import FASTA_NAME  # noqa: E402
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
        with open(work / "train.fasta", "w") as train_fh, open(work / "valid.fasta", "w") as valid_fh:
            for seq_id, family, sequence, _, held_out in split_records(synth / FASTA_NAME, SplitConfig()):
                (valid_fh if held_out else train_fh).write(f">{seq_id} cluster={family} family={family}\n{sequence}\n")
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


def mean_records(per_family: list[list[tuple[str, str, float]]]) -> dict[str, dict[str, float | None]]:
    """{readout: {metric: mean over the families that have a value}} (None where none has)."""
    values: dict[str, dict[str, list[float]]] = {}
    for records in per_family:
        for readout, metric, value in records:
            values.setdefault(readout, {}).setdefault(metric, []).append(value)
    return {
        readout: {
            m: (float(np.mean(f)) if (f := [v for v in vs if not math.isnan(v)]) else None) for m, vs in ms.items()
        }
        for readout, ms in values.items()
    }


def run_variant(name: str, overrides: list[str], synth: Path, work: Path, args, out) -> None:
    ev = CurveEvaluation(sequences=args.eval_sequences)
    targets = [family_targets(family, "family", ev, seed=0) for family in load_families(synth, SplitConfig())]
    exact = [
        epistasis_measures(t.exact_eps, t.rows, t.pairs, t.groups, t.exact_eps)["mean_abs_planted"] for t in targets
    ]
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
        readouts = mean_records([encoder_records(model, t, ev) for t in targets])
        model.train(was_training)
        score, joint = readouts.get("pair_joint_score", {}), readouts.get("pair_joint", {})
        record = {
            "variant": name,
            "overrides": overrides,
            "step": step,
            "train_s": round(clock["train"], 1),
            "train_cpu_s": round(clock["cpu"], 1),
            "spearman_planted": score.get("spearman_planted"),
            "spearman_planted_joint": joint.get("spearman_planted"),
            "spearman_all": score.get("spearman_all"),
            "mean_abs_planted": score.get("mean_abs_planted"),
            "mean_abs_unplanted": score.get("mean_abs_unplanted"),
            "exact_mean_abs_planted": float(np.mean(exact)),
            "readouts": readouts,
            "family": {
                "families": args.families,
                "length": args.length,
                "sequences": args.sequences,
                "coupling_strength": args.coupling_strength,
                "triplets": args.triplets,
                "seed": args.seed,
            },
        }
        out.write(json.dumps(record) + "\n")
        out.flush()

        def show(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        print(
            f"{name} step {step}: spearman planted {show(record['spearman_planted'])} (joint "
            f"{show(record['spearman_planted_joint'])}), |eps| planted {show(record['mean_abs_planted'])} unplanted "
            f"{show(record['mean_abs_unplanted'])} (exact {record['exact_mean_abs_planted']:.3f}), substitution "
            f"{show(readouts.get('substitution', {}).get('spearman_planted'))}, "
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
