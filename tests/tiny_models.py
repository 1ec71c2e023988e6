"""Tiny encoders written as `pmlm pretrain` writes them, an ESM-2 of tiny dims as transformers writes it, and FASTA /
CSV inputs, for the tests of the commands that run them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from pmlm.alphabet import RESIDUES
from pmlm.artefacts import write_encoder
from pmlm.model.config import ModelConfig
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model


def tiny_encoder(
    path: Path,
    objective: str = "pmlm",
    *,
    max_len: int = 18,
    num_layers: int = 2,
    pair_vocab: str = "standard",
    seed: int = 0,
) -> Path:
    """A randomly initialised encoder (hidden 16, window max_len - 2 residues) at ``path`` (+ model.json).

    The initial output layers are small, so every score would be close to zero; their weights are scaled
    up so that the quantities the tests compare differ visibly between classes and pairs.
    """
    torch.manual_seed(seed)
    cfg = ModelConfig(
        num_layers=num_layers, hidden=16, ffn=32, heads=2, max_len=max_len, dropout=0.0, pair_vocab=pair_vocab
    )
    objective_cfg = ObjectiveConfig(name=objective)
    model = build_model(cfg, objective_cfg)
    with torch.no_grad():
        for head in (model.token_head, model.pair_head):
            if head is not None:
                head.out.weight.mul_(50.0)
        if model.triple_head is not None:  # its three-way factors multiply: a smaller scale gives logits ~10
            model.triple_head.out.weight.mul_(5.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_encoder(
        path, model.state_dict(), {"model": model.cfg.to_dict(), "objective": dataclasses.asdict(objective_cfg)}
    )
    return path


def random_letters(length: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "".join(RESIDUES[k] for k in rng.integers(len(RESIDUES), size=length))


def write_fasta(path: Path, records: dict[str, str]) -> Path:
    path.write_text("".join(f">{name} some description\n{seq}\n" for name, seq in records.items()))
    return path


ESM_WINDOW = 96  # residues of make_esm2's encoders: max_position_embeddings 98 counts <cls> and <eos>


def make_esm2(folder: Path, seed: int = 0) -> Path:
    """An ESM-2 of tiny dims with random weights, as transformers writes it (rotary positions, pre-LN, token dropout,
    ESM-2's 33 tokens), the LM head's output scaled up so that residues differ visibly."""
    # transformers imported here: the other helpers' users (most inference tests) do not need it
    import transformers
    from transformers.models.esm.configuration_esm import get_default_vocab_list

    vocabulary = list(get_default_vocab_list())
    config = transformers.EsmConfig(
        vocab_size=len(vocabulary),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=ESM_WINDOW + 2,
        position_embedding_type="rotary",
        token_dropout=True,
        emb_layer_norm_before=False,
        layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=vocabulary.index("<pad>"),
        mask_token_id=vocabulary.index("<mask>"),
    )
    torch.manual_seed(seed)
    model = transformers.EsmForMaskedLM(config)
    with torch.no_grad():
        model.lm_head.dense.weight.mul_(20.0)
        model.esm.embeddings.word_embeddings.weight.mul_(20.0)
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocabulary))
    transformers.EsmTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    return folder
