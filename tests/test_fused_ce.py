"""The fused, chunked output layer + cross-entropy (``pmlm.model.fused_ce``) against the unfused reference
(``F.linear``, ``F.cross_entropy``, ``argmax``): loss, hit count and gradients in fp64, fp32 and CPU bf16 autocast, to
bounds derived from the arithmetic; padding, empty inputs, no_grad, the largest tensor it makes and host syncs.

Bounds (first order, worst case: no thread count or blocking can exceed them, so the tests are not flaky). With unit
roundoff u, a logit is a dot product of length H whose terms sum in absolute value to at most A (``logit_size``), so
it is off by at most (H + 1) u A; a row's loss adds a log-sum-exp over K' classes and the total a sum over R rows,
each sum of n terms off by n u times the absolute size of its terms (Higham's gamma_n). With n = 2H + K' + R + 5 and
S = 2A + log K' + 2 (the size of a row's loss and of its gradient's terms), a result built from terms of total size M
is off by at most n u S M per evaluation; two evaluations are compared."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import LargestTensor
from torch.utils._python_dispatch import TorchDispatchMode

from pmlm.model import fused_ce, objectives
from pmlm.model.fused_ce import IGNORE_INDEX, linear_cross_entropy
from pmlm.model.syncs import SyncCounter

H = 64  # the row width: small, the arithmetic does not depend on it
R = 50  # rows: not a multiple of 7


def padded(K: int, multiple: int = fused_ce.CLASS_MULTIPLE) -> int:
    return -(-K // multiple) * multiple


def problem(K: int, dtype: torch.dtype, seed: int = 0, rows: int = R, width: int = H, bias: bool = True):
    """x (rows, width), weight (K, width), bias (K,) or None with logits of order 1; labels (rows,): every 5th row
    ignored, of the others about half the reference's argmax (so ``correct`` counts something), half random."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g, dtype=torch.float64)
    weight = torch.randn(K, width, generator=g, dtype=torch.float64) / math.sqrt(width)
    b = 0.5 * torch.randn(K, generator=g, dtype=torch.float64) if bias else None
    labels = F.linear(x, weight, b).argmax(-1)
    random = torch.rand(rows, generator=g) < 0.5
    labels = torch.where(random, torch.randint(K, (rows,), generator=g), labels)
    labels[::5] = IGNORE_INDEX
    return x.to(dtype), weight.to(dtype), None if b is None else b.to(dtype), labels


def reference(x, weight, bias, labels):
    """The unfused computation the fused op replaces: (CE sum, correct, logits)."""
    logits = F.linear(x, weight, bias)
    exact = logits if logits.dtype == torch.float64 else logits.float()
    ce = F.cross_entropy(exact, labels, reduction="sum", ignore_index=IGNORE_INDEX)
    return ce, (logits.argmax(-1) == labels).sum(), logits


