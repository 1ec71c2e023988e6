"""What a proteome costs through the workflow's inference target before anything runs (``pmlm plan`` on a config
with an ``inference`` section): per encoder and output, the forward passes, model FLOPs, GPU-hours, shard jobs and
hours per job, rows and disk.

Forward passes, per sequence of L residues and an encoder whose window holds W = max_len - 2 residues (a longer
sequence is read as windows half a window apart, ``pmlm.tokens.window_starts``), each pass a row of n = w + 2 tokens:

* embeddings: one pass per window;
* substitutions, masked marginal: one pass per residue, the site masked, over its window (min(L, W) + 2 tokens);
  wild-type marginal: one pass per window;
* contacts, the pair head's read-out: one pass per window plus the pair head on its w (w - 1) / 2 pairs; the
  categorical Jacobian (encoders without a pair head, or ``readout: jacobian``): 20 w + 1 passes per window.

A pass's model FLOPs are the training count of ``pmlm.train.budget.model_flops`` without the backward (a third of
it): 2 x layers x (4 C^2 + 2 C F) x n + 4 x layers x C x n^2, plus the heads on the residues they read. GPU-hours
are FLOPs over a per-GPU rate of model FLOP/s at the run's precision: config/throughput.yaml's
``inference_flops_per_gpu_second`` once measured, else ASSUMED_RATE: an H100 SXM's dense peak (989 TFLOP/s bf16,
67 fp32) times the model-FLOP utilisation this code measured on one (17.1 %, PMLM-base training with padded
attention, bench/README.md), marked * in the table.

Rows and disk: embeddings one row per residue and one per sequence, C float32 values each (stored uncompressed by
``pmlm embed``); substitutions 19 rows per residue; contacts the ``top`` pairs per sequence (all: the pairs a window
holds at the separation asked). Bytes per row (BYTES_PER_ROW) were measured on the tests' proteome (300 sequences,
zstd, the gathered files): 7.9 per substitution and 9.0 per contact, all columns; an embedding row's C float32
values (4 C bytes) plus about 8 for its id, position and residue.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from pmlm.artefacts import read_encoder_info, recorded_precision, sidecar_path
from pmlm.data.fasta import read_fasta
from pmlm.errors import ConfigError
from pmlm.tokens import max_residues, window_starts
from pmlm.train.budget import model_flops
from pmlm.train.jobs import WorkflowConfig, read_yaml, workflow_jobs
from pmlm.vocabulary import BF16, FP32, MLM, OUTPUT_CONTACTS, OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS, PMLM

NUM_SUBSTITUTIONS = 19  # per residue: every other standard residue
JACOBIAN_PASSES = 20  # per residue of a window: each of the 20 residues substituted (plus the window itself)
# model FLOP/s per GPU assumed until config/throughput.yaml holds a measured figure (module docstring)
MEASURED_MFU = 0.171
ASSUMED_RATE = {BF16: 989e12 * MEASURED_MFU, FP32: 67e12 * MEASURED_MFU}
BYTES_PER_ROW = {  # per row on disk (Parquet, zstd): module docstring
    "residue": 8,  # id, position, residue; plus 4 C of the embedding
    "sequence": 24,  # id, length; plus 4 C
    OUTPUT_SUBSTITUTIONS: 8,  # id, mutant, position, wt, mut, score
    OUTPUT_CONTACTS: 10,  # id, i, j, residue_i, residue_j, separation, score
}
GB = 1e9
# the workflow's rule of each output's shard jobs (workflow/rules/inference.smk): its time limit in the profile
SHARD_RULES = {OUTPUT_EMBEDDINGS: "embed_shard", OUTPUT_SUBSTITUTIONS: "score_shard", OUTPUT_CONTACTS: "contacts_shard"}
ENCODER_WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Encoder:
    """What the estimate needs of an encoder: its dims, heads, window and the precision its passes run at."""

    label: str
    layers: int
    hidden: int
    ffn: int
    max_len: int
    pair_head: bool
    pair_classes: int
    precision: str
    source: str  # where the dims come from (a model.json, a recipe)

    @classmethod
    def from_model(cls, label: str, model: dict, precision: str, source: str) -> Encoder:
        """From a model section (model.json's ``model``, ``ModelConfig.to_dict()``)."""
        try:
            return cls(label, int(model["num_layers"]), int(model["hidden"]), int(model["ffn"]),
                       int(model["max_len"]), bool(model.get("pair_head")),
                       729 if model.get("pair_vocab") == "full" else 400, precision, source)  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: no encoder dims in its model section ({exc})") from None

    @property
    def window(self) -> int:
        return max_residues(self.max_len)

    def passes_flops(self, tokens: int, head_residues: int = 0, objective: str = MLM) -> float:
        """Model FLOPs of one forward pass over ``tokens`` tokens, the token head (and, for PMLM, the pair head on
        their pairs) on ``head_residues`` of them."""
        flops = model_flops(self.layers, self.hidden, self.ffn, objective, [tokens], [head_residues], self.pair_classes)
        return flops / 3  # the training count is forward + backward, the backward twice the forward


@dataclass(frozen=True)
class Settings:
    """The inference section's settings that change the cost."""

    marginal: str = "masked"
    readout: str = "auto"
    top: str | int = "L"
    min_separation: int = 6


def held_pairs(length: int, room: int, separation: int) -> int:
    """Pairs i < j with j - i >= ``separation`` that a window of ``room`` residues holds (those pmlm contacts scores)."""
    starts = window_starts(length, room)
    total = k = end = 0
    for i in range(length):
        while k < len(starts) and starts[k] <= i:  # the furthest end of a window holding residue i
            end = max(end, min(length, starts[k] + room))
            k += 1
        total += max(0, end - i - separation)
    return total


def sequence_cost(encoder: Encoder, output: str, length: int, settings: Settings) -> tuple[int, float, int]:
    """(forward passes, model FLOPs, rows) of ``output`` for one sequence of ``length`` residues (module docstring)."""
    room = encoder.window
    windows = [min(room, length - s) for s in window_starts(length, room)]
    if output == OUTPUT_EMBEDDINGS:
        return len(windows), sum(encoder.passes_flops(w + 2) for w in windows), length
    if output == OUTPUT_SUBSTITUTIONS:
        rows = NUM_SUBSTITUTIONS * length
        if settings.marginal == "masked":
            return length, length * encoder.passes_flops(min(length, room) + 2, 1), rows
        return len(windows), sum(encoder.passes_flops(w + 2, w) for w in windows), rows
    if output != OUTPUT_CONTACTS:
        raise ConfigError(f"no cost for output {output!r}")
    held = held_pairs(length, room, settings.min_separation)
    rows = held if settings.top == "all" else min(held, _top(settings.top, length))
    if settings.readout == "jacobian" or (settings.readout == "auto" and not encoder.pair_head):
        passes = sum(JACOBIAN_PASSES * w + 1 for w in windows)
        return passes, sum((JACOBIAN_PASSES * w + 1) * encoder.passes_flops(w + 2, w) for w in windows), rows
    return len(windows), sum(encoder.passes_flops(w + 2, w, PMLM) for w in windows), rows


def _top(top: str | int, length: int) -> int:
    if isinstance(top, int):
        return top
    _, _, k = str(top).partition("/")
    return length // int(k) if k else length


def disk_bytes(encoder: Encoder, output: str, rows: int, sequences: int) -> float:
    if output == OUTPUT_EMBEDDINGS:
        vector = 4 * encoder.hidden
        return rows * (vector + BYTES_PER_ROW["residue"]) + sequences * (vector + BYTES_PER_ROW["sequence"])
    return rows * BYTES_PER_ROW[output]


def estimate(
    encoders: list[Encoder],
    outputs: list[str],
    lengths: list[int],
    settings: Settings,
    residues_per_shard: int,
    rates: dict[str, float],
    runtimes: dict[str, int | None],
) -> list[dict]:
    """One row per encoder and output: passes, FLOPs, GPU-hours, shard jobs and hours per job against the time
    limit (``runtimes``: output -> minutes), rows and disk. ``rates``: measured FLOP/s per precision (else assumed)."""
    counts = Counter(lengths)
    residues = sum(lengths)
    shards = max(1, min(len(lengths), math.ceil(residues / residues_per_shard)))
    rows = []
    for encoder in encoders:
        rate = rates.get(encoder.precision)
        assumed = rate is None
        rate = ASSUMED_RATE[encoder.precision] if assumed else rate
        for output in outputs:
            passes = flops = out_rows = 0
            for length, n in counts.items():
                p, f, r = sequence_cost(encoder, output, length, settings)
                passes, flops, out_rows = passes + n * p, flops + n * f, out_rows + n * r
            gpu_hours = flops / rate / 3600
            limit = runtimes.get(output)
            rows.append({
                "encoder": encoder.label, "output": output, "precision": encoder.precision, "window": encoder.window,
                "sequences": len(lengths), "residues": residues, "passes": passes, "flops": flops,
                "flops_per_gpu_second": rate, "assumed_rate": assumed, "gpu_hours": gpu_hours, "shards": shards,
                "hours_per_shard": gpu_hours / shards, "runtime_min": limit,
                "within_limit": None if limit is None else gpu_hours / shards * 60 <= limit,
                "rows": out_rows, "disk_gb": disk_bytes(encoder, output, out_rows, len(lengths)) / GB,
                "source": encoder.source,
            })  # fmt: skip
    return rows


def throughput(path: str | Path | None) -> dict[str, float]:
    """Measured model FLOP/s per GPU by precision (``inference_flops_per_gpu_second: {bf16: N, fp32: N}``)."""
    if path is None or not Path(path).exists():
        return {}
    table = (yaml.safe_load(Path(path).read_text()) or {}).get("inference_flops_per_gpu_second") or {}
    for precision, value in table.items():
        if (
            precision not in (BF16, FP32)
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
            or value <= 0
        ):
            raise ConfigError(f"{path}: inference_flops_per_gpu_second.{precision} must be a positive number")
    return {str(k): float(v) for k, v in table.items()}


# -- the inputs of the estimate, from a workflow config ---------------------------------------------------------------


def section_defaults(schema: str | Path) -> dict:
    """The inference section's defaults, as the workflow's schema gives them (the one place they are written)."""
    try:
        properties = yaml.safe_load(Path(schema).read_text())["properties"]["inference"]["properties"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{schema}: no inference section in the workflow's config schema ({exc})") from None
    return {
        key: {k: v["default"] for k, v in spec["properties"].items()} if "properties" in spec else spec["default"]
        for key, spec in properties.items()
    }


def inference_section(config: dict, schema: str | Path) -> dict | None:
    """The config's inference section with the schema's defaults filled in, or None when it names no sequences."""
    section = config.get("inference") or {}
    if not section.get("fasta"):
        return None
    filled = {**section_defaults(schema), **section}
    filled["contacts"] = {**section_defaults(schema)["contacts"], **(section.get("contacts") or {})}
    return filled


def settings_of(section: dict) -> Settings:
    contacts = section["contacts"]
    return Settings(section["marginal"], contacts["readout"], contacts["top"], int(contacts["min_separation"]))


def sequence_lengths(section: dict, proteins: int | None, mean_length: int | None) -> tuple[list[int], str]:
    """The lengths to price and where they come from: ``proteins`` of ``mean_length`` each, else the FASTA's."""
    if proteins is not None or mean_length is not None:
        if not proteins or not mean_length or proteins < 1 or mean_length < 1:
            raise ConfigError("--proteins N and --mean-length L go together, both >= 1")
        return [
            mean_length
        ] * proteins, f"{proteins:,} proteins of {mean_length:,} residues (--proteins, --mean-length)"
    fasta = Path(section["fasta"])
    if not fasta.is_file():
        raise ConfigError(
            f"config.inference.fasta {fasta}: no such file; give --proteins N --mean-length L to price without it"
        )
    lengths = [len(r.sequence) for r in read_fasta(fasta)]
    return lengths, f"{fasta}: {len(lengths):,} sequences, mean length {sum(lengths) / len(lengths):,.0f}"


def config_encoders(config: WorkflowConfig, section: dict, root: str | Path = ".") -> list[Encoder]:
    """Each inference encoder's dims and precision: a model of pretrain.models trained here by its recipe (with
    pretrain.set), a released one by the dims its release entry states (``release.model``, so nothing need be
    downloaded to price it), an encoder file or folder by its model.json; the precision the config asks for, or under
    auto the encoder's (recorded in model.json; a recipe's bf16 unless it says false; a release's fp32, as its import
    records none)."""
    entries = (config.values.get("pretrain") or {}).get("models") or []
    models = {f"{m['dataset']}/{m['objective']}-{m['preset']}": (i, m) for i, m in enumerate(entries)}
    encoders = []
    for label, value in section["encoders"].items():
        where = f"config.inference.encoders.{label}"
        i, model = models.get(value, (None, None))
        if model is not None and model.get("release"):
            dims = model["release"].get("model")
            if not dims:
                raise ConfigError(
                    f"{where}: {value} is a released checkpoint and pretrain.models[{i}].release states no model "
                    "dims (release.model: num_layers, hidden, ffn, heads, max_len, pair_head, pair_vocab); state them, "
                    "or price its imported folder as the encoder"
                )
            trained, source = FP32, f"{config.name}: pretrain.models[{i}].release.model"
        elif model is not None:
            job = next(j for j in workflow_jobs(config, root) if j.name == value)
            trained = FP32 if job.config.bf16 is False else BF16
            dims, source = job.config.model_config().to_dict(), f"recipe {job.recipe}"
        else:
            weights = Path(value) if value.endswith(".safetensors") else Path(value) / ENCODER_WEIGHTS
            if not sidecar_path(weights).is_file():
                raise ConfigError(
                    f"{where}: {sidecar_path(weights)}: no such file (the encoder's model.json); to price a released "
                    "encoder before its download, name its pretrain.models entry (dataset/objective-preset) instead"
                )
            info = read_encoder_info(weights)
            trained, dims, source = recorded_precision(info, weights), info["model"], str(sidecar_path(weights))
        precision = trained if section["precision"] == "auto" else section["precision"]
        encoders.append(Encoder.from_model(label, dims, precision, source))
    return encoders


def shard_runtimes(profile: str | Path) -> dict[str, int | None]:
    """Output -> the time limit (minutes) the SLURM profile gives its shard jobs (``set-resources``)."""
    path = Path(profile) / "config.yaml" if Path(profile).is_dir() else Path(profile)
    blocks = (read_yaml(path).get("set-resources") or {}) if path.exists() else {}
    return {output: (blocks.get(rule) or {}).get("runtime") for output, rule in SHARD_RULES.items()}


def _figure(x: float) -> str:
    """Three significant digits, whole numbers from 100 on (with thousands separators)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def render(rows: list[dict], lengths_source: str) -> str:
    """The estimate as a Markdown table, then what each figure assumes."""
    head = (
        "| encoder | output | precision | forward passes | model FLOPs | TFLOP/s per GPU | GPU-hours | shard jobs | "
        "hours per job (limit) | rows | disk GB |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        limit = (
            "" if r["runtime_min"] is None else f" ({r['runtime_min'] / 60:g} h{'' if r['within_limit'] else ', over'})"
        )
        lines.append(
            f"| {r['encoder']} | {r['output']} | {r['precision']} | {r['passes']:,} | {r['flops']:.3g} | "
            f"{r['flops_per_gpu_second'] / 1e12:.0f}{'*' if r['assumed_rate'] else ''} | {_figure(r['gpu_hours'])} | "
            f"{r['shards']:,} | {_figure(r['hours_per_shard'])}{limit} | {r['rows']:,} | {_figure(r['disk_gb'])} |"
        )
    notes = [
        "",
        f"sequences: {lengths_source}; encoders: "
        + "; ".join(sorted({f"{r['encoder']} from {r['source']} (window {r['window']:,} residues)" for r in rows})),
        "forward passes: embeddings and the wild-type marginal one per window, the masked marginal one per residue, "
        "contacts one per window plus the pair head on its pairs (the categorical Jacobian: 20 L + 1 per window); "
        "model FLOPs: 2 x layers x (4 C^2 + 2 C F) per token plus attention and heads (pmlm.inference.pricing).",
        "hours per job: GPU-hours / shard jobs (shards hold about the same residues; the masked marginal's cost per "
        "residue grows with the length, so a shard of long sequences takes longer); limit: the profile's runtime of "
        "the output's shard rule.",
        "disk: rows x bytes per row measured on the tests' proteome (Parquet, zstd); embeddings' 4 C bytes per row "
        "are stored uncompressed.",
    ]
    if any(r["assumed_rate"] for r in rows):
        notes.append(
            "* assumed: an H100 SXM's dense peak (989 TFLOP/s bf16, 67 fp32) x the 17.1 % model-FLOP utilisation "
            "measured for PMLM-base training on one (bench/README.md); give --inference-flops N or fill "
            "inference_flops_per_gpu_second in config/throughput.yaml with a measured figure."
        )
    return "\n".join(lines + notes) + "\n"


def pretrains(config: WorkflowConfig) -> bool:
    """Whether a workflow config pre-trains an encoder (released checkpoints are imported, not trained)."""
    return any(not m.get("release") for m in (config.values.get("pretrain") or {}).get("models") or [])


def plan_inference(
    config: WorkflowConfig,
    schema: str | Path,
    profile: str | Path,
    throughput_file: str | Path | None,
    proteins: int | None = None,
    mean_length: int | None = None,
    flops_per_second: float | None = None,
) -> tuple[list[dict], str] | None:
    """``pmlm plan``'s inference rows for a workflow config and where the lengths came from (None: no inference
    section). ``flops_per_second`` replaces every rate; else config/throughput.yaml's, else the assumed one."""
    section = inference_section(config.values, schema)
    if section is None:
        if proteins is not None or mean_length is not None:
            raise ConfigError(f"{config.name}: --proteins and --mean-length price an inference section; it has none")
        return None
    lengths, source = sequence_lengths(section, proteins, mean_length)
    encoders = config_encoders(config, section)
    rates = throughput(throughput_file)
    if flops_per_second is not None:
        rates = dict.fromkeys((BF16, FP32), flops_per_second)
    rows = estimate(encoders, section["outputs"], lengths, settings_of(section), section["residues_per_shard"], rates,
                    shard_runtimes(profile))  # fmt: skip
    return rows, source
