"""The encoder's layer variants: post-LN (the released code's) and pre-LN, the embedding LayerNorm, the
activation and the dropouts, pinned by hand-written reference forwards and by the order modules run in; the
layer recipe each objective gets; an encoder written before these fields existed loads as it was."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, NUM_RESIDUES
from pmlm.artefacts import ENCODER_FORMAT, write_encoder
from pmlm.errors import ConfigError
from pmlm.model import ObjectiveConfig, PMLMModel, model_config
from pmlm.model.config import RELEASED_LAYERS
from pmlm.pretrained import build_model, load_encoder

ACT = {"relu": F.relu, "gelu": F.gelu}


def tokens(lengths=(9, 6), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths) + 2), 1)  # <pad>
    for row, n in enumerate(lengths):
        out[row, 0] = CLS_ID
        out[row, 1 : n + 1] = torch.randint(FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + NUM_RESIDUES, (n,), generator=g)
        out[row, n + 1] = EOS_ID
    return out


def reference_attention(layer, x: torch.Tensor) -> torch.Tensor:
    """Multi-head softmax attention of one unpadded sequence x (L, C), written out."""
    L, C = x.shape
    H = layer.attn.heads
    q, k, v = F.linear(x, layer.attn.qkv.weight, layer.attn.qkv.bias).view(L, 3, H, C // H).unbind(1)
    weights = torch.softmax(torch.einsum("ihd,jhd->hij", q, k) / (C // H) ** 0.5, dim=-1)  # (H, L, L)
    out = torch.einsum("hij,jhd->ihd", weights, v).reshape(L, C)
    return F.linear(out, layer.attn.proj.weight, layer.attn.proj.bias)


def reference_layer(layer, x: torch.Tensor, norm: str, activation: str) -> torch.Tensor:
    """One layer without dropout, as fairseq 0.10.2's TransformerSentenceEncoderLayer (post) or ESM-1b's (pre)."""

    def ln(module, y):
        return F.layer_norm(y, y.shape[-1:], module.weight, module.bias, module.eps)

    def ffn(y):
        return F.linear(
            ACT[activation](F.linear(y, layer.ffn_in.weight, layer.ffn_in.bias)),
            layer.ffn_out.weight,
            layer.ffn_out.bias,
        )

    if norm == "post":
        x = ln(layer.attn_norm, x + reference_attention(layer, x))
        return ln(layer.ffn_norm, x + ffn(x))
    x = x + reference_attention(layer, ln(layer.attn_norm, x))
    return x + ffn(ln(layer.ffn_norm, x))


VARIANTS = [("post", "relu", False), ("post", "gelu", True), ("pre", "gelu", False), ("pre", "relu", True)]


@pytest.mark.parametrize(("norm", "activation", "embedding_norm"), VARIANTS)
def test_encoder_matches_a_hand_written_forward(norm, activation, embedding_norm):
    torch.manual_seed(0)
    cfg = model_config("tiny", norm=norm, activation=activation, embedding_norm=embedding_norm)
    encoder = PMLMModel(cfg).encoder.eval()
    with torch.no_grad():
        for p in encoder.parameters():  # LayerNorm gains and biases away from (1, 0), so each is seen
            p.add_(0.05 * torch.randn_like(p))
        batch = tokens()
        got = encoder(batch)
        for row, n in enumerate((9, 6)):
            seq = batch[row, : n + 2]
            x = encoder.embed.weight[seq] + encoder.positions[: n + 2]
            if embedding_norm:
                x = F.layer_norm(x, x.shape[-1:], encoder.embed_norm.weight, encoder.embed_norm.bias)
            for layer in encoder.layers:
                x = reference_layer(layer, x, norm, activation)
            if norm == "pre":
                x = F.layer_norm(x, x.shape[-1:], encoder.final_norm.weight, encoder.final_norm.bias)
            # fp32 sums in another order: a few ulps of values of order 1 to 10
            torch.testing.assert_close(got[row, : n + 2], x, rtol=1e-5, atol=1e-4)
    assert (encoder.final_norm is None) == (norm == "post")
    assert (encoder.embed_norm is None) == (not embedding_norm)


def call_order(module: torch.nn.Module, run) -> list[str]:
    names = {m: n for n, m in module.named_modules()}
    order: list[str] = []
    hooks = [m.register_forward_hook(lambda m, i, o: order.append(names[m])) for m in names if m is not module]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return order


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_layer_order(norm):
    cfg = model_config("tiny", norm=norm, activation_dropout=0.1)
    layer = PMLMModel(cfg).encoder.layers[0]
    x = torch.randn(2, 5, cfg.hidden)
    order = [n for n in call_order(layer, lambda: layer(x, None)) if "." not in n]  # the layer's own modules
    if norm == "post":  # x = LN(x + Drop(Attn(x))); x = LN(x + Drop(FFN(x)))
        expected = ["attn", "dropout", "attn_norm", "ffn_in", "activation_dropout", "ffn_out", "dropout", "ffn_norm"]
    else:  # x = x + Drop(Attn(LN(x))); x = x + Drop(FFN(LN(x)))
        expected = ["attn_norm", "attn", "dropout", "ffn_norm", "ffn_in", "activation_dropout", "ffn_out", "dropout"]
    assert order == expected


@pytest.mark.parametrize(("embedding_norm", "norm"), [(True, "post"), (False, "pre")])
def test_encoder_order_of_embedding_and_final_norms(embedding_norm, norm):
    cfg = model_config("tiny", num_layers=1, norm=norm, embedding_norm=embedding_norm)
    encoder = PMLMModel(cfg).encoder
    order = [n for n in call_order(encoder, lambda: encoder(tokens())) if "." not in n or n.count(".") == 1]
    head = ["embed", "embed_norm", "dropout"] if embedding_norm else ["embed", "dropout"]
    assert order[: len(head)] == head and order[len(head)] == "layers.0"
    assert order[-1] == ("final_norm" if norm == "pre" else "layers.0")


def test_heads_use_the_encoder_activation():
    relu = PMLMModel(model_config("tiny", activation="relu")).eval()
    x = torch.randn(3, relu.cfg.hidden)
    head = relu.token_head
    expected = head.out(F.layer_norm(F.relu(head.dense(x)), x.shape[-1:], head.norm.weight, head.norm.bias))
    torch.testing.assert_close(head(x), expected)
    assert relu.pair_head.act is F.relu
    assert PMLMModel(model_config("tiny", activation="gelu")).pair_head.act is F.gelu


def test_each_objective_gets_the_released_layer_recipe():
    # Mu-Protein pmlm.py:404-406, 418, 420; mlm.py:362-364, 378, 380; pmlmx.py:436-438, 450, 452
    expected = {
        "pmlm": ("post", False, "relu", 0.1, 0.1, 0.0),
        "mlm": ("post", True, "gelu", 0.1, 0.1, 0.0),
        "pmlm_pair_only": ("post", True, "gelu", 0.0, 0.0, 0.0),
        "tmlm": ("post", False, "relu", 0.1, 0.1, 0.0),  # no released Triple MLM: PMLM's layers
    }
    fields = ("norm", "embedding_norm", "activation", "dropout", "attention_dropout", "activation_dropout")
    assert set(RELEASED_LAYERS) == set(expected)
    for preset in ("tiny", "base", "large", "xl"):
        for objective, values in expected.items():
            cfg = model_config(preset, objective)
            assert tuple(getattr(cfg, f) for f in fields) == values, (preset, objective)
    # overrides win over the objective's recipe
    assert model_config("base", "mlm", activation="relu", embedding_norm=False).activation == "relu"
    with pytest.raises(ConfigError, match="model.norm must be one of post, pre"):
        model_config("tiny", norm="sandwich")
    with pytest.raises(ConfigError, match="model.activation"):
        model_config("tiny", activation="swish")
    with pytest.raises(ConfigError, match="model.activation_dropout"):
        model_config("tiny", activation_dropout=1.0)


def test_train_config_builds_the_objective_recipe():
    from pmlm.config.pretraining import TrainConfig

    cfg = TrainConfig.from_dict({"model": {"preset": "tiny"}, "objective": {"name": "mlm"}})
    assert cfg.model_config().embedding_norm and cfg.model_config().activation == "gelu"
    pinned = TrainConfig.from_dict(
        {"model": {"preset": "tiny", "overrides": {"norm": "pre"}}, "objective": {"name": "pmlm_pair_only"}}
    )
    assert pinned.model_config().norm == "pre" and pinned.model_config().dropout == 0.0


def test_encoder_round_trip_records_the_current_format(tmp_path):
    cfg = model_config("tiny", "mlm")
    model = build_model(cfg, ObjectiveConfig(name="mlm"))
    path = tmp_path / "model.safetensors"
    write_encoder(path, model.state_dict(), {"model": dataclasses.asdict(cfg), "objective": {"name": "mlm"}})
    loaded, info, _ = load_encoder(path)
    assert info["format"] == ENCODER_FORMAT == "pmlm-encoder/3"
    assert loaded.cfg == dataclasses.replace(cfg, pair_head=False)
