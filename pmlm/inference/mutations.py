"""``pmlm score``: mutant scores of one sequence, and the one rule that scores a mutant of any number of sites
(``pmlm proteingym score`` scores its assays with it too, so both commands give a mutant the same score).

The rule (singles: the masked marginal; doubles: the pair head's joint; triples: the triple head's joint, else the
singles plus each pair's epistasis, else additive; ``--double`` / ``--triple``) is docs/cli.md's (``pmlm score``).
Windows: every forward row is a window of the model's size (max_len - 2 residues) centred on its site(s). A
joint needs all its sites in one window: under ``auto`` a mutant whose first and last sites are a window or
more apart gets the additive score (per mutant, counted: ``far_apart_notes``); under ``--double pair``,
``--triple triple`` or ``--triple pairs`` such a mutant is an error naming its file and line. Sites sharing a
masked input share its forward pass; rows are batched ``ROWS_PER_PASS`` to a pass.

The CSV in and the TSV out are ``pmlm.inference.mutant_table``; ``--saturation`` is ``pmlm.inference.saturation``.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from pmlm import alphabet
from pmlm.errors import InputError
from pmlm.evaluation.pair_readout import residue_joint
from pmlm.inference.options import ADDITIVE, PAIR_JOINT, PAIRS, TRIPLE_JOINT, DoubleScore, TripleScore
from pmlm.model.pmlm_model import PMLMModel
from pmlm.model.triple import Q
from pmlm.tokens import RESIDUE_OFFSET, batch_tokens, max_residues

KINDS = {1: "single", 2: "double", 3: "triple"}
MULTIPLE = "multiple"  # the kind of 4 or more sites
SOURCE_COLUMN = {"double": "double_from", "triple": "triple_from", MULTIPLE: "multi_from"}
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
    sites: tuple[Site, ...]  # one or more, sorted by position
    line: int


def kind(sites: int) -> str:
    return KINDS.get(sites, MULTIPLE)


def split_mutant(text: str) -> list[tuple[str, int, str]] | None:
    """``A23G:L40P`` -> ``[("A", 23, "G"), ("L", 40, "P")]`` (wild type, 1-based position, mutant, uppercased; any
    number of sites, the ProteinGym / ESM convention), or None when a part is not of that form. Letters are not
    checked."""
    out = []
    for part in text.strip().split(":"):
        match = _SITE.match(part.strip().upper())
        if match is None:
            return None
        out.append((match.group(1), int(match.group(2)), match.group(3)))
    return out


def parse_mutant(text: str, letters: str, path: str, line: int) -> Mutant:
    """``A23G``, ``A23G:L40P``, ``A23G:L40P:K51E``, ... checked against the sequence ``letters``."""
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
        if letters[pos - 1].upper() != wt:
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


# --- forward passes -------------------------------------------------------------------------------------------


def window_start(length: int, room: int, positions: tuple[int, ...]) -> int:
    """Start of the window of ``room`` residues centred on ``positions`` (clamped to the sequence)."""
    centre = (min(positions) + max(positions)) // 2
    return int(min(max(centre - room // 2, 0), max(length - room, 0)))


def masked_rows(sequences: list[np.ndarray], room: int, site_sets: list[tuple[int, ...]]):
    """Token rows (B, T), one per site set of its sequence (``sequences[b]``), each in the window of ``room``
    residues centred on its sites, the sites masked; and each site's token position (B, k)."""
    starts = [window_start(s.size, room, sites) for s, sites in zip(sequences, site_sets)]
    rows = batch_tokens(sequences, starts, max_residues=room)
    tokens = torch.from_numpy(rows.tokens)
    positions = torch.tensor([[p - s + RESIDUE_OFFSET for p in sites] for s, sites in zip(starts, site_sets)])
    tokens[torch.arange(len(site_sets))[:, None], positions] = alphabet.MASK_ID
    return tokens, positions


def token_log_probs(model: PMLMModel, reps: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor):
    """(N, 20) float32 log P(x = a) at token ``positions[n]`` of row ``rows[n]`` of the representations ``reps``
    (B, T, C): the token head's softmax, or on a pair-only encoder the marginal of the pair head's diagonal pair
    (i, i), as its objective trains it."""
    if model.token_head is not None:
        return torch.log_softmax(model.token_head(reps[rows, positions]).float(), dim=-1)
    logits, _ = model.pair_head(reps, torch.stack([rows, positions, positions], dim=1))
    return residue_joint(logits.float()).sum(dim=-1).log()


