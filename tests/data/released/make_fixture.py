"""Make the released-format fixture of tests/test_import.py with the real implementation (see README.md here).

Runs OUTSIDE this project's environment: in a scratch virtualenv with fairseq and the released PMLM plugin
(microsoft/Mu-Protein, folder pmlm/src/protein), neither of which this project installs or contains:

    PLUGIN=/path/to/Mu-Protein/pmlm/src/protein
    /path/to/fairseq-venv/bin/python tests/data/released/make_fixture.py --plugin "$PLUGIN" --out tests/data/released

For each of two tiny models of the released families (``prot_pmlm``, as pmlm_650m.pt; ``prot_mlm``, the MLM
baseline) it builds the model through fairseq's own argument parser, task and model registry with the plugin's
architecture, draws random weights, saves a checkpoint in fairseq 0.10.2's ``save_state`` layout and writes what
the model computes on three sequences: every layer's hidden states, the token logits, and (PMLM) the pair logits
of the ordered pairs of a few marked positions, by the plugin's own training path (``masked_tokens``).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from argparse import Namespace
from pathlib import Path

import torch
from safetensors.torch import save_file

SEED = 20240521
# the sequences (residue letters; "#" marks a <mask> token) and the positions of the pairs (token positions,
# <s> = 0) whose joint the PMLM fixture records
SEQUENCES = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPV#RLQEWAKX", "MADQLTEEQIAEFKEAFSLFDKDGDGTITTKEL"]
MARKED = [[2, 5, 9, 17], [1, 4, 10, 13], [3, 7, 20, 30]]
DIMS = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "4", "--max-positions", "128", "--tokens-per-sample", "128"]
MODELS = {
    # the released pmlm_650m.pt: pmlm/script/pretrain.sh's task, criterion and arch, here with tiny dims
    "pmlm": ["--task", "prot_pmlm", "--criterion", "prot_pmlm", "--arch", "prot_pmlm_1b", "--pretrain-task", "pcomb",
             "--dropout", "0.1", "--weight-decay", "0.01", "--optimizer", "adam", "--lr", "0.0001"],
    # the MLM baseline of the same code (tied input/output embeddings, embedding LayerNorm, GELU, sentence head)
    "mlm": ["--task", "prot_mlm", "--criterion", "prot_mlm", "--arch", "prot_mlm_base",
            "--optimizer", "adam", "--lr", "0.0001"],
}


def build(plugin: Path, data_dir: Path, extra: list[str]):
    from fairseq import options, tasks, utils

    utils.import_user_module(Namespace(user_dir=str(plugin)))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data_dir), "--user-dir", str(plugin), *DIMS, *extra])
    task = tasks.setup_task(args)
    model = task.build_model(args)
    return args, task, model


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter random (LayerNorm scales near 1), so a swapped or misplaced tensor changes the outputs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(noise / math.sqrt(max(p.shape[-1], 1)) if p.dim() > 1 else 0.2 * noise)


def plain(x):
    """What fairseq 0.10.2's save_state does to the state before torch.save (utils.move_to_cpu): dicts become plain
    dicts, lists and tuples keep their kind, half-precision tensors become fp32, everything moves to the CPU."""
    if torch.is_tensor(x):
        return (x.float() if x.dtype in (torch.float16, torch.bfloat16) else x).cpu()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(plain(v) for v in x)
    return x


def training_metrics():
    """fairseq's metrics.state_dict() after a few logged values, as its trainer stores it in extra_state."""
    from fairseq.logging import metrics

    metrics.reset()
    with metrics.aggregate("train"):
        metrics.log_scalar("loss", torch.tensor(4.25), weight=8, round=5)
        metrics.log_scalar("loss_scale", 16.0, priority=700, round=4)
        metrics.log_start_time("train_wall", priority=800, round=0)
        metrics.log_stop_time("train_wall")
    return metrics.state_dict()


