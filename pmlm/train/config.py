"""The typed configuration tree of a pre-training run, loaded from YAML / dicts with strict key checks."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pmlm.errors import ConfigError
from pmlm.model.config import PRESETS, ModelConfig, model_config
from pmlm.model.encoder import ATTENTION_LAYOUTS
from pmlm.model.objectives import ObjectiveConfig

DEVICES = ("auto", "cpu", "cuda")


class YamlConfig:
    """``to_dict`` / ``from_dict`` / ``from_yaml`` for a tree of config dataclasses.

    Unknown keys, unreadable files and bad YAML are one-line ConfigErrors naming the file (and the
    line, for YAML syntax errors) and the dotted key.
    """

    def to_dict(self) -> dict:
        return to_plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, values: dict):
        """Build from nested dicts (YAML, a sidecar); unknown keys are an error that names them."""
        return build_dataclass(cls, values, "")

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] = ()):
        """Load ``path`` and apply ``key.sub=value`` overrides (values parsed as YAML scalars)."""
        path = Path(path)
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of settings at the top level")
        for item in overrides:
            apply_override(values, item)
        try:
            return cls.from_dict(values)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


@dataclass
class ModelSection:
    """Which encoder to train: a named preset plus field overrides (see pmlm.model.config)."""

    preset: str = "tiny"  # tiny | base | large | xl
    # ModelConfig fields replacing the preset's and the objective's layer recipe, e.g. {norm: pre}; they apply
    # to every objective trained from the recipe (see pmlm.model.config)
    overrides: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # an unknown preset or field fails here, at load time, not after the data has been read
        require(self.preset in PRESETS, "model.preset", f"must be one of {', '.join(PRESETS)}", self.preset)
        try:
            self.build()
        except ConfigError as exc:
            raise ConfigError(f"model.overrides: {exc}") from None

    def build(self, objective: str = "pmlm") -> ModelConfig:
        """The encoder of ``objective``: the preset's dimensions, the objective's released layer recipe, the overrides."""
        return model_config(self.preset, objective, **self.overrides)


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then polynomial decay (paper: Adam (0.9, 0.98), eps 1e-6, clip 1.0)."""

    lr: float = 3e-4  # peak learning rate, reached at the end of warm-up (paper: 3e-4 base, 1e-4 large/xl)
    end_lr: float = 0.0  # learning rate at total_steps
    betas: tuple[float, float] = (0.9, 0.98)  # Adam moment decay rates
    eps: float = 1e-6  # Adam denominator epsilon
    # decoupled decay on matrices only (biases, LayerNorms stay undecayed); 0 gives plain Adam
    weight_decay: float = 0.01
    warmup_steps: int = 20_000  # optimizer steps of linear warm-up from 0 to lr
    total_steps: int = 100_000  # optimizer steps in the whole run (the decay ends here)
    power: float = 1.0  # exponent of the polynomial decay; 1.0 is linear
    clip_norm: float = 1.0  # global gradient-norm clip; 0 disables clipping

    def __post_init__(self) -> None:
        check_adamw(self)
        require(0 <= self.end_lr <= self.lr, "optim.end_lr", "must be in [0, optim.lr]", self.end_lr)
        require(self.power > 0, "optim.power", "must be > 0", self.power)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): warm-up, then decay to end_lr."""
        return warmup_decay(step, self.warmup_steps, self.total_steps, self.lr, self.end_lr, self.power)


@dataclass
class DataConfig:
    """How shards become batches."""

    tokens_per_batch: int = 8192  # budget per micro-batch: rows * padded length (specials and padding included)
    max_len: int | None = None  # crop length in tokens incl. <cls>/<eos>; None = the model's max_len
    buffer_rows: int = 16_384  # rows shuffled and length-bucketed together; larger = less padding
    pad_to_multiple: int = 8  # padded batch length rounded up to this (tensor-core friendly shapes)
    num_workers: int = 1  # background threads preparing upcoming shuffle buffers; 0 = inline

    def __post_init__(self) -> None:
        require(self.tokens_per_batch >= 1, "data.tokens_per_batch", "must be >= 1", self.tokens_per_batch)
        max_len_ok = self.max_len is None or self.max_len >= 3
        require(max_len_ok, "data.max_len", "must be >= 3 (it counts <cls> and <eos>) or null", self.max_len)
        require(self.buffer_rows >= 1, "data.buffer_rows", "must be >= 1", self.buffer_rows)
        require(self.pad_to_multiple >= 1, "data.pad_to_multiple", "must be >= 1", self.pad_to_multiple)
        require(self.num_workers >= 0, "data.num_workers", "must be >= 0", self.num_workers)


@dataclass
class TrainConfig(YamlConfig):
    """Everything a pre-training run depends on; saved into every checkpoint as config.json."""

    model: ModelSection = field(default_factory=ModelSection)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    grad_accum: int = 1  # micro-batches per optimizer step (per rank)
    log_every: int = 10  # optimizer steps between rows of metrics.csv / TensorBoard
    eval_every: int = 1000  # optimizer steps between validations; 0 = only at the end
    eval_batches: int = 50  # validation micro-batches per rank (the first ones of the fixed-seed valid stream)
    save_every: int = 1000  # optimizer steps between checkpoints; 0 = only at the end and on SIGTERM/SIGUSR1
    keep_last_checkpoints: int = 3  # older step-N/ folders are deleted
    seed: int = 1  # seeds model init, data order, crops and masks
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda
    bf16: bool | str = "auto"  # bf16 autocast: auto (on CUDA only) | true | false
    compile: bool = False  # torch.compile the encoder layers (see Encoder.compile_layers)
    # layout of padded batches: auto (packed with the fused variable-length kernel on CUDA under bf16,
    # padded with a key mask elsewhere) | packed | padded; see pmlm.model.encoder
    attention: str = "auto"
    # shard parameters and optimizer state with FSDP instead of DDP (for xl); also on one GPU under torchrun
    fsdp: bool = False
    tensorboard: bool = True  # also write TensorBoard events to <out>/tb

    def __post_init__(self) -> None:
        for name in ("grad_accum", "log_every", "eval_batches", "keep_last_checkpoints"):
            require(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        for name in ("eval_every", "save_every", "seed"):
            require(getattr(self, name) >= 0, name, "must be >= 0", getattr(self, name))
        require(self.device in DEVICES, "device", f"must be one of {', '.join(DEVICES)}", self.device)
        require(self.attention in ATTENTION_LAYOUTS, "attention", f"must be one of {', '.join(ATTENTION_LAYOUTS)}",
                 self.attention)
        require(isinstance(self.bf16, bool) or self.bf16 == "auto", "bf16", "must be auto, true or false", self.bf16)
        model_max = self.model_config().max_len
        require(
            self.data.max_len is None or self.data.max_len <= model_max,
            "data.max_len",
            f"must be <= the model's max_len ({model_max}); raise model.overrides.max_len to go longer",
            self.data.max_len,
        )

    @property
    def max_len(self) -> int:
        """Crop length in tokens (<cls> and <eos> included)."""
        return self.data.max_len if self.data.max_len is not None else self.model_config().max_len

    def model_config(self) -> ModelConfig:
        """The encoder this run trains (its preset and overrides, with the objective's layer recipe)."""
        return self.model.build(self.objective.name)


def apply_override(values: dict, item: str) -> None:
    """Set ``a.b.c=value`` inside nested dicts ``values`` (creating levels as needed)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. optim.lr=1e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    *parents, leaf = key.strip().split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part} is not a section")
    node[leaf] = value


def require(ok: bool, key: str, what: str, value) -> None:
    """The one-line ConfigError of every config check: ``key what, got value``."""
    if not ok:
        raise ConfigError(f"{key} {what}, got {value!r}")


def check_adamw(optim) -> None:
    """The checks of the AdamW and schedule settings both runs' ``optim`` sections share."""
    require(optim.lr > 0, "optim.lr", "must be > 0", optim.lr)
    betas_ok = len(optim.betas) == 2 and all(0 <= b < 1 for b in optim.betas)
    require(betas_ok, "optim.betas", "must be two numbers in [0, 1)", optim.betas)
    require(optim.eps > 0, "optim.eps", "must be > 0", optim.eps)
    require(optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0", optim.weight_decay)
    require(optim.total_steps >= 1, "optim.total_steps", "must be >= 1", optim.total_steps)
    warmup_ok = 0 <= optim.warmup_steps <= optim.total_steps
    require(warmup_ok, "optim.warmup_steps", "must be in [0, optim.total_steps]", optim.warmup_steps)
    require(optim.clip_norm >= 0, "optim.clip_norm", "must be >= 0 (0 disables clipping)", optim.clip_norm)


def warmup_decay(step: int, warmup_steps: int, total_steps: int, peak: float = 1.0, end: float = 0.0,
                 power: float = 1.0) -> float:
    """The schedule of both runs at optimizer step ``step`` (0-based): linear warm-up from 0 to ``peak``,
    then polynomial decay to ``end`` at ``total_steps``."""
    update = step + 1
    if update <= warmup_steps:
        return peak * update / warmup_steps
    decay_steps = total_steps - warmup_steps
    if decay_steps <= 0:
        return end
    remaining = max(0.0, 1.0 - (update - warmup_steps) / decay_steps)
    return end + (peak - end) * remaining**power


def to_plain(value):
    """Tuples -> lists, recursively, so the dict round-trips through JSON / YAML unchanged."""
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def build_dataclass(cls, values, prefix: str):
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        names = ", ".join(prefix + k for k in unknown)
        raise ConfigError(f"unknown key(s) {names}; valid keys here: {', '.join(prefix + k for k in known)}")
    kwargs = {name: _coerce(values[name], hints[name], prefix + name) for name in known if name in values}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        # a wrong type that slipped past coercion, reported against the section rather than as a traceback
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {exc}") from None


def _coerce(value, hint, key: str):
    """Check ``value`` against a field's type; numbers written as YAML strings ('3e-4') are accepted."""
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, key + ".")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} is not a valid value")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if origin is tuple:
        items = typing.get_args(hint)
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            raise ConfigError(f"{key} must be a list of {len(items)} values, got {value!r}")
        return tuple(_coerce(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(value, items)))
    if hint is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key} must be a mapping, got {value!r}")
    return value
