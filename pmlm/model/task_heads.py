"""Task heads on a pre-trained encoder (contact: linear or 2-D ResNet; per residue: an MLP or TAPE's convolutional
head; per protein: the residues' mean through an MLP, for classes or a value) and ``TaskModel``, the encoder plus one
head. Which task uses which head is the task's (``pmlm.tasks``).

Every head takes residue representations ``reps`` (B, L, C) (``<cls>`` / ``<eos>`` stripped) and a residue mask
(B, L). Contact heads score all L x L pairs from pair features, either ``M`` (``concat(f_i * f_j, f_i - f_j)``
(B, L, L, 2C) of the encoder outputs, TAPE's pairwise features) or ``M+`` (the PMLM pair head's first block on
those features, ``pmlm.model.heads``; the paper's fine-tuning input), built in row chunks of at most
``pair_chunk_elements`` elements. When a chunk's features need gradients and there is more than one chunk, each
chunk is recomputed in the backward pass (activation checkpointing, RNG state preserved so dropout replays exactly)
instead of keeping all L^2 features alive. Contact logits are symmetrised, ``(s(i, j) + s(j, i)) / 2``.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pmlm.choices import Choice
from pmlm.errors import ConfigError
from pmlm.model.heads import PairHead
from pmlm.model.pmlm_model import PMLMModel
from pmlm.model.symmetry import symmetrize
from pmlm.vocabulary import FEATURES_M, FEATURES_M_PLUS

NORM_EPS = 1e-5  # variance floor of the masked norms (torch's BatchNorm / InstanceNorm default)
NORM_MOMENTUM = 0.1  # running-statistics update rate of the masked batch norm (torch's default)


class HeadKind(Choice):
    """A task head's architecture (``head.kind``); which kinds a task accepts and what it builds for each is the
    task's (``pmlm.tasks``). A plug-in task's own kinds stay their names."""

    AUTO = "auto"  # the task's first
    LINEAR = "linear"  # contacts: TAPE's shallow decoder
    RESNET = "resnet"  # contacts: a 2-D ResNet on the pair map
    MLP = "mlp"  # per residue, or on the residues' mean
    CONV = "conv"  # per residue: TAPE's convolutional head

    @classmethod
    def chosen(cls, kind: str, accepted: tuple[str, ...]) -> str:
        """``kind``, or for auto the first of the task's ``accepted`` kinds."""
        return str(accepted[0]) if cls.argument(kind) is cls.AUTO else kind

    @classmethod
    def pair_blocks(cls, h) -> tuple[int, int]:
        """(elements kept for the backward, model FLOPs) per pair of a ResNet head's blocks, two convolutions each
        (inputs and norms kept); none for the other kinds (``pmlm plan --finetune``)."""
        if cls.argument(h.kind) is not cls.RESNET:
            return 0, 0
        c, n = h.resnet_channels, h.resnet_blocks
        return c * (4 * n + 2), 2 * 2 * n * h.resnet_kernel**2 * c**2


class HeadNorm(Choice):
    """``head.resnet_norm``: statistics per map (instance), or over the batch with running ones for evaluation."""

    INSTANCE = "instance"
    BATCH = "batch"

    @property
    def over_batch(self) -> bool:
        return self is HeadNorm.BATCH


def pair_features(reps: torch.Tensor, start: int, stop: int, pair_block: PairHead | None) -> torch.Tensor:
    """Features of pairs (i, j), i in [start, stop), all j: (B, stop - start, L, 2C).

    pair_block None: ``concat(f_i * f_j, f_i - f_j)``; otherwise the PMLM pair head, whose
    first block turns those features into M+.
    """
    if pair_block is not None:
        return pair_block.first_block_grid(reps, start, stop)  # (B, r, L, 2C) = M+
    f_i = reps[:, start:stop, None, :]  # (B, r, 1, C)
    f_j = reps[:, None, :, :]  # (B, 1, L, C)
    return torch.cat(torch.broadcast_tensors(f_i * f_j, f_i - f_j), dim=-1)  # (B, r, L, 2C)


