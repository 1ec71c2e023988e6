"""What a proteome costs through the workflow's inference target before anything runs (``pmlm plan`` on a config
with an ``inference`` section): per encoder and output, the forward passes, model FLOPs, GPU-hours, shard jobs and
hours per job, rows and disk. How each figure is made: docs/inference.md, "What it costs".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from pmlm.artefacts import read_encoder_info, recorded_precision, sidecar_path
from pmlm.choices import Precision
from pmlm.data.fasta import read_fasta
from pmlm.errors import ConfigError
from pmlm.inference.contacts import Readout
from pmlm.inference.fasta_shards import shard_count
from pmlm.inference.output_types import OUTPUTS
from pmlm.inference.saturation import Marginal
from pmlm.model.config import PairVocab
from pmlm.model.objective_registry import objective_named
from pmlm.pretrained import ENCODER_FILE
from pmlm.tokens import max_residues
from pmlm.train.budget import model_flops
from pmlm.train.jobs import WorkflowConfig, read_yaml, workflow_jobs
from pmlm.vocabulary import MLM

# model FLOP/s per GPU assumed until config/throughput.yaml holds a measured figure (module docstring)
MEASURED_MFU = 0.171
ASSUMED_RATE = {Precision.BF16: 989e12 * MEASURED_MFU, Precision.FP32: 67e12 * MEASURED_MFU}
GB = 1e9
# the workflow's rule of each output's shard jobs, whose block in a profile is their time limit: in this file of the
# lib folder of the workflow whose config schema --schema names (workflow/lib/shard_rules.yaml)
SHARD_RULES_FILE = Path("lib") / "shard_rules.yaml"


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
    precision: Precision
    source: str  # where the dims come from (a model.json, a recipe)

    @classmethod
    def from_model(cls, label: str, model: dict, precision: Precision, source: str) -> Encoder:
        """From a model section (model.json's ``model``, ``ModelConfig.to_dict()``)."""
        try:
            return cls(label, int(model["num_layers"]), int(model["hidden"]), int(model["ffn"]),
                       int(model["max_len"]), bool(model.get("pair_head")),
                       PairVocab(model.get("pair_vocab", PairVocab.STANDARD)).classes, precision, source)  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: no encoder dims in its model section ({exc})") from None

    @property
    def window(self) -> int:
        return max_residues(self.max_len)

    def passes_flops(self, tokens: int, head_residues: int = 0, objective: str = MLM) -> float:
        """Model FLOPs of one forward pass over ``tokens`` tokens, the token head (and, for PMLM, the pair head on
        their pairs) on ``head_residues`` of them."""
        flops = model_flops(
            self.layers, self.hidden, self.ffn, objective_named(objective), [tokens], [head_residues], self.pair_classes
        )
        return flops / 3  # the training count is forward + backward, the backward twice the forward


@dataclass(frozen=True)
class Settings:
    """The inference section's settings that change the cost."""

    marginal: Marginal = Marginal.MASKED
    readout: Readout = Readout.AUTO
    top: str | int = "L"
    min_separation: int = 6


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
    shards = shard_count(residues, len(lengths), residues_per_shard)
    rows = []
    for encoder in encoders:
        rate = rates.get(encoder.precision)
        assumed = rate is None
        rate = ASSUMED_RATE[encoder.precision] if assumed else rate
        for output in outputs:
            kind = OUTPUTS[output]
            passes = flops = out_rows = 0
            for length, n in counts.items():
                p, f, r = kind.cost(encoder, length, settings)
                passes, flops, out_rows = passes + n * p, flops + n * f, out_rows + n * r
            gpu_hours = flops / rate / 3600
            limit = runtimes.get(output)
            rows.append({
                "encoder": encoder.label, "output": output, "precision": encoder.precision, "window": encoder.window,
                "sequences": len(lengths), "residues": residues, "passes": passes, "flops": flops,
                "flops_per_gpu_second": rate, "assumed_rate": assumed, "gpu_hours": gpu_hours, "shards": shards,
                "hours_per_shard": gpu_hours / shards, "runtime_min": limit,
                "within_limit": None if limit is None else gpu_hours / shards * 60 <= limit,
                "rows": out_rows, "disk_gb": kind.disk_bytes(encoder, out_rows, len(lengths)) / GB,
                "source": encoder.source,
            })  # fmt: skip
    return rows


def throughput(path: str | Path | None) -> dict[str, float]:
    """Measured model FLOP/s per GPU by precision (``inference_flops_per_gpu_second: {bf16: N, fp32: N}``)."""
    if path is None or not Path(path).exists():
        return {}
    table = (yaml.safe_load(Path(path).read_text()) or {}).get("inference_flops_per_gpu_second") or {}
    for precision, value in table.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if precision not in ASSUMED_RATE or not number or value <= 0:
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
    defaults = section_defaults(schema)
    return {**defaults, **section, "contacts": {**defaults["contacts"], **(section.get("contacts") or {})}}


def settings_of(section: dict) -> Settings:
    contacts = section["contacts"]
    return Settings(
        Marginal.parse(section["marginal"], "config.inference.marginal"),
        Readout.parse(contacts["readout"], "config.inference.contacts.readout"),
        contacts["top"],
        int(contacts["min_separation"]),
    )


def sequence_lengths(section: dict, proteins: int | None, mean_length: int | None) -> tuple[list[int], str]:
    """The lengths to price and where they come from: ``proteins`` of ``mean_length`` each, else the FASTA's."""
    if proteins is not None or mean_length is not None:
        if not proteins or not mean_length or proteins < 1 or mean_length < 1:
            raise ConfigError("--proteins N and --mean-length L go together, both >= 1")
        given = f"{proteins:,} proteins of {mean_length:,} residues (--proteins, --mean-length)"
        return [mean_length] * proteins, given
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
            trained, source = Precision.FP32, f"{config.name}: pretrain.models[{i}].release.model"
        elif model is not None:
            job = next(j for j in workflow_jobs(config, root) if j.name == value)
            trained = Precision.FP32 if job.config.precision is Precision.FP32 else Precision.BF16
            dims, source = job.config.model_config().to_dict(), f"recipe {job.recipe}"
        else:
            weights = Path(value) if value.endswith(".safetensors") else Path(value) / ENCODER_FILE
            if not sidecar_path(weights).is_file():
                raise ConfigError(
                    f"{where}: {sidecar_path(weights)}: no such file (the encoder's model.json); to price a released "
                    "encoder before its download, name its pretrain.models entry (dataset/objective-preset) instead"
                )
            info = read_encoder_info(weights)
            trained, dims, source = recorded_precision(info, weights), info["model"], str(sidecar_path(weights))
        asked = Precision.parse(section["precision"], "config.inference.precision")
        precision = Precision(trained) if asked is Precision.AUTO else asked
        encoders.append(Encoder.from_model(label, dims, precision, source))
    return encoders


def shard_runtimes(profile: str | Path, schema: str | Path) -> dict[str, int | None]:
    """Output -> the time limit (minutes) the SLURM profile gives its shard jobs (``set-resources``): the block of
    the rule the workflow of ``schema`` runs them by (SHARD_RULES_FILE)."""
    path = Path(profile) / "config.yaml" if Path(profile).is_dir() else Path(profile)
    blocks = (read_yaml(path).get("set-resources") or {}) if path.exists() else {}
    rules_file = Path(schema).parent.parent / SHARD_RULES_FILE
    rules = read_yaml(rules_file) if rules_file.exists() else {}
    return {output: (blocks.get(rules.get(output)) or {}).get("runtime") for output in OUTPUTS}


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
        over = "" if r["within_limit"] else ", over"
        limit = "" if r["runtime_min"] is None else f" ({r['runtime_min'] / 60:g} h{over})"
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
        rates = dict.fromkeys(ASSUMED_RATE, flops_per_second)
    rows = estimate(encoders, section["outputs"], lengths, settings_of(section), section["residues_per_shard"], rates,
                    shard_runtimes(profile, schema))  # fmt: skip
    return rows, source
