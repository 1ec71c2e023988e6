"""Checks of the workflow configuration that report one actionable line naming the offending key, and the names
the checks and the rules share.

The JSON schema (workflow/schemas/config.schema.yaml) is the single description of the keys and their
defaults; the Snakefile validates the config against it once (Snakemake's ``validate``, which also fills
the defaults). This module turns a violation into ``config.<path>: <message>`` (``schema_error``) and
adds the cross-references a schema cannot express (``check_references``: a dataset naming an undefined
source).

Workflow code, not package code: the Snakefile imports it by path (workflow/lib is put on ``sys.path``), and no
``pmlm`` module imports it. It reads the package's names (``pmlm.vocabulary``) and errors (``pmlm.errors``).
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from pmlm.errors import ConfigError
from pmlm.vocabulary import CONTACT_TABLE_KINDS, FEATURES_M_PLUS, MLM

# what an unsupervised read-out's results and contact maps are named beside the fine-tuning runs' (``pair-kl`` ->
# ``unsupervised-pair-kl``: evaluation/<encoder>/unsupervised-pair-kl.tsv, report.contact_maps.runs)
READOUT_PREFIX = "unsupervised-"


def readout_run(readout: str) -> str:
    """The name of read-out ``readout`` among the runs (``pair-kl`` -> ``unsupervised-pair-kl``)."""
    return f"{READOUT_PREFIX}{readout}"


def _where(path) -> str:
    return "config" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def require_config(config) -> None:
    if not isinstance(config, dict) or not config:
        raise ConfigError("config is empty: pass --configfile config/config.yaml (demo) or config/paper.yaml")


def schema_error(config: dict, schema_path: str | Path) -> ConfigError:
    """The most relevant schema violation of an invalid config, as one line naming its key."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if error is None:  # cannot happen for a config the schema rejected; say so rather than pass
        return ConfigError(f"config does not match {schema_path}")
    message = error.message
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        if allowed:
            message += f"; allowed keys: {', '.join(allowed)}"
    return ConfigError(f"{_where(error.absolute_path)}: {message}")


