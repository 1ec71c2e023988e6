"""``pmlm coevolution``: planted-coupling read-outs of an MLM and a PMLM encoder on held-out sequences
of synthetic Potts families (plus ``split`` to make the training/held-out FASTAs and ``report``).

The split: every family contributes sequences to both sides. A sequence is held out when a hash of
(split seed, sequence id) falls below ``valid_fraction``, so the draw is per sequence, deterministic
and independent of file order. Encoders train on the other sequences of the same families (the
couplings are per family, so held-out sequences of unseen families would test nothing learnable);
every model read-out below uses held-out sequences only (the same first ``sequences`` of each family
for all of them), and the MSA baseline uses the training sequences, as an alignment of the family
would. The supervised contact head, the one read-out that learns from labels, is fitted on the planted
maps of half the families and scores the other half, then the halves swap: every family is scored by
a head that never saw its couplings. The argparse of this command is ``pmlm.commands.coevolution``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from pmlm.coevolution.epistasis import exact_headline, study_readouts
from pmlm.coevolution.heldout import FAMILIES_FASTA, StudyConfig, load_families, split_records
from pmlm.coevolution.study import evaluate_models, readout_costs
from pmlm.errors import ConfigError, InputError
from pmlm.outputs import writing_files
from pmlm.pretrained import load_encoder, pick_device
from pmlm.version import versions
from pmlm.vocabulary import MLM, PMLM, TMLM


def summarise(per_family: dict[str, dict]) -> dict:
    """Mean over families of every (read-out, model, metric)."""
    out: dict[str, dict] = {}
    for row in per_family.values():
        for readout, by_model in row.items():
            for model, metrics in by_model.items():
                for metric, value in metrics.items():
                    out.setdefault(readout, {}).setdefault(model, {}).setdefault(metric, []).append(value)

    def mean(values: list[float]) -> float:
        finite = [v for v in values if not math.isnan(v)]
        return float(np.mean(finite)) if finite else math.nan

    return {
        r: {m: {k: mean(v) for k, v in metrics.items()} for m, metrics in by_model.items()}
        for r, by_model in out.items()
    }


def dependence_summary(values: dict) -> dict:
    """Medians of planted and non-planted pairs and their ratio, per read-out, model and measure."""
    out: dict = {}
    for readout, by_model in values.items():
        for model, kinds in by_model.items():
            for kind, groups in kinds.items():
                planted = np.asarray(groups["planted"])
                other = np.asarray(groups["non_planted"])
                mp = float(np.median(planted)) if planted.size else math.nan
                mo = float(np.median(other)) if other.size else math.nan
                out.setdefault(readout, {}).setdefault(model, {})[kind] = {
                    "median_planted": mp,
                    "median_non_planted": mo,
                    "ratio": mp / mo if mo > 0 else math.nan,
                    "pairs_planted": int(planted.size),
                    "pairs_non_planted": int(other.size),
                }
    return out


def _json_ready(value):
    """NaN (an empty group, a family without edges) as null: strict JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _rounded(values: dict):
    """Value lists at 4 significant digits: plenty for histograms, a third of the JSON size."""
    if isinstance(values, dict):
        return {k: _rounded(v) for k, v in values.items()}
    return [float(f"{v:.4g}") for v in values]


def _tsv_rows(per_family: dict[str, dict]) -> list[str]:
    rows = ["family\treadout\tmodel\tp_at_edges\tp_at_l5\tchance"]
    for family, row in per_family.items():
        for readout, by_model in row.items():
            for model, m in by_model.items():
                values = "\t".join(f"{m[k]:.6g}" for k in ("p_at_edges", "p_at_l5", "chance"))
                rows.append(f"{family}\t{readout}\t{model}\t{values}")
    return rows


