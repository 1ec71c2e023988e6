"""Hugging Face both ways (docs/huggingface.md).

* ``pmlm export``: the folder loads in ``transformers`` (RobertaForMaskedLM for the MLM family, our own class with
  trust_remote_code for the others) and computes what our encoder computes, layer by layer, for tiny random
  encoders and for the encoders imported from the fairseq-made fixture (tests/data/released, checked against what
  fairseq computed); ``pmlm import`` of the folder gives the exported tensors back exactly.
* ``pmlm import`` of an ESM-2 of tiny dims made here with ``transformers`` (random weights, ``save_pretrained``): its
  masked marginals are ``EsmForMaskedLM``'s own at the masked site, and it fine-tunes, evaluates, embeds, predicts
  contacts through a fine-tuned head and feeds the tables, through the commands and through the workflow.
* Bad folders: one line naming the file, exit 2, nothing written.

Tolerances: our encoder and ``transformers``' modules do the same fp32 arithmetic in other orders (fused q/k/v
against three projections, the pair head's split first layer against one Linear on the concatenation, attention
kernels), so values may differ by the rounding of their sums, which grows with depth (conftest.layer_tolerance).
The ESM encoder runs ``transformers``' module itself, so its representations are those of ``transformers`` exactly;
only our 20-residue token head reorders sums (test ``esm_score_tolerance``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
import yaml
from conftest import RELEASED_FIXTURE as FIXTURE
from conftest import REPO, job_counts, layer_tolerance, our_tokens, reorder_tolerance, snakemake
from safetensors.torch import load_file, save_file
from tiny_models import ESM_WINDOW, demo_chains, make_esm2
from transformers.models.esm.configuration_esm import get_default_vocab_list
from workflow_rules import workflow_config

from pmlm import alphabet
from pmlm.artefacts import write_encoder
from pmlm.cli import main
from pmlm.errors import ConfigError
from pmlm.fairseq_checkpoint import import_checkpoint
from pmlm.model.config import model_config
from pmlm.model.objectives import ObjectiveConfig
from pmlm.pretrained import build_model, load_encoder
from pmlm.tokens import batch_tokens

SEQUENCES = ["MKTAYIAKQRQISFVKSHFSRQLEERLG", "GSHMLEDPVDAFQ", "ACDEFGHIKLMNPQRSTVWY"]


# -- helpers ---------------------------------------------------------------------------------------------------


def tokens_of(sequences: list[str]) -> torch.Tensor:
    """Our batch layout: <cls> residues <eos>, right-padded with <pad>."""
    return torch.from_numpy(batch_tokens([alphabet.encode(s) for s in sequences]).tokens).long()


def our_states(model, tokens: torch.Tensor) -> tuple[list[torch.Tensor], dict]:
    """Every layer's output (the embeddings first, as transformers' hidden_states) and the forward's outputs."""
    states = []
    hooks = [model.encoder.dropout.register_forward_hook(lambda m, i, o: states.append(o))]
    hooks += [layer.register_forward_hook(lambda m, i, o: states.append(o)) for layer in model.encoder.layers]
    model.encoder.attention = "padded"
    with torch.no_grad():
        out = model(tokens)
    for hook in hooks:
        hook.remove()
    return states, out


def tiny_encoder(root: Path, objective: str, seed: int = 0, **overrides) -> Path:
    """A random encoder with the objective's layers (pmlm.model.config), written as pmlm pretrain writes it; the
    heads' output layers scaled up so that classes differ visibly."""
    torch.manual_seed(seed)
    cfg = model_config("tiny", objective, max_len=40, **overrides)
    model = build_model(cfg, ObjectiveConfig(name=objective))
    with torch.no_grad():
        for head in (model.token_head, model.pair_head):
            if head is not None:
                head.out.weight.mul_(30.0)
    info = {"model": model.cfg.to_dict(), "objective": {"name": objective}, "step": 7, "final_scores": {"step": 7}}
    return write_encoder(root / "model.safetensors", model.state_dict(), info)[0]