def run(fn, x, weight, bias, labels, scale: float = 0.37, **kwargs):
    """(CE sum, correct, gradients of x, weight and bias) of ``fn``, with ``scale`` as the loss's incoming gradient."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    ce, correct = fn(*leaves, labels, **kwargs)[:2]
    (ce * scale).backward()
    return ce.detach(), correct, [None if t is None else t.grad for t in leaves]


def logit_size(x, weight, bias) -> float:
    """A: the largest absolute sum of the terms behind one logit."""
    terms = x.double().abs() @ weight.double().abs().T
    return float((terms if bias is None else terms + bias.double().abs()).max())


def sizes(x, weight) -> dict[str, float]:
    """M per result: a row's loss sums over R rows, x's gradient over K' classes (|softmax - onehot| sums to <= 2,
    folded into S), the weight's over R rows of x, the bias's over R rows."""
    return {"ce": R, "x": float(weight.abs().max()), "weight": float(x.abs().sum(0).max()), "bias": R}


def bound(dtype: torch.dtype, K: int, A: float, M: float, rows: int = R) -> float:
    """Two evaluations of a result of total term size M in ``dtype`` differ by at most 2 n u S M (module docstring)."""
    n = 2 * H + padded(K) + rows + 5
    S = 2 * A + math.log(padded(K)) + 2
    return 2 * n * (torch.finfo(dtype).eps / 2) * S * M


def assert_matches_reference(dtype, K, bias=True, **kwargs):
    x, weight, b, labels = problem(K, dtype, bias=bias)
    ce, correct, grads = run(linear_cross_entropy, x, weight, b, labels, **kwargs)
    ref_ce, ref_correct, grads_ref = run(reference, x, weight, b, labels)
    A = logit_size(x, weight, b)
    M = sizes(x, weight)
    assert ce.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) and correct.dtype == torch.long
    torch.testing.assert_close(ce, ref_ce, rtol=0, atol=bound(dtype, K, A, M["ce"]))
    for name, got, want in zip(("x", "weight", "bias"), grads, grads_ref):
        if want is None:
            assert got is None
            continue
        assert got.dtype == dtype, name
        torch.testing.assert_close(got, want, rtol=0, atol=bound(dtype, K, A, M[name]), msg=name)
    # the argmax agrees wherever rounding cannot swap the top two classes: each logit is off by (H + 1) u A at most
    top2 = reference(x, weight, b, labels)[2].double().topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 4 * (H + 1) * torch.finfo(dtype).eps / 2 * A  # the seed's data
    assert int(correct) == int(ref_correct) > 0


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000, None])
@pytest.mark.parametrize("K", [400, 729])
def test_fp64_loss_hits_and_gradients_equal_the_unfused_reference(K, chunk_rows):
    assert_matches_reference(torch.float64, K, chunk_rows=chunk_rows)


@pytest.mark.parametrize("chunk_rows", [7, None])
@pytest.mark.parametrize("K", [400, 729])
def test_fp32_loss_hits_and_gradients_equal_the_unfused_reference(K, chunk_rows):
    # u = 2^-24: dot products of length H and softmax sums over K' classes dominate n
    assert_matches_reference(torch.float32, K, chunk_rows=chunk_rows)


def test_without_a_bias():
    assert_matches_reference(torch.float64, 400, bias=False, chunk_rows=7)


@pytest.mark.parametrize("class_multiple", [1, 100, 128])
def test_the_padding_of_the_classes_changes_nothing(class_multiple):
    assert_matches_reference(torch.float64, 729, chunk_rows=7, class_multiple=class_multiple)


@pytest.mark.parametrize("chunk_rows", [1, None])
def test_no_rows_give_zero_loss_and_zero_gradients(chunk_rows):
    x, weight, b, _ = problem(400, torch.float32, rows=0)
    ce, correct, grads = run(
        linear_cross_entropy, x, weight, b, torch.zeros(0, dtype=torch.long), chunk_rows=chunk_rows
    )
    assert ce.dtype == torch.float32 and float(ce) == 0.0 and int(correct) == 0
    assert grads[0].shape == (0, H)
    assert not grads[1].any() and not grads[2].any()


class Ops(TorchDispatchMode):
    """Records every op's name and, for matrix products, the output shape while active."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.append(func.overloadpacket.__name__)
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.shapes.append((func.overloadpacket.__name__, tuple(out.shape)))
        return out


PADDED = {"chunk_rows": 7, "class_multiple": fused_ce.CLASS_MULTIPLE}  # the class padding a GPU gets by default


def test_the_classes_are_padded_by_default_on_a_gpu_only():
    x, weight, b, labels = problem(400, torch.float32)
    with Ops() as log:
        linear_cross_entropy(x.requires_grad_(), weight.requires_grad_(), b, labels, chunk_rows=7)
    # on a CPU the padding would only add work: the weight gradient keeps its 400 rows
    assert (400, H) in {s for op, s in log.shapes if op == "mm"} and (padded(400), H) not in set(log.shapes)


