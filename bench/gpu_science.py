"""The inputs and the report of bench/gpu_science.sh, the equal-compute co-evolution study at GPU length in one call
of at most five minutes (config/coevolution_curves_gpu_length.yaml; docs/coevolution.md "At GPU length").

    python bench/gpu_science.py prepare OUT [--tiny]   on a CPU: the config, the sampled and tokenized families, the
                                                       baselines' rows and the Biopython wheel (a few MiB)
    python bench/gpu_science.py summary RUN OUT         the rows that came back: per arm, the budgets reached, training
                                                       steps per second and the answer's first line (OUT/figures.md)

``prepare`` does on a CPU everything of the study that is not training: the Potts families of every seed are sampled,
split and tokenized (``pmlm.coevolution.curves.prepare_seed``), and the seed's baselines unit (the pseudo-likelihood
Potts fit, MSA MI, the exact couplings) writes its rows, so the GPU call trains and reads out the arms only. The
GPU image has no Biopython (which reads the families' FASTA): its wheel is carried. ``--tiny`` is the rehearsal's:
300 sequences per family, budgets of 10 and 20 steps, two held-out sequences per family.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "coevolution_curves_gpu_length.yaml"
# the rehearsal's sizes: every code path of the GPU call, in seconds on a CPU
TINY = {
    "sequences": 300,
    "steps": [10, 20],
    "evaluate": {"sequences": 2, "head_steps": 10},
    "baselines": {"plm_iterations": 10},
    "threads": 1,
}
TINY_SET = {"optim.warmup_steps": 2, "log_every": 10}


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def study_config(tiny: bool):
    """The GPU-length study's config, or the rehearsal's sizes of it."""
    import yaml

    from pmlm.coevolution.curves_config import CurvesConfig

    values = yaml.safe_load(CONFIG.read_text())
    if tiny:
        for key, value in TINY.items():
            if isinstance(value, dict):
                values[key] = {**values.get(key, {}), **value}
            else:
                values[key] = value
        values["set"] = {**values["set"], **TINY_SET}
    return CurvesConfig.from_dict(values)


def prepare(out: Path, tiny: bool) -> dict:
    """OUT/config.yaml (the study as the GPU call runs it), OUT/run/data (every seed's families and shards),
    OUT/run/units/seed<S>-baseline.tsv and, unless ``tiny``, OUT/wheels (Biopython for the GPU image)."""
    import yaml

    from pmlm.coevolution.curves import Unit, prepare_seed, run_unit

    cfg = study_config(tiny)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    run = out / "run"
    for seed in cfg.seeds:
        prepare_seed(cfg, seed, run)
        if not (run / "units" / f"{Unit(seed, None, None).name}.tsv").exists():
            run_unit(cfg.to_dict(), Unit(seed, None, None), str(run), str(ROOT))
    for scratch in run.glob("data/seed*/*/*.fasta"):  # the tokenized copies of the families: the shards hold them
        scratch.unlink()
    if not tiny:
        load_script(ROOT / "bench" / "gpu_check.py").wheels(out / "wheels")
    files = sorted(p for p in out.rglob("*") if p.is_file())
    listing = {str(p.relative_to(out)): p.stat().st_size for p in files}
    return {"inputs": str(out), "bytes": sum(listing.values()), "files": len(listing)}


def summary(run: Path, out: Path) -> dict:
    """Per arm the budgets it reached and its training steps per second (wall time, read-outs excluded); the
    answer's first line (pair-joint epistasis rho against the MLM's token head by substitution) at the last budget
    every arm reached (``Results.last``). Written to OUT/summary.json and OUT/figures.md; also returned."""
    from pmlm.coevolution.curve_report import Results
    from pmlm.coevolution.curves import read_rows

    path = run / "curves.tsv"
    res = Results(read_rows(path), path) if path.exists() else None
    per_arm, answer = {}, {"step": 0}
    if res is not None:
        for arm in res.arms:
            walls = {s: np.mean(list(v.values())) for s in res.steps if (v := res.units(arm, s, "training", "wall_s"))}
            last = max(walls)
            per_arm[arm] = {
                "budgets": sorted(walls),
                "steps_per_s": round(last / walls[last], 1) if walls[last] > 0 else math.nan,
                "training_wall_s": round(float(walls[last]), 1),
            }

        def rho(arm: str, readout: str) -> float:
            values = list(res.units(arm, res.last, readout, "spearman_planted").values())
            return round(float(np.mean(values)), 3) if values else math.nan

        answer = {"step": res.last, "mlm_substitution": rho("mlm", "substitution")}
        answer.update({f"{arm}_pair_joint": rho(arm, "pair_joint") for arm in res.pmlm_arms()})
    result = {"arms": per_arm, "answer": answer}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| arm | budgets reached | training steps/s | training wall-s |", "|---|---|---|---|"]
    for arm, a in per_arm.items():
        budgets = ", ".join(f"{s:,}" for s in a["budgets"])
        lines.append(f"| {arm} | {budgets} | {a['steps_per_s']} | {a['training_wall_s']} |")
    lines += [
        "",
        f"epistasis rho at planted pairs, step {answer['step']:,}: "
        + ", ".join(f"{k} {v}" for k, v in answer.items() if k != "step"),
    ]
    (out / "figures.md").write_text("\n".join(lines) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="the GPU call's inputs, on a CPU")
    p.add_argument("out", type=Path)
    p.add_argument("--tiny", action="store_true", help="the rehearsal's sizes")
    s = sub.add_parser("summary", help="budgets reached, steps/s and the answer's first line")
    s.add_argument("run", type=Path, help="the study's folder (curves.tsv)")
    s.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        print(json.dumps(prepare(args.out, args.tiny)))
    else:
        print(json.dumps(summary(args.run, args.out)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