def save_released_layout(path: Path, args, model, criterion_name: str, optimizer_state: dict | None) -> None:
    state = {
        "args": args,
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": criterion_name, "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": 3.1875}, "num_updates": 1234}],
        "extra_state": {"train_iterator": {"version": 2, "epoch": 3, "iterations_in_epoch": 17, "shuffle": True},
                        "val_loss": 3.1875, "best": 3.1875, "metrics": training_metrics(),
                        "previous_training_time": 321.5},
    }
    if optimizer_state is not None:  # save_state adds it unless --no-save-optimizer-state
        state["last_optimizer_state"] = optimizer_state
    torch.save(plain(state), path)


def tokens_of(dictionary, sequence: str) -> list[int]:
    body = [dictionary.index("<mask>") if c == "#" else dictionary.index(c) for c in sequence]
    return [dictionary.bos(), *body, dictionary.eos()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", type=Path, required=True, help="Mu-Protein's pmlm/src/protein folder")
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args()
    import fairseq

    generator = torch.Generator().manual_seed(SEED)
    provenance = {"fairseq": fairseq.__version__, "torch": torch.__version__, "seed": SEED, "sequences": SEQUENCES,
                  "marked_positions": MARKED, "dims": DIMS, "models": {}}
    with tempfile.TemporaryDirectory() as data_dir:
        # the task reads its dictionary from DATA/dict.txt: the plugin's own
        Path(data_dir, "dict.txt").write_text((opts.plugin / "dict.txt").read_text())
        for name, extra in MODELS.items():
            args, task, model = build(opts.plugin, Path(data_dir), extra)
            dictionary = task.source_dictionary
            rows = [tokens_of(dictionary, s) for s in SEQUENCES]
            width = max(map(len, rows))
            src = torch.full((len(rows), width), dictionary.pad(), dtype=torch.long)
            for b, row in enumerate(rows):
                src[b, :len(row)] = torch.tensor(row)
            optimizer_state = None
            if name == "mlm":  # one checkpoint carries an optimiser state too, as save_state writes by default
                optim = torch.optim.Adam(model.parameters(), lr=1e-4)
                model(src)[0].float().pow(2).mean().backward()
                optim.step()
                optimizer_state = {**optim.state_dict(), "loss_scale": 128.0}
                model.zero_grad()
            randomize(model, generator)  # after the step: the saved weights are those the outputs come from
            model.eval()
            outputs = {"src_tokens": src}
            with torch.no_grad():
                inner, _ = model.encoder.sentence_encoder(src)
                outputs["hidden_states"] = torch.stack([h.transpose(0, 1) for h in inner])  # (layers + 1, B, T, C)
                logits, _ = model(src)  # every position: (B, T, |dictionary|)
                outputs["token_logits"] = logits
                if name == "pmlm":
                    marked = torch.zeros_like(src, dtype=torch.bool)
                    for b, positions in enumerate(MARKED):
                        marked[b, positions] = True
                    masked_logits, extra_out = model(src, masked_tokens=marked)
                    outputs["marked"] = marked
                    outputs["marked_token_logits"] = masked_logits  # (N, |dictionary|)
                    outputs["pair_logits"] = extra_out["x_pair"]  # (P, |dictionary|^2), rows (b, i, j), i != j
            ckpt = opts.out / f"{name}_tiny.pt"
            criterion = type(task.build_criterion(args)).__name__
            with torch.no_grad():
                save_released_layout(ckpt, args, model, criterion, optimizer_state)
            save_file({k: v.contiguous() for k, v in outputs.items()}, opts.out / f"{name}_tiny_reference.safetensors")
            provenance["models"][name] = {"args": extra, "checkpoint": ckpt.name, "criterion": criterion,
                                          "dictionary": [dictionary[i] for i in range(len(dictionary))],
                                          "state_dict_keys": list(model.state_dict())}
    (opts.out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")


if __name__ == "__main__":
    main()