def assert_parity(model, hf_out, tokens: torch.Tensor, cfg) -> float:
    """Hidden states of every layer and the token logits at the real tokens; returns the largest error seen."""
    real = tokens.ne(alphabet.PAD_ID)
    states, out = our_states(model, tokens)
    worst = 0.0
    assert len(hf_out.hidden_states) == len(states) == cfg.num_layers + 1
    for depth, (ours, theirs) in enumerate(zip(states, hf_out.hidden_states)):
        tol = layer_tolerance(ours, depth + 1, cfg)
        np.testing.assert_allclose(theirs[real], ours[real], rtol=0, atol=tol)
        worst = max(worst, float((theirs[real] - ours[real]).abs().max()))
    if out["logits"] is not None:
        logits = hf_out.logits[..., alphabet.FIRST_RESIDUE_ID : alphabet.FIRST_RESIDUE_ID + alphabet.NUM_RESIDUES]
        tol = layer_tolerance(out["logits"], cfg.num_layers + 2, cfg)
        np.testing.assert_allclose(logits[real], out["logits"][real], rtol=0, atol=tol)
        others = torch.ones(hf_out.logits.shape[-1], dtype=torch.bool)
        others[alphabet.FIRST_RESIDUE_ID : alphabet.FIRST_RESIDUE_ID + alphabet.NUM_RESIDUES] = False
        assert torch.isneginf(hf_out.logits[..., others]).all()  # our head predicts residues only
        worst = max(worst, float((logits[real] - out["logits"][real]).abs().max()))
    return worst


def all_pairs(tokens: torch.Tensor) -> torch.Tensor:
    """(P, 3) rows (b, i, j), i != j, over the residue positions of every row."""
    rows = []
    for b, row in enumerate(tokens):
        residues = [int(i) for i in (row >= alphabet.FIRST_RESIDUE_ID).nonzero().flatten()]
        rows += [(b, i, j) for i in residues for j in residues if i != j]
    return torch.tensor(rows)


def load_hf(folder: Path, remote: bool):
    kwargs = {"trust_remote_code": True} if remote else {}
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder, **kwargs).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
    return model, tokenizer


# -- export: the MLM family onto a stock RoBERTa ------------------------------------------------------------------


def test_an_mlm_encoder_exports_as_a_stock_roberta(tmp_path, capsys):
    weights = tiny_encoder(tmp_path / "mlm", "mlm")
    out = tmp_path / "mlm_hf"
    assert main(["export", str(weights), "-o", str(out)]) == 0
    assert "RobertaForMaskedLM" in capsys.readouterr().err
    assert not (out / "modeling_pmlm.py").exists()  # no remote code
    model, tokenizer = load_hf(out, remote=False)
    assert type(model).__name__ == "RobertaForMaskedLM"
    batch = tokenizer(SEQUENCES, return_tensors="pt", padding=True)
    tokens = tokens_of(SEQUENCES)
    assert torch.equal(batch["input_ids"], tokens)  # our token ids, our layout
    assert torch.equal(batch["attention_mask"].bool(), tokens.ne(alphabet.PAD_ID))
    ours, info, _ = load_encoder(weights)
    with torch.no_grad():
        theirs = model(**batch, output_hidden_states=True)
    assert_parity(ours, theirs, tokens, ours.cfg)
    section = json.loads((out / "config.json").read_text())["pmlm"]
    assert section["layout"] == "roberta" and section["objective"]["name"] == "mlm"
    assert section["model"] == ours.cfg.to_dict() and section["step"] == info["step"]


def test_the_exported_tokenizer_gives_one_token_per_residue_as_pmlm_reads_it(tmp_path):
    """EsmTokenizer made one <unk> of a run of unknown letters (MKBZT: 4 tokens for 5 residues); the exported
    tokenizer reads every character as one token, letters as pmlm embed --unknown x reads them (lowercase as
    uppercase, B J O U Z as X), and loads without remote code."""
    from pmlm.inference.sequences import check_sequence

    out = tmp_path / "hf"
    assert main(["export", str(tiny_encoder(tmp_path / "mlm", "mlm")), "-o", str(out)]) == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)  # no trust_remote_code, offline
    cls, eos, unk, mask = alphabet.CLS_ID, alphabet.EOS_ID, alphabet.UNK_ID, alphabet.MASK_ID
    ids = tokenizer(["MKBZT", "mkbzt", "MKXXT", "MkBzT"])["input_ids"]
    assert ids[0] == [cls, *(alphabet.TOKEN_TO_ID[c] for c in "MKXXT"), eos]
    assert ids[0] == ids[1] == ids[2] == ids[3]
    assert ids[0][1:-1] == check_sequence("in.fasta", "a", "mkbzt", 1, unknown="x").residues.tolist()
    # every other character is one <unk>; specials written in the text are tokens; whitespace is dropped
    assert tokenizer("M K*-1<mask>T")["input_ids"] == [cls, 14, 12, unk, unk, unk, mask, 20, eos]
    assert tokenizer.decode(ids[1], skip_special_tokens=True) == "MKXXT"
    batch = tokenizer(["MKT", "MKBZTAA"], padding=True, return_tensors="pt")
    assert "token_type_ids" not in batch and batch["input_ids"][0, -1] == alphabet.PAD_ID
    assert torch.equal(batch["input_ids"][1], tokens_of(["MKXXTAA"])[0])
    assert not (out / "vocab.txt").exists()


