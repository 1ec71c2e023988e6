"""Measured pre-training rates: the throughput file ``pmlm plan`` prices with (``config/throughput.yaml``), read and
filled from a GPU check's result (``pmlm throughput``).

The file's ``tokens_per_gpu_second`` holds, per recipe preset and objective, the best non-pad tokens/s one GPU
sustained at the recipe's step and the card, torch, layout, micro-batch and MFU it was measured with::

    tokens_per_gpu_second:
      base:
        pmlm: {tokens_per_second: 610000, card: NVIDIA H100 80GB HBM3, torch: 2.11.0+cu130, layout: packed, ...}

The older flat form (``base: 610000``) is read as a rate for every objective of the preset, card unknown. The rest
of the file (the inference section, its comments) is the inference pricing's and is kept byte for byte when the file
is filled; a file that is not a throughput file is not written over (``throughput_target``, pmlm.outputs' rule).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from pmlm.errors import ConfigError, InputError
from pmlm.outputs import OutputError, file_target, writing_files
from pmlm.vocabulary import OBJECTIVES

SECTION = "tokens_per_gpu_second"
SECTIONS = (SECTION, "inference_flops_per_gpu_second")  # what a throughput file holds (pmlm.inference.pricing: the 2nd)
ANY_OBJECTIVE = "*"  # the flat form's key: one rate for every objective of a preset
HEADER = """\
# Pre-training throughput per GPU that `pmlm plan` prices its GPU-hours and time-limit segments with: per recipe
# preset (config/train/<preset>.yaml) and objective, the best non-pad tokens/s one GPU sustained at the recipe's
# step, with the card that measured it, e.g.
#   tokens_per_gpu_second:
#     base:
#       pmlm: {tokens_per_second: 610000, card: NVIDIA H100 80GB HBM3, torch: 2.11.0+cu130, layout: packed, ...}
# and also compiled, micro_tokens (the micro-batch), mfu, measured (the result's day), source (its file) and
# padding_fraction (the share of the step's tokens_per_step that was padding, which the rate does not count).
# Filled from a GPU check (bash bench/gpu_check.sh; its throughput step's result) by
#   pmlm throughput bench/out/gpu_check/throughput.json -o config/throughput.yaml
# which rewrites this section only. A job measured for its preset and objective takes its own rate; one that is not
# takes the nearest measured one (another objective of its preset, else another preset: the same objective first,
# then the closest size) at the same model-FLOP rate, on the card that measured it; with nothing measured `pmlm plan`
# assumes the paper's own V100 rate (docs/gpu.md, "How long will it take"). The flat form {base: 610000} is read as
# one rate for every objective of the preset.
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


GIVEN = "--tokens-per-second"  # the source of a rate given on pmlm plan's command line


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
    # share of the measured step's tokens that were padding (tokens_per_step counts them, the rate does not)
    padding_fraction: float | None = None

    def describe(self) -> str:
        """Where it was measured, for the plan's notes."""
        if self.source == GIVEN:
            return "--tokens-per-second"
        if self.card is None:
            return "a card not recorded (the file's flat form)"
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
            for objective in entry:
                if objective not in OBJECTIVES:
                    raise ConfigError(
                        f"{path}: {SECTION}.{preset}.{objective}: not an objective ({', '.join(OBJECTIVES)}); "
                        f"write {preset}: {{OBJECTIVE: {{tokens_per_second: N, ...}}}} or {preset}: N"
                    )
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
        if not result["rows"]:
            raise InputError(path, "no rows: the bench measured nothing")
        card = result.get("device")
        if not card or not isinstance(card, str):
            raise InputError(path, "names no device: not a bench_gpu_throughput.py result")
        if card == "cpu" and not allow_cpu:
            raise InputError(path, "measured on a CPU, not a GPU: no rate for pmlm plan (--allow-cpu to take it)")
        day = datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()  # the result records no date of its own
        for i, row in enumerate(result["rows"]):
            if not isinstance(row, dict):
                raise InputError(path, f"row {i}: not an object")
            if row.get("model") != "ours" or row.get("out_of_memory"):
                continue
            tps = row.get("non_pad_tokens_per_s")
            if isinstance(tps, bool) or not isinstance(tps, (int, float)) or tps <= 0 or not row.get("dims"):
                raise InputError(path, f"row {i}: needs dims, objective and a positive non_pad_tokens_per_s")
            if row.get("objective") not in OBJECTIVES:
                raise InputError(
                    path, f"row {i}: objective {row.get('objective')!r} is not one of {', '.join(OBJECTIVES)}"
                )
            rate = MeasuredRate(
                float(tps), card, result.get("torch"), row.get("layout"), row.get("compiled"),
                row.get("micro_tokens"), row.get("mfu"), day, str(path), row.get("padding_fraction"),
            )  # fmt: skip
            current = best.setdefault(str(row["dims"]), {}).get(row["objective"])
            if current is None or rate.tokens_per_second > current.tokens_per_second:
                best[str(row["dims"])][row["objective"]] = rate
    if not best:
        raise InputError(
            ", ".join(map(str, paths)), "no row of ours with a measured rate (only out-of-memory or HF rows)"
        )
    return best