def evaluate_study(
    synth: str | Path,
    mlm: str | Path,
    pmlm: str | Path,
    out_prefix: str,
    cfg: StudyConfig,
    *,
    tmlm: str | Path | None = None,
    device: str = "auto",
) -> dict:
    """The study's read-outs of the MLM and PMLM encoders (and, for the exact read-outs, a Triple MLM) on the
    families of ``pmlm synth``'s folder ``synth``: writes PREFIX.json (the document, returned) and PREFIX.tsv."""
    device = str(pick_device(device))
    families = load_families(synth, cfg)
    longest = max(f.length for f in families)
    models, infos = {}, {}
    # the Triple MLM joins the exact read-outs only
    for name, weights, head in ((MLM, mlm, "token_head"), (PMLM, pmlm, "pair_head"), (TMLM, tmlm, "triple_head")):
        if not weights:
            continue
        models[name], infos[name], _ = load_encoder(weights, device)
        if getattr(models[name], head) is None:
            raise InputError(
                weights,
                f"--{name} needs a model with a {head.replace('_', ' ')} "
                f"(this one was trained with objective {infos[name]['objective']['name']})",
            )
        if models[name].cfg.max_len < longest + 2:
            raise InputError(
                weights,
                f"model max_len {models[name].cfg.max_len} is too short for length-{longest} families (+2 specials)",
            )
    exact_models = models
    models = {name: models[name] for name in (MLM, PMLM)}
    # read-outs run under no_grad (the probe enables grad for its own fit); no process-wide switch
    result = evaluate_models(families, models, cfg)
    exact = study_readouts(families, exact_models, cfg) if cfg.exact else None
    if exact is not None:
        print(f"coevolution: seed {cfg.seed}: {exact_headline(exact['summary'])}", file=sys.stderr)
    scores = {name: infos[name].get("final_scores") or {} for name in exact_models}
    document = {
        "seed": cfg.seed,
        "config": asdict(cfg),
        "inputs": {"synth": str(synth), MLM: str(mlm), PMLM: str(pmlm), **({TMLM: str(tmlm)} if tmlm else {})},
        "device": device,
        "families": {
            f.name: {
                "length": f.length,
                "edges": int(np.triu(f.contacts).sum()),
                "train": len(f.train),
                "heldout": len(f.heldout),
            }
            for f in families
        },
        "pretraining": {
            name: {
                k: scores[name].get(k)
                for k in ("step", "acc_mlm", "acc_pmlm", "dacc", "l_mlm", "l_pmlm", "l_tmlm", "acc_tmlm")
            }
            for name in exact_models
        },
        "summary": summarise(result["per_family"]),
        # encoder forwards per evaluation sequence and per pair, at the families' length
        "costs": readout_costs(max(f.length for f in families)),
        "dependence": dependence_summary(result["dependence"]),
        "per_family": result["per_family"],
        "folds": result["folds"],
        "sequences": result["sequences"],
        "dependence_values": _rounded(result["dependence"]),
        # epistasis and conditional log-loss against the exact Potts values (pmlm.coevolution.epistasis)
        "exact": exact,
        "versions": versions(),
    }
    with writing_files([out_prefix + ".json", out_prefix + ".tsv"]) as (json_tmp, tsv_tmp):  # both or neither
        Path(json_tmp).write_text(json.dumps(_json_ready(document), indent=1, allow_nan=False) + "\n")
        Path(tsv_tmp).write_text("\n".join(_tsv_rows(result["per_family"])) + "\n")
    return document


def split_study(synth: str | Path, train: str | Path, valid: str | Path, cfg: StudyConfig) -> dict[str, int]:
    """Two FASTAs with ``cluster=<family>`` headers, so `pmlm tokenize` keeps each family in one shard; returns the
    sequences on each side."""
    counts = {"train": 0, "valid": 0}
    with writing_files([train, valid]) as (train_tmp, valid_tmp):
        with open(train_tmp, "w") as train_fh, open(valid_tmp, "w") as valid_fh:
            for seq_id, family, sequence, _, held_out in split_records(Path(synth) / FAMILIES_FASTA, cfg):
                side = "valid" if held_out else "train"
                (valid_fh if held_out else train_fh).write(f">{seq_id} cluster={family} family={family}\n{sequence}\n")
                counts[side] += 1
        for side, count in counts.items():
            if count == 0:
                raise ConfigError(
                    f"the {side} side of the split is empty at valid_fraction {cfg.valid_fraction}; "
                    "change --valid-fraction or sample more sequences"
                )
    return counts
