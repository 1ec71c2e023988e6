"""The pair head's output layer and cross-entropy as one chunked op: ``linear_cross_entropy``.

The pair head scores every ordered pair of masked residues, R rows (about 700,000 on a GPU) of width H = 2C against
K = 400 (or 729) classes; this op gives the loss summed over the rows and the argmax's hit count without ever holding
the (R, K) logits. Unfused, autograd keeps the (R, K) fp32 logits and their log-softmax for the backward (about 2.2 GB
at R = 700,000, K = 400) and the accuracy reads them once more; here each chunk of rows computes its logits, its loss,
its argmax and, when gradients are wanted, its gradients at once (d logits = softmax - onehot), then drops them, so
the largest transient is one chunk's logits (``CHUNK_BYTES``) and what survives to the backward is the gradients of
the inputs and weights, which the backward only scales by the incoming gradient.

The class dimension is padded for the matmuls to a multiple of ``class_multiple`` (400 -> 448, 729 -> 768 with the
default 64) with zero weight rows and a -inf bias, so a padded class has probability exactly 0 and is never the argmax.
Under autocast the matmuls run in autocast's dtype and the softmax in fp32; fp64 inputs stay fp64 throughout (the
tests' reference models). Nothing reads a value back to the host: the number of chunks comes from shapes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

# the one home of the ignored class is the alphabet (pmlm.model.objectives imports it from there too, and importing
# objectives here would be circular): re-exported so callers of this op need no second import
from pmlm.alphabet import IGNORE_INDEX

__all__ = ["CHUNK_BYTES", "CLASS_MULTIPLE", "IGNORE_INDEX", "linear_cross_entropy"]

CLASS_MULTIPLE = 64  # default multiple the class dimension is padded to: whole tensor-core tiles on a GPU
CHUNK_BYTES = 64 * 2**20  # one chunk's fp32 logits, about this many bytes: large matmuls, small transients


def linear_cross_entropy(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    labels: Tensor,
    *,
    chunk_rows: int | None = None,
    class_multiple: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(ce_sum, correct)`` of ``F.linear(x, weight, bias)`` against ``labels``: x (R, H), weight (K, H), bias (K,)
    or None, labels (R,) int64 with IGNORE_INDEX on rows that count nothing. ``ce_sum`` is the cross-entropy summed
    over the rows, 0-dim fp32 (fp64 for fp64 ``x``) with autograd; ``correct`` how many rows the argmax gets right,
    0-dim int64 without. ``chunk_rows`` rows go through at a time (None: one chunk's fp32 logits near CHUNK_BYTES);
    ``class_multiple``: None pads to CLASS_MULTIPLE on a GPU, where it buys whole tensor-core tiles, and not at all
    elsewhere, where it would only add work."""
    if class_multiple is None:
        class_multiple = CLASS_MULTIPLE if x.is_cuda else 1
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"x must be (R, H) and weight (K, H), got {tuple(x.shape)} and {tuple(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be (K,) = {tuple(weight.shape[:1])}, got {tuple(bias.shape)}")
    if labels.shape != x.shape[:1]:
        raise ValueError(f"labels must be (R,) = {tuple(x.shape[:1])}, got {tuple(labels.shape)}")
    if class_multiple < 1 or (chunk_rows is not None and chunk_rows < 1):
        raise ValueError(f"chunk_rows and class_multiple must be >= 1, got {chunk_rows} and {class_multiple}")
    padded = -(-weight.shape[0] // class_multiple) * class_multiple  # K'
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_BYTES // (4 * padded))  # 37,449 rows at K' = 448, 21,845 at 768
    # an autograd.Function's forward runs with autograd off: which gradients are wanted is decided here, so that
    # validation under no_grad (and a frozen weight) does no gradient work at all
    wanted = tuple(torch.is_grad_enabled() and t is not None and t.requires_grad for t in (x, weight, bias))
    return _LinearCrossEntropy.apply(x, weight, bias, labels, chunk_rows, padded, wanted)


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The matmuls' dtype: autocast's where it is on (as F.linear would run, fp64 excepted), else x's."""
    device = x.device.type
    if x.dtype != torch.float64 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """x (R, H), weight (K, H), bias (K,) or None, labels (R,) -> (CE sum, correct); the gradients are computed in
    the forward and scaled in the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, labels, chunk_rows, padded, wanted):
        want_x, want_w, want_b = wanted
        R, H = x.shape
        K = weight.shape[0]
        compute = _compute_dtype(x)
        exact = torch.float64 if x.dtype == torch.float64 else torch.float32  # softmax, loss and accumulators
        device = x.device
        # autocast off inside: every cast below is explicit, so the dtypes do not depend on autocast's op lists
        with torch.autocast(device.type, enabled=False):
            w = F.pad(weight.to(compute), (0, 0, 0, padded - K))  # (K', H): zero rows for the padded classes
            b = torch.zeros(K, dtype=compute, device=device) if bias is None else bias.to(compute)
            b = F.pad(b, (0, padded - K), value=float("-inf"))  # (K',): exp(-inf) is exactly 0
            ce = torch.zeros((), dtype=exact, device=device)
            correct = torch.zeros((), dtype=torch.long, device=device)
            # grad_x in the matmul's dtype, as autograd through F.linear would hold it; weight sums over all R rows
            # accumulate in exact
            grad_x = torch.empty((R, H), dtype=compute, device=device) if want_x else None
            grad_w = torch.zeros((padded, H), dtype=exact, device=device) if want_w else None
            grad_b = torch.zeros(padded, dtype=exact, device=device) if want_b else None
            for start in range(0, R, chunk_rows):
                xc = x[start : start + chunk_rows].to(compute)  # (r, H)
                target = labels[start : start + chunk_rows]  # (r,)
                counted = target.ne(IGNORE_INDEX)  # (r,) bool
                safe = target.clamp(min=0)[:, None]  # (r, 1): a real class to gather on ignore rows, masked after
                logits = torch.addmm(b, xc, w.t()).to(exact)  # (r, K')
                correct += (logits.argmax(dim=-1) == target).sum()  # IGNORE_INDEX never equals a class
                log_probs = torch.log_softmax(logits, dim=-1)  # (r, K')
                del logits  # one (r, K') buffer fewer at the gradient step's peak
                ce -= torch.where(counted, log_probs.gather(1, safe).squeeze(1), 0.0).sum()
                if not any(wanted):
                    continue
                # d CE / d logits = softmax - onehot on counted rows, zero on ignore rows
                weight_r = counted.to(exact)[:, None]  # (r, 1)
                dlogits = log_probs.exp_().mul_(weight_r).scatter_add_(1, safe, -weight_r)  # (r, K')
                if want_b:
                    grad_b += dlogits.sum(0)
                d = dlogits.to(compute)
                if want_x:
                    torch.mm(d, w, out=grad_x[start : start + chunk_rows])  # (r, H)
                if want_w:
                    grad_w += d.t() @ xc  # (K', H)
        ctx.save_for_backward(grad_x, None if grad_w is None else grad_w[:K], None if grad_b is None else grad_b[:K])
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(correct)
        return ce, correct

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_ce, _grad_correct):
        grad_x, grad_w, grad_b = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        # grad_ce is 0-dim (the loss is scaled and divided later); the (R, H) one is copied once and scaled in place,
        # so a second backward (retain_graph) still finds the stored gradient unscaled
        dx = grad_x.to(x_dtype, copy=True).mul_(grad_ce) if grad_x is not None else None
        dw = (grad_w * grad_ce).to(w_dtype) if grad_w is not None else None
        db = (grad_b * grad_ce).to(b_dtype) if grad_b is not None else None
        return dx, dw, db, None, None, None, None
