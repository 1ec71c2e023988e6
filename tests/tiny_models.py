"""What the tests build and feed to the code under test: tiny encoders written as `pmlm pretrain` writes them, an ESM-2
of tiny dims as transformers writes it, small recipes, token batches, and input files in the formats the commands
read (FASTA, structure JSONL, PDB, ProteinGym's CSVs, a throughput result). Import with ``from tiny_models import
...`` (tests/ is on sys.path); no test module imports another."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import gzip
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pmlm.alphabet import CLS_ID, EOS_ID, FIRST_RESIDUE_ID, NUM_RESIDUES, PAD_ID, RESIDUES
from pmlm.artefacts import write_encoder
from pmlm.model.config import ModelConfig, PairVocab
from pmlm.model.heads import loss_precision
from pmlm.model.objectives import ObjectiveConfig
from pmlm.model.step_inputs import upper_pair_indices
from pmlm.pretrained import build_model

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"


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


def make_encoder(
    path: Path,
    objective: str = "pmlm",
    hidden: int = 32,
    max_len: int = 66,
    dropout: float = 0.0,
    seed: int = 0,
    attention_dropout: float = 0.1,
) -> Path:
    """A randomly initialised one-layer encoder written like `pmlm pretrain` writes its final weights, its output
    layers as initialised (for the tests that train on it; tiny_encoder's are scaled for the tests that score)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        num_layers=1, hidden=hidden, ffn=2 * hidden, heads=2, max_len=max_len, dropout=dropout,
        attention_dropout=attention_dropout,
    )  # fmt: skip
    objective_cfg = ObjectiveConfig(name=objective)
    model = build_model(cfg, objective_cfg)
    info = {"model": model.cfg.to_dict(), "objective": dataclasses.asdict(objective_cfg)}
    write_encoder(path, model.state_dict(), info)
    return path


# -- recipes small enough for CPU steps of a few milliseconds --------------------------------------------------------


def _changed(cfg: dict, changes: dict) -> dict:
    """``cfg`` with each ``section__key=value`` of ``changes`` set (sections made where missing)."""
    for key, value in changes.items():
        *sections, leaf = key.split("__")
        node = cfg
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return cfg


def recipe(**changes) -> dict:
    """A contact fine-tuning recipe, changed by ``section__key=value`` items."""
    cfg = {
        "task": "contact",
        "head": {"kind": "linear", "features": "M", "dropout": 0.5},
        "optim": {"head_lr": 1e-2, "lr": 1e-3, "warmup_steps": 2, "total_steps": 10},
        "data": {"batch_size": 4, "crop": 32},
        "log_every": 1,
        "save_every": 5,
        "keep_last_checkpoints": 20,
        "device": "cpu",
    }
    return _changed(cfg, changes)


def pretrain_recipe(**changes) -> dict:
    """A pre-training recipe of a one-layer model, dropout on (so a resume must restore the RNG), changed by
    ``section__key=value`` items."""
    cfg = {
        "model": {"preset": "tiny", "overrides": {"num_layers": 1, "hidden": 32, "ffn": 64, "heads": 2, "max_len": 64}},
        "optim": {"lr": 3e-3, "warmup_steps": 2, "total_steps": 10},
        "tokens_per_step": 512,
        "data": {"buffer_rows": 64, "num_workers": 1},
        "log_every": 1,
        "eval_every": 10,
        "eval_batches": 2,
        "save_every": 5,
        "keep_last_checkpoints": 20,
        "tensorboard": False,
        "device": "cpu",
    }
    return _changed(cfg, changes)


# -- masked pairs: the references the objectives' tests check the step's pair term against --------------------------


def upper_pairs(valid: torch.Tensor) -> torch.Tensor:
    """Unordered pairs of flagged positions of ``valid`` (B, L) in each row: (P, 3) rows (b, i, j), i < j, sorted."""
    pos = valid.nonzero()  # (N, 2) row-major
    first, second = upper_pair_indices(valid)
    return torch.stack([pos[first, 0], pos[first, 1], pos[second, 1]], dim=1)


def swap_pairs(pair_index: torch.Tensor) -> torch.Tensor:
    """(b, i, j) -> (b, j, i)."""
    return pair_index[:, [0, 2, 1]]


def diagonal_pairs(valid: torch.Tensor) -> torch.Tensor:
    """(N, 3) rows (b, i, i) for the flagged positions."""
    pos = valid.nonzero()
    return torch.stack([pos[:, 0], pos[:, 1], pos[:, 1]], dim=1)


