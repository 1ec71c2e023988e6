"""``pmlm score``: single and double mutant scores of one sequence.

* single ``A23G`` (1-based position, wild type first): the masked marginal, log P(G) - log P(A) at site 23
  with that site set to ``<mask>`` (ESM-1v's masked-marginal score), from the token head (a pair-only model
  takes the marginal of the pair head's diagonal, as its objective trains it);
* double ``A23G:L40P`` from the pair head (``double_from = pair_joint``): both sites masked, the pair head's
  joint over residue classes at (23, 40), log P(G, P) - log P(A, L). ``epistasis`` is that minus the sum of
  the two single scores: how far the pair departs from independent effects;
* double on an encoder without a pair head (MLM), or with ``--double additive``: the sum of the two single
  scores (``double_from = additive``, epistasis 0 by construction);
* triple ``A23G:L40P:K51E`` from the Triple MLM's triple head (``triple_from = triple_joint``): the three sites
  masked, log P(a', b', c') - log P(a, b, c) of its joint; on an encoder with a pair head but no triple head
  from its pairs (``triple_from = pairs``): the three single scores plus the three double mutants' epistasis
  (each pair's joint with that pair masked), so no third-order term; without a pair head, or with
  ``--triple additive``, the sum of the single scores (``triple_from = additive``). ``epistasis`` is the score
  minus the sum of the singles; the third-order part is that minus the three doubles' epistasis.

Sites are read in a window of the model's size centred on them (both sites of a double in one window; a
double whose sites are farther apart than the window has no joint and is an error). Sites sharing a masked
input share its forward pass.

Mutations CSV: a header row with a ``mutant`` column (the ProteinGym / ESM variant-prediction convention;
``mutation`` is accepted too), one mutant per row, other columns ignored. Output TSV, one row per input row
in input order: ``mutant``, ``kind`` (single | double), ``score``, ``additive`` (sum of the single scores),
``epistasis`` (doubles and triples: score - additive), ``double_from`` (doubles: pair_joint | additive),
``triple_from`` (triples: triple_joint | pairs | additive), ``precision`` (fp32 | bf16: the forward passes'
arithmetic, the encoder's recorded one unless asked otherwise, ``pmlm.train.runtime.evaluation_precision``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pmlm import alphabet
from pmlm.artefacts import recorded_precision
from pmlm.errors import ConfigError, InputError
from pmlm.evaluation.pair_readout import residue_joint
from pmlm.files import atomic_output
from pmlm.inference.sequences import read_fasta_sequences
from pmlm.model.pmlm_model import PMLMModel
from pmlm.model.triple import Q
from pmlm.pretrained import load_encoder, pick_device
from pmlm.tokens import RESIDUE_OFFSET, batch_tokens, max_residues
from pmlm.train.runtime import evaluation_precision

MUTANT_COLUMNS = ("mutant", "mutation")
DOUBLE_MODES = ("auto", "pair", "additive")
TRIPLE_MODES = ("auto", "triple", "pairs", "additive")
PAIR_JOINT, ADDITIVE, TRIPLE_JOINT, PAIRS = "pair_joint", "additive", "triple_joint", "pairs"
OUT_COLUMNS = ("mutant", "kind", "score", "additive", "epistasis", "double_from", "triple_from", "precision")
KINDS = {1: "single", 2: "double", 3: "triple"}
ROWS_PER_PASS = 32  # masked copies of the sequence per forward pass
_SITE = re.compile(r"^([A-Z])([0-9]+)([A-Z])$")


@dataclass(frozen=True)
class Site:
    pos: int  # 0-based residue index
    wt: int  # residue class 0..19
    mut: int


@dataclass(frozen=True)
class Mutant:
    text: str
    sites: tuple[Site, ...]  # one, two or three, sorted by position
    line: int


def split_mutant(text: str) -> list[tuple[str, int, str]] | None:
    """``A23G:L40P`` -> ``[("A", 23, "G"), ("L", 40, "P")]`` (wild type, 1-based position, mutant; any number of
    sites, the ProteinGym / ESM convention), or None when a part is not of that form. Letters are not checked."""
    out = []
    for part in text.strip().split(":"):
        match = _SITE.match(part.strip())
        if match is None:
            return None
        out.append((match.group(1), int(match.group(2)), match.group(3)))
    return out


def parse_mutant(text: str, letters: str, path: str, line: int) -> Mutant:
    """``A23G``, ``A23G:L40P`` or ``A23G:L40P:K51E`` checked against the sequence ``letters``."""
    if len(text.strip().split(":")) > 3:
        raise InputError(path, f"{text!r}: only single, double and triple mutants are scored", line=line)
    parts = split_mutant(text)
    if parts is None:
        raise InputError(path, f"{text!r}: expected mutants like A23G, A23G:L40P or A23G:L40P:K51E", line=line)
    sites = []
    for wt, pos, mut in parts:
        for letter in (wt, mut):
            if letter not in alphabet.RESIDUES:
                raise InputError(
                    path, f"{text!r}: {letter!r} is not one of the 20 residues {alphabet.RESIDUES}", line=line
                )
        if not 1 <= pos <= len(letters):
            raise InputError(path, f"{text!r}: position {pos} is outside the sequence (1..{len(letters)})", line=line)
        if letters[pos - 1] != wt:
            raise InputError(
                path,
                f"{text!r}: wild type {wt} does not match the sequence, which has {letters[pos - 1]} at {pos}",
                line=line,
            )
        sites.append(Site(pos - 1, alphabet.RESIDUES.index(wt), alphabet.RESIDUES.index(mut)))
    positions = [s.pos for s in sites]
    if len(set(positions)) < len(positions):
        repeated = next(p for p in positions if positions.count(p) > 1)
        raise InputError(path, f"{text!r}: two mutations are at position {repeated + 1}", line=line)
    return Mutant(text.strip(), tuple(sorted(sites, key=lambda s: s.pos)), line)


def read_mutants(path: str | Path, letters: str) -> list[Mutant]:
    path = str(path)
    if not Path(path).is_file():
        raise InputError(path, "no such file")
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # spreadsheets start CSVs with a BOM
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise InputError(path, "empty file (expected a header row with a 'mutant' column)", line=1)
            names = [h.strip() for h in header]
            column = next((names.index(c) for c in MUTANT_COLUMNS if c in names), None)
            if column is None:
                raise InputError(path, f"no 'mutant' column in the header {','.join(names)!r}", line=1)
            out = []
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise InputError(path, f"{len(row)} fields, the header has {len(header)}", line=reader.line_num)
                if not row[column].strip():
                    raise InputError(path, "empty mutant", line=reader.line_num)
                out.append(parse_mutant(row[column], letters, path, reader.line_num))
    except UnicodeDecodeError:
        raise InputError(path, "not UTF-8 text") from None
    except csv.Error as exc:
        raise InputError(path, f"malformed CSV: {exc}") from None
    if not out:
        raise InputError(path, "no mutants after the header")
    return out


def window_start(length: int, room: int, positions: tuple[int, ...]) -> int:
    """Start of the window of ``room`` residues centred on ``positions`` (clamped to the sequence)."""
    centre = (min(positions) + max(positions)) // 2
    return int(min(max(centre - room // 2, 0), max(length - room, 0)))


def _masked_rows(residues: np.ndarray, room: int, site_sets: list[tuple[int, ...]]):
    """Token rows (B, T), one per site set, the sites masked, and each site's token position (B, k)."""
    starts = [window_start(residues.size, room, sites) for sites in site_sets]
    rows = batch_tokens([residues] * len(site_sets), starts, max_residues=room)
    tokens = torch.from_numpy(rows.tokens)
    positions = torch.tensor([[p - s + RESIDUE_OFFSET for p in sites] for s, sites in zip(starts, site_sets)])
    tokens[torch.arange(len(site_sets))[:, None], positions] = alphabet.MASK_ID
    return tokens, positions


