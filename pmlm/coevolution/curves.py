"""``pmlm coevolution curves``, the co-evolution study: the paper's question on exact ground truth at equal compute.
Per seed, Potts families of every group (``CurvesConfig.groups``) are sampled, split per sequence and tokenized; one
encoder per arm (MLM, PMLM with the paper's pair head, PMLM with the product base, a Triple MLM, ...) trains on all
of them with the same recipe, batch and steps (``pmlm.train``'s loop), and at every budget in ``steps`` (one budget:
at the end of training only) every read-out of ``pmlm.coevolution.curve_readouts`` runs on the same held-out
sequences; the classical baselines (the exact couplings, a pseudo-likelihood Potts fit, MSA MI + APC) run once per
family.

Work is split into units: a seed's baselines, and one arm of one seed. ``run_curves`` runs each in its own process
(``jobs`` at once); the workflow's ``coevolution`` target runs one per job, after a job per seed that prepares its
families. A unit writes ``units/<unit>.tsv`` atomically when it is done, so a rerun skips finished units and redoes
the others from the start; ``curves.tsv`` is their rows in a fixed order. An arm also rewrites
``units/<unit>.partial.tsv`` after each budget's read-outs, so a run cut short by a time limit keeps the budgets it
reached: ``collect_rows`` (``pmlm coevolution curves --collect``) reports them beside the units that ended. Each
arm's cost is measured beside its read-outs: process CPU- and wall-seconds of training alone (read-outs excluded; on
a GPU the wall time counts) and the FLOPs of one optimizer step on a batch of each group's length
(``torch.utils.flop_counter``, forward and backward).
"""

from __future__ import annotations

import csv
import math
import multiprocessing
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from pmlm.coevolution.curve_readouts import (
    FamilyTargets,
    baseline_records,
    encoder_records,
    family_targets,
    supervised_records,
)
from pmlm.coevolution.curves_config import BASELINE_ARM, RESULTS_TSV, SEQUENCES_TSV, CurvesConfig, Unit
from pmlm.coevolution.heldout import FamilyData, SplitConfig, load_families, split_records
from pmlm.coevolution.readouts import residue_ids
from pmlm.config.pretraining import TrainConfig
from pmlm.data.shards import tokenize
from pmlm.errors import InputError
from pmlm.files import atomic_output
from pmlm.model.objectives import pretraining_losses
from pmlm.pretrained import build_model
from pmlm.synth.potts import PottsConfig
from pmlm.synth.pseudolikelihood import fit_pseudolikelihood
from pmlm.synth.synth_config import SynthConfig
from pmlm.synth.synthesize import FASTA_NAME, synthesize
from pmlm.tokens import batch_tokens
from pmlm.train.pretrain import TrainHooks, train

COLUMNS = ("seed", "group", "family", "arm", "step", "readout", "metric", "value")
ALL = "-"  # the family column of rows about a whole run (its cost; the group column names the encoder)
SEED_STRIDE = 1000  # group g of seed s is sampled with pmlm synth --seed SEED_STRIDE * s + g


def synth_seed(seed: int, group_index: int) -> int:
    return SEED_STRIDE * seed + group_index


