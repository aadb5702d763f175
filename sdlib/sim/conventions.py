"""Which of the authors' simulator quirks to follow: the two conventions of :mod:`sdlib.sim.oracle`, as data
the one simulator walk (:func:`sdlib.sim.policy.walk.position_steps`) reads.

Usage:
    from sdlib.sim.conventions import get_convention
    get_convention("authors").index_shift   # True
"""

from __future__ import annotations

from dataclasses import dataclass

#: the authors' "n-gram matched" probability for steps whose acc is 1 (SpecDecode-Bench simulator.py
#: NGRAM_MATCHING_PROBABILITY, keyed by our dataset names); others: :data:`AUTHORS_NGRAM_MATCH_DEFAULT`
AUTHORS_NGRAM_MATCH_PROB = {"sharegpt": 0.2, "cnn_dailymail": 0.4, "gsm8k": 0.2, "instructcoder": 0.8}
AUTHORS_NGRAM_MATCH_DEFAULT = 0.2


@dataclass(frozen=True)
class Convention:
    """Which of the authors' simulator quirks to follow (see :mod:`sdlib.sim.oracle`)."""

    name: str
    index_shift: bool  # a step starting with c output tokens reads acc[c-1] (authors) instead of acc[c]
    combine_draft: str  # drafting charged to Combine: "ngram" (authors), "winner", "both"
    combine_length: str  # Combine's output length: "shorter" (min of the lists) or "output"
    ngram_match: str  # n-gram FIXED_k steps with acc 1: "authors" (their random rule, in expectation), "tokens", "always"
    ngram_idle_draft: bool  # charge n-gram drafting on steps that propose nothing


CONVENTIONS = {
    "authors": Convention("authors", index_shift=True, combine_draft="ngram", combine_length="shorter",
                          ngram_match="authors", ngram_idle_draft=False),
    "corrected": Convention("corrected", index_shift=False, combine_draft="both", combine_length="output",
                            ngram_match="tokens", ngram_idle_draft=True),
}
CORRECTED = CONVENTIONS["corrected"]


def get_convention(c: "str | Convention") -> Convention:
    """A :class:`Convention` by name (or itself)."""
    if isinstance(c, Convention):
        return c
    try:
        return CONVENTIONS[c]
    except KeyError:
        raise ValueError(f"convention {c!r} is not one of {list(CONVENTIONS)}") from None
