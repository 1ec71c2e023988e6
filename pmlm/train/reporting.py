"""What pre-training reports: running sums per micro-batch, summed over ranks, turned into means and
accuracies for ``metrics.csv`` and the final scores, and the validation pass that produces them."""

from __future__ import annotations

import time
from itertools import islice

import torch
import torch.distributed as dist
from torch import nn

from pmlm.config.pretraining import TrainConfig
from pmlm.model.objective import ObjectiveOutputs
from pmlm.model.objectives import mask_batch, sample_sizes
from pmlm.train.loader import ShardStream
from pmlm.train.runtime import derived_seed
from pmlm.train.step_layout import StepLayout, part_outputs, step_parts, to_device

CSV_FIELDS = (
    "split",
    "step",
    "epoch",
    "lr",
    "loss",
    "l_mlm",
    "l_pmlm",
    "acc_mlm",
    "acc_pmlm",
    "dacc",
    "grad_norm",
    "residues",
    "residues_per_s",
    "elapsed_s",
    "l_tmlm",
    "acc_tmlm",
)
# running sums behind the logged metrics; summed over micro-batches and then over ranks. ``loss`` adds each rank's
# backward loss (its share of the step's loss x ranks) and ``steps`` counts steps on every rank, so their ratio is
# the mean step loss once summed over the ranks, and a fair estimate of it on one rank before
SUMS = (
    "loss",
    "l_mlm_x_n",
    "mlm_correct",
    "mlm_total",
    "l_pmlm_x_n",
    "pair_correct",
    "pair_total",
    "residues",
    "steps",
    "l_tmlm_x_n",
    "triple_correct",
    "triple_total",
)
# counters, not metrics: in the CSV's scores but not plotted
COUNTS = ("mlm_total", "pair_total", "triple_total")
VALID_STREAM = 2  # random stream (see runtime.derived_seed) of the validation masks


def step_sums(out: ObjectiveOutputs, loss: torch.Tensor, device) -> torch.Tensor:
    """One micro-batch's contribution to SUMS (``loss``: the one it backwards), without a host sync; the step's
    residues and the step itself are counted by ``count_step``."""
    nothing = torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack(
        [
            loss.detach().double(),
            out.l_mlm.double() * out.mlm_total,
            out.mlm_correct.double(),
            out.mlm_total.double(),
            out.l_pmlm.double() * out.pair_total,
            out.pair_correct.double(),
            out.pair_total.double(),
            nothing,
            nothing,
            out.l_tmlm.double() * out.triple_total,
            out.triple_correct.double(),
            out.triple_total.double(),
        ]
    )


def summarise(values: list[float]) -> dict:
    """Means and accuracies from SUMS; None where nothing was counted (e.g. pair metrics under MLM)."""
    s = dict(zip(SUMS, values))
    acc_mlm = s["mlm_correct"] / s["mlm_total"] if s["mlm_total"] else None
    acc_pmlm = s["pair_correct"] / s["pair_total"] if s["pair_total"] else None
    return {
        "loss": s["loss"] / s["steps"] if s["steps"] else None,
        "l_mlm": s["l_mlm_x_n"] / s["mlm_total"] if s["mlm_total"] else None,
        "l_pmlm": s["l_pmlm_x_n"] / s["pair_total"] if s["pair_total"] else None,
        "acc_mlm": acc_mlm,
        "acc_pmlm": acc_pmlm,
        # paper: dAcc = Acc_pmlm - Acc_mlm^2, how far the pair head is from independent positions
        "dacc": acc_pmlm - acc_mlm**2 if acc_mlm is not None and acc_pmlm is not None else None,
        "residues": int(s["residues"]),
        "mlm_total": int(s["mlm_total"]),
        "pair_total": int(s["pair_total"]),
        # the Triple MLM's triple head (None for the other objectives)
        "l_tmlm": s["l_tmlm_x_n"] / s["triple_total"] if s["triple_total"] else None,
        "acc_tmlm": s["triple_correct"] / s["triple_total"] if s["triple_total"] else None,
        "triple_total": int(s["triple_total"]),
    }


def log_row(split: str, step: int, epoch: int, lr: float, metrics: dict) -> tuple[dict, dict]:
    """(metrics.csv row, TensorBoard scalars) of one summary."""
    row = {"split": split, "step": step, "epoch": epoch, "lr": lr, **metrics}
    scalars = {f"{split}/{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and k not in COUNTS}
    if split == "train":
        scalars["train/lr"] = lr
    return row, scalars


def validation_metrics(
    module: nn.Module,
    stream: ShardStream,
    cfg: TrainConfig,
    device,
    autocast,
    rank: int,
    layout: StepLayout,
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Validation metrics over the first ``eval_batches`` batches of the fixed-seed valid stream.

    Each batch is a step's worth of tokens, masked whole on the host by a generator re-seeded every time and split
    over the ranks and micro-batches like a training step (``train.step_layout``), so each validation sees identical
    inputs and gives the same figures on any number of ranks; every rank runs the same number of micro-batches (FSDP's
    forward is collective). ``module``: the objective (its ``model``); ``dtype``: the forward passes' (autocast's)."""
    generator = torch.Generator().manual_seed(derived_seed(cfg.seed, 0, VALID_STREAM))
    sums = torch.zeros(len(SUMS), dtype=torch.float64, device=device)
    module.eval()
    with torch.no_grad():
        for batch in islice(stream.epoch_batches(0), cfg.eval_batches):
            masked = mask_batch(batch.tokens, cfg.objective, generator)
            sizes = to_device(sample_sizes(masked, cfg.objective), device)
            parts = layout.rank_parts(batch.tokens.shape[0], rank)
            prepared = step_parts(masked, parts, cfg, module.model, device, dtype, False, layout.micro_tokens)
            for inputs, live in prepared:
                out, loss = part_outputs(module, inputs, live, sizes, layout.world, autocast)
                sums += step_sums(out, loss, device)
            sums[SUMS.index("steps")] += 1
            sums[SUMS.index("residues")] += batch.residues if rank == 0 else 0
    if layout.world > 1:
        dist.all_reduce(sums)
    return summarise(sums.tolist())


class TrainWindow:
    """The running SUMS since the last train row of ``metrics.csv``."""

    def __init__(self, device):
        self.sums = torch.zeros(len(SUMS), dtype=torch.float64, device=device)
        self.started = time.perf_counter()

    def count_step(self, residues: int) -> None:
        """A new step, with ``residues`` residues (given on one rank only: the sums add up over ranks)."""
        self.sums[SUMS.index("steps")] += 1
        self.sums[SUMS.index("residues")] += residues

    def mean_loss(self) -> float:
        return float(self.sums[0] / self.sums[SUMS.index("steps")])

    def flush(self, log, step: int, epoch: int, lr: float, world: int, grad_norm: float) -> None:
        """Sum over ranks, write the row (rank 0 holds ``log``; ``grad_norm``: the window's mean), start a new
        window."""
        if world > 1:
            dist.all_reduce(self.sums)
        if log is not None:
            elapsed = time.perf_counter() - self.started
            metrics = summarise(self.sums.tolist())
            metrics["grad_norm"] = grad_norm
            metrics["residues_per_s"] = metrics["residues"] / max(elapsed, 1e-9)
            log.write(*log_row("train", step, epoch, lr, metrics))
        self.sums.zero_()
        self.started = time.perf_counter()
