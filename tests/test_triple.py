"""The Triple MLM (objective tmlm): the factorised triple head against its formula written out, the triple sampler,
the objective's losses and counters, the sidecar round trip and the parameters of the pair head's unary form."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pmlm.artefacts import write_encoder
from pmlm.errors import ConfigError
from pmlm.model.config import model_config
from pmlm.model.heads import PairHead
from pmlm.model.objectives import IGNORE_INDEX, ObjectiveConfig, mask_tokens, pretraining_losses
from pmlm.model.triple import NUM_TRIPLE_CLASSES, Q, TripleHead, sample_triples, triple_labels, triples_per_sequence
from pmlm.pretrained import build_model, load_encoder

pytestmark = pytest.mark.usefixtures("single_thread")


def _tokens(lengths: list[int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2
    tokens = torch.ones(len(lengths), width, dtype=torch.long)  # <pad>
    for row, n in enumerate(lengths):
        tokens[row, 0] = 0
        tokens[row, 1 : n + 1] = torch.randint(4, 24, (n,), generator=g)
        tokens[row, n + 1] = 2
    return tokens


def test_factorised_logits_are_the_formula_written_out():
    torch.manual_seed(0)
    head = TripleHead(hidden=8, width=12, rank=3, chunk_size=2)
    reps = torch.randn(2, 9, 8)
    index = torch.tensor([[0, 1, 4, 7], [1, 2, 3, 8], [1, 5, 6, 8]])
    logits = head(reps, index)  # three rows through chunks of two
    assert logits.shape == (3, NUM_TRIPLE_CLASSES)
    for row, (b, i, j, k) in enumerate(index.tolist()):
        h = reps[b, [i, j, k]]  # (3, C)
        w = head.project.weight.view(3, 12, 8)
        pre = sum(w[r] @ h[r] for r in range(3)) + head.product(h[0] * h[1] * h[2])
        f = head.out(head.norm(head.act(pre)))
        u = f[: 3 * Q].view(3, Q)
        p = f[3 * Q : 3 * Q + 3 * Q * Q].view(3, Q, Q)
        cp = f[3 * Q + 3 * Q * Q :].view(3, 3, Q)
        want = torch.zeros(Q, Q, Q)
        for a in range(Q):
            for bb in range(Q):
                for c in range(Q):
                    want[a, bb, c] = (
                        u[0, a]
                        + u[1, bb]
                        + u[2, c]
                        + p[0, a, bb]
                        + p[1, a, c]
                        + p[2, bb, c]
                        + (cp[0, :, a] * cp[1, :, bb] * cp[2, :, c]).sum()
                    )
        # sums of ~10 terms of size ~1 in fp32
        torch.testing.assert_close(logits[row].view(Q, Q, Q), want, atol=1e-5, rtol=1e-5)


def test_triple_sampler():
    valid = torch.zeros(4, 12, dtype=torch.bool)
    valid[0, [1, 3, 5, 7, 9]] = True  # 5 flagged
    valid[1, [2, 4]] = True  # too few for a triple
    valid[3, [0, 2, 4, 6, 8, 10, 11]] = True  # 7 flagged
    out = sample_triples(valid, 1.5, torch.Generator().manual_seed(0))
    counts = torch.bincount(out[:, 0], minlength=4).tolist()
    assert counts == [triples_per_sequence(5, 1.5), 0, 0, triples_per_sequence(7, 1.5)] == [8, 0, 0, 11]
    assert bool((out[:, 1] < out[:, 2]).all() and (out[:, 2] < out[:, 3]).all())
    assert bool(valid[out[:, [0]].expand(-1, 3), out[:, 1:]].all())  # only flagged positions
    again = sample_triples(valid, 1.5, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    many = sample_triples(valid[:1].expand(1, -1), 400.0, torch.Generator().manual_seed(1))
    assert len({tuple(t) for t in many[:, 1:].tolist()}) == math.comb(5, 3)  # every triple is drawn
    assert sample_triples(torch.zeros(2, 5, dtype=torch.bool), 1.0, torch.Generator()).shape == (0, 4)


def test_tmlm_objective_losses_and_counters():
    torch.manual_seed(0)
    cfg = ObjectiveConfig(name="tmlm", mask_prob=0.3, triple_weight=0.5, triples_per_masked=2.0)
    model = build_model(model_config("tiny", "tmlm", dropout=0.0, attention_dropout=0.0), cfg)
    assert model.triple_head is not None and model.cfg.triple_hidden == 128
    tokens = _tokens([30, 22, 17])
    out = pretraining_losses(model, tokens, cfg, torch.Generator().manual_seed(3))
    assert out.l_tmlm > 0 and int(out.triple_total) > 0
    total = out.l_mlm + cfg.pair_weight * out.l_pmlm + cfg.triple_weight * out.l_tmlm
    torch.testing.assert_close(out.loss.detach(), total)
    # the counters: the same masks as mask_tokens draws, then ceil(2 n) triples per sequence
    _, targets, _ = mask_tokens(tokens, cfg, torch.Generator().manual_seed(3))
    n = targets.ne(IGNORE_INDEX).sum(dim=1).tolist()
    assert int(out.triple_total) == sum(triples_per_sequence(k, 2.0) for k in n)
    out.loss.backward()
    assert model.triple_head.out.weight.grad.abs().sum() > 0 and model.encoder.embed.weight.grad.abs().sum() > 0
    # untrained: the triple loss is near the uniform log(8000)
    assert abs(float(out.l_tmlm) - math.log(NUM_TRIPLE_CLASSES)) < 1.0
    pmlm = build_model(model_config("tiny", "pmlm"), ObjectiveConfig(name="pmlm"))
    assert pmlm.triple_head is None
    with pytest.raises(ConfigError, match="needs a triple head"):
        pretraining_losses(pmlm, tokens, cfg, torch.Generator())
    with pytest.raises(ConfigError, match="no triple head"):
        pmlm(tokens, triple_index=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ConfigError, match="triples_per_masked"):
        ObjectiveConfig(name="tmlm", triples_per_masked=0)
    with pytest.raises(ConfigError, match="triple_weight"):
        ObjectiveConfig(name="tmlm", triple_weight=-1)
    labels = triple_labels(torch.tensor([[0, 1, 2, 3]]), torch.tensor([[-100, 4, 7, 19]]))
    assert int(labels[0]) == 400 * 4 + 20 * 7 + 19


def test_sidecar_round_trip(tmp_path):
    torch.manual_seed(1)
    objective = ObjectiveConfig(name="tmlm", triple_weight=0.3)
    model = build_model(model_config("tiny", "tmlm", triple_rank=5, triple_width=40), objective).eval()
    path = write_encoder(
        tmp_path / "model.safetensors",
        model.state_dict(),
        {"model": model.cfg.to_dict(), "objective": dataclasses.asdict(objective)},
    )[0]
    loaded, info, _ = load_encoder(path, "cpu")
    assert loaded.triple_head.rank == 5 and loaded.triple_head.width == 40 and info["objective"]["triple_weight"] == 0.3
    tokens = _tokens([14])
    index = torch.tensor([[0, 1, 5, 9]])
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(tokens, triple_index=index)["triple_logits"],
            model(tokens, triple_index=index)["triple_logits"],
            rtol=0,
            atol=0,
        )
    with pytest.raises(ConfigError, match="triple_width"):
        model_config("tiny", "tmlm", triple_width=-1)


def test_unary_pair_head_is_the_same_linear_map():
    """pair_unary adds per-residue terms computed from M+: folding them into the output layer gives a plain head
    with identical logits, so the functions are the paper's."""
    torch.manual_seed(2)
    head = PairHead(hidden=8, num_classes=400, chunk_size=5, unary=True)
    plain = PairHead(hidden=8, num_classes=400, chunk_size=5)
    plain.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("unary")})
    with torch.no_grad():
        u = head.unary.weight.view(2, Q, -1)
        ub = head.unary.bias.view(2, Q)
        plain.out.weight += (u[0][:, None, :] + u[1][None, :, :]).reshape(400, -1)
        plain.out.bias += (ub[0][:, None] + ub[1][None, :]).reshape(400)
    reps = torch.randn(2, 7, 8)
    index = torch.tensor([[0, 1, 3], [1, 2, 6], [0, 4, 5]])
    got, _ = head(reps, index, mirror=True)
    want, _ = plain(reps, index, mirror=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_product_base_heads_start_from_the_product_of_the_token_marginals():
    """product_base: with a head's own output at zero, its joint is the product of the token head's marginals at
    its positions (both orders of a mirrored pair row; the three sites of a triple), and the token head's weights
    stay in their own place in the state dict."""
    torch.manual_seed(3)
    model = build_model(
        model_config("tiny", "tmlm", product_base=True, dropout=0.0, attention_dropout=0.0),
        ObjectiveConfig(name="tmlm"),
    ).eval()
    assert not any(k.startswith(("pair_head.", "triple_head.")) and "token" in k for k in model.state_dict())
    with torch.no_grad():
        for head in (model.pair_head, model.triple_head):
            head.out.weight.zero_()
            head.out.bias.zero_()
        tokens = _tokens([12, 9])
        index = torch.tensor([[0, 2, 7], [1, 1, 5]])
        out = model(tokens, pair_index=index, mirror_pairs=True)
        reps = out["representations"]
        for row, (b, i, j) in enumerate(index.tolist()):
            pi = torch.log_softmax(model.token_head(reps[b, i]), dim=-1)
            pj = torch.log_softmax(model.token_head(reps[b, j]), dim=-1)
            joint = torch.log_softmax(out["pair_logits"][row], dim=-1).view(Q, Q)
            torch.testing.assert_close(joint, pi[:, None] + pj[None, :], atol=1e-5, rtol=1e-5)
            swapped = torch.log_softmax(out["pair_logits"][row + len(index)], dim=-1).view(Q, Q)
            torch.testing.assert_close(swapped, joint.T, atol=1e-5, rtol=1e-5)
        triple = torch.tensor([[0, 1, 4, 9]])
        logits = model(tokens, triple_index=triple)["triple_logits"][0]
        marginals = [torch.log_softmax(model.token_head(reps[0, p]), dim=-1) for p in (1, 4, 9)]
        want = marginals[0][:, None, None] + marginals[1][None, :, None] + marginals[2][None, None, :]
        torch.testing.assert_close(torch.log_softmax(logits, dim=-1).view(Q, Q, Q), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="product_base"):
        model_config("tiny", "pmlm", product_base=True, pair_vocab="full")