# -- export: PMLM, pair-only, TMLM, pre-LN as our own class -----------------------------------------------------


@pytest.mark.parametrize(
    "objective, overrides",
    [
        ("pmlm", {}),
        ("pmlm_pair_only", {}),
        ("tmlm", {"triple_rank": 4}),
        ("pmlm", {"norm": "pre", "pair_unary": True, "product_base": True}),
    ],
    ids=["pmlm", "pair-only", "tmlm", "pmlm-pre-ln-unary-product"],
)
def test_pair_encoders_export_as_our_class_with_their_heads(tmp_path, objective, overrides):
    weights = tiny_encoder(tmp_path / "enc", objective, **overrides)
    out = tmp_path / f"{objective}_{len(overrides)}_hf"
    assert main(["export", str(weights), "-o", str(out)]) == 0
    assert (out / "modeling_pmlm.py").is_file()
    model, tokenizer = load_hf(out, remote=True)
    assert type(model).__name__ == "PmlmForMaskedLM"
    batch = tokenizer(SEQUENCES, return_tensors="pt", padding=True)
    tokens = tokens_of(SEQUENCES)
    assert torch.equal(batch["input_ids"], tokens)
    ours, _, _ = load_encoder(weights)
    cfg = ours.cfg
    pairs = all_pairs(tokens)
    with torch.no_grad():
        theirs = model(**batch, pair_index=pairs, output_hidden_states=True)
        mine = ours(tokens, pair_index=pairs, return_pair_repr=True)
    assert_parity(ours, theirs, tokens, cfg)
    real = tokens.ne(alphabet.PAD_ID)
    np.testing.assert_allclose(
        theirs.last_hidden_state[real],
        mine["representations"][real],
        rtol=0,
        atol=layer_tolerance(mine["representations"], cfg.num_layers + 1, cfg),
    )
    # the pair head's logits and M+ of every ordered pair of residues (the class layout is ours)
    tol = layer_tolerance(mine["pair_logits"], cfg.num_layers + 2, cfg)
    np.testing.assert_allclose(theirs.pair_logits, mine["pair_logits"], rtol=0, atol=tol)
    np.testing.assert_allclose(
        theirs.pair_representation,
        mine["pair_repr"],
        rtol=0,
        atol=layer_tolerance(mine["pair_repr"], cfg.num_layers + 2, cfg),
    )
    assert theirs.pair_logits.shape == (len(pairs), cfg.pair_classes)
    if objective == "tmlm":
        triples = torch.tensor([[0, 1, 5, 9], [1, 2, 3, 4], [2, 1, 10, 20]])
        with torch.no_grad():
            mine_t = ours(tokens, triple_index=triples)["triple_logits"]
            theirs_t = model(**batch, triple_index=triples).triple_logits
        np.testing.assert_allclose(theirs_t, mine_t, rtol=0, atol=layer_tolerance(mine_t, cfg.num_layers + 3, cfg))


