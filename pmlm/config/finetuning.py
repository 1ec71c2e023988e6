"""The typed configuration tree of a fine-tuning run (task, head, optimizer, data), loaded from YAML with
strict key checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pmlm.choices import Device, Precision
from pmlm.config.optim import FinetuneOptimConfig
from pmlm.config.tree import YamlConfig, require
from pmlm.errors import ConfigError
from pmlm.model.task_heads import HeadKind, HeadNorm
from pmlm.tasks.registry import format_names, task_named
from pmlm.tasks.structures import CONTACT_THRESHOLD
from pmlm.tasks.task import ReadOptions, Task, TaskSettings
from pmlm.vocabulary import FEATURES_M, FEATURES_M_PLUS, TASK_CONTACT

# head.features: M (encoder outputs), M+ (the pair head's first block) or auto (M+ where the encoder has a pair
# head)
FEATURES = ("auto", FEATURES_M, FEATURES_M_PLUS)
CONTACT_ATOM_CHOICES = ("auto", "CA", "CB")
ON_ERROR = ("raise", "skip")
ADAPTER_KINDS = ("lora",)


@dataclass
class HeadConfig:
    """The task head put on top of the encoder."""

    # contact: linear (TAPE's shallow decoder) | resnet (2-D ResNet, as for RaptorX);
    # ss3, residue_classification: mlp (per residue) | conv (TAPE's secondary-structure head, two 1-D convolutions);
    # remote_homology, fluorescence, stability, sequence_classification, sequence_regression: mlp (the residues'
    # mean through an MLP); auto picks the task's first (pmlm.tasks)
    kind: str = "auto"
    # contact only. M: concat(f_i * f_j, f_i - f_j) of the encoder outputs;
    # M+: the pair head's first-block output (needs a PMLM encoder);
    # auto: M+ when the encoder has a pair head (the paper's choice), M otherwise
    features: str = "auto"
    # contact heads: dropout on the input pair features (TAPE: 0.5); mlp: after the hidden layer;
    # conv: after the first convolution (TAPE: 0.0)
    dropout: float = 0.5
    resnet_blocks: int = 8  # residual blocks of the resnet head (each two 2-D convs)
    resnet_channels: int = 64  # channels of the pairwise map inside the resnet head
    resnet_kernel: int = 3  # square, non-dilated convolution kernel (odd)
    # instance | batch: normalisation inside the residual blocks (statistics over real pairs only)
    resnet_norm: HeadNorm = HeadNorm.INSTANCE
    mlp_hidden: int = 512  # hidden width of the mlp head (TAPE's SimpleMLP: 512)
    conv_hidden: int = 512  # channels between the conv head's two convolutions (TAPE's SimpleConv: 512)
    # output classes; None = the task's (3 for ss3, 1,195 folds for remote homology, data.classes for a user's)
    num_classes: int | None = None
    # upper bound on the elements of one chunk of pair features (B x rows x L x F); bounds the
    # transient memory of L^2 pair features, the only quantity that grows quadratically
    pair_chunk_elements: int = 1 << 24

    def __post_init__(self) -> None:
        require(self.features in FEATURES, "head.features", f"must be one of {', '.join(FEATURES)}", self.features)
        require(0.0 <= self.dropout < 1.0, "head.dropout", "must be in [0, 1)", self.dropout)
        for name in ("resnet_blocks", "resnet_channels", "mlp_hidden", "conv_hidden", "pair_chunk_elements"):
            require(getattr(self, name) >= 1, f"head.{name}", "must be >= 1", getattr(self, name))
        require(
            self.resnet_kernel >= 1 and self.resnet_kernel % 2 == 1,
            "head.resnet_kernel",
            "must be a positive odd number (the pairwise map keeps its size)",
            self.resnet_kernel,
        )
        self.resnet_norm = HeadNorm.parse(self.resnet_norm, "head.resnet_norm")
        require(
            self.num_classes is None or self.num_classes >= 1,
            "head.num_classes",
            "must be >= 1 or null",
            self.num_classes,
        )


@dataclass
class TaskDataConfig:
    """How task files become labelled, cropped batches."""

    # auto (by file name / content) | structure_jsonl | tape | raptorx | table, or a plug-in's (pmlm.tasks.registry)
    format: str = "auto"
    batch_size: int = 8  # proteins per micro-batch
    # training crop in residues: longer proteins get a random window of this size (per epoch);
    # null = the encoder's window (max_len - 2). Evaluation always uses full length.
    crop: int | None = 256
    # atom whose distance defines a contact: auto = the dataset's convention (structure JSONL
    # and RaptorX: CB; TAPE's ProteinNet holds only CA); CA / CB force it (CB on TAPE data is an error)
    contact_atom: str = "auto"
    contact_threshold: float = CONTACT_THRESHOLD  # Angstrom; contact when distance <= this
    min_separation: int = 6  # training loss over pairs with |i - j| >= this (TAPE / RaptorX ignore closer pairs)
    on_error: str = "raise"  # bad records: raise (one line naming file and line) | skip (counted, reported)
    max_proteins: int | None = None  # use only the first N proteins of the training file (null = all)
    # table files (a user's task: CSV, TSV or Parquet, pmlm.tasks.labelled): the columns read
    sequence_column: str = "sequence"
    label_column: str = "label"
    id_column: str = "id"  # optional in the file: the row number names a protein without it
    # a classification's class names in id order; null = the training file's distinct labels, sorted (the head
    # records them)
    classes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        formats = ("auto", *format_names())
        require(self.format in formats, "data.format", f"must be one of {', '.join(formats)}", self.format)
        require(self.batch_size >= 1, "data.batch_size", "must be >= 1", self.batch_size)
        require(self.crop is None or self.crop >= 1, "data.crop", "must be >= 1 or null", self.crop)
        require(
            self.contact_atom in CONTACT_ATOM_CHOICES,
            "data.contact_atom",
            f"must be one of {', '.join(CONTACT_ATOM_CHOICES)}",
            self.contact_atom,
        )
        require(self.contact_threshold > 0, "data.contact_threshold", "must be > 0 (Angstrom)", self.contact_threshold)
        require(self.min_separation >= 1, "data.min_separation", "must be >= 1", self.min_separation)
        require(self.on_error in ON_ERROR, "data.on_error", f"must be one of {', '.join(ON_ERROR)}", self.on_error)
        require(
            self.max_proteins is None or self.max_proteins >= 1,
            "data.max_proteins",
            "must be >= 1 or null",
            self.max_proteins,
        )


@dataclass
class AdapterConfig:
    """Low-rank adapters (LoRA, through ``peft``) in the encoder's linear layers: the encoder's own weights stay
    as pre-trained, the adapters and the head train (``pmlm.adapters``)."""

    kind: str = "lora"  # lora: W x + (alpha / rank) B A x on each targeted linear layer (peft's LoraConfig)
    rank: int = 8  # inner dimension r of A (r x in) and B (out x r)
    alpha: float = 16.0  # scale numerator: the update is multiplied by alpha / rank
    dropout: float = 0.05  # dropout on the adapter's input (training only)
    # names of the encoder's linear layers that get an adapter: a name matches a layer whose path is it or ends in
    # "." + it (peft's rule); auto = the attention projections (qkv, proj in pmlm encoders; query, key, value,
    # attention.output.dense in ESM ones)
    targets: tuple[str, ...] | str = "auto"

    def __post_init__(self) -> None:
        require(self.kind in ADAPTER_KINDS, "adapter.kind", f"must be one of {', '.join(ADAPTER_KINDS)}", self.kind)
        require(self.rank >= 1, "adapter.rank", "must be >= 1", self.rank)
        require(self.alpha > 0, "adapter.alpha", "must be > 0", self.alpha)
        require(0.0 <= self.dropout < 1.0, "adapter.dropout", "must be in [0, 1)", self.dropout)
        if isinstance(self.targets, str):
            require(self.targets == "auto", "adapter.targets", "must be a list of layer names or auto", self.targets)
        else:
            require(len(self.targets) > 0, "adapter.targets", "must name at least one layer (or be auto)", self.targets)


# Settings that do not change what a run computes: left out of the fingerprint that ties a checkpoint to its run
# (pmlm.train.run_folder), so changing them resumes the run. The precision that `bf16` resolves to on the device
# is fingerprinted in its place.
NOT_IN_FINGERPRINT = (
    "log_every",  # when a metrics row is written
    "save_every",  # when checkpoints are written
    "keep_last_checkpoints",  # how many are kept
    "device",  # where the arithmetic runs (the precision it resolves to is fingerprinted)
    "bf16",  # fingerprinted as the resolved precision
    "head.pair_chunk_elements",  # the same pair features computed in chunks of another size
)


@dataclass
class FinetuneConfig(YamlConfig):
    """Everything a fine-tuning run depends on; saved into every checkpoint and the head's sidecar."""

    # contact | ss3 | remote_homology | fluorescence | stability | residue_classification | sequence_classification |
    # sequence_regression, or a task registered by a plug-in (pmlm.tasks.registry)
    task: str = TASK_CONTACT
    # true: train the head only (frozen features); false: the encoder trains too, all of it (full fine-tuning) or
    # through the adapters that ``adapter`` puts in it
    freeze_encoder: bool = True
    adapter: AdapterConfig | None = None  # null: no adapters; e.g. {kind: lora, rank: 8} (needs freeze_encoder false)
    head: HeadConfig = field(default_factory=HeadConfig)
    optim: FinetuneOptimConfig = field(default_factory=FinetuneOptimConfig)
    data: TaskDataConfig = field(default_factory=TaskDataConfig)
    grad_accum: int = 1  # micro-batches per optimizer step
    log_every: int = 10  # optimizer steps between rows of metrics.csv
    # optimizer steps between validations on --valid; 0 = only at the end. The head (and adapters) kept is the one of
    # the best validation (the task's headline metric), its step recorded in head.json
    eval_every: int = 0
    # stop after this many validations in a row without a better headline metric; 0 = never stop early
    patience: int = 0
    save_every: int = 500  # optimizer steps between checkpoints; 0 = only at the end and on SIGTERM / SIGUSR1
    keep_last_checkpoints: int = 2  # older step-N/ folders are deleted
    seed: int = 1  # seeds head initialisation, batch order, crops and dropout
    device: Device = Device.AUTO  # auto (CUDA when available) | cpu | cuda
    bf16: bool | str = "auto"  # bf16 autocast: auto (on CUDA only) | true | false (never on CPU)

    def __post_init__(self) -> None:
        task = task_named(self.task)
        allowed = task.heads
        self.head = dataclasses.replace(self.head, kind=HeadKind.chosen(self.head.kind, allowed))
        require(
            self.head.kind in allowed,
            "head.kind",
            f"must be {' or '.join(allowed)} for task {self.task}",
            self.head.kind,
        )
        if not task.reads_pairs and self.head.features == FEATURES_M_PLUS:
            raise ConfigError(
                f"head.features M+ describes residue pairs; task {self.task} uses encoder outputs "
                "(set head.features: M or auto)"
            )
        for name in ("grad_accum", "log_every", "keep_last_checkpoints"):
            require(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        if self.adapter is not None and self.freeze_encoder:
            raise ConfigError(
                "adapter: an adapter trains inside the encoder, and freeze_encoder: true trains the head only; "
                "set freeze_encoder: false (the encoder's own weights stay frozen under an adapter) or drop adapter"
            )
        require(
            self.patience == 0 or self.eval_every > 0,
            "patience",
            "counts validations: set eval_every > 0 too",
            self.patience,
        )
        for name in ("eval_every", "save_every", "seed", "patience"):
            require(getattr(self, name) >= 0, name, "must be >= 0", getattr(self, name))
        self.device = Device.parse(self.device, "device")
        Precision.of_recipe(self.bf16)

    @property
    def precision(self) -> Precision:
        """``bf16`` as a precision (auto: bf16 on CUDA, fp32 elsewhere)."""
        return Precision.of_recipe(self.bf16)

    def read_options(self, **changes) -> ReadOptions:
        """How this run's task files are read (``data``'s settings and the head's classes); ``changes`` override."""
        d = self.data
        options = ReadOptions(
            fmt=d.format,
            on_error=d.on_error,
            num_classes=self.head.num_classes or task_named(self.task).num_classes,
            classes=d.classes,
            sequence_column=d.sequence_column,
            label_column=d.label_column,
            id_column=d.id_column,
        )
        return dataclasses.replace(options, **changes)

    def configured_task(self, **changes) -> Task:
        """The run's task with ``data``'s contact definition and loss pairs bound; ``changes`` override them."""
        d = self.data
        settings = TaskSettings(d.contact_atom, d.contact_threshold, d.min_separation)
        return task_named(self.task).configure(dataclasses.replace(settings, **changes))
