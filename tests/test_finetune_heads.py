"""Task heads: shapes, symmetry, chunked pair features, M+ equal to the pair head's first block, padding."""

from __future__ import annotations

import pytest
import torch

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, NUM_RESIDUES, PAD_ID
from pmlm.config.finetuning import FinetuneConfig
from pmlm.errors import ConfigError
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.model.symmetry import symmetrize
from pmlm.model.task_heads import (
    ContactLinearHead,
    ContactResNetHead,
    SecondaryStructureHead,
    SequenceHead,
    TapeConvHead,
    TaskModel,
    pair_features,
    pair_map,
    resolve_features,
)
from pmlm.pretrained import build_model
from pmlm.tasks.registry import task_named

HIDDEN = 16


def _head(cfg):
    return task_named(cfg.task).build_head(cfg, HIDDEN)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _reps(batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randn(batch, length, HIDDEN)


def _tiny_model(objective: str = "pmlm") -> torch.nn.Module:
    cfg = ModelConfig(num_layers=1, hidden=HIDDEN, ffn=32, heads=2, max_len=40, dropout=0.0)
    return build_model(cfg, ObjectiveConfig(name=objective)).eval()


def _tokens(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(lengths)
    tokens = torch.full((len(lengths), longest + 2), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(lengths), longest, dtype=torch.bool)
    for b, n in enumerate(lengths):
        tokens[b, 0] = CLS_ID
        tokens[b, 1 : n + 1] = torch.randint(NUM_RESIDUES, (n,)) + FIRST_RESIDUE_ID
        tokens[b, n + 1] = EOS_ID
        mask[b, :n] = True
    return tokens, mask


@pytest.mark.parametrize("training", [True, False])
def test_head_shapes_and_contact_symmetry(training):
    reps, mask = _reps(), torch.ones(2, 7, dtype=torch.bool)
    heads = {
        "linear": ContactLinearHead(HIDDEN, 0.5, 1 << 20),
        "resnet": ContactResNetHead(HIDDEN, 0.1, channels=4, blocks=2, kernel=3, norm="batch", chunk_elements=1 << 20),
        "ss3": SecondaryStructureHead(HIDDEN, 8, 3, 0.1),
        "ss3_conv": TapeConvHead(HIDDEN, 8, 3, 0.1),
        "remote": SequenceHead(HIDDEN, 8, 11, 0.1),
    }
    shapes = {"linear": (2, 7, 7), "resnet": (2, 7, 7), "ss3": (2, 7, 3), "ss3_conv": (2, 7, 3), "remote": (2, 11)}
    for name, head in heads.items():
        out = head.train(training)(reps, mask)
        assert out.shape == shapes[name], name
        if name in ("linear", "resnet"):
            assert torch.equal(out, out.transpose(1, 2)), name


def test_linear_head_closed_form_equals_explicit_pair_features():
    head = ContactLinearHead(HIDDEN, 0.5, 1 << 20).eval()
    reps = _reps()
    explicit = symmetrize(pair_map(reps, None, lambda f: head.out(f).squeeze(-1), 1 << 20))
    torch.testing.assert_close(head(reps, None), explicit, rtol=1e-5, atol=1e-5)
    # the features really are concat(f_i * f_j, f_i - f_j)
    feats = pair_features(reps, 2, 4, None)  # (B, 2, L, 2C)
    torch.testing.assert_close(feats[1, 1, 5], torch.cat([reps[1, 3] * reps[1, 5], reps[1, 3] - reps[1, 5]]))


@pytest.mark.parametrize("kind", ["linear", "resnet"])
def test_chunked_checkpointed_pair_features_match_one_chunk(kind):
    """Small chunks (recomputed in backward) give the same logits and gradients as one big chunk."""
    reps = _reps(length=9).requires_grad_()
    results = []
    for chunk in (1 << 20, 2 * 9 * 2 * HIDDEN * 2):  # one chunk | two rows per chunk
        torch.manual_seed(1)
        if kind == "linear":
            head = ContactLinearHead(HIDDEN, 0.0, chunk)
        else:
            head = ContactResNetHead(HIDDEN, 0.0, channels=4, blocks=1, kernel=3, norm="instance", chunk_elements=chunk)
        out = head.train()(reps, torch.ones(2, 9, dtype=torch.bool))
        grads = torch.autograd.grad(out.square().sum(), [reps, *head.parameters()])
        results.append((out, grads))
    (out_a, grads_a), (out_b, grads_b) = results
    torch.testing.assert_close(out_a, out_b)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb)


def test_mplus_features_equal_the_pair_heads_first_block():
    model = _tiny_model()
    tokens, _ = _tokens([6])
    length = 6
    out_reps = model.encode(tokens)[:, 1 : length + 1]  # (1, L, C)
    mplus = pair_features(out_reps, 0, length, model.pair_head)  # (1, L, L, 2C)
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    pair_index = torch.stack([torch.zeros(length * length, dtype=torch.long), i.flatten() + 1, j.flatten() + 1], 1)
    reference = model(tokens, pair_index=pair_index, return_pair_repr=True)["pair_repr"]  # (L*L, 2C)
    torch.testing.assert_close(mplus.reshape(length * length, -1), reference, rtol=1e-4, atol=1e-5)


def test_resnet_head_ignores_padding():
    """A protein scores the same alone and padded next to a longer one (masked norms, zeroed padding)."""
    model = _tiny_model()
    tokens, mask = _tokens([5, 9])
    cfg = FinetuneConfig.from_dict(
        {"task": "contact", "head": {"kind": "resnet", "resnet_blocks": 2, "resnet_channels": 4, "features": "M+"}}
    )
    task_model = TaskModel(model, _head(cfg), "contact", "M+", freeze_encoder=True).eval()
    with torch.no_grad():
        both = task_model(tokens, mask)
        alone = task_model(tokens[:1, :7], mask[:1, :5])
    torch.testing.assert_close(both[0, :5, :5], alone[0], rtol=1e-4, atol=1e-5)


def test_frozen_task_model_trains_only_the_head():
    model = _tiny_model()
    cfg = FinetuneConfig.from_dict({"task": "contact", "head": {"kind": "linear"}})
    tokens, mask = _tokens([8, 6])
    frozen = TaskModel(model, _head(cfg), "contact", "M+", freeze_encoder=True).train()
    frozen(tokens, mask).sum().backward()
    assert all(p.grad is None for p in frozen.encoder.parameters())
    assert all(p.grad is not None for p in frozen.head.parameters())
    assert not frozen.encoder.training and list(frozen.trainable()) == ["head"]

    full = TaskModel(_tiny_model(), _head(cfg), "contact", "M+", freeze_encoder=False).train()
    full(tokens, mask).sum().backward()
    named = dict(full.encoder.named_parameters())
    assert named["encoder.layers.0.attn.qkv.weight"].grad is not None
    assert named["pair_head.dense.weight"].grad is not None  # M+ is fine-tuned with the encoder
    assert named["pair_head.out.weight"].grad is None and named["token_head.out.weight"].grad is None
    assert list(full.trainable()) == ["head", "encoder"]


def test_features_auto_and_mplus_need_a_pair_head():
    assert resolve_features("auto", True, _tiny_model("pmlm")) == "M+"
    assert resolve_features("auto", True, _tiny_model("mlm")) == "M"
    assert resolve_features("auto", False, _tiny_model("pmlm")) == "M"
    with pytest.raises(ConfigError, match="needs an encoder with a pair head"):
        resolve_features("M+", True, _tiny_model("mlm"))


def test_tape_conv_head_layers_and_padding_independence():
    """TAPE's SimpleConv: BatchNorm1d -> wn-Conv1d(C, hidden, 5) -> ReLU -> Dropout -> wn-Conv1d(hidden, 3, 3),
    weight norm with one gain per kernel; a protein's logits do not depend on the padding beside it."""
    torch.manual_seed(0)
    head = TapeConvHead(HIDDEN, 8, 3, 0.0).eval()
    assert (head.conv1.kernel_size, head.conv2.kernel_size) == ((5,), (3,))
    assert head.conv1.parametrizations.weight.original0.shape == ()  # dim=None: a single gain
    with torch.no_grad():
        head.norm.running_mean.normal_()
        head.norm.running_var.uniform_(0.5, 2.0)
    reps = _reps(batch=1, length=6)
    padded = torch.cat([reps, torch.randn(1, 4, HIDDEN)], dim=1)  # 4 padded positions of garbage
    mask = torch.tensor([[True] * 6 + [False] * 4])
    alone = head(reps, torch.ones(1, 6, dtype=torch.bool))
    torch.testing.assert_close(head(padded, mask)[:, :6], alone)
    # the same arithmetic written out: eval-mode batch norm, zero padding, two convolutions
    x = (reps.transpose(1, 2) - head.norm.running_mean[:, None]) / torch.sqrt(head.norm.running_var[:, None] + 1e-5)
    x = x * head.norm.weight[:, None] + head.norm.bias[:, None]
    x = torch.relu(torch.nn.functional.conv1d(x, head.conv1.weight, head.conv1.bias, padding=2))
    expected = torch.nn.functional.conv1d(x, head.conv2.weight, head.conv2.bias, padding=1).transpose(1, 2)
    torch.testing.assert_close(alone, expected, rtol=1e-5, atol=1e-5)
    w = head.conv1.parametrizations.weight
    torch.testing.assert_close(head.conv1.weight, w.original0 * w.original1 / w.original1.norm())


def test_conv_head_is_an_ss3_option_only():
    cfg = FinetuneConfig.from_dict({"task": "ss3", "head": {"kind": "conv", "conv_hidden": 16}})
    assert isinstance(_head(cfg), TapeConvHead)
    assert isinstance(_head(FinetuneConfig.from_dict({"task": "ss3"})), SecondaryStructureHead)
    with pytest.raises(ConfigError, match="head.kind must be linear or resnet for task contact"):
        FinetuneConfig.from_dict({"task": "contact", "head": {"kind": "conv"}})
