"""Measured pre-training rates: the throughput file ``pmlm plan`` prices with (``config/throughput.yaml``), read and
filled from a GPU check's result (``pmlm throughput``).

The file's ``tokens_per_gpu_second`` holds, per recipe preset and objective, the best non-pad tokens/s one GPU
sustained at the recipe's step and the card, torch, layout, micro-batch and MFU it was measured with::

    tokens_per_gpu_second:
      base:
        pmlm: {tokens_per_second: 610000, card: NVIDIA H100 80GB HBM3, torch: 2.11.0+cu130, layout: packed, ...}

The older flat form (``base: 610000``) is read as a rate for every objective of the preset, card unknown. The rest
of the file (the inference section) is the inference pricing's and is kept as it is when the file is filled.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from pmlm.errors import ConfigError, InputError
from pmlm.outputs import writing_files

SECTION = "tokens_per_gpu_second"
ANY_OBJECTIVE = "*"  # the flat form's key: one rate for every objective of a preset
HEADER = """\
# Pre-training throughput per GPU that `pmlm plan` prices its GPU-hours and time-limit segments with: per recipe
# preset (config/train/<preset>.yaml) and objective, the best non-pad tokens/s one GPU sustained at the recipe's
# step, with the card that measured it, e.g.
#   tokens_per_gpu_second:
#     base:
#       pmlm: {tokens_per_second: 610000, card: NVIDIA H100 80GB HBM3, torch: 2.11.0+cu130, layout: packed, ...}
# Filled from a GPU check (bash bench/gpu_check.sh; its throughput step's result) by
#   pmlm throughput bench/out/gpu_check/throughput.json -o config/throughput.yaml
# A job measured for its preset and objective takes its own rate; another objective of a measured preset, or a
# preset measured on the same card, is derived from the measured model-FLOP rate; with nothing measured `pmlm plan`
# assumes the paper's own V100 rate (docs/gpu.md, "How long will it take").
"""
INFERENCE_SECTION = """\
# Inference throughput per GPU that `pmlm plan` uses for a config's inference section (docs/inference.md): model
# FLOP/s one GPU sustains in pmlm embed, score and contacts, by the precision of the forward passes, e.g.
#   inference_flops_per_gpu_second: {bf16: <FLOP/s>, fp32: <FLOP/s>}
# (model FLOPs as pmlm.inference.pricing counts them, over the wall time of a shard job's command). Until one is
# measured, `pmlm plan` assumes an H100 SXM's dense peak x the 17.1 % model-FLOP utilisation measured for PMLM-base
# training on one (bench/README.md) and marks it `*`.
inference_flops_per_gpu_second: {}
"""


@dataclass(frozen=True)
class MeasuredRate:
    """One measured rate: a preset's objective on one card."""

    tokens_per_second: float
    card: str | None = None
    torch: str | None = None
    layout: str | None = None
    compiled: bool | None = None
    micro_tokens: int | None = None
    mfu: float | None = None
    measured: str | None = None  # the day
    source: str | None = None  # the result file it came from

    def describe(self) -> str:
        """Where it was measured, for the plan's notes."""
        if self.card is None:
            return "the throughput file (card not recorded)"
        extras = ", ".join(x for x in (f"torch {self.torch}" if self.torch else "", self.measured or "") if x)
        return f"{self.card}" + (f" ({extras})" if extras else "")


def read_rates(path: str | Path | None) -> dict[str, dict[str, MeasuredRate]]:
    """{preset: {objective (or ANY_OBJECTIVE): rate}} of a throughput file; {} if there is none."""
    if path is None or not Path(path).exists():
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    table = data.get(SECTION) or {} if isinstance(data, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {SECTION} must map presets to rates, got {table!r}")
    rates: dict[str, dict[str, MeasuredRate]] = {}
    for preset, entry in table.items():
        if isinstance(entry, dict):
            rates[str(preset)] = {str(o): _rate(path, f"{preset}.{o}", v) for o, v in entry.items()}
        else:
            rates[str(preset)] = {ANY_OBJECTIVE: _rate(path, str(preset), entry)}
    return rates


def _rate(path, key: str, value) -> MeasuredRate:
    fields = value if isinstance(value, dict) else {"tokens_per_second": value}
    tps = fields.get("tokens_per_second")
    if not isinstance(tps, (int, float)) or isinstance(tps, bool) or tps <= 0:
        raise ConfigError(f"{path}: {SECTION}.{key} must be a positive number of tokens/s, got {tps!r}")
    known = {k: v for k, v in fields.items() if k in MeasuredRate.__dataclass_fields__}
    return MeasuredRate(**{**known, "tokens_per_second": float(tps)})


def rates_from_results(paths: list[str | Path], allow_cpu: bool = False) -> dict[str, dict[str, MeasuredRate]]:
    """The best rate per preset and objective of our rows in bench_gpu_throughput.py result files."""
    best: dict[str, dict[str, MeasuredRate]] = {}
    for path in map(Path, paths):
        try:
            result = json.loads(path.read_text())
        except OSError as exc:
            raise InputError(path, f"cannot read: {exc.strerror}") from None
        except ValueError as exc:
            raise InputError(path, f"not JSON ({exc})") from None
        if not isinstance(result, dict) or not isinstance(result.get("rows"), list):
            raise InputError(path, "not a bench_gpu_throughput.py result (no rows)")
        card = result.get("device")
        if (not card or card == "cpu") and not allow_cpu:
            raise InputError(path, "measured on a CPU, not a GPU: no rate for pmlm plan (--allow-cpu to take it)")
        day = datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()
        for i, row in enumerate(result["rows"]):
            if row.get("model") != "ours" or row.get("out_of_memory"):
                continue
            tps = row.get("non_pad_tokens_per_s")
            if not isinstance(tps, (int, float)) or tps <= 0 or not row.get("dims") or not row.get("objective"):
                raise InputError(path, f"row {i}: needs dims, objective and a positive non_pad_tokens_per_s")
            rate = MeasuredRate(
                float(tps), card, result.get("torch"), row.get("layout"), row.get("compiled"),
                row.get("micro_tokens"), row.get("mfu"), day, str(path),
            )  # fmt: skip
            current = best.setdefault(row["dims"], {}).get(row["objective"])
            if current is None or rate.tokens_per_second > current.tokens_per_second:
                best[row["dims"]][row["objective"]] = rate
    if not best:
        raise InputError(Path(paths[0]), "no row of ours with a measured rate")
    return best


def write_rates(path: str | Path, rates: dict[str, dict[str, MeasuredRate]]) -> None:
    """The throughput file with ``rates`` as its section, the rest of an existing file (the inference section) as it
    was; written under a temporary name and renamed (pmlm.outputs)."""
    path = Path(path)
    rest = INFERENCE_SECTION
    if path.exists():
        lines = path.read_text().splitlines(keepends=True)
        start = next((i for i, line in enumerate(lines) if line.startswith(f"{SECTION}:")), None)
        if start is not None:
            # the section ends at the next line at the margin that is not blank: the rest begins there
            end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "")), len(lines))
            rest = "".join(lines[end:])
    table = {
        p: {o: {k: v for k, v in asdict(r).items() if v is not None} for o, r in e.items()} for p, e in rates.items()
    }
    body = yaml.safe_dump({SECTION: table}, default_flow_style=None, sort_keys=False, width=200)
    with writing_files([path]) as (tmp,):
        Path(tmp).write_text(HEADER + body + "\n" + rest)