def throughput_target(path: str | Path, overwrite: bool = False) -> Path:
    """``-o``, checked before any work (pmlm.outputs): a new ``.yaml`` file, or a throughput file to fill (the previous
    result); anything else that exists (a workflow config, a file that is not YAML) only with ``overwrite``."""
    out = file_target(path, suffixes=(".yaml",), what="throughput file", overwrite=overwrite)
    if out.exists() and not overwrite and _sections(out) is None:
        raise OutputError(
            f"-o {path}: exists and is not a throughput file (YAML holding only {' and '.join(SECTIONS)}), so it "
            "was not written by this command; choose another name (or --overwrite to replace it)"
        )
    return out


def _sections(path: Path) -> dict | None:
    """The sections of an existing throughput file, or None when it is not one."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    data = {} if data is None else data
    return data if isinstance(data, dict) and set(data) <= set(SECTIONS) else None


def _at_margin(line: str) -> bool:
    return bool(line.strip()) and not line[0].isspace()


def write_rates(path: str | Path, rates: dict[str, dict[str, MeasuredRate]]) -> None:
    """The throughput file with ``rates`` as its section and the rest of an existing throughput file (the inference
    section, comments) as it was, byte for byte; the header comments are HEADER's. Written under a temporary name
    and renamed (pmlm.outputs)."""
    path = Path(path)
    table = {
        preset: {
            o: {k: round(v) if k == "tokens_per_second" else v for k, v in asdict(entries[o]).items() if v is not None}
            for o in sorted(entries, key=OBJECTIVES.index)
        }
        for preset, entries in sorted(rates.items())
    }
    body = yaml.safe_dump({SECTION: table}, default_flow_style=None, sort_keys=False, width=200)
    before, rest = HEADER, INFERENCE_SECTION
    kept = _sections(path) if path.exists() else None
    if kept is not None:  # the previous result: replace its section only (else --overwrite of another file)
        lines = path.read_text().splitlines(keepends=True)
        start = next((i for i, line in enumerate(lines) if line.startswith(f"{SECTION}:")), None)
        if start is None:
            rest = "".join(lines)
        else:
            # the section ends at the next line at the margin that is not blank: the rest begins there
            end = next((i for i in range(start + 1, len(lines)) if _at_margin(lines[i])), len(lines))
            rest = "".join(lines[end:])
            if any(_at_margin(line) and not line.startswith("#") for line in lines[:start]):
                before = "".join(lines[:start])  # other sections above it: kept, with whatever comments they have
    text = before + body + "\n" + rest
    # the splice must leave every other section as it was: checked on the text before it is written
    expected = {k: v for k, v in (yaml.safe_load(rest) if kept is None else kept).items() if k != SECTION}
    try:
        written = yaml.safe_load(text)
    except yaml.YAMLError:
        written = None
    if written != {SECTION: table, **expected}:
        raise OutputError(f"-o {path}: its other sections could not be kept as they are; write to a new file")
    with writing_files([path]) as (tmp,):
        Path(tmp).write_text(text)