@torch.no_grad()
def site_log_probs(model: PMLMModel, residues: np.ndarray, positions: list[int], device) -> dict[int, np.ndarray]:
    """{position: (20,) log P(x_i = a | sequence with site i masked)} (float64 numpy)."""
    room = max_residues(model.cfg.max_len)
    out = {}
    for k in range(0, len(positions), ROWS_PER_PASS):
        chunk = positions[k : k + ROWS_PER_PASS]
        tokens, pos = _masked_rows(residues, room, [(p,) for p in chunk])
        tokens, pos = tokens.to(device), pos[:, 0].to(device)
        reps = model.encode(tokens)  # (B, T, C)
        rows = torch.arange(len(chunk), device=device)
        if model.token_head is not None:
            log_p = torch.log_softmax(model.token_head(reps[rows, pos]).float(), dim=-1)  # (B, 20)
        else:  # pair-only: the marginal of the diagonal pair (i, i)
            logits, _ = model.pair_head(reps, torch.stack([rows, pos, pos], dim=1))
            log_p = residue_joint(logits.float()).sum(dim=-1).log()  # (B, 20)
        for p, values in zip(chunk, log_p.double().cpu().numpy()):
            out[p] = values
    return out


@torch.no_grad()
def pair_log_joints(
    model: PMLMModel, residues: np.ndarray, pairs: list[tuple[int, int]], device
) -> dict[tuple[int, int], np.ndarray]:
    """{(i, j): (20, 20) log P(x_i = a, x_j = b | sequence with i and j masked)}, i < j (float64 numpy).

    The pair head's class of (a, b) is its row-major (x_i, x_j) class, which ``residue_joint`` reshapes to
    [a, b] for either pair vocabulary, the head's size read from its logits."""
    room = max_residues(model.cfg.max_len)
    out = {}
    for k in range(0, len(pairs), ROWS_PER_PASS):
        chunk = pairs[k : k + ROWS_PER_PASS]
        tokens, pos = _masked_rows(residues, room, chunk)
        tokens, pos = tokens.to(device), pos.to(device)
        reps = model.encode(tokens)  # (B, T, C)
        rows = torch.arange(len(chunk), device=device)
        logits, _ = model.pair_head(reps, torch.stack([rows, pos[:, 0], pos[:, 1]], dim=1))  # (B, K)
        log_joint = residue_joint(logits.float()).double().log()  # (B, 20, 20)
        for pair, values in zip(chunk, log_joint.cpu().numpy()):
            out[pair] = values
    return out


