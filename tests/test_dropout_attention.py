"""Dropout on the attention probabilities: the CPU blockwise kernel against an explicit reference with the same
draws (forward and backward, fp64), its draws' statistics beside SDPA's own dropout, bit-identical results for any
thread count, the encoder's use of it, evaluation unchanged; the packed layout's op with dropout (its reference on
CPU here, against the explicit formula with the same draws; FlashAttention's kernel on CUDA, in the gpu-marked
tests)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import reorder_tolerance
from tiny_models import mixed_batch

from pmlm.model import ObjectiveConfig, PMLMModel, model_config, pretraining_losses
from pmlm.model import dropout_attention as kernel
from pmlm.model.attention import Packing, flash_usable, packed_attention, reference_varlen_attention
from pmlm.model.encoder import SelfAttention
from pmlm.model.layout import Layout, key_padding_mask, packed_inputs, unpack
from pmlm.pretrained import build_model

DIMS = {"num_layers": 2, "hidden": 64, "ffn": 256, "heads": 4, "max_len": 72}


def key_mask(lengths: list[int], width: int) -> torch.Tensor:
    """(B, 1, 1, width) key mask of a right-padded batch, as the encoder builds it (an empty row keeps position 0)."""
    return key_padding_mask(mixed_batch([max(n - 2, 0) if n else 0 for n in lengths], width, seed=0))


def explicit_attention(q, k, v, keep_keys, keep, dropout_p):
    """softmax(q k^T / sqrt(D), masked) * keep / (1 - p) @ v, written out: the reference for given draws."""
    width = keep.shape[-1]
    scores = q @ k[:, :, :width].transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep_keys[:, :, :, :width], float("-inf"))
    return (scores.softmax(-1) * keep / (1 - kernel.rounded_probability(dropout_p))) @ v[:, :, :width]


def documented_keep(seed: int, matrices: int, rows: int, width: int, dropout_p: float) -> torch.Tensor:
    """(matrices, rows, width) bool: the scores a call with this seed keeps, by the rule of the kernel's docstring
    (matrices = B * H, rows = L, width = the keys left after ``key_layout``): group g's blocks draw, in row order,
    from NumPy's SFC64 stream (seed, g), four signed 16-bit draws per 64-bit word; a draw below
    round(p 2^16) - 2^15 drops its score."""
    group_size, block_rows = kernel.block_shape(matrices, rows, width)
    threshold = round(dropout_p * 2**16) - 2**15
    keep = torch.empty(matrices, rows, width, dtype=torch.bool)
    for group, start in enumerate(range(0, matrices, group_size)):
        stream = np.random.SFC64([seed, group])
        for r in range(0, rows, block_rows):
            block = keep[start : start + group_size, r : r + block_rows]
            n = block.numel()
            draws = stream.random_raw(-(-n // 4)).view(np.int16)[:n]
            block.copy_(torch.from_numpy(draws >= threshold).view(block.shape))
    return keep


def qkv(B, H, L, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("block_elements", [1 << 17, 300, 40])  # one block per group; several row blocks; one row
def test_the_kernel_is_the_explicit_formula_with_the_same_draws(monkeypatch, block_elements):
    monkeypatch.setattr(kernel, "BLOCK_ELEMENTS", block_elements)
    B, H, L, D, p = 4, 3, 40, 8, 0.3
    # rows of 34, 12 and 25 tokens, and an all-<pad> filler row; no row reaches the last 6 columns (cut off)
    keep_keys = key_mask([34, 12, 0, 25], width=L)
    keep_keys[1, 0, 0, 5:8] = False  # <pad> keys inside a row: the score bias, not the cut
    q, k, v = qkv(B, H, L, D, torch.float64, seed=1)
    out = kernel.dropout_attention(q, k, v, keep_keys, p, seed=123)
    grad = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(out, (q, k, v), grad)

    width, bias = kernel.key_layout(keep_keys, L, q.dtype)
    assert width == 34 and bias is not None
    keep = documented_keep(123, B * H, L, width, p).view(B, H, L, width)
    ref = explicit_attention(q, k, v, keep_keys, keep, p)
    expected = torch.autograd.grad(ref, (q, k, v), grad)
    # the same sums in another order (blocks, bmm vs matmul): fp64 rounding over `width` or L terms
    torch.testing.assert_close(out, ref, rtol=0, atol=reorder_tolerance(ref, width, torch.float64))
    for name, a, b in zip("qkv", got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=reorder_tolerance(b, L, torch.float64), msg=name)
    dropped = 1 - keep.float().mean().item()  # 4 x 3 x 40 x 34 = 16,320 draws of Bernoulli(0.3)
    assert abs(dropped - p) <= 5 * math.sqrt(p * (1 - p) / keep.numel())


def test_results_are_bit_identical_for_any_thread_count():
    q, k, v = qkv(3, 4, 130, 16, torch.float32, seed=3)
    keep_keys = key_mask([130, 77, 10], width=130)
    grad = torch.randn(3, 4, 130, 16, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            out = kernel.dropout_attention(q, k, v, keep_keys, 0.1, seed=5)
            results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
            assert torch.get_num_threads() == threads  # the kernel restores torch's setting
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_a_retained_graph_runs_backward_twice():
    q, k, v = qkv(2, 2, 20, 4, torch.float64, seed=6)
    out = kernel.dropout_attention(q, k, v, None, 0.2, seed=7)
    out.sum().backward(retain_graph=True)
    first = q.grad.clone()
    out.sum().backward()
    torch.testing.assert_close(q.grad, 2 * first, rtol=0, atol=0)


def dropped_mass_z(attend, lengths: list[int], width: int, dropout_p: float, calls: int) -> torch.Tensor:
    """z-scores of the probability mass attention dropout removed, one per call, head and real query row.

    With q = 0 every real query attends uniformly to the n real keys of its row, and with v = e_0 the output's
    first channel is (kept keys / n) / (1 - p); so the dropped mass f = 1 - (1 - p) * out[..., 0] has mean p
    and variance p (1 - p) / n under independent Bernoulli(p) drops, and z = (f - p) / sqrt(p (1 - p) / n).
    """
    B, H, D = len(lengths), 4, 8
    q = torch.zeros(B, H, width, D)
    k = torch.randn(B, H, width, D, generator=torch.Generator().manual_seed(8))
    v = torch.zeros(B, H, width, D)
    v[..., 0] = 1.0
    n = torch.tensor(lengths, dtype=torch.float32)[:, None, None]  # (B, 1, 1)
    real = torch.arange(width)[None, None, :] < n  # (B, 1, width) real query rows
    zs = []
    for _ in range(calls):
        out = attend(q, k, v, dropout_p)  # (B, H, width, D)
        dropped = 1 - (1 - dropout_p) * out[..., 0]
        z = (dropped - dropout_p) / torch.sqrt(dropout_p * (1 - dropout_p) / n)
        zs.append(z[real.expand(B, H, width)])
    return torch.cat(zs)


def assert_standard(z: torch.Tensor, lengths: list[int], dropout_p: float) -> None:
    """Mean 0 and variance 1 within 5 standard errors (the variance's error includes the binomial's excess kurtosis)."""
    R = z.numel()
    kurtosis = (1 - 6 * dropout_p * (1 - dropout_p)) / (min(lengths) * dropout_p * (1 - dropout_p))
    assert abs(z.mean().item()) <= 5 / math.sqrt(R), f"mean {z.mean().item()}"
    assert abs(z.var().item() - 1) <= 5 * math.sqrt((2 + abs(kurtosis)) / R), f"var {z.var().item()}"


LENGTHS = [64, 40, 100, 17]


def padded(dropout_attend):
    """attend(q, k, v, p) over the right-padded batch of LENGTHS in the padded layout."""

    def attend(q, k, v, p):
        return dropout_attend(q, k, v, key_mask(LENGTHS, q.shape[2]), p)

    return attend


def packed(packed_attend):
    """attend(q, k, v, p) through the packed layout: pack (filler rows included), attend on (T, H, D), scatter back."""

    def attend(q, k, v, p):
        B, H, L, D = q.shape
        inputs = packed_inputs(mixed_batch([max(n - 2, 0) if n else 0 for n in LENGTHS], L, seed=0))
        index = inputs.index.to(q.device)
        filler = inputs.tokens.shape[0] - index.numel()
        rows = [t.transpose(1, 2).reshape(B * L, H, D).index_select(0, index) for t in (q, k, v)]
        rows = [F.pad(t, (0, 0, 0, 0, 0, filler)) for t in rows]  # the filler rows: a sequence of their own
        out = packed_attend(*rows, Packing(inputs.cu_seqlens.to(q.device), inputs.max_len), p)
        return unpack(out.reshape(-1, H * D), inputs.to(q.device)).view(B, L, H, D).transpose(1, 2)

    return attend


def sdpa(q, k, v, mask, p):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def varlen_reference(q, k, v, packing, p):
    return reference_varlen_attention(q, k, v, packing.cu_seqlens, p)


@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
@pytest.mark.parametrize(
    "name, attend",
    [
        ("kernel, padded", padded(kernel.dropout_attention)),
        ("SDPA's math path, padded (the reference)", padded(sdpa)),
        ("per-sequence reference, packed", packed(varlen_reference)),
        ("the packed op, packed", packed(packed_attention)),
    ],
)
def test_every_layout_drops_probability_mass_like_bernoulli_dropout(name, attend, dropout_p):
    torch.manual_seed(9)
    z = dropped_mass_z(attend, LENGTHS, width=128, dropout_p=dropout_p, calls=6)  # 6 x 4 x 221 = 5,304 rows
    assert_standard(z, LENGTHS, dropout_p)


def test_the_dropped_mass_statistic_detects_a_wrong_rate_or_scale():
    torch.manual_seed(10)
    # dropout is unbiased at any rate, so a wrong rate shows in the variance: SDPA at p = 0.12 read as p = 0.1
    # gives z a variance of 0.81 * 0.12 / 0.88 / 0.09 = 1.23, 10 standard errors away from 1
    z = dropped_mass_z(lambda q, k, v, p: padded(sdpa)(q, k, v, 0.12), LENGTHS, 128, 0.1, calls=6)
    with pytest.raises(AssertionError, match="var"):
        assert_standard(z, LENGTHS, 0.1)
    # without the 1 / (1 - p) rescaling the mean moves by p * sqrt(n (1 - p) / p), 3.9 to 9.5 per row
    z = dropped_mass_z(lambda q, k, v, p: padded(sdpa)(q, k, v, p) * (1 - p), LENGTHS, 128, 0.1, calls=1)
    with pytest.raises(AssertionError, match="mean"):
        assert_standard(z, LENGTHS, 0.1)


def test_evaluation_and_zero_dropout_are_scaled_dot_product_attention_unchanged():
    torch.manual_seed(11)
    tokens = mixed_batch([60, 12, 33], width=64, seed=4)
    model = PMLMModel(model_config("tiny", **DIMS)).eval()  # the released layers: attention dropout 0.1
    twin = PMLMModel(model_config("tiny", **DIMS, attention_dropout=0.0)).eval()
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model.encode(tokens), twin.encode(tokens))
    q, k, v = qkv(2, 2, 9, 4, torch.float32, seed=12)
    mask = key_mask([9, 5], width=9)
    assert torch.equal(kernel.attention(q, k, v, mask, 0.0), sdpa(q, k, v, mask, 0.0))
    # dtypes NumPy has no view for keep SDPA's own dropout (same generator draws, same values)
    qb, kb, vb = (t.detach().bfloat16() for t in (q, k, v))
    torch.manual_seed(13)
    ours = kernel.attention(qb, kb, vb, mask, 0.1)
    torch.manual_seed(13)
    assert torch.equal(ours, sdpa(qb, kb, vb, mask, 0.1))


def test_the_padded_encoder_trains_through_the_kernel_with_seeds_from_torchs_generator():
    cfg = model_config("tiny", **DIMS, attention_dropout=0.3)
    torch.manual_seed(14)
    attn = SelfAttention(cfg).train()
    x = torch.randn(3, 50, cfg.hidden)
    mask = key_mask([50, 21, 8], width=50)
    torch.manual_seed(15)
    out = attn(x, mask)
    torch.manual_seed(15)
    seed = int(torch.randint(kernel.SEED_BOUND, ()))  # the one draw the layer makes
    q, k, v = attn.qkv(x).view(3, 50, 3, cfg.heads, cfg.head_dim).permute(2, 0, 3, 1, 4)
    keep = documented_keep(seed, 3 * cfg.heads, 50, 50, 0.3).view(3, cfg.heads, 50, 50)
    ref = attn.proj(explicit_attention(q, k, v, mask, keep, 0.3).transpose(1, 2).reshape(3, 50, cfg.hidden))
    torch.testing.assert_close(out, ref, rtol=0, atol=reorder_tolerance(ref, cfg.hidden))


def test_training_with_attention_dropout_in_both_cpu_layouts_learns():
    torch.manual_seed(16)
    tokens = mixed_batch([60, 12, 33, 0], width=64, seed=5)
    objective = ObjectiveConfig(name="pmlm")
    for layout in ("padded", "packed"):
        model = build_model(model_config("tiny", **DIMS), objective).train()
        model.encoder.attention = layout  # packed on a CPU: the op's reference, dropout drawn from one seed
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for step in range(12):
            out = pretraining_losses(model, tokens, objective, torch.Generator().manual_seed(step % 2))
            optimizer.zero_grad()
            out.loss.backward()
            assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
            optimizer.step()
            losses.append(out.loss.item())
        assert losses[-1] < losses[0] and losses[-2] < losses[1], (layout, losses)


def test_the_packed_op_without_dropout_is_the_per_sequence_reference():
    tokens = mixed_batch([10, 0, 30, 5], width=40, seed=3)  # an empty row: a sequence without rows
    inputs = packed_inputs(tokens)
    assert inputs.cu_seqlens.tolist()[:5] == [0, 12, 12, 44, 51] and inputs.max_len == 64
    g = torch.Generator().manual_seed(17)
    rows = torch.randn(inputs.tokens.shape[0], 3, 4, 16, dtype=torch.float64, generator=g, requires_grad=True)
    q, k, v = rows.unbind(1)  # strided views of one projection, as in the encoder
    out = packed_attention(q, k, v, inputs.packing, 0.0)
    ref = reference_varlen_attention(q, k, v, inputs.cu_seqlens)
    grad = torch.randn(out.shape, dtype=out.dtype, generator=g)
    (got,), (expected,) = torch.autograd.grad(out, rows, grad), torch.autograd.grad(ref, rows, grad)
    torch.testing.assert_close(out, ref, rtol=0, atol=reorder_tolerance(ref, 64, torch.float64))
    torch.testing.assert_close(got, expected, rtol=0, atol=reorder_tolerance(expected, 64, torch.float64))


def test_the_packed_ops_dropout_is_the_explicit_formula_with_its_documented_draws():
    # the reference draws one seed from torch's generator and, sequence by sequence, keep = rand(H, n, n) >= p from
    # a generator seeded with it; the backward draws the same masks again
    tokens = mixed_batch([10, 0, 30, 5], width=40, seed=3)
    inputs = packed_inputs(tokens)
    g = torch.Generator().manual_seed(18)
    rows = torch.randn(inputs.tokens.shape[0], 3, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    q, k, v = rows.unbind(1)
    p = 0.3
    torch.manual_seed(19)
    out = packed_attention(q, k, v, inputs.packing, p)
    torch.manual_seed(19)
    draws = torch.Generator().manual_seed(int(torch.randint(2**62, ())))
    parts = []
    bounds = inputs.cu_seqlens.tolist()
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (H, n, D)
        keep = torch.rand(qs.shape[0], end - start, end - start, generator=draws) >= p
        probs = (qs @ ks.transpose(1, 2) / math.sqrt(8)).softmax(-1) * keep / (1 - p)
        parts.append((probs @ vs).transpose(0, 1))
    ref = torch.cat(parts)
    grad = torch.randn(out.shape, dtype=out.dtype, generator=g)
    (got,), (expected,) = torch.autograd.grad(out, rows, grad), torch.autograd.grad(ref, rows, grad)
    torch.testing.assert_close(out, ref, rtol=0, atol=reorder_tolerance(ref, 64, torch.float64))
    torch.testing.assert_close(got, expected, rtol=0, atol=reorder_tolerance(expected, 64, torch.float64))


def test_packed_attention_has_a_fused_kernel_only_where_flash_runs():
    cuda = torch.device("cuda", 0)
    # these verdicts are reached before any CUDA call, so they hold on a machine without a GPU
    assert not flash_usable(torch.device("cpu"), torch.bfloat16, 64)
    assert not flash_usable(cuda, torch.float32, 64)  # FlashAttention: bf16 / fp16 only
    assert not flash_usable(cuda, torch.bfloat16, 12)  # head dim not a multiple of 8
    assert not flash_usable(cuda, torch.bfloat16, 512)  # head dim above 256


# ------------------------------------------------------------------------------------------------
# CUDA: FlashAttention's variable-length kernel with dropout, through the packed op

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
def test_flash_attention_drops_probability_mass_like_bernoulli_dropout(dropout_p):
    if not flash_usable(torch.device("cuda"), torch.bfloat16, 8):
        pytest.skip("FlashAttention does not run on this GPU")

    def attend(q, k, v, p):
        return packed(packed_attention)(*(t.cuda().bfloat16() for t in (q, k, v)), p).float().cpu()

    torch.manual_seed(18)
    z = dropped_mass_z(attend, LENGTHS, width=128, dropout_p=dropout_p, calls=6)
    # bf16 rounds the output (~1 + O(p)) to 8 significant bits: a bias of up to 2^-8 in f, i.e. up to
    # 2^-8 / sqrt(p (1 - p) / n) in z; the dropped-mass z-scores are compared after removing that bound
    bound = 2**-8 / math.sqrt(dropout_p * (1 - dropout_p) / max(LENGTHS))
    assert abs(z.mean().item()) <= 5 / math.sqrt(z.numel()) + bound
    assert abs(z.var().item() - 1) <= 5 * math.sqrt(3 / z.numel()) + 2 * bound


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("objective", ["mlm", "pmlm"])
def test_the_released_recipes_train_packed_on_cuda_with_attention_dropout(objective):
    torch.manual_seed(19)
    cfg = model_config("base", num_layers=2)  # attention dropout 0.1, the released layers
    model = build_model(cfg, ObjectiveConfig(name=objective)).cuda().train()
    tokens = mixed_batch([510, 100, 0, 37], width=512, seed=1).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if model.encoder.layout(tokens.device) != Layout.PACKED:
            pytest.skip("FlashAttention does not run on this GPU")
        out = pretraining_losses(model, tokens, ObjectiveConfig(name=objective), torch.Generator("cuda").manual_seed(0))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
