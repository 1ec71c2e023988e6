"""The packed (unpadded) encoder against the padded, masked reference: packing, forward and backward
on CPU in fp32 and fp64, layout selection; the fused varlen kernel against the reference on CUDA."""

from __future__ import annotations

import pytest
import torch
from tiny_models import mixed_batch, random_lengths

from pmlm.alphabet import PAD_ID
from pmlm.errors import PmlmError
from pmlm.model import ObjectiveConfig, model_config, pretraining_losses
from pmlm.model.attention import flash_usable, packed_attention, reference_varlen_attention
from pmlm.model.layout import Layout, packed_inputs, unpack
from pmlm.model.pmlm_model import PMLMModel
from pmlm.pretrained import build_model

# tiny preset, shortened so the checks run in well under a second
DIMS = {"num_layers": 2, "hidden": 64, "ffn": 256, "heads": 4, "max_len": 72}


def tolerance(cfg, dtype: torch.dtype) -> float:
    """Bound on the difference between two orders of the same sums, for outputs and gradients of scale ~1.

    The layouts do the same arithmetic in a different order (GEMMs over T vs B * L rows, softmax
    over n keys vs L keys of which L - n are exactly 0 after masking). The standard worst-case
    bound of a length-K dot product is K * eps relative to the sum of |terms|; the longest sums
    are the feed-forward (K = ffn) and attention (K = max_len) reductions of every layer.
    (Measured: a few eps, far inside the bound; a wrong offset or position gives O(1) errors.)
    """
    eps = torch.finfo(dtype).eps
    return cfg.num_layers * (cfg.ffn + cfg.max_len) * eps


def forward_backward(model: PMLMModel, tokens: torch.Tensor, layout: str, probe: torch.Tensor):
    model.zero_grad(set_to_none=True)
    model.encoder.attention = layout
    reps = model.encode(tokens)  # (B, L, C)
    keep = tokens.ne(PAD_ID)
    # a fixed random read-out of the real positions only: pads carry no loss in either layout
    (reps[keep] * probe).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return reps.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_matches_the_padded_reference_forward_and_backward(dtype, seed):
    torch.manual_seed(seed)
    cfg = model_config("tiny", **DIMS, dropout=0.0, attention_dropout=0.0)
    model = PMLMModel(cfg).to(dtype).train()  # train mode: dropout is 0, so both layouts are deterministic
    lengths = random_lengths(seed, rows=6, most=cfg.max_len - 2)
    lengths[seed % 6] = cfg.max_len - 2  # one full-width row
    tokens = mixed_batch(lengths, width=cfg.max_len, seed=seed)
    keep = tokens.ne(PAD_ID)
    probe = torch.randn(int(keep.sum()), cfg.hidden, dtype=dtype, generator=torch.Generator().manual_seed(seed))

    ref, ref_grads = forward_backward(model, tokens, "padded", probe)
    out, grads = forward_backward(model, tokens, "packed", probe)
    tol = tolerance(cfg, dtype)
    torch.testing.assert_close(out[keep], ref[keep], rtol=tol, atol=tol)
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))  # <pad> rows are zero in the packed layout
    assert ref_grads.keys() == grads.keys()
    # a weight gradient is one more sum, over the batch's real rows: add their count to the bound
    grad_tol = tol + int(keep.sum()) * torch.finfo(dtype).eps
    for name, g in grads.items():
        scale = ref_grads[name].abs().max().item()
        torch.testing.assert_close(g, ref_grads[name], rtol=0, atol=grad_tol * scale, msg=name)


def test_an_all_pad_filler_row_stays_finite_and_zero():
    torch.manual_seed(0)
    cfg = model_config("tiny", **DIMS, dropout=0.0, attention_dropout=0.0)
    model = PMLMModel(cfg)
    model.encoder.attention = "packed"
    tokens = mixed_batch([10, 0, 30], width=40, seed=3)
    reps = model.encode(tokens)
    reps.sum().backward()
    assert torch.isfinite(reps).all() and reps[1].abs().sum() == 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_packing_offsets_positions_filler_and_round_trip():
    tokens = mixed_batch([3, 0, 5], width=9, seed=0)  # rows of 5, 0 and 7 tokens
    inputs = packed_inputs(tokens, row_multiple=16)
    # the rows' sequences, then the filler up to 16 rows: one sequence of its own (shorter than the bound 64)
    assert inputs.cu_seqlens.dtype == torch.int32
    assert inputs.cu_seqlens.tolist() == [0, 5, 5, 12, 16]
    assert inputs.max_len == 64 and inputs.rows == 16
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4] + [0, 1, 2, 3, 4, 5, 6] + [0] * 4
    assert inputs.tokens[12:].tolist() == [PAD_ID] * 4
    assert inputs.index.tolist() == [0, 1, 2, 3, 4, 18, 19, 20, 21, 22, 23, 24]
    values = torch.randn(16, 2)
    grid = unpack(values, inputs)  # (3, 9, 2)
    assert torch.equal(grid[tokens.ne(PAD_ID)], values[:12]) and grid[tokens.eq(PAD_ID)].abs().sum() == 0
    # a long filler is cut into sequences no longer than the bound, so that every row is in one
    long = packed_inputs(mixed_batch([3], width=5, seed=0), row_multiple=200)
    lengths = long.cu_seqlens.diff().tolist()
    assert lengths == [5, 64, 64, 64, 3] and max(lengths) <= long.max_len


