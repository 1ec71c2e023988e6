"""KL(P(x_i)P(x_j) || P(x_i,x_j)) read-out: exactly the pair is masked, values are valid divergences."""

import numpy as np
import pytest
import torch

from pmlm import alphabet
from pmlm.evaluation.kl import pair_kl, summarise
from pmlm.evaluation.pair_readout import residue_joint
from pmlm.model.config import model_config
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model


class Recorder(torch.nn.Module):
    """Wraps a model and keeps what it was called with, to check the masking protocol."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.token_head, self.pair_head = model.token_head, model.pair_head
        self.calls = []

    def forward(self, tokens, pair_index=None, **kwargs):
        self.calls.append((tokens.clone(), pair_index.clone()))
        return self.model(tokens, pair_index=pair_index, **kwargs)


@pytest.fixture
def sequences():
    rng = np.random.default_rng(0)
    return [rng.integers(alphabet.FIRST_RESIDUE_ID, alphabet.X_ID, size=n).astype(np.uint8) for n in (30, 45)]


def test_exactly_the_pair_is_masked(sequences):
    torch.manual_seed(0)
    model = Recorder(build_model(model_config("tiny"), ObjectiveConfig(name="pmlm")).eval())
    with torch.no_grad():
        out = pair_kl(model, sequences, pairs_per_sequence=5, seed=1)
    assert out["kl"].shape == (10,) and np.all(out["kl"] >= -1e-6) and np.all(np.isfinite(out["kl"]))
    for (tokens, pair_index), residues in zip(model.calls, sequences):
        for row, (b, i, j) in enumerate(pair_index.tolist()):
            assert b == row and 1 <= i < j <= residues.size
            masked = (tokens[row] == alphabet.MASK_ID).nonzero().flatten().tolist()
            assert masked == [i, j]  # nothing else is hidden from the model
            unmasked = tokens[row, 1 : 1 + residues.size].clone()
            unmasked[[i - 1, j - 1]] = torch.from_numpy(residues[[i - 1, j - 1]].astype(np.int64))
            assert torch.equal(unmasked, torch.from_numpy(residues.astype(np.int64)))


def test_deterministic_for_a_seed(sequences):
    torch.manual_seed(0)
    model = build_model(model_config("tiny"), ObjectiveConfig(name="pmlm")).eval()
    with torch.no_grad():
        a = pair_kl(model, sequences, 4, seed=3)
        b = pair_kl(model, sequences, 4, seed=3)
    np.testing.assert_array_equal(a["kl"], b["kl"])
    np.testing.assert_array_equal(a["separation"], b["separation"])


def test_pair_only_model_uses_the_joint_marginals(sequences):
    torch.manual_seed(0)
    model = build_model(model_config("tiny"), ObjectiveConfig(name="pmlm_pair_only")).eval()
    with torch.no_grad():
        out = pair_kl(model, sequences, 3, seed=0)
    assert out["kl"].shape == (6,) and np.all(out["kl"] >= -1e-6)


def test_full_vocabulary_joint_is_restricted_to_residues():
    logits = torch.randn(3, alphabet.NUM_FULL_PAIR_CLASSES)
    joint = residue_joint(logits)
    assert joint.shape == (3, 20, 20)
    torch.testing.assert_close(joint.sum(dim=(1, 2)), torch.ones(3))
    with pytest.raises(ValueError):
        residue_joint(torch.randn(2, 17))


def test_summary_by_separation():
    kl = np.array([0.1, 0.2, 0.3, 0.4])
    sep = np.array([1, 7, 13, 30])
    s = summarise(kl, sep)
    assert s["all"]["pairs"] == 4 and s["s >= 24"]["pairs"] == 1 and s["s < 6"]["median"] == pytest.approx(0.1)


def test_every_model_on_every_validation_set_one_panel_each(tmp_path):
    import json

    from conftest import make_sequences, write_shards

    from pmlm.artefacts import write_encoder
    from pmlm.cli import main
    from pmlm.evaluation.kl import read_shard_sequences

    torch.manual_seed(0)
    weights = {}
    for objective in ("pmlm", "pmlm_pair_only"):
        cfg = model_config("tiny")
        model = build_model(cfg, ObjectiveConfig(name=objective))
        weights[objective] = tmp_path / objective / "model.safetensors"
        write_encoder(
            weights[objective],
            {k: v.contiguous() for k, v in model.state_dict().items()},
            {"model": cfg.to_dict(), "objective": {"name": objective}},
        )
    sets = {
        "fam": write_shards(tmp_path / "fam", {"valid": make_sequences(6, seed=1)}),
        "uni": write_shards(tmp_path / "uni", {"valid": make_sequences(6, seed=2, families=3)}),
    }
    prefix = tmp_path / "kl"
    argv = [
        "kl",
        "--model",
        f"A={weights['pmlm']}",
        "--model",
        f"B={weights['pmlm_pair_only']}",
        "--valid",
        f"fam={sets['fam']}",
        "--valid",
        f"uni={sets['uni']}",
        "--sequences",
        "4",
        "--pairs",
        "3",
        "--out-prefix",
        str(prefix),
    ]
    assert main(argv) == 0
    summary = json.loads(prefix.with_suffix(".json").read_text())
    assert list(summary) == ["fam", "uni"] and all(list(panel) == ["A", "B"] for panel in summary.values())
    # each panel reads its own set: the same numbers as the read-out on that set's sequences
    from pmlm.pretrained import load_encoder

    model, *_ = load_encoder(weights["pmlm"])
    for label, folder in sets.items():
        with torch.inference_mode():
            direct = pair_kl(model, read_shard_sequences(folder, "valid", 4, 254), 3, seed=0)
        assert summary[label]["A"]["all"]["pairs"] == direct["kl"].size == 12
        assert summary[label]["A"]["all"]["median"] == pytest.approx(float(np.median(direct["kl"])), rel=1e-5)
    assert summary["fam"]["A"]["all"]["median"] != summary["uni"]["A"]["all"]["median"]
    svg = prefix.with_suffix(".svg").read_text()
    assert "fam valid" in svg and "uni valid" in svg  # side-by-side panels, titled by set
    assert prefix.with_suffix(".png").stat().st_size > 10_000


def test_one_validation_set_is_one_panel():
    from pmlm.evaluation.kl import plot_histogram

    rng = np.random.default_rng(0)
    results = {"demo": {"M": {"kl": rng.exponential(0.01, 50), "separation": rng.integers(1, 40, 50)}}}
    import matplotlib.pyplot as plt

    fig = plot_histogram(results, "t")
    try:
        assert [ax.get_title() for ax in fig.axes] == ["demo valid"]
    finally:
        plt.close(fig)
