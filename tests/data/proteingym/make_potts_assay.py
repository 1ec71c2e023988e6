"""Write the ProteinGym-format assay of a synthetic Potts family whose fitness is known exactly.

    .venv/bin/python tests/data/proteingym/make_potts_assay.py [--out tests/data/proteingym]

One Potts family (``pmlm.synth.potts``, 32 residues, couplings of 2 nats on 32 planted edges) is sampled by
Gibbs sampling; the wild type is its sampled sequence of highest probability. The assay holds every single
mutant, 12 doubles at each planted edge (where the two sites interact), 256 doubles at pairs without a
coupling (additive by construction) and 64 triples. ``DMS_score`` is the exact log-probability ratio
log P(mutant) - log P(wild type) = sum of the changed fields and couplings (the partition function cancels);
``DMS_score_bin`` is 1 where ``DMS_score`` is at least the median (ProteinGym's "median" binarisation).

Files: ``POTTS1_SYNTH_Potts.csv`` (the assay, ProteinGym's columns), ``DMS_substitutions.csv`` (its reference
row, under ProteinGym v1.3's header), ``potts_family.fasta`` (the 2,000 sampled sequences, to train on) and
``potts_model.npz`` (fields, edges, couplings, wild type: the truth the tests recompute the scores from).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from pmlm.alphabet import RESIDUES
from pmlm.synth.potts import PottsConfig, family_rng, gibbs_sample, random_potts_model

SEED = 25
DMS_ID = "POTTS1_SYNTH_Potts"
UNIPROT = "POTTS1_SYNTH"
DOUBLES_PER_EDGE = 12
UNCOUPLED_DOUBLES = 256
TRIPLES = 64
# ProteinGym v1.3's reference_files/DMS_substitutions.csv header, in its order
REFERENCE_HEADER = (
    "DMS_index,DMS_id,DMS_filename,UniProt_ID,taxon,source_organism,target_seq,seq_len,includes_multiple_mutants,"
    "DMS_total_number_mutants,DMS_number_single_mutants,DMS_number_multiple_mutants,DMS_binarization_cutoff,"
    "DMS_binarization_method,first_author,title,year,jo,region_mutated,molecule_name,selection_assay,selection_type,"
    "MSA_filename,MSA_start,MSA_end,MSA_len,MSA_bitscore,MSA_theta,MSA_num_seqs,MSA_perc_cov,MSA_num_cov,MSA_N_eff,"
    "MSA_Neff_L,MSA_Neff_L_category,MSA_num_significant,MSA_num_significant_L,raw_DMS_filename,"
    "raw_DMS_phenotype_name,raw_DMS_directionality,raw_DMS_mutant_column,weight_file_name,pdb_file,pdb_range,"
    "ProteinGym_version,raw_mut_offset,coarse_selection_type"
).split(",")


def mutant_text(wild: np.ndarray, sites: list[tuple[int, int]]) -> str:
    return ":".join(f"{RESIDUES[wild[i]]}{i + 1}{RESIDUES[a]}" for i, a in sorted(sites))


def other_residue(rng: np.random.Generator, wt: int) -> int:
    return int((wt + rng.integers(1, len(RESIDUES))) % len(RESIDUES))


def build(out: Path) -> None:
    cfg = PottsConfig(length=32, num_sequences=2000, coupling_strength=2.0)
    rng = family_rng(SEED, 0)
    model = random_potts_model(cfg, rng)
    sequences, _ = gibbs_sample(model, cfg.num_sequences, rng, chains=cfg.chains, burn_in=cfg.burn_in,
                                thinning=cfg.thinning)
    weights = model.log_weight(sequences)
    wild = sequences[int(np.argmax(weights))].astype(np.int64)
    length = model.length
    site_sets: list[list[tuple[int, int]]] = [[(i, a)] for i in range(length) for a in range(len(RESIDUES))
                                              if a != wild[i]]
    seen = set()
    for i, j in model.edges:
        drawn = 0
        while drawn < DOUBLES_PER_EDGE:
            pair = ((int(i), other_residue(rng, wild[i])), (int(j), other_residue(rng, wild[j])))
            if pair not in seen:
                seen.add(pair)
                site_sets.append(list(pair))
                drawn += 1
    coupled = {tuple(e) for e in model.edges.tolist()}
    drawn = 0
    while drawn < UNCOUPLED_DOUBLES:
        i, j = sorted(int(x) for x in rng.choice(length, size=2, replace=False))
        pair = ((i, other_residue(rng, wild[i])), (j, other_residue(rng, wild[j])))
        if (i, j) not in coupled and pair not in seen:
            seen.add(pair)
            site_sets.append(list(pair))
            drawn += 1
    for _ in range(TRIPLES):
        positions = sorted(int(x) for x in rng.choice(length, size=3, replace=False))
        site_sets.append([(p, other_residue(rng, wild[p])) for p in positions])
    variants = np.repeat(wild[None, :], len(site_sets), axis=0)
    for row, sites in zip(variants, site_sets):
        for i, a in sites:
            row[i] = a
    scores = model.log_weight(variants) - model.log_weight(wild[None, :])[0]  # exact log P(mutant) - log P(wt)
    cutoff = float(np.median(scores))
    letters = lambda seq: "".join(RESIDUES[k] for k in seq)  # noqa: E731
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{DMS_ID}.csv", "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["mutant", "mutated_sequence", "DMS_score", "DMS_score_bin"])
        for sites, seq, score in zip(site_sets, variants, scores):
            writer.writerow([mutant_text(wild, sites), letters(seq), repr(float(score)), int(score >= cutoff)])
    singles = sum(len(s) == 1 for s in site_sets)
    row = dict.fromkeys(REFERENCE_HEADER, "")
    row.update({"DMS_index": "DMS_sub_0", "DMS_id": DMS_ID, "DMS_filename": f"{DMS_ID}.csv", "UniProt_ID": UNIPROT,
                "taxon": "Synthetic", "source_organism": "Potts model (pmlm.synth.potts)", "target_seq": letters(wild),
                "seq_len": length, "includes_multiple_mutants": "TRUE", "DMS_total_number_mutants": len(site_sets),
                "DMS_number_single_mutants": singles, "DMS_number_multiple_mutants": len(site_sets) - singles,
                "DMS_binarization_cutoff": repr(cutoff), "DMS_binarization_method": "median",
                "selection_assay": "exact log-probability ratio", "selection_type": "Potts log-probability",
                "raw_DMS_directionality": 1, "raw_DMS_mutant_column": "mutant",
                "coarse_selection_type": "OrganismalFitness"})
    with open(out / "DMS_substitutions.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=REFERENCE_HEADER, lineterminator="\n")
        writer.writeheader()
        writer.writerow(row)
    with open(out / "potts_family.fasta", "w") as fh:
        for k, seq in enumerate(sequences):
            fh.write(f">potts1_{k}\n{letters(seq)}\n")
    np.savez_compressed(out / "potts_model.npz", fields=model.fields, edges=model.edges, couplings=model.couplings,
                        wild_type=wild)
    print(f"{DMS_ID}: {len(site_sets)} mutants ({singles} singles), cutoff {cutoff:.4f}, wild type {letters(wild)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