def test_reference_varlen_attention_is_per_sequence_sdpa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    out = reference_varlen_attention(q, k, v, cu)
    for start, end in ((0, 5), (5, 12)):
        scores = torch.einsum("qhd,khd->hqk", q[start:end], k[start:end]) / 8**0.5
        expected = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[start:end])
        torch.testing.assert_close(out[start:end], expected)


def test_auto_layout_on_cpu_pads_for_training_packs_for_inference_and_bad_names_are_refused():
    torch.manual_seed(0)
    cfg = model_config("tiny", **DIMS, dropout=0.0, attention_dropout=0.0)
    model = PMLMModel(cfg).eval()
    tokens = mixed_batch([12, 30, 5], width=40, seed=1)
    auto_grad = model.encode(tokens)  # with autograd (training): the padded path
    with torch.no_grad():
        auto = model.encode(tokens)  # inference: the packed path
        model.encoder.attention = "padded"
        padded = model.encode(tokens)
        model.encoder.attention = "packed"
        packed = model.encode(tokens)
    assert torch.equal(auto_grad.detach(), padded)  # the same code path: identical bits
    assert torch.equal(auto, packed)
    model.encoder.attention = "flash"
    with pytest.raises(PmlmError, match="attention must be one of"):
        model.encode(tokens)


def test_auto_packs_on_cuda_under_half_precision_dropout_or_not():
    torch.manual_seed(0)
    model = PMLMModel(model_config("tiny", **DIMS))  # attention dropout 0.1
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert model.encoder.layout(cpu, torch.float32, grad=True) == Layout.PADDED  # training on a CPU
    assert model.encoder.layout(cpu, torch.float32, grad=False) == Layout.PACKED  # inference on a CPU
    # these verdicts are reached before any CUDA call, so they hold on a machine without a GPU
    assert model.encoder.layout(cuda, torch.float32, grad=True) == Layout.PADDED  # FlashAttention: bf16 / fp16
    assert not flash_usable(cuda, torch.bfloat16, 12)  # head dim not a multiple of 8
    assert not flash_usable(cuda, torch.bfloat16, 512)  # head dim above 256
    model.encoder.attention = "packed"
    assert model.encoder.layout(cuda, torch.float32, grad=True) == Layout.PACKED  # asked for: the reference runs


# ------------------------------------------------------------------------------------------------
# CUDA: the fused kernel itself

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# bf16 keeps 8 significant bits: one rounding of an O(1) value is up to 2^-8 relative; FlashAttention
# rounds q, k, v, the probabilities and the output once each, so a few units of 2^-8 bound the error
BF16_TOL = 4 * torch.finfo(torch.bfloat16).eps


@pytest.mark.gpu
@gpu
def test_the_packed_op_matches_the_reference_on_cuda():
    if not flash_usable(torch.device("cuda"), torch.bfloat16, 64):
        pytest.skip("FlashAttention does not run on this GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = packed_inputs(mixed_batch([500, 0, 17, 333, 1022, 64], width=1024, seed=0)).to(torch.device("cuda"))
    T = inputs.rows
    q32, k32, v32 = (torch.randn(T, 12, 64, device="cuda", generator=g) for _ in range(3))
    q, k, v = (t.bfloat16().requires_grad_() for t in (q32, k32, v32))
    fused = packed_attention(q, k, v, inputs.packing)  # FlashAttention's variable-length kernel: bf16 on CUDA
    # the reference in fp32 from the same bf16-rounded inputs
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = reference_varlen_attention(qr, kr, vr, inputs.cu_seqlens)
    torch.testing.assert_close(fused.float(), ref, rtol=BF16_TOL, atol=BF16_TOL)
    grad = torch.randn(T, 12, 64, device="cuda", generator=g)
    fused.backward(grad.bfloat16())
    ref.backward(grad)
    for a, b in ((q, qr), (k, kr), (v, vr)):
        scale = b.grad.abs().max().item()
        torch.testing.assert_close(a.grad.float(), b.grad, rtol=BF16_TOL, atol=BF16_TOL * scale)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("objective", ["mlm", "pmlm"])
def test_packed_model_on_cuda_matches_the_padded_model_under_bf16(objective):
    torch.manual_seed(0)
    cfg = model_config("base", num_layers=2, dropout=0.0, attention_dropout=0.0)
    model = build_model(cfg, ObjectiveConfig(name=objective)).cuda()
    tokens = mixed_batch([510, 100, 250, 37], width=512, seed=1).cuda()
    losses, grads = {}, {}
    for layout in ("padded", "auto"):
        model.zero_grad(set_to_none=True)
        model.encoder.attention = layout
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = pretraining_losses(
                model, tokens, ObjectiveConfig(name=objective), torch.Generator("cuda").manual_seed(0)
            )
        out.loss.backward()
        losses[layout] = out.loss.item()
        grads[layout] = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert model.encoder.layout(tokens.device) == Layout.PACKED, "auto should pack under bf16 on this GPU"
    # the same bf16 arithmetic in another order: the loss, a mean of many fp32 terms, moves by less than
    # one bf16 rounding; the gradients, element by element, by a few (BF16_TOL in the L2 sense)
    bf16_eps = torch.finfo(torch.bfloat16).eps
    assert abs(losses["auto"] - losses["padded"]) <= bf16_eps * abs(losses["padded"])
    assert (grads["auto"] - grads["padded"]).norm() <= BF16_TOL * grads["padded"].norm()