def pair_labels(pair_index: torch.Tensor, targets: torch.Tensor, pair_vocab=PairVocab.STANDARD) -> torch.Tensor:
    """Class of each ordered pair (b, i, j) from residue-class targets (B, L); every row must have valid targets."""
    ti = targets[pair_index[:, 0], pair_index[:, 1]]
    tj = targets[pair_index[:, 0], pair_index[:, 2]]
    return pair_vocab.pair_class(ti, tj)


def masked_pair_loss(
    pair_logits: torch.Tensor, upper: torch.Tensor, targets: torch.Tensor, pair_vocab=PairVocab.STANDARD
):
    """``(ce_sum, n_pairs, n_correct)`` of pair logits (2P, K) in the mirrored head's row order: the rows of ``upper``
    (P, 3), then their swaps; ``targets`` (B, L) from ``mask_tokens``."""
    labels = torch.cat([pair_labels(upper, targets, pair_vocab), pair_labels(swap_pairs(upper), targets, pair_vocab)])
    ce_sum = F.cross_entropy(loss_precision(pair_logits), labels, reduction="sum")
    return ce_sum, labels.numel(), (pair_logits.argmax(dim=-1) == labels).sum()


# -- token batches ---------------------------------------------------------------------------------------------------


def mixed_batch(lengths: list[int], width: int, seed: int) -> torch.Tensor:
    """<cls> residues <eos> <pad>...: (B, width) with each row's residues given by ``lengths`` (0 = all-<pad> row)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    for row, n in enumerate(lengths):
        if n == 0:
            continue
        tokens[row, 0] = CLS_ID
        tokens[row, 1 : 1 + n] = torch.randint(FIRST_RESIDUE_ID, FIRST_RESIDUE_ID + NUM_RESIDUES, (n,), generator=g)
        tokens[row, 1 + n] = EOS_ID
    return tokens


def random_lengths(seed: int, rows: int, most: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, most + 1, (rows,), generator=g).tolist()


# -- structures ------------------------------------------------------------------------------------------------------

CLUSTER_SPACING = 20.0  # Angstrom between residue-type clusters: far beyond the 8 A contact threshold
CLUSTER_RADIUS = 2.5  # every C-beta lies this close to its type's centre, so same-type pairs are <= 5 A apart
SS_OF_TYPE = "HEC"  # residue type k gets DSSP state SS_OF_TYPE[k % 3]: learnable from the residue alone


def write_structures(path: Path, n: int, seed: int, lengths=(24, 48), types: int = 8) -> Path:
    """Structure JSONL whose contacts are exactly the pairs of identical residue types.

    Each residue type sits in its own cluster (C-beta within CLUSTER_RADIUS of the type's centre,
    centres CLUSTER_SPACING apart), so a pair is in contact iff both residues have the same type;
    the DSSP state is a function of the type too. Geometry is not protein-like, only learnable.
    """
    rng = np.random.default_rng(seed)
    alphabet = RESIDUES[:types]
    centres = np.arange(types)[:, None] * np.array([CLUSTER_SPACING, 0.0, 0.0])
    with open(path, "w") as fh:
        for k in range(n):
            length = int(rng.integers(lengths[0], lengths[1] + 1))
            kinds = rng.integers(types, size=length)
            direction = rng.normal(size=(length, 3))
            direction /= np.linalg.norm(direction, axis=1, keepdims=True)
            cb = centres[kinds] + direction * rng.uniform(0, CLUSTER_RADIUS, size=(length, 1))
            ca = cb + 1.5 * direction
            record = {
                "id": f"p{k}",
                "chain": "A",
                "start_resnum": 1,
                "seq": "".join(alphabet[t] for t in kinds),
                "dssp": "".join(SS_OF_TYPE[t % 3] for t in kinds),
                "ca": ca.round(3).tolist(),
                "cb": cb.round(3).tolist(),
            }
            fh.write(json.dumps(record) + "\n")
    return path


def demo_chains(n: int, max_len: int) -> list[dict]:
    """The first ``n`` chains of the demo's PDB sample (data/demo) of at most ``max_len`` residues."""
    out = []
    with gzip.open(DEMO / "pdb_chains_sample.jsonl.gz", "rt") as fh:
        for line in fh:
            record = json.loads(line)
            if len(record["seq"]) <= max_len:
                out.append(record)
            if len(out) == n:
                return out
    raise AssertionError("not enough short chains in the demo set")


def _atom(serial, name, resname, chain, resnum, xyz, record="ATOM"):
    element = name[0]
    label = f" {name:<3}" if len(name) < 4 else name
    return (
        f"{record:<6}{serial:>5} {label}{'':1}{resname:>3} {chain}{resnum:>4}{'':1}   "
        f"{xyz[0]:8.3f}{xyz[1]:8.3f}{xyz[2]:8.3f}{1.0:6.2f}{0.0:6.2f}          {element:>2}"
    )


