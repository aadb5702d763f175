"""Per-request, per-verify-step acceptance from what vLLM reports (pure Python, no vLLM).

Two sources, one output (rows of the ``steps`` table):

* ``detailed`` (vLLM >= 0.29): the ordered (drafted, accepted) of every verify
  step that had drafts, attached to the request's final output. Steps with no
  draft (n-gram found no match) are missing there; we place the entries on the
  request's engine steps, known from the tokens each step added (DELTA
  outputs), so every step gets its output position.
* ``delta`` (older vLLM): only tokens gained per engine step; accepted =
  gained - 1 and drafted is k for model-based drafters (unknown -> None for
  n-gram, which may propose nothing).

Usage:
    from sdlib.extract.acceptance import steps_from_gains
    rows = steps_from_gains(gains=[1, 3, 1, 4], detailed=([3, 3, 3], [2, 0, 3]))
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional


class AlignmentError(ValueError):
    """The detailed per-step metrics do not fit the tokens gained per step."""


def _compatible(gain: int, accepted: int, last: bool) -> bool:
    """A step that gained ``gain`` tokens can be a verify step that accepted ``accepted``.

    The last step may be cut short by max_tokens or a stop token.
    """
    return gain == accepted + 1 or (last and 1 <= gain <= accepted + 1)


def align(decode_gains: list[int], accepted: list[int],
          has_draft: Optional[list[bool]] = None) -> list[Optional[int]]:
    """Map each decode step to the index of its detailed entry, or None if it had no draft.

    ``decode_gains``: tokens added per engine step after the prefill token.
    ``accepted``: the detailed per-step accepted counts (steps with drafts only).
    ``has_draft``: per decode step, whether the drafter proposed anything there,
    when it is known independently (n-gram: :func:`sdlib.extract.ngram.ngram_trace`
    recomputes vLLM's look-up exactly). Undrafted steps gain exactly 1 token.
    Without ``has_draft``, where the placement is ambiguous (a zero-acceptance
    entry among several one-token steps) the earliest feasible placement is
    chosen; with it, a step takes an entry iff it drafted (AlignmentError if
    that does not fit).
    """
    n, m = len(decode_gains), len(accepted)
    if m > n:
        raise AlignmentError(f"{m} drafted steps but only {n} decode steps")
    if has_draft is not None and len(has_draft) != n:
        raise AlignmentError(f"has_draft has {len(has_draft)} entries for {n} decode steps")

    @lru_cache(maxsize=None)
    def feasible(i: int, j: int) -> bool:
        if j == m:
            return all(g == 1 for g in decode_gains[i:]) and (
                has_draft is None or not any(has_draft[i:]))
        if n - i < m - j:
            return False
        last = i == n - 1
        if (has_draft is None or has_draft[i]) and _compatible(decode_gains[i], accepted[j], last) \
                and feasible(i + 1, j + 1):
            return True
        return (has_draft is None or not has_draft[i]) and decode_gains[i] == 1 and feasible(i + 1, j)

    if not feasible(0, 0):
        raise AlignmentError(f"gains {decode_gains[:20]}... do not fit accepted {accepted[:20]}...")
    out: list[Optional[int]] = []
    i = j = 0
    while i < n:
        last = i == n - 1
        if j < m and (has_draft is None or has_draft[i]) and _compatible(decode_gains[i], accepted[j], last) \
                and feasible(i + 1, j + 1):
            out.append(j)
            j += 1
        else:
            out.append(None)
        i += 1
    feasible.cache_clear()
    return out


def steps_from_gains(
    gains: list[int],
    detailed: Optional[tuple[list[int], list[int]]] = None,
    k: int = 0,
    drafter_always_proposes: bool = True,
    drafted_at: Optional[Callable[[int], bool]] = None,
) -> list[dict]:
    """Verify-step rows ``{step, position, drafted, accepted}`` for one request.

    ``gains``: tokens added to the request by each engine step that added any,
    in order; the first is the prefill's token(s) and is not a verify step.
    ``detailed``: (drafted, accepted) lists from vLLM, if available.
    ``k``: tokens proposed per step, for the ``delta`` source.
    ``drafter_always_proposes``: model-based drafters propose k every step;
    n-gram may not (then ``drafted`` is None in the ``delta`` source).
    ``drafted_at``: ``position -> bool``, whether the drafter proposed at that output
    position (n-gram, recomputed offline); pins the ``detailed`` entries to those steps.
    """
    if not gains:
        return []
    position = gains[0]
    decode = list(gains[1:])
    rows = []
    if detailed is not None:
        drafted, accepted = detailed
        if len(drafted) != len(accepted):
            raise AlignmentError("drafted and accepted lists differ in length")
        has_draft = None
        if drafted_at is not None:
            pos, has_draft = position, []
            for g in decode:
                has_draft.append(bool(drafted_at(pos)))
                pos += g
        where = align(decode, accepted, has_draft)
        for s, (g, j) in enumerate(zip(decode, where)):
            rows.append({
                "step": s,
                "position": position,
                "drafted": 0 if j is None else drafted[j],
                "accepted": 0 if j is None else accepted[j],
            })
            position += g
        return rows
    for s, g in enumerate(decode):
        rows.append({
            "step": s,
            "position": position,
            "drafted": (k if (k > 0 and drafter_always_proposes) else (0 if k == 0 else None)),
            "accepted": g - 1,
        })
        position += g
    return rows


def mean_acceptance_length(drafted: list[Optional[int]], accepted: list[int]) -> float:
    """The paper's definition: 1 + accepted / drafts, over steps that drafted (NaN if none)."""
    drafts = sum(1 for d in drafted if d)
    acc = sum(a for d, a in zip(drafted, accepted) if d)
    return 1.0 + acc / drafts if drafts else float("nan")