@torch.no_grad()
def site_log_probs(model: PMLMModel, residues: np.ndarray, positions: list[int], device) -> dict[int, np.ndarray]:
    """{position: (20,) log P(x_i = a | sequence with site i masked)} (float64 numpy)."""
    room = max_residues(model.cfg.max_len)
    out = {}
    for k in range(0, len(positions), ROWS_PER_PASS):
        chunk = positions[k : k + ROWS_PER_PASS]
        tokens, pos = masked_rows([residues] * len(chunk), room, [(p,) for p in chunk])
        reps = model.encode(tokens.to(device))  # (B, T, C)
        log_p = token_log_probs(model, reps, torch.arange(len(chunk), device=device), pos[:, 0].to(device))
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
        tokens, pos = masked_rows([residues] * len(chunk), room, chunk)
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
        tokens, pos = masked_rows([residues] * len(chunk), room, chunk)
        tokens, pos = tokens.to(device), pos.to(device)
        reps = model.encode(tokens)  # (B, T, C)
        rows = torch.arange(len(chunk), device=device)[:, None]
        logits = model.triple_head(reps, torch.cat([rows, pos], dim=1))  # (B, 8000)
        log_joint = torch.log_softmax(logits.float(), dim=-1).double().view(-1, Q, Q, Q)
        for triple, values in zip(chunk, log_joint.cpu().numpy()):
            out[triple] = values
    return out


# --- the rule -------------------------------------------------------------------------------------------------


@dataclass
class MutantScores:
    """The rows of ``mutant_scores`` (one per mutant, the module docstring's columns but the input's and
    ``precision``), the forward rows run (``sites``, ``pairs``, ``triples``), the mutants scored additively because
    their sites do not fit one window (kind -> count) and that window (residues)."""

    rows: list[dict]
    forward_rows: dict[str, int]
    far_apart: Counter
    window: int


def _refuse_far(m, path: str, room: int, what: str, fallback: str) -> None:
    first, last = m.sites[0].pos, m.sites[-1].pos
    raise InputError(
        path,
        f"{m.text!r}: sites {first + 1} and {last + 1} do not fit in one window of {room} residues, so the "
        f"{what} has no joint for them (use {fallback})",
        line=m.line,
    )


def _source(
    m, double: DoubleScore, triple: TripleScore, heads: tuple[bool, bool], fits: bool, room: int, path: str
) -> str | None:
    """The rule (module docstring) that scores mutant ``m``, whose sites ``fits`` in one window of ``room``
    residues or not; None for a single. ``heads``: whether the encoder has a (pair, triple) head."""
    n = len(m.sites)
    if n == 1:
        return None
    if n == 2:
        if not double.joint(heads[0], fits):
            return ADDITIVE
        if not fits:
            _refuse_far(m, path, room, "pair head", "--double additive")
        return PAIR_JOINT
    source = triple.source(n, heads, fits)
    if source == TRIPLE_JOINT and n > 3:
        raise InputError(
            path,
            f"{m.text!r}: {n} sites, and the triple head's joint holds three (use --triple auto, pairs or additive)",
            line=m.line,
        )
    if not fits and source != ADDITIVE:
        _refuse_far(m, path, room, "triple head" if source == TRIPLE_JOINT else "pair head", "--triple additive")
    return source


def _check_heads(
    mutants, double: DoubleScore, triple: TripleScore, heads: tuple[bool, bool], path: str, model_name: str
) -> None:
    has_pair, has_triple = heads
    sizes = {len(m.sites) for m in mutants}
    if 2 in sizes and not has_pair and double.joint(has_pair, True):
        raise InputError(
            model_name,
            f"no pair head (an MLM model): the double mutants of {path} need the pair "
            "head's joint (a PMLM model), or --double additive",
        )
    if 3 in sizes and not has_triple and triple.source(3, heads, True) == TRIPLE_JOINT:
        raise InputError(
            model_name,
            f"no triple head: the triple mutants of {path} need a Triple MLM (objective tmlm), "
            "or --triple pairs / additive",
        )
    if max(sizes, default=0) >= 3 and not has_pair and triple.source(max(sizes), heads, True) == PAIRS:
        raise InputError(
            model_name,
            "no pair head (an MLM model): --triple pairs needs the pair head's joints; use --triple additive",
        )


