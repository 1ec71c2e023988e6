"""The named options of the commands that use a trained encoder (``pmlm score``, ``pmlm contacts``,
``pmlm proteingym score``), as types: the rules that score multi-site mutants, the contact read-out, the marginal of
a substitution. Standard library only, so the commands take their ``choices`` from them."""

from __future__ import annotations

from pmlm.choices import Choice

PAIR_JOINT, ADDITIVE, TRIPLE_JOINT, PAIRS = "pair_joint", "additive", "triple_joint", "pairs"


class DoubleScore(Choice):
    """The rule that scores double mutants (``--double``; pmlm.inference.mutations)."""

    AUTO = "auto"
    PAIR = "pair"
    ADDITIVE = "additive"

    def joint(self, has_pair: bool, fits: bool) -> bool:
        """Whether a double is scored by the pair head's joint, else additively (``pair`` reads the joint even
        where the sites do not fit one window: the caller refuses that)."""
        return self is DoubleScore.PAIR or (self is DoubleScore.AUTO and has_pair and fits)


class TripleScore(Choice):
    """The rule that scores mutants of three or more sites (``--triple``; pmlm.inference.mutations)."""

    AUTO = "auto"
    TRIPLE = "triple"
    PAIRS = "pairs"
    ADDITIVE = "additive"

    def source(self, n: int, heads: tuple[bool, bool], fits: bool) -> str:
        """The source of a mutant of ``n`` >= 3 sites (``heads``: has a pair, a triple head): additive,
        triple_joint or pairs; a joint the sites do not fit or a triple of more sites is the caller's to refuse."""
        has_pair, has_triple = heads
        if self is not TripleScore.AUTO:
            return {TripleScore.ADDITIVE: ADDITIVE, TripleScore.TRIPLE: TRIPLE_JOINT, TripleScore.PAIRS: PAIRS}[self]
        if not fits:
            return ADDITIVE
        return TRIPLE_JOINT if n == 3 and has_triple else PAIRS if has_pair else ADDITIVE


class Readout(Choice):
    """What an encoder's contact scores are read from (``--readout``): auto = the pair head when it has one."""

    AUTO = "auto"
    PAIR = "pair"  # the pair head's joint: KL from independence, APC per window
    JACOBIAN = "jacobian"  # the token head's categorical Jacobian, APC per window

    @property
    def score_kind(self) -> str:
        """The ``score_kind`` its maps record: ``pair_kl_apc`` or ``jacobian_apc``."""
        return f"{'pair_kl' if self is Readout.PAIR else 'jacobian'}_apc"

    def head(self, encoder):
        """The head of ``encoder`` this read-out reads (None where it has none)."""
        return encoder.pair_head if self is Readout.PAIR else encoder.token_head


class Marginal(Choice):
    """The marginal a substitution is scored from (``--marginal``; pmlm.inference.saturation)."""

    MASKED = "masked"  # one row per site, that site masked
    WILDTYPE = "wildtype"  # every site read from one unmasked pass per window

    @property
    def masks(self) -> bool:
        return self is Marginal.MASKED
