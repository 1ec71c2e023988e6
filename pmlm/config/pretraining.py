"""The typed configuration tree of a pre-training run, loaded from YAML / dicts with strict key checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pmlm.choices import Device, Precision
from pmlm.config.optim import PretrainOptimConfig
from pmlm.config.tree import YamlConfig, require
from pmlm.errors import ConfigError
from pmlm.model.config import PRESETS, ModelConfig, model_config
from pmlm.model.layout import Layout
from pmlm.model.objectives import ObjectiveConfig
from pmlm.vocabulary import PMLM

AUTO = "auto"  # data.tokens_per_batch: the micro-batch chosen for the hardware (pmlm.train.step_layout)


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

    def build(self, objective: str = PMLM) -> ModelConfig:
        """The encoder of ``objective``: the preset's dimensions, the objective's released layer recipe, the overrides."""
        return model_config(self.preset, objective, **self.overrides)


@dataclass
class ShardDataConfig:
    """How shards become batches."""

    # a hardware setting, not the recipe's: the token budget (rows * padded length, specials and padding included)
    # of one micro-batch on one GPU; auto = the largest that fits the card by the memory estimate (pmlm plan), one
    # micro-batch per rank on CPU. The batch of an optimizer step is tokens_per_step whatever this is.
    tokens_per_batch: int | str = "auto"
    max_len: int | None = None  # crop length in tokens incl. <cls>/<eos>; None = the model's max_len
    buffer_rows: int = 16_384  # rows shuffled and length-bucketed together; larger = less padding
    pad_to_multiple: int = 8  # padded batch length rounded up to this (tensor-core friendly shapes)
    num_workers: int = 1  # background threads preparing upcoming shuffle buffers; 0 = inline

    def __post_init__(self) -> None:
        micro = self.tokens_per_batch
        micro_ok = micro == AUTO or (isinstance(micro, int) and micro >= 1)
        require(micro_ok, "data.tokens_per_batch", "must be auto or a whole number >= 1", micro)
        max_len_ok = self.max_len is None or self.max_len >= 3
        require(max_len_ok, "data.max_len", "must be >= 3 (it counts <cls> and <eos>) or null", self.max_len)
        require(self.buffer_rows >= 1, "data.buffer_rows", "must be >= 1", self.buffer_rows)
        require(self.pad_to_multiple >= 1, "data.pad_to_multiple", "must be >= 1", self.pad_to_multiple)
        require(self.num_workers >= 0, "data.num_workers", "must be >= 0", self.num_workers)


# Settings that do not change what a run computes: left out of the fingerprint that ties a checkpoint to its run
# (pmlm.train.run_folder), so changing them resumes the run. The precision that `bf16` resolves to on the device
# is fingerprinted in its place.
NOT_IN_FINGERPRINT = (
    "log_every",  # when a metrics row is written
    "eval_every",  # when validation runs (the final validation runs at the end either way)
    "save_every",  # when checkpoints are written
    "keep_last_checkpoints",  # how many are kept
    "tensorboard",  # whether the rows also go to TensorBoard
    "data.num_workers",  # threads preparing the same batches ahead of time
    # how the step's batch is cut into micro-batches: the same update up to the order of rounding (the loss is
    # normalised by the step's sample sizes, pmlm.model.objectives); the number of ranks is not recorded either
    "data.tokens_per_batch",
    "device",  # where the arithmetic runs (the precision it resolves to is fingerprinted)
    "bf16",  # fingerprinted as the resolved precision
    "compile",  # the same layers compiled: the same arithmetic, up to the order of rounding
    "cuda_graphs",  # the same compiled encoder replayed as CUDA graphs
    "attention",  # the same attention laid out packed or padded: likewise
    "fsdp",  # the same model and optimizer with their state sharded: likewise
)


@dataclass
class TrainConfig(YamlConfig):
    """Everything a pre-training run depends on; saved into every checkpoint as config.json."""

    # keys of earlier recipes, refused with what replaced them
    RETIRED: ClassVar[dict[str, str]] = {
        "grad_accum": (
            "is derived now: tokens_per_step / (data.tokens_per_batch x GPUs); state the recipe's batch as "
            "tokens_per_step (the old data.tokens_per_batch x grad_accum x GPUs) and leave the micro-batch to the "
            "hardware (docs/training.md, 'The batch')"
        )
    }

    model: ModelSection = field(default_factory=ModelSection)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: PretrainOptimConfig = field(default_factory=PretrainOptimConfig)
    data: ShardDataConfig = field(default_factory=ShardDataConfig)
    # the recipe's batch: the token budget of one optimizer step, rows * padded length over all its micro-batches
    # and ranks. It is cut from the length-bucketed stream as one batch and split over ranks x micro-batches
    # (train.step_layout), so 1, 4 or 8 GPUs train the same model; the accumulation follows from it.
    tokens_per_step: int = 8192
    log_every: int = 10  # optimizer steps between rows of metrics.csv / TensorBoard
    eval_every: int = 1000  # optimizer steps between validations; 0 = only at the end
    # validation batches of tokens_per_step each (the first ones of the fixed-seed valid stream), split over ranks
    # and micro-batches like a training step's, so the figures do not depend on the hardware
    eval_batches: int = 50
    save_every: int = 1000  # optimizer steps between checkpoints; 0 = only at the end and on SIGTERM/SIGUSR1
    keep_last_checkpoints: int = 3  # older step-N/ folders are deleted
    seed: int = 1  # seeds model init, data order, crops and masks
    device: Device = Device.AUTO  # auto (CUDA when available) | cpu | cuda
    bf16: bool | str = "auto"  # bf16 autocast: auto (on CUDA only) | true | false
    compile: bool = False  # torch.compile the encoder whole (per layer under FSDP; Encoder.compile_encoder)
    # capture the compiled encoder as CUDA graphs (torch.compile's reduce-overhead mode): every micro-batch is packed
    # to one shape (pmlm.model.layout.StaticShape), so one graph replays step after step; needs compile, CUDA and
    # the packed layout
    cuda_graphs: bool = False
    # layout of padded batches: auto (packed with the fused variable-length kernel on CUDA under bf16,
    # padded with a key mask elsewhere) | packed | padded; see pmlm.model.encoder
    attention: Layout = Layout.AUTO
    # shard parameters and optimizer state with FSDP instead of DDP (for xl); also on one GPU under torchrun
    fsdp: bool = False
    tensorboard: bool = True  # also write TensorBoard events to <out>/tb

    def __post_init__(self) -> None:
        for name in ("tokens_per_step", "log_every", "eval_batches", "keep_last_checkpoints"):
            require(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        for name in ("eval_every", "save_every", "seed"):
            require(getattr(self, name) >= 0, name, "must be >= 0", getattr(self, name))
        self.device = Device.parse(self.device, "device")
        self.attention = Layout.parse(self.attention, "attention")
        Precision.of_recipe(self.bf16)
        require(not self.cuda_graphs or self.compile, "cuda_graphs", "needs compile: true", self.cuda_graphs)
        require(
            not self.cuda_graphs or self.attention in (Layout.AUTO, Layout.PACKED),
            "cuda_graphs",
            "needs the packed layout (attention: auto or packed)",
            self.cuda_graphs,
        )
        model_max = self.model_config().max_len
        require(
            self.data.max_len is None or self.data.max_len <= model_max,
            "data.max_len",
            f"must be <= the model's max_len ({model_max}); raise model.overrides.max_len to go longer",
            self.data.max_len,
        )

    @property
    def precision(self) -> Precision:
        """``bf16`` as a precision (auto: bf16 on CUDA, fp32 elsewhere)."""
        return Precision.of_recipe(self.bf16)

    @property
    def max_len(self) -> int:
        """Crop length in tokens (<cls> and <eos> included)."""
        return self.data.max_len if self.data.max_len is not None else self.model_config().max_len

    def model_config(self) -> ModelConfig:
        """The encoder this run trains (its preset and overrides, with the objective's layer recipe)."""
        return self.model.build(self.objective.name)