@pytest.mark.parametrize("objective", ["mlm", "pmlm"])
def test_export_then_import_gives_the_encoder_back_exactly(tmp_path, objective):
    weights = tiny_encoder(tmp_path / "enc", objective, seed=3)
    assert main(["export", str(weights), "-o", str(tmp_path / "hf")]) == 0
    assert main(["import", str(tmp_path / "hf"), "-o", str(tmp_path / "back"), "--objective", objective]) == 0
    before, after = load_file(weights), load_file(tmp_path / "back" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    info_before = json.loads(weights.with_suffix(".json").read_text())
    info_after = json.loads((tmp_path / "back" / "model.json").read_text())
    assert info_after["model"] == info_before["model"] and info_after["objective"] == info_before["objective"]
    assert info_after["exported"]["encoder_sha256"] == __import__("hashlib").sha256(weights.read_bytes()).hexdigest()
    # a folder changed after export (here: its position table) is no longer our encoder
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    name = "encoder.positions" if objective == "pmlm" else "roberta.embeddings.position_embeddings.weight"
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, tmp_path / "hf" / "model.safetensors")
    assert main(["import", str(tmp_path / "hf"), "-o", str(tmp_path / "changed")]) == 2
    assert not (tmp_path / "changed").exists()


# -- export of the encoders imported from the fairseq-made fixture ----------------------------------------------


@pytest.mark.parametrize("name, remote", [("mlm", False), ("pmlm", True)])
def test_released_fixture_encoders_compute_in_transformers_what_fairseq_computed(tmp_path, name, remote):
    """The chain fairseq checkpoint -> pmlm import -> pmlm export -> transformers, against fairseq's own outputs."""
    weights = import_checkpoint(FIXTURE / f"{name}_tiny.pt", tmp_path / "enc")
    assert main(["export", str(weights), "-o", str(tmp_path / f"released_{name}")]) == 0
    model, _ = load_hf(tmp_path / f"released_{name}", remote)
    ref = load_file(FIXTURE / f"{name}_tiny_reference.safetensors")
    tokens = our_tokens(ref["src_tokens"])
    real = tokens.ne(alphabet.PAD_ID)
    cfg = load_encoder(weights)[0].cfg
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=real.long(), output_hidden_states=True)
    for depth, (theirs, fairseq) in enumerate(zip(out.hidden_states, ref["hidden_states"])):
        # two reorderings now: ours against fairseq (test_import) and transformers' against ours
        tol = 2 * layer_tolerance(fairseq, depth + 1, cfg)
        np.testing.assert_allclose(theirs[real], fairseq[real], rtol=0, atol=tol)
    dictionary = json.loads((FIXTURE / "provenance.json").read_text())["models"][name]["dictionary"]
    fairseq_logits = ref["token_logits"][..., [dictionary.index(r) for r in alphabet.RESIDUES]]
    logits = out.logits[..., alphabet.FIRST_RESIDUE_ID : alphabet.FIRST_RESIDUE_ID + alphabet.NUM_RESIDUES]
    tol = 2 * layer_tolerance(fairseq_logits, cfg.num_layers + 2, cfg)
    np.testing.assert_allclose(logits[real], fairseq_logits[real], rtol=0, atol=tol)
    section = json.loads((tmp_path / f"released_{name}" / "config.json").read_text())["pmlm"]
    assert section["layout"] == ("pmlm" if remote else "roberta")
    checkpoint = FIXTURE / f"{name}_tiny.pt"
    assert section["source"]["sha256"] == __import__("hashlib").sha256(checkpoint.read_bytes()).hexdigest()
    assert section["objective"]["name"] == name and section["model"]["positions"] == "fairseq"


# -- ESM-2 through transformers ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def esm2(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("esm2")
    source = make_esm2(root / "esm2_tiny")
    assert main(["import", str(source), "-o", str(root / "encoder"), "--objective", "mlm"]) == 0
    return {"root": root, "source": source, "encoder": root / "encoder" / "model.safetensors"}


def test_an_esm2_folder_imports_as_an_encoder_with_its_provenance(esm2):
    info = json.loads(esm2["encoder"].with_suffix(".json").read_text())
    assert info["model"] == {
        "architecture": "esm",
        "num_layers": 2,
        "hidden": 32,
        "ffn": 64,
        "heads": 4,
        "max_len": ESM_WINDOW + 2,
        "token_head": True,
        "pair_head": False,
        "triple_head": False,
    }
    assert info["objective"]["name"] == "mlm"
    source = info["source"]
    weights = esm2["source"] / "model.safetensors"
    assert source["sha256"] == __import__("hashlib").sha256(weights.read_bytes()).hexdigest()
    assert source["architectures"] == ["EsmForMaskedLM"] and source["position_embedding_type"] == "rotary"
    # the encoder's folder is a transformers folder too
    model = transformers.EsmForMaskedLM.from_pretrained(esm2["encoder"].parent)
    original = transformers.EsmForMaskedLM.from_pretrained(esm2["source"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), original.state_dict().values()))


