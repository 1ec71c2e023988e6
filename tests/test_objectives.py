"""Masking statistics, masked-pair labels and the MLM / PMLM / pair-only losses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tiny_models import diagonal_pairs, pair_labels, swap_pairs, upper_pairs

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, FULL_PAIR_SIDE, MASK_ID, NUM_RESIDUES, PAD_ID, X_ID
from pmlm.errors import ConfigError
from pmlm.model import ObjectiveConfig, mask_tokens, model_config, pretraining_losses
from pmlm.model.config import PairVocab
from pmlm.model.objective_registry import objective_named, objective_names
from pmlm.model.objectives import IGNORE_INDEX
from pmlm.pretrained import build_model
from pmlm.vocabulary import OBJECTIVES


def ordered_pairs_of(valid):
    """All ordered pairs (b, i, j), i != j, of flagged positions: the upper pairs, then their swaps."""
    upper = upper_pairs(valid)
    return torch.cat([upper, swap_pairs(upper)])


def make_tokens(lengths: list[int], seed: int = 0, x_every: int = 0) -> torch.Tensor:
    """<cls> residues <eos> <pad>... rows; every ``x_every``-th residue is X when set."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths) + 2), PAD_ID, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, 0] = CLS_ID
        tokens[row, 1 : n + 1] = torch.randint(FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + NUM_RESIDUES, (n,), generator=g)
        if x_every:
            tokens[row, 1 : n + 1 : x_every] = X_ID
        tokens[row, n + 1] = EOS_ID
    return tokens


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_masking_rate_and_maskable_positions():
    lengths = [30 + 7 * k for k in range(128)]  # ragged: exercises padding
    tokens = make_tokens(lengths, x_every=11)
    inputs, targets, masked = mask_tokens(tokens, ObjectiveConfig(), gen(0))
    residue = (tokens >= FIRST_RESIDUE_ID) & (tokens <= X_ID)
    assert not (masked & ~residue).any()  # specials and padding are never selected
    assert inputs[~residue].equal(tokens[~residue])
    rate = masked.sum().item() / residue.sum().item()
    assert abs(rate - 0.15) < 0.005
    # per sequence: floor(0.15 n) or ceil(0.15 n) positions
    n = residue.sum(1).double()
    per_row = masked.sum(1).double()
    assert ((per_row >= torch.floor(0.15 * n)) & (per_row <= torch.ceil(0.15 * n))).all()
    # X is maskable but carries no target; masked standard residues carry their class
    assert (masked & tokens.eq(X_ID)).any()
    assert (targets[masked & tokens.eq(X_ID)] == IGNORE_INDEX).all()
    std = masked & tokens.ne(X_ID)
    assert targets[std].equal(tokens[std] - FIRST_RESIDUE_ID)
    assert (targets[~masked] == IGNORE_INDEX).all()


def test_mask_rate_follows_config():
    tokens = make_tokens([400] * 64)
    _, _, masked = mask_tokens(tokens, ObjectiveConfig(mask_prob=0.4), gen(3))
    assert abs(masked.float().sum().item() / (400 * 64) - 0.4) < 0.005


def test_80_10_10_split():
    tokens = make_tokens([1000] * 128)
    inputs, _, masked = mask_tokens(tokens, ObjectiveConfig(), gen(1))
    n = masked.sum().item()
    to_mask = (inputs.eq(MASK_ID) & masked).sum().item() / n
    changed = (inputs.ne(tokens) & inputs.ne(MASK_ID) & masked).sum().item() / n
    kept = (inputs.eq(tokens) & masked).sum().item() / n
    # a random residue equals the original 1 time in 20
    assert abs(to_mask - 0.8) < 0.015
    assert abs(changed - 0.1 * 19 / 20) < 0.01
    assert abs(kept - (0.1 + 0.1 / 20)) < 0.01
    replaced = inputs[inputs.ne(tokens) & inputs.ne(MASK_ID)]
    assert ((replaced >= FIRST_RESIDUE_ID) & (replaced < FIRST_RESIDUE_ID + NUM_RESIDUES)).all()
    assert not inputs[~masked].eq(MASK_ID).any()


def test_masking_is_deterministic_per_seed():
    tokens = make_tokens([50, 80, 20])
    a = mask_tokens(tokens, ObjectiveConfig(), gen(7))
    b = mask_tokens(tokens, ObjectiveConfig(), gen(7))
    c = mask_tokens(tokens, ObjectiveConfig(), gen(8))
    assert all(x.equal(y) for x, y in zip(a, b))
    assert not a[2].equal(c[2])
    # the global RNG is neither used nor advanced
    state = torch.random.get_rng_state()
    mask_tokens(tokens, ObjectiveConfig(), gen(7))
    assert torch.random.get_rng_state().equal(state)