def pair_map(reps: torch.Tensor, pair_block: PairHead | None, transform, chunk_elements: int) -> torch.Tensor:
    """``transform(pair_features)`` for all L x L pairs, built in row chunks: (B, L, L, D)."""
    B, L, C = reps.shape
    rows = max(1, chunk_elements // max(1, B * L * 2 * C))
    chunks = range(0, L, rows)

    def one_chunk(x: torch.Tensor, start: int) -> torch.Tensor:
        return transform(pair_features(x, start, min(start + rows, L), pair_block))  # (B, r, L, D)

    recompute = torch.is_grad_enabled() and len(chunks) > 1
    parts = [
        checkpoint(one_chunk, reps, start, use_reentrant=False) if recompute else one_chunk(reps, start)
        for start in chunks
    ]
    return torch.cat(parts, dim=1)


class ContactLinearHead(nn.Module):
    """TAPE's shallow decoder: dropout on the pair features, Linear(2C, 1), symmetrised.

    With encoder features the symmetrised score is ``sum_c w_prod[c] f_ic f_jc + b``: the
    difference half of the weight cancels between (i, j) and (j, i), so it only matters through
    dropout in training. Evaluation uses that closed form (one matmul, no L^2 features).
    """

    def __init__(self, hidden: int, dropout: float, chunk_elements: int):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(2 * hidden, 1)
        self.chunk_elements = chunk_elements

    def forward(self, reps: torch.Tensor, mask: torch.Tensor, pair_block: PairHead | None = None) -> torch.Tensor:
        if not self.training and pair_block is None:
            w_prod = self.out.weight[0, : reps.shape[-1]]  # (C,)
            # symmetric in exact arithmetic; symmetrised anyway so rounding cannot break it
            return symmetrize((reps * w_prod) @ reps.transpose(1, 2) + self.out.bias)  # (B, L, L)
        raw = pair_map(reps, pair_block, lambda f: self.out(self.dropout(f)).squeeze(-1), self.chunk_elements)
        return symmetrize(raw)  # (B, L, L)


class MaskedNorm(nn.Module):
    """Instance or batch normalisation of a (B, C, *spatial) map, e.g. (B, C, L, L) pairs or (B, C, L) residues,
    whose statistics skip padded positions."""

    def __init__(self, channels: int, norm: str):
        super().__init__()
        self.over_batch = HeadNorm(norm).over_batch
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        if self.over_batch:
            self.register_buffer("running_mean", torch.zeros(channels))
            self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        # x (B, C, *S); pair_mask (B, 1, *S) float, 1 at real residues (pairs of them)
        channel = (1, -1) + (1,) * (x.dim() - 2)  # broadcast a (C,) vector over (B, C, *S)
        if self.over_batch and not self.training:
            mean = self.running_mean.view(channel)
            var = self.running_var.view(channel)
        else:
            spatial = tuple(range(2, x.dim()))
            dims = (0, *spatial) if self.over_batch else spatial
            count = pair_mask.sum(dim=dims, keepdim=True).clamp_min(1.0)
            mean = (x * pair_mask).sum(dim=dims, keepdim=True) / count  # (B or 1, C, 1, 1)
            var = (((x - mean) * pair_mask) ** 2).sum(dim=dims, keepdim=True) / count
            if self.over_batch:
                with torch.no_grad():
                    self.running_mean.lerp_(mean.flatten().to(self.running_mean.dtype), NORM_MOMENTUM)
                    self.running_var.lerp_(var.flatten().to(self.running_var.dtype), NORM_MOMENTUM)
        x = (x - mean) * torch.rsqrt(var + NORM_EPS)
        return (x * self.weight.view(channel) + self.bias.view(channel)) * pair_mask


class ResidualBlock2d(nn.Module):
    """Pre-activation residual block: norm -> ReLU -> conv, twice, plus the input (non-dilated)."""

    def __init__(self, channels: int, kernel: int, norm: str):
        super().__init__()
        self.norm1 = MaskedNorm(channels, norm)
        self.conv1 = nn.Conv2d(channels, channels, kernel, padding=kernel // 2)
        self.norm2 = MaskedNorm(channels, norm)
        self.conv2 = nn.Conv2d(channels, channels, kernel, padding=kernel // 2)

    def forward(self, x: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        # padded pairs are zeroed after every conv, so a protein's edge looks like zero padding
        y = self.conv1(F.relu(self.norm1(x, pair_mask))) * pair_mask
        y = self.conv2(F.relu(self.norm2(y, pair_mask))) * pair_mask
        return x + y  # (B, C, L, L)


class ContactResNetHead(nn.Module):
    """Pair features -> dropout -> Linear(2C, channels) -> residual blocks -> 1x1 conv -> 1 logit, symmetrised."""

    def __init__(
        self, hidden: int, dropout: float, channels: int, blocks: int, kernel: int, norm: str, chunk_elements: int
    ):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.project = nn.Linear(2 * hidden, channels)
        self.blocks = nn.ModuleList(ResidualBlock2d(channels, kernel, norm) for _ in range(blocks))
        self.final_norm = MaskedNorm(channels, norm)
        self.out = nn.Conv2d(channels, 1, kernel_size=1)
        self.chunk_elements = chunk_elements

    def forward(self, reps: torch.Tensor, mask: torch.Tensor, pair_block: PairHead | None = None) -> torch.Tensor:
        x = pair_map(reps, pair_block, lambda f: self.project(self.dropout(f)), self.chunk_elements)  # (B, L, L, ch)
        x = x.permute(0, 3, 1, 2)  # (B, ch, L, L)
        m = mask.to(x.dtype)
        pair_mask = (m[:, :, None] * m[:, None, :]).unsqueeze(1)  # (B, 1, L, L)
        x = x * pair_mask
        for block in self.blocks:
            x = block(x, pair_mask)
        x = F.relu(self.final_norm(x, pair_mask))
        return symmetrize(self.out(x).squeeze(1))  # (B, L, L)


def _mlp(hidden: int, mlp_hidden: int, classes: int, dropout: float) -> nn.Sequential:
    """Linear -> ReLU -> Dropout -> Linear: the shape of TAPE's SimpleMLP, without its weight normalisation."""
    return nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(mlp_hidden, classes))


class SecondaryStructureHead(nn.Module):
    """Per-residue MLP -> classes (3 for secondary structure: H, E, C); each residue is classified from its own
    representation only (not TAPE's head: that is ``TapeConvHead``)."""

    def __init__(self, hidden: int, mlp_hidden: int, classes: int, dropout: float):
        super().__init__()
        self.mlp = _mlp(hidden, mlp_hidden, classes, dropout)

    def forward(self, reps: torch.Tensor, mask: torch.Tensor, pair_block: PairHead | None = None) -> torch.Tensor:
        return self.mlp(reps)  # (B, L, classes)


class TapeConvHead(nn.Module):
    """TAPE's secondary-structure head (``SimpleConv``, songlab-cal/tape ``tape/models/modeling_utils.py``
    l.696-715, used by its ``SequenceToSequenceClassificationHead`` l.816-840; the released PMLM code's
    ``ConvNet`` is the same): along the sequence,

        BatchNorm1d(C) -> wn-Conv1d(C, 512, k=5) -> ReLU -> Dropout -> wn-Conv1d(512, classes, k=3)

    with weight normalisation over the whole kernel (one gain per convolution, ``dim=None``) and
    "same" zero padding. Two departures, so a protein's logits do not depend on the proteins batched
    with it: the batch statistics skip padded positions, and the convolutions see zeros beyond a
    protein's ends (TAPE's see the ``<cls>`` / ``<sep>`` vectors there, then padding).
    """

    def __init__(self, hidden: int, conv_hidden: int, classes: int, dropout: float):
        super().__init__()
        weight_norm = torch.nn.utils.parametrizations.weight_norm
        self.norm = MaskedNorm(hidden, HeadNorm.BATCH)
        self.conv1 = weight_norm(nn.Conv1d(hidden, conv_hidden, kernel_size=5, padding=2), dim=None)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = weight_norm(nn.Conv1d(conv_hidden, classes, kernel_size=3, padding=1), dim=None)

    def forward(self, reps: torch.Tensor, mask: torch.Tensor, pair_block: PairHead | None = None) -> torch.Tensor:
        m = mask.to(reps.dtype).unsqueeze(1)  # (B, 1, L)
        x = self.norm(reps.transpose(1, 2), m)  # (B, C, L), zero at padding
        x = self.dropout(F.relu(self.conv1(x))) * m  # (B, 512, L)
        return self.conv2(x).transpose(1, 2)  # (B, L, classes)


class SequenceHead(nn.Module):
    """Mean over the real residues -> MLP -> one logit per class (remote homology's folds, a user's classes)."""

    def __init__(self, hidden: int, mlp_hidden: int, classes: int, dropout: float):
        super().__init__()
        self.mlp = _mlp(hidden, mlp_hidden, classes, dropout)

    def forward(self, reps: torch.Tensor, mask: torch.Tensor, pair_block: PairHead | None = None) -> torch.Tensor:
        m = mask.to(reps.dtype).unsqueeze(-1)  # (B, L, 1)
        pooled = (reps * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (B, C)
        return self.mlp(pooled)  # (B, classes)


class SequenceRegressionHead(SequenceHead):
    """Mean over the real residues -> MLP -> one value per protein on the training values' scale:
    ``mean + scale * z``, with the training set's mean and standard deviation kept as buffers (saved with the
    weights), so the MLP learns a standardised value whatever the unit of the measurement."""

    def __init__(self, hidden: int, mlp_hidden: int, dropout: float):
        super().__init__(hidden, mlp_hidden, 1, dropout)
        self.register_buffer("target_mean", torch.zeros(()))
        self.register_buffer("target_scale", torch.ones(()))

    def set_scale(self, mean: float, scale: float) -> None:
        self.target_mean.fill_(mean)
        self.target_scale.fill_(scale)

    def forward(self, reps: torch.Tensor, mask: torch.Tensor, pair_block: PairHead | None = None) -> torch.Tensor:
        z = super().forward(reps, mask, pair_block)[:, 0]  # (B,)
        return self.target_mean + self.target_scale * z  # (B,)


def set_contact_prior(head: nn.Module, rate: float) -> None:
    """Start a contact head at the base rate: output bias = log-odds of ``rate`` (0 < rate < 1).

    Contacts are a few percent of the scored pairs; a head starting at probability 0.5 spends
    its first steps learning only that, which a short run cannot afford.
    """
    with torch.no_grad():
        head.out.bias.fill_(math.log(rate / (1.0 - rate)))


def resolve_features(requested: str, reads_pairs: bool, encoder: PMLMModel) -> str:
    """``auto`` -> M+ for heads that read pair features on encoders with a pair head, else M; M+ is checked."""
    if not reads_pairs:
        return FEATURES_M
    has_pair_head = encoder.pair_head is not None
    if requested == "auto":
        return FEATURES_M_PLUS if has_pair_head else FEATURES_M
    if requested == FEATURES_M_PLUS and not has_pair_head:
        raise ConfigError(
            "head.features M+ needs an encoder with a pair head (a PMLM model); "
            "this one was pre-trained without (use head.features: M)"
        )
    return requested


class TaskModel(nn.Module):
    """Pre-trained encoder plus one task head; ``forward(tokens, mask)`` returns the head's logits.

    With ``freeze_encoder`` the encoder (and the pair head's first block, for M+ features)
    stays in eval mode without gradients; otherwise they train with the head, all of it, or only the
    ``adapter`` weights put in it (pmlm.adapters: the encoder's own weights stay frozen). The token head
    and the pair head's output layer never train.
    """

    def __init__(
        self,
        encoder: PMLMModel,
        head: nn.Module,
        task: str,
        features: str,
        freeze_encoder: bool,
        adapter: nn.Module | None = None,
    ):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.task = task
        self.features = features
        self.freeze_encoder = freeze_encoder
        self.adapter = adapter
        trained = set() if freeze_encoder or adapter is not None else {"encoder."}
        if trained and features == FEATURES_M_PLUS:
            trained |= {"pair_head.dense.", "pair_head.norm."}
        for name, p in encoder.named_parameters():
            p.requires_grad_(any(name.startswith(prefix) for prefix in trained))
        if adapter is not None:
            for p in adapter.parameters():
                p.requires_grad_(True)

    def train(self, mode: bool = True) -> TaskModel:
        super().train(mode)
        if self.freeze_encoder:
            self.encoder.eval()  # frozen features: no dropout noise
        return self

    def trainable(self) -> nn.ModuleDict:
        """The parts whose weights change: what checkpoints and the final head file hold."""
        parts = {"head": self.head}
        if self.adapter is not None:
            parts["adapter"] = self.adapter
        elif not self.freeze_encoder:
            parts["encoder"] = self.encoder
        return nn.ModuleDict(parts)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """tokens (B, L + 2) with <cls> first; mask (B, L) real residues. Returns the head's output: per pair
        (B, L, L), per residue (B, L, classes) or per protein (B, classes) logits, or (B,) values."""
        length = mask.shape[1]
        with torch.no_grad() if self.freeze_encoder else nullcontext():
            reps = self.encoder.encode(tokens)[:, 1 : 1 + length]  # (B, L, C) without <cls> / <eos>
        pair_block = self.encoder.pair_head if self.features == FEATURES_M_PLUS else None
        return self.head(reps, mask, pair_block)