def mutant_scores(
    model: PMLMModel,
    residues: np.ndarray,
    mutants: list,
    *,
    double: DoubleScore = DoubleScore.AUTO,
    triple: TripleScore = TripleScore.AUTO,
    device="cpu",
    path: str = "mutations",
    model_name: str = "the encoder",
) -> MutantScores:
    """Every mutant (anything with ``text``, ``sites`` sorted by position and ``line``) scored by the module
    docstring's rule; ``path`` and ``model_name`` name the mutant file and the encoder in errors."""
    double, triple = DoubleScore.parse(double, "--double"), TripleScore.parse(triple, "--triple")  # the Python API's
    heads = (model.pair_head is not None, getattr(model, "triple_head", None) is not None)
    _check_heads(mutants, double, triple, heads, path, model_name)
    room = max_residues(model.cfg.max_len)
    sources, far = [], Counter()
    for m in mutants:
        fits = m.sites[-1].pos - m.sites[0].pos < room
        sources.append(_source(m, double, triple, heads, fits, room, path))
        if not fits and sources[-1] == ADDITIVE and _source(m, double, triple, heads, True, room, path) != ADDITIVE:
            far[kind(len(m.sites))] += 1  # a joint's rule had the sites fitted one window
    pairs = sorted(
        {
            (a.pos, b.pos)
            for m, source in zip(mutants, sources)
            if source in (PAIR_JOINT, PAIRS)
            for a, b in itertools.combinations(m.sites, 2)
        }
    )
    triples = sorted({tuple(s.pos for s in m.sites) for m, source in zip(mutants, sources) if source == TRIPLE_JOINT})
    sites = sorted({s.pos for m in mutants for s in m.sites})
    singles = site_log_probs(model, residues, sites, device)
    joints = pair_log_joints(model, residues, pairs, device) if pairs else {}
    triple_joints = triple_log_joints(model, residues, triples, device) if triples else {}

    def single(s: Site) -> float:
        return float(singles[s.pos][s.mut] - singles[s.pos][s.wt])

    def pair_score(a: Site, b: Site) -> float:
        log_joint = joints[(a.pos, b.pos)]
        return float(log_joint[a.mut, b.mut] - log_joint[a.wt, b.wt])

    rows = []
    for m, source in zip(mutants, sources):
        additive = sum(single(s) for s in m.sites)
        score = additive
        if source == PAIR_JOINT:
            score = pair_score(*m.sites)
        elif source == TRIPLE_JOINT:
            a, b, c = m.sites
            log_joint = triple_joints[(a.pos, b.pos, c.pos)]
            score = float(log_joint[a.mut, b.mut, c.mut] - log_joint[a.wt, b.wt, c.wt])
        elif source == PAIRS:  # the singles plus each pair's epistasis (its double score minus its two singles)
            score = additive + sum(
                pair_score(a, b) - single(a) - single(b) for a, b in itertools.combinations(m.sites, 2)
            )
        row = {"mutant": m.text, "kind": kind(len(m.sites)), "score": score, "additive": additive}
        row.update({"epistasis": None if source is None else score - additive, **dict.fromkeys(SOURCE_COLUMN.values())})
        if source is not None:
            row[SOURCE_COLUMN[row["kind"]]] = source
        rows.append(row)
    forward_rows = {"sites": len(sites), "pairs": len(pairs), "triples": len(triples)}
    return MutantScores(rows, forward_rows, far, room)


def score_mutants(model: PMLMModel, residues: np.ndarray, mutants: list, **options) -> list[dict]:
    """The rows of ``mutant_scores`` (same options): mutant, kind, score, additive, epistasis, double_from,
    triple_from, multi_from."""
    return mutant_scores(model, residues, mutants, **options).rows


def far_apart_notes(scored: MutantScores) -> list[str]:
    """One line per kind of mutant scored additively because its sites do not fit one window."""
    return [
        f"{n} {what}{'' if n == 1 else 's'} scored additively: sites farther apart than the window of "
        f"{scored.window} residues"
        for what in SOURCE_COLUMN
        if (n := scored.far_apart[what])
    ]