def test_pair_index_and_labels_match_brute_force():
    targets = torch.full((3, 9), IGNORE_INDEX)
    targets[0, [1, 4, 6]] = torch.tensor([3, 3, 17])
    targets[1, [2]] = torch.tensor([5])  # one masked residue: no pairs
    targets[2, [1, 2, 5, 8]] = torch.tensor([0, 19, 7, 7])
    valid = targets.ne(IGNORE_INDEX)
    expected = set()
    for b in range(3):
        for i in range(9):
            for j in range(9):
                if i != j and valid[b, i] and valid[b, j]:
                    expected.add((b, i, j, NUM_RESIDUES * targets[b, i].item() + targets[b, j].item()))
    index = ordered_pairs_of(valid)
    labels = pair_labels(index, targets)
    got = [(*row, lab) for row, lab in zip(index.tolist(), labels.tolist())]
    assert len(got) == len(expected) == (9 - 3) + (16 - 4)  # |M|^2 - |M| per sequence
    assert set(got) == expected
    up = upper_pairs(valid)
    assert (up[:, 1] < up[:, 2]).all() and up.tolist() == sorted(up.tolist())
    full = pair_labels(index, targets, PairVocab.FULL)
    ti, tj = targets[index[:, 0], index[:, 1]], targets[index[:, 0], index[:, 2]]
    assert full.equal((ti + FIRST_RESIDUE_ID) * FULL_PAIR_SIDE + tj + FIRST_RESIDUE_ID)
    diag = diagonal_pairs(valid)
    assert diag.shape == (8, 3) and diag[:, 1].equal(diag[:, 2])


def tiny_model(objective: str, **overrides):
    torch.manual_seed(0)
    return build_model(
        model_config("tiny", dropout=0.0, attention_dropout=0.0, **overrides), ObjectiveConfig(name=objective)
    )


@pytest.mark.parametrize("pair_vocab", ["standard", "full"])
def test_pmlm_loss_matches_reference_computation(pair_vocab):
    cfg = ObjectiveConfig(name="pmlm", mask_prob=0.3, pair_weight=0.5)
    model = tiny_model("pmlm", pair_vocab=pair_vocab)
    tokens = make_tokens([40, 25, 33], x_every=7)
    out = pretraining_losses(model, tokens, cfg, gen(5))

    inputs, targets, _ = mask_tokens(tokens, cfg, gen(5))
    valid = targets.ne(IGNORE_INDEX)
    index = ordered_pairs_of(valid)
    with torch.no_grad():
        ref = model(inputs, pair_index=index)
        l_mlm = F.cross_entropy(ref["logits"][valid], targets[valid])
        labels = pair_labels(index, targets, PairVocab(pair_vocab))
        l_pmlm = F.cross_entropy(ref["pair_logits"], labels)
    sizes = valid.sum(1)
    assert out.pair_total.item() == int((sizes * sizes - sizes).sum())
    assert out.mlm_total.item() == int(valid.sum())
    torch.testing.assert_close(out.l_mlm, l_mlm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.l_pmlm, l_pmlm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.loss.detach(), l_mlm + 0.5 * l_pmlm, rtol=1e-4, atol=1e-5)
    assert out.mlm_correct.item() == int((ref["logits"][valid].argmax(-1) == targets[valid]).sum())
    assert out.pair_correct.item() == int((ref["pair_logits"].argmax(-1) == labels).sum())
    if pair_vocab == "full":
        assert ref["pair_logits"].shape[1] == FULL_PAIR_SIDE**2


def test_pair_only_uses_diagonal_and_its_marginal():
    cfg = ObjectiveConfig(name="pmlm_pair_only", mask_prob=0.3)
    model = tiny_model("pmlm_pair_only")
    assert model.token_head is None and model.pair_head is not None
    tokens = make_tokens([40, 25, 33], x_every=9)
    out = pretraining_losses(model, tokens, cfg, gen(2))

    inputs, targets, _ = mask_tokens(tokens, cfg, gen(2))
    valid = targets.ne(IGNORE_INDEX)
    off, diag = ordered_pairs_of(valid), diagonal_pairs(valid)
    with torch.no_grad():
        off_logits = model(inputs, pair_index=off)["pair_logits"]
        diag_logits = model(inputs, pair_index=diag)["pair_logits"]
    off_labels, diag_labels = pair_labels(off, targets), pair_labels(diag, targets)
    assert diag_labels.equal(targets[valid] * (NUM_RESIDUES + 1))  # (x, x) classes
    n_all = off_labels.numel() + diag_labels.numel()
    loss = (
        F.cross_entropy(off_logits, off_labels, reduction="sum")
        + F.cross_entropy(diag_logits, diag_labels, reduction="sum")
    ) / n_all
    torch.testing.assert_close(out.loss.detach(), loss, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.l_pmlm, F.cross_entropy(off_logits, off_labels), rtol=1e-4, atol=1e-5)
    # marginal over the second residue of the 400-way softmax, explicitly summed
    marginal = diag_logits.softmax(-1).view(-1, NUM_RESIDUES, NUM_RESIDUES).sum(dim=2)  # (N, 20)
    t = targets[valid]
    assert out.mlm_correct.item() == int((marginal.argmax(-1) == t).sum())
    torch.testing.assert_close(out.l_mlm, -marginal[torch.arange(t.numel()), t].log().mean(), rtol=1e-4, atol=1e-5)