def prepare_seed(cfg: CurvesConfig, seed: int, out: Path) -> None:
    """Sample every group's families of ``seed``, split them and tokenize one shard per family for each encoder;
    idempotent."""
    data = out / "data" / f"seed{seed}"
    split = SplitConfig(valid_fraction=cfg.valid_fraction, split_seed=cfg.split_seed)
    index = {name: g for g, name in enumerate(cfg.groups)}
    for encoder, names in cfg.encoders().items():
        shards = data / encoder / "shards"
        if (shards / "manifest.json").exists():
            continue
        train_fasta, valid_fasta = data / encoder / "train.fasta", data / encoder / "valid.fasta"
        with (
            atomic_output(train_fasta) as train_tmp,
            atomic_output(valid_fasta) as valid_tmp,
            open(train_tmp, "w") as train_fh,
            open(valid_tmp, "w") as valid_fh,
        ):
            for name in names:
                group = cfg.groups[name]
                potts = PottsConfig(
                    length=group.length,
                    num_sequences=cfg.sequences,
                    edges=group.edges,
                    coupling_strength=group.coupling_strength,
                    triplets=group.triplets,
                    triplet_strength=group.triplet_strength,
                )
                synth = SynthConfig(
                    families=group.families, seed=synth_seed(seed, index[name]), prefix=f"{name}-", potts=potts
                )
                synthesize(synth, data / "synth" / name)
                for seq_id, family, sequence, _, held_out in split_records(data / "synth" / name / FASTA_NAME, split):
                    handle = valid_fh if held_out else train_fh
                    handle.write(f">{seq_id} cluster={family} family={family}\n{sequence}\n")
        families = sum(cfg.groups[name].families for name in names)
        tokenize({"train": [str(train_fasta)], "valid": [str(valid_fasta)]}, str(shards), families, 64)


def seed_families(
    cfg: CurvesConfig, seed: int, out: Path, groups: list[str] | None = None
) -> list[tuple[str, FamilyData]]:
    """(group, family) of every family of ``seed`` (of ``groups`` only, if given), in the config's group order."""
    split = SplitConfig(valid_fraction=cfg.valid_fraction, split_seed=cfg.split_seed)
    data = out / "data" / f"seed{seed}" / "synth"
    return [(name, f) for name in groups or cfg.groups for f in load_families(data / name, split)]


def train_config(cfg: CurvesConfig, arm: str, seed: int, recipe_root: Path) -> TrainConfig:
    """The shared recipe with the study's and the arm's overrides, the seed and the last budget as total steps."""
    recipe = Path(cfg.recipe)
    recipe = recipe if recipe.is_absolute() else recipe_root / recipe
    sets = [f"{k}={v}" for k, v in cfg.set.items()] + cfg.arms[arm].overrides()
    sets += [
        f"seed={seed}",
        f"optim.total_steps={cfg.total_steps}",
        "save_every=0",
        "eval_every=0",
        "tensorboard=false",
    ]
    return TrainConfig.from_yaml(recipe, sets)