def esm_reference(source: Path, sequences: list[str], masked: dict[int, int] | None = None):
    """transformers' own EsmForMaskedLM on ESM's own token ids (its tokenizer), ``masked``: row -> residue index
    (1-based) set to <mask>."""
    model = transformers.EsmForMaskedLM.from_pretrained(source).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    batch = tokenizer(sequences, return_tensors="pt", padding=True)
    for row, site in (masked or {}).items():
        batch["input_ids"][row, site] = tokenizer.mask_token_id
    with torch.no_grad():
        return model(**batch, output_hidden_states=True), tokenizer, batch


def test_esm2_representations_are_transformers_own(esm2):
    encoder, _, _ = load_encoder(esm2["encoder"])
    tokens = tokens_of(SEQUENCES)
    tokens[0, 5] = alphabet.MASK_ID  # token dropout: a masked row rescales its embeddings
    reference, _, batch = esm_reference(esm2["source"], SEQUENCES, {0: 5})
    states, out = our_states(encoder, tokens)
    real = batch["attention_mask"].bool()
    # the same module on the same ids: the same values (the layers' outputs come before the final LayerNorm)
    assert torch.equal(out["representations"][real], reference.hidden_states[-1][real])
    for ours, theirs in zip(states[1:-1], reference.hidden_states[1:-1]):
        assert torch.equal(ours[real], theirs[real])


def esm_score_tolerance(logits: torch.Tensor, hidden: int) -> float:
    """A masked marginal log P(mt) - log P(wt) is a difference of two logits in exact arithmetic, whichever
    residues the softmax runs over (ours: 20, transformers': 33 tokens); our head reorders the dense and decoder
    sums (2 C terms) and the normaliser cancels up to the rounding of log-sum-exp over the vocabulary."""
    return 2 * reorder_tolerance(logits, 2 * hidden + len(get_default_vocab_list()))


def test_esm2_masked_marginals_are_transformers_forward_at_the_masked_site(esm2, tmp_path):
    sequence = SEQUENCES[0]
    (tmp_path / "wt.fasta").write_text(f">wt\n{sequence}\n")
    mutants = ["M1A", "K2R", "A4W", "G28P"]
    (tmp_path / "muts.csv").write_text("mutant\n" + "\n".join(mutants) + "\n")
    args = ["--sequence", str(tmp_path / "wt.fasta"), "--mutations", str(tmp_path / "muts.csv"), "--device", "cpu"]
    assert main(["score", str(esm2["encoder"].parent), *args, "-o", str(tmp_path / "s.tsv")]) == 0
    table = pd.read_csv(tmp_path / "s.tsv", sep="\t")
    for row, mutant in zip(table.itertuples(), mutants):
        site = int(mutant[1:-1])
        reference, tokenizer, _ = esm_reference(esm2["source"], [sequence], {0: site})
        logits = reference.logits[0, site]
        log_p = torch.log_softmax(logits.double(), dim=-1)
        expected = float(
            log_p[tokenizer.convert_tokens_to_ids(mutant[-1])] - log_p[tokenizer.convert_tokens_to_ids(mutant[0])]
        )
        assert abs(row.score - expected) <= esm_score_tolerance(logits, 32), (mutant, row.score, expected)
        assert row.kind == "single"
    assert len({round(s, 3) for s in table["score"]}) == len(mutants)  # the scores differ: a real comparison