@torch.no_grad()
def triple_log_joints(
    model: PMLMModel, residues: np.ndarray, triples: list[tuple[int, int, int]], device
) -> dict[tuple[int, int, int], np.ndarray]:
    """{(i, j, k): (20, 20, 20) log P(x_i = a, x_j = b, x_k = c | sequence with i, j, k masked)}, i < j < k: the
    triple head's class ``400 a + 20 b + c`` (float64 numpy)."""
    room = max_residues(model.cfg.max_len)
    out = {}
    for k in range(0, len(triples), ROWS_PER_PASS):
        chunk = triples[k : k + ROWS_PER_PASS]
        tokens, pos = _masked_rows(residues, room, chunk)
        tokens, pos = tokens.to(device), pos.to(device)
        reps = model.encode(tokens)  # (B, T, C)
        rows = torch.arange(len(chunk), device=device)[:, None]
        logits = model.triple_head(reps, torch.cat([rows, pos], dim=1))  # (B, 8000)
        log_joint = torch.log_softmax(logits.float(), dim=-1).double().view(-1, Q, Q, Q)
        for triple, values in zip(chunk, log_joint.cpu().numpy()):
            out[triple] = values
    return out


def _check_window(mutants: list[Mutant], room: int, path: str, what: str, fallback: str) -> None:
    for m in mutants:
        first, last = m.sites[0].pos, m.sites[-1].pos
        if last - first >= room:
            raise InputError(
                path,
                f"{m.text!r}: sites {first + 1} and {last + 1} do not fit in one window of {room} "
                f"residues, so the {what} has no joint for them (use {fallback})",
                line=m.line,
            )


