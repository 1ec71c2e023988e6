"""Encoder and head behaviour: preset sizes, shapes, padding invariance, pair-head chunking and memory."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import LargestTensor, reorder_tolerance
from tiny_models import pair_labels, swap_pairs, upper_pairs

from pmlm import alphabet
from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, NUM_RESIDUES, PAD_ID
from pmlm.errors import ConfigError, PmlmError
from pmlm.model import PRESETS, ObjectiveConfig, PMLMModel, model_config
from pmlm.model.config import ModelConfig, PairVocab
from pmlm.model.heads import PairHead
from pmlm.pretrained import build_model

# (preset, objective) -> parameter count stated by the paper / design table
PAPER_PARAMS = {
    ("base", "mlm"): 85e6,
    ("base", "pmlm"): 87e6,
    ("large", "pmlm"): 250e6,
    ("xl", "pmlm"): 713e6,
}


def ordered_pairs_of(valid):
    """All ordered pairs (b, i, j), i != j, of flagged positions: the upper pairs, then their swaps."""
    upper = upper_pairs(valid)
    return torch.cat([upper, swap_pairs(upper)])


def make_tokens(lengths: list[int], total_len: int | None = None, seed: int = 0) -> torch.Tensor:
    """<cls> residues <eos> <pad>... rows with the given residue counts."""
    g = torch.Generator().manual_seed(seed)
    width = total_len or max(lengths) + 2
    tokens = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, 0] = CLS_ID
        tokens[row, 1 : n + 1] = torch.randint(FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + NUM_RESIDUES, (n,), generator=g)
        tokens[row, n + 1] = EOS_ID
    return tokens


@pytest.mark.parametrize(("preset", "objective"), sorted(PAPER_PARAMS))
def test_preset_parameter_counts_match_paper(preset, objective):
    with torch.device("meta"):  # no memory: shapes only
        model = build_model(model_config(preset, objective), ObjectiveConfig(name=objective))
    count = model.num_parameters()
    expected = PAPER_PARAMS[(preset, objective)]
    assert abs(count - expected) / expected < 0.03, (preset, objective, count)


def test_presets_match_design_table():
    assert PRESETS["base"] == {"num_layers": 12, "hidden": 768, "ffn": 3072, "heads": 12, "max_len": 512}
    assert PRESETS["large"] == {"num_layers": 34, "hidden": 768, "ffn": 3072, "heads": 12, "max_len": 1024}
    assert PRESETS["xl"] == {"num_layers": 36, "hidden": 1280, "ffn": 5120, "heads": 20, "max_len": 1024}


def test_config_errors_are_actionable():
    with pytest.raises(ConfigError, match="unknown model preset"):
        model_config("huge")
    with pytest.raises(ConfigError, match="unknown model field"):
        model_config("tiny", width=3)
    with pytest.raises(ConfigError, match="divisible"):
        model_config("tiny", heads=5)
    with pytest.raises(ConfigError, match="pair_vocab"):
        model_config("tiny", pair_vocab="huge")
    with pytest.raises(ConfigError, match="dropout"):
        model_config("tiny", dropout=1.5)


def test_tiny_forward_shapes():
    cfg = model_config("tiny")
    model = PMLMModel(cfg).eval()
    tokens = make_tokens([10, 7, 3])
    pair_index = torch.tensor([[0, 1, 2], [1, 3, 1], [2, 2, 2], [0, 5, 9]])
    out = model(tokens, pair_index=pair_index, return_pair_repr=True)
    B, L = tokens.shape
    assert out["representations"].shape == (B, L, cfg.hidden)
    assert out["logits"].shape == (B, L, NUM_RESIDUES)
    assert out["pair_logits"].shape == (4, NUM_RESIDUES**2)
    assert out["pair_repr"].shape == (4, 2 * cfg.hidden)
    assert torch.isfinite(out["pair_logits"]).all()
    plain = model(tokens)
    assert plain["pair_logits"] is None and plain["pair_repr"] is None


# The released code's dictionary (Mu-Protein pmlm/src/protein/dict.txt, one symbol per line, after
# fairseq's 4 specials <s> <pad> </s> <unk>; the task then adds <mask>)
RELEASED_DICT_TXT = "A R N D C Q E G H I L K M F P S T W Y V X -".split()  # noqa: SIM905 (dict.txt's order)


@pytest.mark.parametrize("pair_vocab", ["standard", "full"])
def test_pair_vocabulary_class_counts(pair_vocab):
    released = 4 + len(RELEASED_DICT_TXT) + 1  # 27
    # ours holds every released symbol but the gap, and nothing else besides the vocabulary padding
    ours = [t for t in alphabet.TOKENS if not t.startswith("<null_")]
    assert set(RELEASED_DICT_TXT) - {alphabet.GAP} == set(alphabet.RESIDUES + alphabet.UNKNOWN_RESIDUE)
    assert len(ours) + 1 == released == alphabet.FULL_PAIR_SIDE
    expected = {"standard": len(alphabet.RESIDUES) ** 2, "full": released**2}[pair_vocab]  # 400, 729
    model = PMLMModel(model_config("tiny", pair_vocab=pair_vocab)).eval()
    assert model.cfg.pair_classes == model.pair_head.out.out_features == expected
    out = model(make_tokens([6]), pair_index=torch.tensor([[0, 1, 2], [0, 2, 1]]))
    assert out["pair_logits"].shape == (2, expected)
    # every label of a pair of standard residues is a class of the head, distinct per ordered pair
    classes = torch.arange(NUM_RESIDUES)
    targets = torch.cat([classes, classes]).view(1, -1)  # (1, 40): each residue class twice
    index = torch.tensor([[0, i, NUM_RESIDUES + j] for i in range(NUM_RESIDUES) for j in range(NUM_RESIDUES)])
    labels = pair_labels(index, targets, model.cfg.pair_vocab)
    assert labels.unique().numel() == NUM_RESIDUES**2 and labels.min() >= 0 and labels.max() < expected


def test_the_pair_vocabulary_is_a_type_written_as_its_name():
    cfg = model_config("tiny", pair_vocab="full")
    assert cfg.pair_vocab is PairVocab.FULL and cfg.pair_classes == PairVocab.FULL.side**2 == 729
    assert json.loads(json.dumps(cfg.to_dict()))["pair_vocab"] == "full"  # sidecars keep their bytes
    assert ModelConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ConfigError, match="model.pair_vocab must be one of standard, full, got 'huge'"):
        model_config("tiny", pair_vocab="huge")
    first, second = torch.tensor([0, 19]), torch.tensor([19, 0])
    assert PairVocab.STANDARD.pair_class(first, second).tolist() == [19, 380]
    side, offset = alphabet.FULL_PAIR_SIDE, alphabet.FIRST_RESIDUE_ID
    assert PairVocab.FULL.pair_class(first, second).tolist() == [
        offset * side + offset + 19,
        (offset + 19) * side + offset,
    ]


def test_heads_follow_config_and_errors():
    encoder_only = PMLMModel(model_config("tiny", token_head=False, pair_head=False))
    out = encoder_only(make_tokens([5]))
    assert out["logits"] is None and out["pair_logits"] is None
    with pytest.raises(ConfigError, match="no pair head"):
        encoder_only(make_tokens([5]), pair_index=torch.tensor([[0, 1, 2]]))
    too_long = make_tokens([300])  # tiny max_len is 256 tokens
    with pytest.raises(PmlmError, match="max_len"):
        PMLMModel(model_config("tiny"))(too_long)


def test_padding_invariance():
    model = PMLMModel(model_config("tiny")).eval()
    tight = make_tokens([12, 5])
    padded = torch.full((2, tight.shape[1] + 9), PAD_ID, dtype=torch.long)
    padded[:, : tight.shape[1]] = tight
    with torch.no_grad():
        a = model(tight)
        b = model(padded)
        single = model(tight[1:2, :7])  # the short row alone, no padding at all
    real = tight.ne(PAD_ID)
    torch.testing.assert_close(b["representations"][:, : tight.shape[1]][real], a["representations"][real])
    torch.testing.assert_close(b["logits"][:, : tight.shape[1]][real], a["logits"][real])
    torch.testing.assert_close(a["representations"][1, :7], single["representations"][0])
    # an all-<pad> filler row stays finite (it would otherwise inject NaN into gradients)
    filler = torch.cat([padded, torch.full((1, padded.shape[1]), PAD_ID)], dim=0)
    with torch.no_grad():
        assert torch.isfinite(model(filler)["representations"]).all()


def naive_pair_head(head: PairHead, reps: torch.Tensor, pair_index: torch.Tensor):
    """The head as written in the paper: explicit concat(h_i * h_j, h_i - h_j)."""
    b, i, j = pair_index.unbind(1)
    hi, hj = reps[b, i], reps[b, j]
    feats = torch.cat([hi * hj, hi - hj], dim=-1)  # (P, 2C)
    m_plus = head.norm(head.act(head.dense(feats)))  # the encoder's activation (relu in the pmlm recipe)
    return head.out(m_plus), m_plus


def all_pairs_index(B: int, L: int) -> torch.Tensor:
    b, i, j = torch.meshgrid(torch.arange(B), torch.arange(L), torch.arange(L), indexing="ij")
    return torch.stack([b.flatten(), i.flatten(), j.flatten()], dim=1)


def test_pair_head_matches_concat_formula_chunked_and_mirrored():
    torch.manual_seed(0)
    model = PMLMModel(model_config("tiny", dropout=0.0)).eval()
    tokens = make_tokens([20, 14])
    with torch.no_grad():
        reps = model.encode(tokens)
        g = torch.Generator().manual_seed(1)
        pair_index = torch.stack(
            [
                torch.randint(2, (50,), generator=g),
                torch.randint(1, 15, (50,), generator=g),
                torch.randint(1, 15, (50,), generator=g),
            ],
            dim=1,
        )
        ref_logits, ref_repr = naive_pair_head(model.pair_head, reps, pair_index)
        one_chunk = model.pair_head(reps, pair_index, return_repr=True)
        model.pair_head.chunk_size = 7  # many chunks, last one partial
        chunked = model.pair_head(reps, pair_index, return_repr=True)
        mirrored, _ = model.pair_head(reps, pair_index, mirror=True)
    torch.testing.assert_close(one_chunk[0], ref_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(one_chunk[1], ref_repr, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunked[0], one_chunk[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked[1], one_chunk[1], rtol=1e-5, atol=1e-5)
    swapped_ref, _ = naive_pair_head(model.pair_head, reps, pair_index[:, [0, 2, 1]])
    torch.testing.assert_close(mirrored, torch.cat([ref_logits, swapped_ref]), rtol=1e-4, atol=1e-4)


def test_pair_head_chunking_preserves_gradients():
    """Chunks change only the order in which the pairs' contributions are added up. In float64, so that the
    comparison sees the chunking and not fp32 rounding (in fp32 the two orders differ by up to ~1e-6 of the
    largest gradient, depending on the CPU and thread count)."""
    torch.manual_seed(0)
    head = PairHead(hidden=8, num_classes=NUM_RESIDUES**2, chunk_size=1000).double()
    reps = torch.randn(2, 9, 8, dtype=torch.float64, requires_grad=True)
    pair_index = all_pairs_index(2, 9)[::3]
    head(reps, pair_index)[0].square().sum().backward()
    grads_one = [reps.grad.clone()] + [p.grad.clone() for p in head.parameters()]
    reps.grad = None
    head.zero_grad()
    head.chunk_size = 5
    head(reps, pair_index)[0].square().sum().backward()
    grads_many = [reps.grad] + [p.grad for p in head.parameters()]
    n_terms = pair_index.shape[0] * NUM_RESIDUES**2  # the longest sums: over pairs and pair classes
    for a, b in zip(grads_one, grads_many):
        torch.testing.assert_close(a, b, rtol=0, atol=reorder_tolerance(a, n_terms, torch.float64))


def test_pair_head_never_builds_an_all_pairs_tensor():
    B, L, C = 2, 256, 64
    head = PairHead(hidden=C, num_classes=NUM_RESIDUES**2, chunk_size=64)
    reps = torch.randn(B, L, C, requires_grad=True)
    valid = torch.zeros(B, L, dtype=torch.bool)
    valid[:, 1:L:9] = True  # ~15 % of positions, like masking
    pair_index = ordered_pairs_of(valid)
    P = pair_index.shape[0]
    assert P < B * L * L // 20
    tracker = LargestTensor()
    with tracker:
        logits, _ = head(reps, pair_index)
        logits.logsumexp(-1).sum().backward()
    all_pairs_features = B * L * L * 2 * C  # (B, L, L, 2C)
    assert tracker.max_numel <= P * NUM_RESIDUES**2  # the logits themselves are the largest tensor
    assert tracker.max_numel < all_pairs_features // 10


def test_token_positions_and_mirrored_pairs_in_forward():
    model = PMLMModel(model_config("tiny")).eval()
    tokens = make_tokens([12, 9])
    positions = torch.zeros_like(tokens, dtype=torch.bool)
    positions[0, [2, 5]] = True
    positions[1, 3] = True
    pair_index = torch.tensor([[0, 2, 5], [1, 3, 7]])
    with torch.no_grad():
        full = model(tokens, pair_index=pair_index)
        sub = model(tokens, pair_index=pair_index, token_positions=positions, mirror_pairs=True)
        swapped = model(tokens, pair_index=pair_index[:, [0, 2, 1]])
    torch.testing.assert_close(sub["logits"], full["logits"][positions])
    torch.testing.assert_close(
        sub["pair_logits"], torch.cat([full["pair_logits"], swapped["pair_logits"]]), rtol=1e-4, atol=1e-4
    )