def step_flops(train_cfg: TrainConfig, families: list[tuple[str, FamilyData]]) -> float:
    """FLOPs of one optimizer step (forward and backward), averaged over the families' lengths weighted by their
    share of training residues: a batch of each length holds as many rows as the token budget allows."""
    torch.manual_seed(train_cfg.seed)
    model = build_model(train_cfg.model_config(), train_cfg.objective)
    generator = torch.Generator().manual_seed(train_cfg.seed)
    total, weight = 0.0, 0
    for _, family in families:
        padded = -(-(family.length + 2) // train_cfg.data.pad_to_multiple) * train_cfg.data.pad_to_multiple
        rows = max(1, train_cfg.tokens_per_step // padded)
        tokens = torch.from_numpy(batch_tokens(list(residue_ids(family.train[:rows]))).tokens)
        counter = FlopCounterMode(display=False)
        with counter:
            pretraining_losses(model, tokens, train_cfg.objective, generator).loss.backward()
        residues = family.train.size
        total += counter.get_total_flops() * residues
        weight += residues
        model.zero_grad(set_to_none=True)
    return total / weight


def _rows(seed: int, group: str, family: str, arm: str, step: int, records) -> list[tuple]:
    return [(seed, group, family, arm, step, readout, metric, value) for readout, metric, value in records]


def run_baselines(cfg: CurvesConfig, seed: int, out: Path) -> list[tuple]:
    rows = []
    for group, family in seed_families(cfg, seed, out):
        targets = family_targets(family, group, cfg.evaluate, seed)
        b = cfg.baselines
        fit = fit_pseudolikelihood(
            family.train,
            lambda_fields=b.plm_lambda_fields,
            lambda_couplings=b.plm_lambda_couplings,
            iterations=b.plm_iterations,
        )
        rows += _rows(seed, group, family.name, BASELINE_ARM, 0, baseline_records(targets, fit, cfg.evaluate))
        print(f"curves: seed {seed} {family.name}: baselines done", file=sys.stderr, flush=True)
    return rows


def evaluate_point(model, targets: list[FamilyTargets], cfg: CurvesConfig, seed: int, arm: str, step: int) -> list:
    """Every read-out of ``model`` on every family of the seed; the model's mode and gradient flags (the contact
    head's fit freezes the encoder) and the global RNG are left as they were."""
    rng = torch.get_rng_state()
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    try:
        per_family = {t.family.name: encoder_records(model, t, cfg.evaluate) for t in targets}
        for name, records in supervised_records(model, targets, cfg.evaluate, seed).items():
            per_family[name] += records
    finally:
        model.train(was_training)
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        torch.set_rng_state(rng)
    return [row for t in targets for row in _rows(seed, t.group, t.family.name, arm, step, per_family[t.family.name])]


def run_arm(
    cfg: CurvesConfig, seed: int, encoder: str, arm: str, out: Path, recipe_root: Path, partial: Path | None = None
) -> list[tuple]:
    """Train one arm of one encoder and seed, reading it out at every budget; its rows. ``partial``: rewritten with
    the rows so far after each budget (what a run stopped by a time limit keeps)."""
    families = seed_families(cfg, seed, out, cfg.encoders()[encoder])
    targets = [family_targets(f, group, cfg.evaluate, seed) for group, f in families]
    train_cfg = train_config(cfg, arm, seed, recipe_root)
    rows = _rows(seed, encoder, ALL, arm, 0, [("training", "flops_per_step", step_flops(train_cfg, families))])
    budgets = set(cfg.steps)
    clock = {"cpu": 0.0, "wall": 0.0, "cpu_mark": time.process_time(), "wall_mark": time.perf_counter()}

    def after_step(step: int, model) -> None:
        if step not in budgets:
            return
        clock["cpu"] += time.process_time() - clock["cpu_mark"]
        clock["wall"] += time.perf_counter() - clock["wall_mark"]
        on_gpu = float(next(model.parameters()).is_cuda)  # which of the two times is the run's cost
        records = [("training", "cpu_s", clock["cpu"]), ("training", "wall_s", clock["wall"])]
        records.append(("training", "on_gpu", on_gpu))
        rows.extend(_rows(seed, encoder, ALL, arm, step, records))
        point = evaluate_point(model, targets, cfg, seed, arm, step)
        rows.extend(point)
        if partial is not None:
            write_rows(partial, rows)
        print(f"curves: seed {seed} {encoder} {arm} step {step}: {headline(point)}; training {clock['cpu']:.0f} CPU-s",
              file=sys.stderr, flush=True)  # fmt: skip
        clock["cpu_mark"], clock["wall_mark"] = time.process_time(), time.perf_counter()

    run_dir = out / "runs" / f"seed{seed}" / encoder / arm
    shutil.rmtree(run_dir, ignore_errors=True)  # a unit starts over: its rows are written only when it ends
    shards = out / "data" / f"seed{seed}" / encoder / "shards"
    status = train(train_cfg, shards, run_dir, hooks=TrainHooks(after_step=after_step))
    if status != 0:
        raise RuntimeError(f"training seed {seed} encoder {encoder} arm {arm} stopped with status {status}")
    shutil.rmtree(run_dir, ignore_errors=True)  # its checkpoint is not an output of the study
    return rows


def headline(rows: list[tuple]) -> str:
    """Means over the families of the epistasis rank correlations at planted pairs and the top-#edges precisions."""
    values: dict[str, list[float]] = {}
    for *_, readout, metric, value in rows:
        if metric in ("spearman_planted", "p_edges") and not math.isnan(value):
            values.setdefault(f"{readout} {'rho' if metric == 'spearman_planted' else 'P'}", []).append(value)
    return ", ".join(f"{k} {np.mean(v):.3f}" for k, v in values.items())


def format_value(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.6g}"


def write_rows(path: Path, rows: list[tuple]) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([*row[:-1], format_value(float(row[-1]))])


def read_rows(path: Path) -> list[tuple]:
    with open(path, newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if tuple(header or ()) != COLUMNS:
            raise InputError(path, f"expected the columns {', '.join(COLUMNS)}, got {header!r}", line=1)
        return [(int(s), g, f, a, int(st), r, m, float(v)) for s, g, f, a, st, r, m, v in reader]


def run_unit(config: dict, unit: Unit, out: str, recipe_root: str) -> str:
    """One unit in its own process (``ProcessPoolExecutor``): its rows, written atomically to units/<unit>.tsv."""
    cfg = CurvesConfig.from_dict(config)
    torch.set_num_threads(cfg.threads)
    out_path = Path(out)
    target, partial = unit_files(out_path, unit)
    partial.unlink(missing_ok=True)  # a unit starts over: an earlier attempt's budgets are not this one's
    rows = (
        run_baselines(cfg, unit.seed, out_path)
        if unit.arm is None
        else run_arm(cfg, unit.seed, unit.encoder, unit.arm, out_path, Path(recipe_root), partial)
    )
    write_rows(target, rows)
    partial.unlink(missing_ok=True)
    return str(target)


def unit_files(out: Path, unit: Unit) -> tuple[Path, Path]:
    """The unit's rows when it has ended, and the rows of the budgets it has reached while it runs."""
    return out / "units" / f"{unit.name}.tsv", out / "units" / f"{unit.name}.partial.tsv"


def collect_rows(cfg: CurvesConfig, out: str | Path) -> tuple[list[tuple], dict[str, str]]:
    """The rows of every unit that has ended and of the budgets that the others reached (their partial files), in
    ``CurvesConfig.units`` order; and each unit's state: ``done``, ``stopped after step N`` or ``missing``."""
    rows, states = [], {}
    for unit in cfg.units():
        done, partial = unit_files(Path(out), unit)
        if done.exists():
            rows += read_rows(done)
            states[unit.name] = "done"
        elif partial.exists():
            mine = read_rows(partial)
            rows += mine
            states[unit.name] = f"stopped after step {max(r[4] for r in mine):,}"
        else:
            states[unit.name] = "missing"
    return rows, states


def write_results(cfg: CurvesConfig, out: Path, rows: list[tuple]) -> Path:
    """``curves.tsv`` (``rows``) and ``sequences.tsv`` (the held-out ids each family's read-outs used)."""
    target = out / RESULTS_TSV
    write_rows(target, rows)
    with atomic_output(out / SEQUENCES_TSV) as tmp, open(tmp, "w") as handle:
        handle.write("seed\tgroup\tfamily\tsequences\n")
        for seed in cfg.seeds:
            for group, family in seed_families(cfg, seed, out):
                ids = ",".join(family.heldout_ids[: cfg.evaluate.sequences])
                handle.write(f"{seed}\t{group}\t{family.name}\t{ids}\n")
    return target


def run_curves(cfg: CurvesConfig, out: str | Path, recipe_root: str | Path = ".") -> Path:
    """Run every unit not yet done (``cfg.jobs`` at once) and write ``curves.tsv``; returns its path."""
    out = Path(out)
    for seed in cfg.seeds:
        prepare_seed(cfg, seed, out)
    units = cfg.units()
    todo = [u for u in units if not unit_files(out, u)[0].exists()]
    config = cfg.to_dict()
    if cfg.jobs == 1:
        threads = torch.get_num_threads()
        try:
            for unit in todo:
                run_unit(config, unit, str(out), str(recipe_root))
        finally:
            torch.set_num_threads(threads)  # the caller's setting, as it was
    elif todo:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch state
        with ProcessPoolExecutor(max_workers=cfg.jobs, mp_context=context) as pool:
            for future in [pool.submit(run_unit, config, u, str(out), str(recipe_root)) for u in todo]:
                future.result()
    return write_results(cfg, out, [row for u in units for row in read_rows(unit_files(out, u)[0])])