@pytest.mark.parametrize("mode", ["no_grad", "frozen weight"])
def test_only_the_wanted_gradients_are_computed(mode):
    x, weight, b, labels = problem(400, torch.float32)
    with Ops() as full:
        ce, correct = linear_cross_entropy(x.requires_grad_(), weight.requires_grad_(), b, labels, **PADDED)
    chunks = -(-R // 7)
    assert {s for op, s in full.shapes if op == "mm"} >= {(7, H), (padded(400), H)}  # the log sees gradient work
    if mode == "no_grad":
        with torch.no_grad(), Ops() as log:
            ce_ng, correct_ng = linear_cross_entropy(x, weight, b, labels, **PADDED)
        assert ce_ng.grad_fn is None and not ce_ng.requires_grad
        assert [op for op, _ in log.shapes] == ["addmm"] * chunks  # the logits' matmul, nothing else
        assert "scatter_add_" in full.names and "scatter_add_" not in log.names  # nor softmax - onehot
    else:
        with Ops() as log:
            ce_ng, correct_ng = linear_cross_entropy(x, weight.detach(), b, labels, **PADDED)
        assert (padded(400), H) not in {s for _, s in log.shapes}  # no weight gradient
        assert {s for op, s in log.shapes if op == "mm"} == {(7, H), (R % 7, H)}  # x's gradient, chunk by chunk
    assert torch.equal(ce_ng.detach(), ce.detach()) and torch.equal(correct_ng, correct)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_padded_classes_never_win_the_argmax(dtype):
    # one real class far below zero and 63 padded ones at -inf: the real one must win every row, with loss exactly 0
    x, weight, _, _ = problem(1, torch.float32)
    bias = torch.full((1,), -1e4)
    labels = torch.zeros(R, dtype=torch.long)
    autocast = dtype == torch.bfloat16
    data = [t.to(torch.float32 if autocast else dtype) for t in (x, weight, bias)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ce, correct = linear_cross_entropy(*data, labels, chunk_rows=7)
    assert float(ce) == 0.0 and int(correct) == R


def test_padded_classes_never_win_against_very_negative_real_logits():
    x, weight, _, labels = problem(400, torch.float64)
    bias = torch.full((400,), -1e4, dtype=torch.float64)
    labels = torch.where(labels.eq(IGNORE_INDEX), labels, F.linear(x, weight, bias).argmax(-1))
    ce, correct = linear_cross_entropy(x, weight, bias, labels, chunk_rows=7)
    ref_ce, ref_correct, _ = reference(x, weight, bias, labels)
    assert int(correct) == int(ref_correct) == int(labels.ne(IGNORE_INDEX).sum())
    torch.testing.assert_close(ce, ref_ce, rtol=0, atol=bound(torch.float64, 400, logit_size(x, weight, bias), R))


def test_no_tensor_of_all_rows_by_all_classes_is_made():
    # H <= chunk_rows, so the (K', H) weight gradient and the (R, H) input gradient are no larger than one chunk's
    # logits, and the largest tensor tells whether the (R, K) logits were ever held
    rows, width, chunk_rows, K = 100, 8, 16, 400
    x, weight, b, labels = problem(K, torch.float32, rows=rows, width=width)
    with LargestTensor() as fused:
        run(linear_cross_entropy, x, weight, b, labels, chunk_rows=chunk_rows)
    with LargestTensor() as unfused:
        run(reference, x, weight, b, labels)
    assert unfused.max_numel >= rows * K  # the tracker sees the (R, K) logits where they are made
    assert fused.max_numel <= chunk_rows * padded(K) < rows * K


@pytest.mark.parametrize("autocast", [False, True])
def test_forward_and_backward_never_synchronise(autocast):
    x, weight, b, labels = problem(729, torch.float32)
    with SyncCounter() as counter, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        run(linear_cross_entropy, x, weight, b, labels, chunk_rows=7)
    assert counter.events == [], counter.summary()
    with SyncCounter() as counter:
        labels[labels.ne(IGNORE_INDEX)]  # boolean-mask indexing: the counter sees a sync
    assert counter.events


class Dtypes(TorchDispatchMode):
    """Records the input dtypes of matrix products and the dtypes log_softmax runs in."""

    def __init__(self):
        super().__init__()
        self.matmul: set[torch.dtype] = set()
        self.softmax: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.matmul |= {a.dtype for a in args if isinstance(a, torch.Tensor)}
        if func.overloadpacket is torch.ops.aten._log_softmax:
            self.softmax.add(args[0].dtype)
        return func(*args, **(kwargs or {}))


def test_cpu_bf16_autocast_matches_fp32_within_bf16_rounding():
    K = 400
    x, weight, b, labels = problem(K, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16), Dtypes() as dtypes:
        ce, correct, grads = run(linear_cross_entropy, x, weight, b, labels, chunk_rows=7)
    assert dtypes.matmul == {torch.bfloat16} and dtypes.softmax == {torch.float32}
    assert ce.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
    ref_ce, _, grads_ref = run(reference, x, weight, b, labels)
    # bf16 keeps 8 significant bits (u = 2^-8): x, W and b rounded (2u + u^2 per product), the logit rounded once
    # more (u), both sides' fp32 sums ((H + 1) u32 each), so a logit is off from the reference's by dz; a row's loss
    # then by 2 dz, softmax by a factor e^(2 dz) (so softmax - onehot by expm1(2 dz) in l1), and rounding d, the
    # other factor and the product adds 3 u relative to the terms (l1 of softmax - onehot <= 2, folded into M)
    u, u32 = 2.0**-8, 2.0**-24
    A = logit_size(x, weight, b)
    dz = (3 * u + u * u + 2 * (H + 1) * u32) * A
    M = sizes(x, weight)
    torch.testing.assert_close(ce, ref_ce, rtol=0, atol=2 * dz * M["ce"] + bound(torch.float32, K, A, M["ce"]))
    for name, got, want in zip(("x", "weight", "bias"), grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=0, atol=(math.expm1(2 * dz) + 6 * u) * M[name], msg=name)
    # a row is surely hit (missed) when its label's reference logit leads (trails) the rest by more than 2 dz
    logits = reference(x, weight, b, labels)[2]
    counted = labels.ne(IGNORE_INDEX)
    own = logits.gather(1, labels.clamp(min=0)[:, None]).squeeze(1)
    rest = logits.scatter(1, labels.clamp(min=0)[:, None], float("-inf")).max(-1).values
    sure_hits = int((counted & (own - rest > 2 * dz)).sum())
    possible_hits = int((counted & (own - rest > -2 * dz)).sum())
    assert 0 < sure_hits <= int(correct) <= possible_hits


def test_the_ignored_class_is_the_objectives():
    assert fused_ce.IGNORE_INDEX == objectives.IGNORE_INDEX == -100


def test_bad_arguments_are_refused():
    x, weight, b, labels = problem(400, torch.float32)
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(x, weight, b, labels, chunk_rows=0)
    with pytest.raises(ValueError, match="labels"):
        linear_cross_entropy(x, weight, b, labels[:-1])