def write_chains(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    chains = demo_chains(20, ESM_WINDOW)
    paths = {}
    for split, rows in (("train", chains[:12]), ("valid", chains[12:15]), ("test", chains[15:])):
        paths[split] = folder / f"chains_{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def test_esm2_finetunes_evaluates_embeds_and_predicts_contacts_through_the_commands(esm2, tmp_path):
    data = write_chains(tmp_path / "data")
    encoder = str(esm2["encoder"])
    short = ["--set", "optim.total_steps=3", "--set", "optim.warmup_steps=1", "--set", "data.batch_size=4"]
    short += ["--set", "data.crop=64"]
    results = {}
    for name, recipe, extra in (
        ("contact", "contact_linear_tiny.yaml", []),
        ("ss3", "ss3_tiny.yaml", ["--set", "freeze_encoder=false"]),  # the trunk trains and is saved with the head
    ):
        run = tmp_path / name
        head = run / "head.safetensors"
        args = ["finetune", "--config", str(REPO / "config" / "finetune" / recipe), "--encoder", encoder]
        args += ["--train", str(data["train"]), "--valid", str(data["valid"]), "--out", str(run / "run")]
        args += ["--final", str(head), "--set", "device=cpu", *short, *extra]
        code = main(args)
        assert code == 0
        results[name] = tmp_path / f"{name}.tsv"
        args = ["evaluate", "--head", str(head), "--test", f"t={data['test']}", "--out", str(results[name])]
        assert main([*args, "--model", "ESM2-tiny", "--device", "cpu"]) == 0
        assert json.loads(head.with_suffix(".json").read_text())["features"] == "M"
    trained = load_file(tmp_path / "ss3" / "head.safetensors")
    assert any(k.startswith("encoder.encoder.esm.") for k in trained)  # full fine-tuning kept the trunk's weights
    args = [
        "tables",
        "results",
        "--result",
        f"tape_contact={results['contact']}",
        "--out-dir",
        str(tmp_path / "tables"),
    ]
    assert main([*args, "--result", f"secondary_structure={results['ss3']}"]) == 0
    assert "| ours | ESM2-tiny |" in (tmp_path / "tables" / "tape_contact.md").read_text()
    assert "| ours | ESM2-tiny |" in (tmp_path / "tables" / "secondary_structure.md").read_text()
    fasta = tmp_path / "q.fasta"
    fasta.write_text(f">q\n{SEQUENCES[0]}\n")
    head = tmp_path / "contact" / "head.safetensors"
    assert (
        main(["contacts", encoder, str(fasta), "-o", str(tmp_path / "maps"), "--head", str(head), "--device", "cpu"])
        == 0
    )
    scores = np.load(tmp_path / "maps" / "q.npz")["scores"]
    assert (
        scores.shape == (len(SEQUENCES[0]),) * 2 and np.isfinite(scores).all() and ((scores > 0) & (scores < 1)).all()
    )
    assert main(["embed", encoder, str(fasta), "-o", str(tmp_path / "e.parquet"), "--device", "cpu"]) == 0
    emb = np.stack(pd.read_parquet(tmp_path / "e.parquet")["embedding"].to_numpy())
    reference, _, _ = esm_reference(esm2["source"], [SEQUENCES[0]])
    np.testing.assert_array_equal(emb, reference.hidden_states[-1][0, 1 : len(SEQUENCES[0]) + 1].numpy())


# -- the workflow: an ESM-2 row beside ours ----------------------------------------------------------------------


def esm_config(source: str, data: dict[str, Path]) -> dict:
    return {
        "run": "esm",
        "pretrain": {
            "models": [
                {
                    "dataset": "ur50d",
                    "objective": "mlm",
                    "preset": "esm2_tiny",
                    "release": {"huggingface": source, "size": 4 * 40_000},
                }
            ]
        },
        # the workflow takes task files a user provides from resources/local
        "task_data": {"chains": {"files": {s: {"path": f"resources/local/{p.name}"} for s, p in data.items()}}},
        "finetune": {
            "recipes": {"contact": "config/finetune/contact_linear_tiny.yaml", "ss3": "config/finetune/ss3_tiny.yaml"},
            "runs": {
                "contact": {"recipe": "contact", "data": "chains", "table": "tape_contact", "tests": {"t": "test"}},
                "ss3": {"recipe": "ss3", "data": "chains", "table": "secondary_structure", "tests": {"t": "test"}},
            },
            "set": {
                "optim.total_steps": 3,
                "optim.warmup_steps": 1,
                "data.batch_size": 4,
                "data.crop": 64,
                "device": "cpu",
            },
            "unsupervised": {"readouts": []},
            "test_label": "five demo chains",
        },
    }


def test_the_workflow_plans_an_esm2_row_from_a_folder_or_a_hub_id(tmp_path, esm2):
    data = write_chains(tmp_path / "resources" / "local")
    for source in (str(esm2["source"]), "facebook/esm2_t6_8M_UR50D"):
        config = esm_config(source, data)
        if "/" in source and not Path(source).exists():
            config["pretrain"]["models"][0]["release"]["revision"] = "c731040f"
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
        proc = snakemake("-n", "-p", "--configfile", str(tmp_path / "c.yaml"), "--directory", str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        counts = job_counts(proc.stdout)
        assert counts["import_huggingface"] == 1 and "import_release" not in counts and "pretrain" not in counts
        assert counts["finetune"] == 2 and counts["evaluate"] == 2 and counts["aggregate_tables"] == 1
        line = next(x for x in proc.stdout.splitlines() if "-m pmlm import" in x)
        assert f"python -m pmlm import {source} -o results/esm/pretrain/ur50d/mlm-esm2_tiny --objective mlm" in line
        assert ("--revision c731040f" in line) == (source.startswith("facebook/"))


def test_a_transformers_release_must_be_an_mlm_encoder():
    config = {
        "pretrain": {
            "models": [{"dataset": "d", "objective": "pmlm", "preset": "p", "release": {"huggingface": "x", "size": 4}}]
        }
    }
    with pytest.raises(ConfigError, match=r"config.pretrain.models\[0\].objective: a transformers model"):
        workflow_config.check_references(config)


@pytest.mark.slow
def test_the_esm2_dag_runs_import_finetune_evaluate_tables(tmp_path, esm2):
    data = write_chains(tmp_path / "resources" / "local")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(esm_config(str(esm2["source"]), data)))
    where = ("-s", str(REPO / "Snakefile"), "--directory", str(tmp_path))
    proc = snakemake("--cores", "2", *where, "--configfile", str(tmp_path / "c.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results" / "esm"
    encoder = results / "pretrain" / "ur50d" / "mlm-esm2_tiny"
    assert json.loads((encoder / "model.json").read_text())["model"]["architecture"] == "esm"
    tables = {
        t: (results / "tables" / f"{t}.md").read_text()
        for t in ("tape_contact", "secondary_structure", "pretrain_scores")
    }
    assert "| ours | MLM-esm2_tiny | ur50d | linear | M | t |" in tables["tape_contact"]
    assert "| ours | MLM-esm2_tiny | ur50d | mlp | M |" in tables["secondary_structure"]
    params = sum(t.numel() for t in load_file(encoder / "model.safetensors").values())
    assert f"| ours | MLM-esm2_tiny | ur50d | {params / 1e3:.0f}K |" in tables["pretrain_scores"]


# -- bad folders: one line, exit 2, nothing written ---------------------------------------------------------------


def _refused(source: Path, out: Path, message: str, capsys, command: str = "import") -> None:
    assert main([command, str(source), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pmlm {command}: error: "), err
    assert message in err, err
    assert not out.exists(), list(out.iterdir())


def test_bad_folders_are_one_line_and_write_nothing(tmp_path, esm2, capsys):
    import shutil

    out = tmp_path / "out"
    empty = tmp_path / "not_a_model"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello\n")
    _refused(empty, out, f"{empty}: not a transformers model folder (no config.json)", capsys)

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    _refused(bert, out, "unsupported architecture: model_type 'bert' (BertForMaskedLM)", capsys)

    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(esm2["source"], no_tokenizer)
    (no_tokenizer / "vocab.txt").unlink()
    _refused(no_tokenizer, out, f"{no_tokenizer / 'vocab.txt'}: missing: an ESM folder needs its tokenizer", capsys)

    wrong_shapes = tmp_path / "wrong_shapes"
    shutil.copytree(esm2["source"], wrong_shapes)
    config = json.loads((wrong_shapes / "config.json").read_text())
    config["intermediate_size"] = 48
    (wrong_shapes / "config.json").write_text(json.dumps(config))
    _refused(
        wrong_shapes,
        out,
        "weights do not match config.json (6 tensors, e.g. esm.encoder.layer.0.intermediate.dense.bias",
        capsys,
    )

    missing_tensor = tmp_path / "missing_tensor"
    shutil.copytree(esm2["source"], missing_tensor)
    tensors = load_file(missing_tensor / "model.safetensors")
    del tensors["lm_head.dense.weight"]
    save_file(tensors, missing_tensor / "model.safetensors", metadata={"format": "pt"})
    _refused(missing_tensor, out, "1 tensors missing, e.g. lm_head.dense.weight", capsys)

    _refused(tmp_path / "nowhere" / "x", out, "no such checkpoint file", capsys)  # neither folder nor hub id
    _refused(esm2["source"], out, "a transformers folder, not a pmlm encoder: pmlm import it first", capsys, "export")