def check_references(config: dict) -> None:
    """Raise ConfigError for the first key that names something the config does not define."""
    sources = config.get("sources") or {}
    datasets = config.get("datasets") or {}
    for name, dataset in datasets.items():
        for key in ("sources", "decontaminate"):
            for i, ref in enumerate(dataset.get(key) or []):
                if ref not in sources:
                    raise ConfigError(
                        f"config.datasets.{name}.{key}[{i}]: unknown source {ref!r}; defined sources: "
                        f"{', '.join(sorted(sources))}"
                    )
    pretrain = config.get("pretrain") or {}
    recipes = pretrain.get("recipes") or {}
    seen = set()
    for i, model in enumerate(pretrain.get("models") or []):
        where = f"config.pretrain.models[{i}]"
        key = (model["dataset"], model["objective"], model["preset"])
        if model.get("release"):  # a released encoder: named freely, neither trained nor read from a dataset
            if is_transformers_release(model) and model["objective"] != MLM:
                raise ConfigError(
                    f"{where}.objective: a transformers model (release.huggingface: ESM) is an MLM encoder; "
                    f"give objective mlm, not {model['objective']}"
                )
            if not is_transformers_release(model) and release_source(model) in sources:
                raise ConfigError(
                    f"{where}: the source name {release_source(model)!r} of this release is taken by config.sources"
                )
        elif model["dataset"] not in datasets:
            raise ConfigError(
                f"{where}.dataset: unknown dataset {model['dataset']!r}; defined: {', '.join(sorted(datasets))}"
            )
        elif model["preset"] not in recipes:
            raise ConfigError(f"{where}.preset: no recipe for {model['preset']!r} in config.pretrain.recipes")
        if key in seen:
            raise ConfigError(f"{where}: duplicate model {'/'.join(key)}")
        seen.add(key)
    for i, name in enumerate((pretrain.get("kl") or {}).get("datasets") or []):
        if name not in datasets:
            raise ConfigError(
                f"config.pretrain.kl.datasets[{i}]: unknown dataset {name!r}; defined: {', '.join(sorted(datasets))}"
            )
    task_data = config.get("task_data") or {}
    for name, spec in task_data.items():
        where = f"config.task_data.{name}"
        if bool(spec.get("split")) == bool(spec.get("files")):
            raise ConfigError(f"{where}: give either source + split (derived splits) or files (one file per split)")
        if spec.get("split") and spec.get("source") not in sources:
            raise ConfigError(f"{where}.source: unknown source {spec.get('source')!r}")
        if spec.get("table") and spec.get("source") in sources:
            _check_table_columns(where, spec["table"], sources[spec["source"]])
        for split, entry in (spec.get("files") or {}).items():
            if bool(entry.get("path")) == bool(entry.get("source")):
                raise ConfigError(f"{where}.files.{split}: give either path or source + member")
            if entry.get("source") and (entry["source"] not in sources or not entry.get("member")):
                raise ConfigError(f"{where}.files.{split}: needs a defined source and a member")
    finetune = config.get("finetune") or {}
    recipes = finetune.get("recipes") or {}
    for name, run in (finetune.get("runs") or {}).items():
        where = f"config.finetune.runs.{name}"
        if run["recipe"] not in recipes:
            raise ConfigError(
                f"{where}.recipe: unknown recipe {run['recipe']!r}; defined: {', '.join(sorted(recipes))}"
            )
        if run["data"] not in task_data:
            raise ConfigError(f"{where}.data: unknown task data {run['data']!r}")
        splits = _splits(task_data[run["data"]])
        for split in {"train": "train", "valid": "valid", **run["tests"]}.values():
            if split not in splits:
                raise ConfigError(
                    f"{where}: task data {run['data']!r} has no split {split!r} (has {', '.join(sorted(splits))})"
                )
        _check_features(where, run, pretrain.get("models") or [])
    unsupervised = finetune.get("unsupervised") or {}
    if unsupervised.get("readouts"):
        if unsupervised.get("data") not in task_data:
            raise ConfigError(f"config.finetune.unsupervised.data: unknown task data {unsupervised.get('data')!r}")
        splits = _splits(task_data[unsupervised["data"]])
        for label, split in (unsupervised.get("tests") or {}).items():
            if split not in splits:
                raise ConfigError(f"config.finetune.unsupervised.tests.{label}: no split {split!r}")
    _check_proteingym(config)
    _check_inference(config)
    maps = ((config.get("report") or {}).get("contact_maps") or {}).get("runs") or []
    contact_runs = {name for name, run in (finetune.get("runs") or {}).items() if run["table"] in CONTACT_TABLE_KINDS}
    drawable = contact_runs | {readout_run(r) for r in unsupervised.get("readouts") or []}
    for i, name in enumerate(maps):
        if name not in drawable:
            raise ConfigError(
                f"config.report.contact_maps.runs[{i}]: {name!r} is not a contact run or unsupervised "
                f"read-out of this config (have: {', '.join(sorted(drawable)) or 'none'})"
            )


def is_transformers_release(model: dict) -> bool:
    """Whether a pretrain.models entry's release is a transformers model (release.huggingface), not a checkpoint."""
    return "huggingface" in (model.get("release") or {})


def release_source(model: dict) -> str:
    """The name under which the workflow downloads a released encoder's checkpoint (a source of fetch_source)."""
    return f"release-{model['dataset']}-{model['objective']}-{model['preset']}"


def _check_proteingym(config: dict) -> None:
    """The ProteinGym section names defined sources and pre-trained encoders."""
    section = config.get("proteingym") or {}
    if not section.get("archive") and not section.get("reference"):
        return
    sources = config.get("sources") or {}
    for key in ("archive", "reference"):
        if section.get(key) not in sources:
            raise ConfigError(
                f"config.proteingym.{key}: unknown source {section.get(key)!r}; defined sources: "
                f"{', '.join(sorted(sources)) or 'none'}"
            )
    models = (config.get("pretrain") or {}).get("models") or []
    ids = [f"{m['dataset']}/{m['objective']}-{m['preset']}" for m in models]
    for i, encoder in enumerate(section.get("encoders") or []):
        if encoder not in ids:
            raise ConfigError(
                f"config.proteingym.encoders[{i}]: {encoder!r} is not an encoder of pretrain.models "
                f"(have: {', '.join(ids) or 'none'})"
            )
    if not models:
        raise ConfigError("config.proteingym: no encoder to score (pretrain.models is empty)")


# the folder of the inference shards beside the encoders' results folders (results/<run>/inference/shards)
INFERENCE_SHARDS_FOLDER = "shards"
ENCODER_WEIGHTS = "model.safetensors"