def test_pair_only_with_full_vocab_scores_residues_only():
    model = tiny_model("pmlm_pair_only", pair_vocab="full")
    out = pretraining_losses(model, make_tokens([40, 30]), ObjectiveConfig(name="pmlm_pair_only"), gen(6))
    assert torch.isfinite(out.loss) and torch.isfinite(out.l_mlm)
    assert 0 <= out.mlm_correct.item() <= out.mlm_total.item()
    # 20-way marginal restricted to residues: its CE is below that of the 1024-way pair softmax
    assert out.l_mlm.item() < out.l_pmlm.item()


def test_mlm_objective_has_no_pair_terms():
    model = tiny_model("mlm")
    assert model.pair_head is None
    out = pretraining_losses(model, make_tokens([30, 30]), ObjectiveConfig(name="mlm"), gen(0))
    assert out.pair_total.item() == 0 and out.l_pmlm.item() == 0.0
    assert out.mlm_total.item() > 0
    with pytest.raises(ConfigError, match="pair head"):
        pretraining_losses(model, make_tokens([30]), ObjectiveConfig(name="pmlm"), gen(0))


def test_no_masked_residues_gives_zero_loss_and_finite_gradients():
    model = tiny_model("pmlm")
    tokens = make_tokens([4, 6], x_every=1)  # only X residues: all selected, none has a target
    cfg = ObjectiveConfig(mask_prob=1.0)
    out = pretraining_losses(model, tokens, cfg, gen(0))
    assert out.mlm_total.item() == 0 and out.pair_total.item() == 0
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_objective_config_validation():
    with pytest.raises(ConfigError, match="objective.name"):
        ObjectiveConfig(name="bert")
    with pytest.raises(ConfigError, match="mask_prob"):
        ObjectiveConfig(mask_prob=0.0)
    with pytest.raises(ConfigError, match="<= 1"):
        ObjectiveConfig(mask_token_prob=0.9, random_token_prob=0.2)


def test_objectives_are_registered_types_that_own_their_heads_and_sample_sizes():
    assert objective_names()[: len(OBJECTIVES)] == OBJECTIVES
    with pytest.raises(ConfigError, match=r"objective.name must be one of mlm, pmlm, pmlm_pair_only, tmlm.*'bert'"):
        ObjectiveConfig(name="bert")
    counts = torch.tensor([5, 20, 3])  # N masked residues, 2P ordered pairs, T triples
    sizes = {name: ObjectiveConfig(name=name).kind.sample_sizes(counts).tolist() for name in OBJECTIVES}
    assert sizes == {"mlm": [5, 0, 0], "pmlm": [5, 20, 0], "pmlm_pair_only": [0, 25, 0], "tmlm": [5, 20, 3]}
    for name in OBJECTIVES:
        kind, model = objective_named(name), tiny_model(name)
        assert (model.token_head is not None, model.pair_head is not None, model.triple_head is not None) == (
            kind.token_head,
            kind.pair_head,
            kind.triple_head,
        )


@pytest.mark.parametrize("objective", ["mlm", "pmlm", "pmlm_pair_only", "tmlm"])
def test_loss_decreases_with_adam(objective):
    model = tiny_model(objective)
    cfg = ObjectiveConfig(name=objective, mask_prob=0.25)
    tokens = make_tokens([60, 45, 50, 38], seed=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        out = pretraining_losses(model, tokens, cfg, gen(11))  # same masks each step: a fixed target
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.7 * losses[0], losses


def test_losses_go_through_a_distributed_wrapper(tmp_path):
    """DDP (gloo, one process): the objective calls the wrapper, so its gradient hooks run."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cfg = ObjectiveConfig(name="pmlm")
    tokens = make_tokens([30, 22])
    plain = tiny_model("pmlm")
    wrapped_inner = tiny_model("pmlm")  # same seed: identical weights
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(wrapped_inner)
        out_ddp = pretraining_losses(ddp, tokens, cfg, gen(4))
        out_ddp.loss.backward()
    finally:
        dist.destroy_process_group()
    out_plain = pretraining_losses(plain, tokens, cfg, gen(4))
    out_plain.loss.backward()
    torch.testing.assert_close(out_ddp.loss, out_plain.loss)
    for a, b in zip(plain.parameters(), wrapped_inner.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
