"""``pmlm synth``: sample synthetic protein families from Potts models and write their sequences,
planted contacts and parameters (the run's in ``params.json``, each family's Potts model in
``params/<family>.safetensors``, see ``pmlm.synth.parameters``) into a folder of its own (``pmlm.outputs``: a folder
holding files pmlm synth did not write is refused before any sampling; the results appear together)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from pmlm.alphabet import RESIDUES
from pmlm.errors import InputError
from pmlm.evaluation.metrics import chance_precision, top_k_precision
from pmlm.evaluation.unsupervised import msa_mi_apc
from pmlm.outputs import folder_target, writing_folder
from pmlm.synth.parameters import PARAMS_DIR, POTTS_FORMAT, write_potts
from pmlm.synth.potts import BACKGROUND, Family, family_rng, generate_family
from pmlm.synth.synth_config import SynthConfig
from pmlm.version import __version__

SYNTH_COMMAND = "pmlm synth"
FASTA_NAME = "families.fasta"
CONTACTS_DIR = "contacts"
PARAMS_NAME = "params.json"
LONG_SEPARATION = 24  # the design's long range |i-j| >= 24, for the edge counts in params.json
_RESIDUE_LETTERS = np.frombuffer(RESIDUES.encode("ascii"), dtype=np.uint8)  # class -> ASCII byte


def generate(config: SynthConfig) -> list[Family]:
    names = config.family_names()
    return [generate_family(name, config.potts, family_rng(config.seed, k)) for k, name in enumerate(names)]


def validation_summary(family: Family, config: SynthConfig) -> dict:
    """MI+APC top-(#edges) precision of the family against its planted edges, and chance."""
    contacts = family.model.contact_map()
    k = len(family.model.edges)
    if k == 0:
        return {"mi_apc_precision": None, "chance_precision": 0.0, "top_k": 0}
    scores = msa_mi_apc(family.sequences, config.validation_pseudocount)
    sep = config.validation_min_separation
    return {
        "mi_apc_precision": top_k_precision(scores, contacts, k, sep),
        "chance_precision": chance_precision(contacts, sep),
        "top_k": k,
    }


def fasta_text(families: list[Family]) -> str:
    lines = []
    for fam in families:
        for k, seq in enumerate(fam.sequences):
            lines.append(f">{fam.name}_{k} family={fam.name}")
            lines.append(_RESIDUE_LETTERS[seq].tobytes().decode("ascii"))
    return "\n".join(lines) + "\n"


def contacts_text(family: Family) -> str:
    """0-based ``i<TAB>j<TAB>strength`` rows, strength = zero-sum-gauge Frobenius norm of J_ij."""
    rows = ["i\tj\tstrength"]
    for (i, j), norm in zip(family.model.edges, family.model.coupling_norms()):
        rows.append(f"{i}\t{j}\t{norm:.6g}")
    return "\n".join(rows) + "\n"


def params_document(config: SynthConfig, families: list[Family]) -> dict:
    potts = config.potts
    per_family = []
    for k, fam in enumerate(families):
        sep = np.diff(fam.model.edges, axis=1).ravel()
        per_family.append(
            {
                "name": fam.name,
                "seed_spawn_key": [k],
                "sequences": len(fam.sequences),
                "edges": len(fam.model.edges),
                "edges_short": int((sep < potts.medium_separation).sum()),
                "edges_medium": int(((sep >= potts.medium_separation) & (sep < LONG_SEPARATION)).sum()),
                "edges_long": int((sep >= LONG_SEPARATION).sum()),
                "triplets": len(fam.model.triplets),
                # NaN (one chain or one round) is not JSON: written as null
                "sampler": {k: (None if np.isnan(v) else v) for k, v in dataclasses.asdict(fam.stats).items()},
                "validation": validation_summary(fam, config),
            }
        )
    return {
        "pmlm_version": __version__,
        "seed": config.seed,
        "config": dataclasses.asdict(config),
        "model": "P(x) ~ exp(sum_i h_i(x_i) + sum_(i,j) J_ij(x_i, x_j) + sum_(i,j,k) K_ijk(x_i, x_j, x_k)), "
        "residue classes in the order of RESIDUES",
        "residues": RESIDUES,
        "background_composition": [round(float(b), 6) for b in BACKGROUND],
        "contacts_format": (
            "TSV with header i, j (0-based positions, i < j), strength (zero-sum-gauge Frobenius norm of J_ij)"
        ),
        "validation_method": "MI with APC, top-(#edges) pairs with |i-j| >= validation_min_separation",
        "files": {
            "fasta": FASTA_NAME,
            "contacts": f"{CONTACTS_DIR}/{{family}}.tsv",
            "potts": f"{PARAMS_DIR}/{{family}}.safetensors",
        },
        "potts_format": (
            f"{POTTS_FORMAT}: safetensors fields (L, 20), edges (E, 2), couplings (E, 20, 20), "
            "triplets (T, 3), triple_couplings (T, 20, 20, 20)"
        ),
        "families": per_family,
    }


def write_outputs(out: Path, config: SynthConfig, families: list[Family], *, overwrite: bool = False) -> None:
    """Write contacts, Potts parameters, FASTA and params.json into ``out`` (pmlm.outputs.writing_folder: they
    appear together; a rerun with fewer families leaves none of its stale files behind)."""
    with writing_folder(out, command=SYNTH_COMMAND, option="--out", overwrite=overwrite) as staged:
        (staged / CONTACTS_DIR).mkdir()
        (staged / PARAMS_DIR).mkdir()
        for fam in families:
            (staged / CONTACTS_DIR / f"{fam.name}.tsv").write_text(contacts_text(fam), encoding="utf-8")
            write_potts(staged / PARAMS_DIR / f"{fam.name}.safetensors", fam.model)
        (staged / FASTA_NAME).write_text(fasta_text(families), encoding="utf-8", newline="\n")
        document = json.dumps(params_document(config, families), indent=2) + "\n"
        (staged / PARAMS_NAME).write_text(document, encoding="utf-8", newline="\n")


def synthesize(config: SynthConfig, out: str | Path, *, overwrite: bool = False) -> list[Family]:
    """Sample the families of ``config`` and write them (FASTA, edges, Potts parameters, summary) into the folder
    ``out``, checked first (pmlm.outputs.folder_target)."""
    out = folder_target(out, command=SYNTH_COMMAND, option="--out", overwrite=overwrite)
    families = generate(config)
    try:
        write_outputs(out, config, families, overwrite=overwrite)
    except OSError as exc:
        raise InputError(exc.filename or out, f"cannot write output: {exc.strerror or exc}") from None
    return families