def pdb_text() -> str:
    """A PDB file. Chain A: ALA, GLY (no CB), LYS, MSE (HETATM), TRP with C-alpha only; a water; chain B: one ALA."""
    lines, serial = [], 1
    residues = [
        ("ALA", "ATOM", "N CA C O CB"),
        ("GLY", "ATOM", "N CA C O"),
        ("LYS", "ATOM", "N CA C O CB"),
        ("MSE", "HETATM", "N CA C O CB"),
        ("TRP", "ATOM", "CA"),
    ]
    # ideal backbone: N-CA 1.458 A, CA-C 1.525 A, N-CA-C 111 degrees
    offsets = {
        "N": (-1.458, 0.0, 0.0),
        "CA": (0.0, 0.0, 0.0),
        "C": (0.546, 1.424, 0.0),
        "O": (0.2, 2.6, 0.0),
        "CB": (0.0, -0.8, 1.3),
    }
    for i, (resname, record, atoms) in enumerate(residues, start=1):
        for name in atoms.split():
            dx, dy, dz = offsets[name]
            lines.append(_atom(serial, name, resname, "A", i, (3.8 * i + dx, dy, dz), record))
            serial += 1
    lines.append(_atom(serial, "O", "HOH", "A", 101, (0.0, 9.0, 9.0), "HETATM"))
    lines.append(_atom(serial + 1, "CA", "ALA", "B", 1, (50.0, 0.0, 0.0)))
    return "\n".join([*lines, "END", ""])


# -- ProteinGym's files, as published --------------------------------------------------------------------------------

PROTEINGYM_FOLDER = "DMS_ProteinGym_substitutions"  # the folder of the published archive's CSV files
REFERENCE_COLUMNS = [
    "DMS_index",
    "DMS_id",
    "DMS_filename",
    "UniProt_ID",
    "taxon",
    "target_seq",
    "seq_len",
    "coarse_selection_type",
]


def write_reference(path: Path, assays: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=REFERENCE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for k, a in enumerate(assays):
            writer.writerow(
                {
                    "DMS_index": f"DMS_sub_{k}",
                    "taxon": "Human",
                    "seq_len": len(a["target_seq"]),
                    "DMS_filename": f"{a['DMS_id']}.csv",
                    **a,
                }
            )
    return path


def write_zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(f"{PROTEINGYM_FOLDER}/{name}", text)
    return path


def mutated(target: str, mutant: str) -> str:
    letters = list(target)
    for part in mutant.split(":"):
        letters[int(part[1:-1]) - 1] = part[-1]
    return "".join(letters)


def assay_text(target: str, mutants: list[str], *, seq_of=None) -> str:
    lines = ["mutant,mutated_sequence,DMS_score,DMS_score_bin"]
    for k, m in enumerate(mutants):
        seq = seq_of(m) if seq_of else mutated(target, m)
        lines.append(f"{m},{seq},{0.1 * k - 1:.2f},{k % 2}")
    return "\n".join(lines) + "\n"


# -- a GPU check's throughput result ---------------------------------------------------------------------------------

CARD = "NVIDIA H100 80GB HBM3"
DAY = "2026-11-28"  # the result file's date (its modification time: the bench records none)


def result_file(path, device=CARD, rows=None):
    """A `bench/gpu_throughput` result file of ``device`` dated DAY: its rows, or a few of each kind."""
    rows = rows or [
        {"dims": "base", "model": "ours", "objective": "pmlm", "layout": "packed", "compiled": False,
         "micro_tokens": 131072, "non_pad_tokens_per_s": 600000, "mfu": 0.41},
        {"dims": "base", "model": "ours", "objective": "pmlm", "layout": "padded", "compiled": False,
         "micro_tokens": 65536, "non_pad_tokens_per_s": 500000, "mfu": 0.35},
        {"dims": "base", "model": "ours", "objective": "mlm", "layout": "packed", "micro_tokens": 131072,
         "out_of_memory": True},
        {"dims": "base", "model": "hf_esm", "objective": "mlm", "layout": "hf-default", "non_pad_tokens_per_s": 1e6},
    ]  # fmt: skip
    path.write_text(json.dumps({"bench": "gpu_throughput", "device": device, "torch": "2.11.0+cu130", "rows": rows}))
    noon = datetime.datetime.fromisoformat(f"{DAY}T12:00").timestamp()
    os.utime(path, (noon, noon))
    return path