def score_mutants(
    model: PMLMModel,
    residues: np.ndarray,
    mutants: list[Mutant],
    *,
    double: str = "auto",
    triple: str = "auto",
    device="cpu",
    path: str = "mutations",
    model_name: str = "the encoder",
) -> list[dict]:
    """One output row per mutant (the module docstring's columns); ``path`` and ``model_name`` name the mutant
    file and the encoder in errors."""
    if double not in DOUBLE_MODES:
        raise ConfigError(f"--double must be one of {', '.join(DOUBLE_MODES)}, got {double!r}")
    if triple not in TRIPLE_MODES:
        raise ConfigError(f"--triple must be one of {', '.join(TRIPLE_MODES)}, got {triple!r}")
    doubles = [m for m in mutants if len(m.sites) == 2]
    triples = [m for m in mutants if len(m.sites) == 3]
    has_pair, has_triple = model.pair_head is not None, getattr(model, "triple_head", None) is not None
    use_pair = double == "pair" or (double == "auto" and has_pair)
    if doubles and use_pair and not has_pair:
        raise InputError(
            model_name,
            f"no pair head (an MLM model): the double mutants of {path} need the pair "
            "head's joint (a PMLM model), or --double additive",
            line=None,
        )
    triple_source = triple if triple != "auto" else TRIPLE_JOINT if has_triple else PAIRS if has_pair else ADDITIVE
    triple_source = {"triple": TRIPLE_JOINT}.get(triple_source, triple_source)
    if triples and triple_source == TRIPLE_JOINT and not has_triple:
        raise InputError(
            model_name,
            f"no triple head: the triple mutants of {path} need a Triple MLM (objective "
            "tmlm), or --triple pairs / additive",
            line=None,
        )
    if triples and triple_source == PAIRS and not has_pair:
        raise InputError(
            model_name,
            "no pair head (an MLM model): --triple pairs needs the pair head's joints; use --triple additive",
            line=None,
        )
    room = max_residues(model.cfg.max_len)
    if use_pair:
        _check_window(doubles, room, path, "pair head", "--double additive")
    if triple_source in (TRIPLE_JOINT, PAIRS):
        _check_window(
            triples, room, path, "triple head" if triple_source == TRIPLE_JOINT else "pair head", "--triple additive"
        )
    singles = site_log_probs(model, residues, sorted({s.pos for m in mutants for s in m.sites}), device)
    pair_sets = {(m.sites[0].pos, m.sites[1].pos) for m in doubles} if use_pair else set()
    if triple_source == PAIRS:
        pair_sets |= {
            (a.pos, b.pos)
            for m in triples
            for a, b in ((m.sites[0], m.sites[1]), (m.sites[0], m.sites[2]), (m.sites[1], m.sites[2]))
        }
    joints = pair_log_joints(model, residues, sorted(pair_sets), device) if pair_sets else {}
    triple_joints = (
        triple_log_joints(model, residues, sorted({tuple(s.pos for s in m.sites) for m in triples}), device)
        if triple_source == TRIPLE_JOINT and triples
        else {}
    )

    def single(s: Site) -> float:
        return float(singles[s.pos][s.mut] - singles[s.pos][s.wt])

    def pair_score(a: Site, b: Site) -> float:
        log_joint = joints[(a.pos, b.pos)]
        return float(log_joint[a.mut, b.mut] - log_joint[a.wt, b.wt])

    rows = []
    for m in mutants:
        additive = sum(single(s) for s in m.sites)
        row = {
            "mutant": m.text,
            "kind": KINDS[len(m.sites)],
            "score": additive,
            "additive": additive,
            "epistasis": None,
            "double_from": None,
            "triple_from": None,
        }
        if len(m.sites) == 2:
            a, b = m.sites
            source = PAIR_JOINT if use_pair else ADDITIVE
            score = pair_score(a, b) if use_pair else additive
            row.update(score=score, epistasis=score - additive, double_from=source)
        elif len(m.sites) == 3:
            a, b, c = m.sites
            if triple_source == TRIPLE_JOINT:
                log_joint = triple_joints[(a.pos, b.pos, c.pos)]
                score = float(log_joint[a.mut, b.mut, c.mut] - log_joint[a.wt, b.wt, c.wt])
            elif triple_source == PAIRS:
                # the singles plus each pair's epistasis (its double score minus its two singles)
                score = pair_score(a, b) + pair_score(a, c) + pair_score(b, c) - additive
            else:
                score = additive
            row.update(score=score, epistasis=score - additive, triple_from=triple_source)
        rows.append(row)
    return rows


def write_scores(path: str | Path, rows: list[dict]) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(OUT_COLUMNS)
        for row in rows:
            writer.writerow(
                ["" if row[c] is None else repr(row[c]) if isinstance(row[c], float) else row[c] for c in OUT_COLUMNS]
            )


def score_fasta(
    model: str,
    sequence: str,
    mutations: str,
    out: str,
    *,
    double: str = "auto",
    triple: str = "auto",
    device: str = "auto",
    precision: str = "auto",
) -> dict:
    """Score the mutants listed in the CSV ``mutations`` of the one wild type in FASTA ``sequence`` with encoder
    ``model`` at ``precision`` (``--precision``); writes the TSV ``out``. Returns the wild type's id, the rows and
    the precision."""
    dev = pick_device(device)
    encoder, info, weights = load_encoder(model, dev)
    recorded = recorded_precision(info, weights)
    arithmetic = evaluation_precision(dev, recorded, precision, trained="the encoder", command="pmlm score")
    records = read_fasta_sequences(sequence)
    if len(records) != 1:
        raise InputError(
            sequence,
            f"expected one sequence (the wild type), found {len(records)}",
            line=records[1].line if len(records) > 1 else None,
        )
    wild = records[0]
    mutants = read_mutants(mutations, wild.letters)
    with arithmetic.autocast():
        rows = score_mutants(
            encoder,
            wild.residues,
            mutants,
            double=double,
            triple=triple,
            device=dev,
            path=mutations,
            model_name=str(weights),
        )
    rows = [{**row, "precision": arithmetic.name} for row in rows]
    write_scores(out, rows)
    return {"id": wild.id, "rows": rows, "precision": arithmetic.name}