def inference_encoder(config: dict, value: str) -> dict | None:
    """The pretrain.models entry an inference.encoders value names (dataset/objective-preset), or None (a path)."""
    models = (config.get("pretrain") or {}).get("models") or []
    return next((m for m in models if f"{m['dataset']}/{m['objective']}-{m['preset']}" == value), None)


def encoder_weights_path(value: str) -> str:
    """The weights an inference.encoders path names: the file itself, or model.safetensors in the folder."""
    return value if value.endswith(".safetensors") else str(Path(value) / ENCODER_WEIGHTS)


def _check_inference(config: dict) -> None:
    """The inference section has sequences and encoders together, and each encoder is one of pretrain.models or an
    existing encoder file or folder."""
    section = config.get("inference") or {}
    encoders = section.get("encoders") or {}
    if section.get("fasta") and not encoders:
        raise ConfigError("config.inference.encoders: name at least one encoder to run on config.inference.fasta")
    if encoders and not section.get("fasta"):
        raise ConfigError("config.inference.fasta: the sequences the encoders of config.inference.encoders read")
    for label, value in encoders.items():
        where = f"config.inference.encoders.{label}"
        if label == INFERENCE_SHARDS_FOLDER:
            raise ConfigError(f"{where}: {label!r} names the shards' folder; choose another label")
        if inference_encoder(config, value) is not None:
            continue
        weights = Path(encoder_weights_path(value))
        if not weights.is_file():
            models = (config.get("pretrain") or {}).get("models") or []
            ids = ", ".join(f"{m['dataset']}/{m['objective']}-{m['preset']}" for m in models) or "none"
            raise ConfigError(
                f"{where}: {value!r} is neither an encoder of pretrain.models (have: {ids}) nor an encoder file or "
                f"folder ({weights}: no such file)"
            )


def _check_features(where: str, run: dict, models: list[dict]) -> None:
    """A run's features name encoders it fine-tunes; M+ only for contact runs on encoders with a pair head."""
    spec = run.get("features", "auto")
    ids = {f"{m['dataset']}/{m['objective']}-{m['preset']}": m for m in models}
    applies = [i for i in ids if not run.get("encoders") or i in run["encoders"]]
    if isinstance(spec, dict):
        for encoder in spec:
            if encoder not in applies:
                raise ConfigError(f"{where}.features.{encoder}: not an encoder of this run ({', '.join(applies)})")
        chosen = {i: spec.get(i, "auto") for i in applies}
    else:
        chosen = dict.fromkeys(applies, spec)
    for encoder, features in chosen.items():
        if features == FEATURES_M_PLUS and run.get("table") not in CONTACT_TABLE_KINDS:
            raise ConfigError(
                f"{where}.features: M+ describes residue pairs; table {run.get('table')} reads encoder outputs (M)"
            )
        if features == FEATURES_M_PLUS and ids[encoder]["objective"] == MLM:
            raise ConfigError(f"{where}.features: M+ needs a pair head; {encoder} is an MLM encoder (use M)")


TABLE_COLUMNS = ("sequence_column", "label_column", "split_column")  # the columns a table's settings name


def _check_table_columns(where: str, table: dict, source: dict) -> None:
    """A table of one's own that is a local file (``url: file:...``) already: each column its settings name is one
    of the file's, before any job runs; the line names the setting the user wrote, not a flag of a command."""
    url = str(source.get("url") or "")
    if not url.startswith("file:") or source.get("member"):
        return
    path = Path(url[len("file:") :])
    if not path.is_file():
        return  # the fetch rule reports it
    found = table_header(path)
    if found is None:
        return  # not a table this check reads; the split rule reports what it finds
    for key in TABLE_COLUMNS:
        column = table.get(key)
        if column and column not in found:
            raise ConfigError(
                f"{where}.table.{key}: no column {column!r} in {path} (its columns: {', '.join(found) or 'none'})"
            )


def table_header(path: Path) -> list[str] | None:
    """The column names of a CSV / TSV (plain or gzip) or Parquet table, or None when it is none of them."""
    import csv
    import gzip

    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except (OSError, ValueError):
            return None
    if not name.endswith((".csv", ".tsv", ".csv.gz", ".tsv.gz")):
        return None
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(path, "rt", newline="", encoding="utf-8-sig") as fh:
            return next(csv.reader(fh, delimiter="\t" if ".tsv" in name else ","), [])
    except (OSError, UnicodeDecodeError, EOFError, csv.Error):
        return None


def _splits(spec: dict) -> set[str]:
    return {"train", "valid", "test"} if spec.get("split") else set(spec.get("files") or {})
