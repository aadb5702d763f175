"""The one n-gram (prompt look-up) rule, as vLLM's n-gram proposer applies it.

vLLM 0.32's ``NgramProposer`` (``_find_longest_matched_ngram_and_propose_tokens``,
read in the installed source; 0.26 is the same) looks, in context = prompt +
output[:p], for the *longest* suffix n-gram with ``prompt_lookup_min <= n <=
prompt_lookup_max`` that occurs earlier (occurrences may overlap the suffix),
takes its *earliest* occurrence, and proposes the ``min(k, tokens after it,
max_model_len - len(context))`` tokens that follow it. ``acc_len[p] = 1 +``
(leading proposed tokens equal to ``output[p:]``).

:func:`ngram_lookup_lengths` finds the matches for every position at once
(hashing); :func:`ngram_trace` re-checks every hit token by token (brute-force
fallback :func:`ngram_propose`) and gives per position the tokens proposed and
``acc_len``; :func:`ngram_replay` predicts every step a vLLM n-gram run took
along its output. Tests compare this with vLLM's own function on random
sequences and with vLLM's per-step acceptance in real n-gram runs. The sweep's
step extraction (:mod:`sdlib.extract.tables`), the trace producer
(:mod:`sdlib.run.traces`) and the simulator (:mod:`sdlib.sim.oracle`) all use it.

Usage:
    from sdlib.extract.ngram import ngram_trace
    ngram_trace(prompt=[1, 2, 3, 4], output=[1, 2, 3, 4, 9], k=4, nmin=2, nmax=3).acc_len  # -> [1, 1, 3, 2, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from sdlib.core.registry import KMAX, NGRAM_MAX, NGRAM_MIN

#: The longest draft the authors' traces record (k = 20; ``acc_len`` is capped at 21).
TRACE_MAX_K = KMAX
#: Draft length of our own traces unless asked otherwise.
DEFAULT_K = 8

_MULT = np.uint64(0x9E3779B97F4A7C15)


def window_hashes(tok: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit hash of every length-``n`` window of ``tok`` (uint64; one per start, ``len(tok) - n + 1``)."""
    N = len(tok)
    h = np.zeros(N - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _MULT + tok[j:N - n + 1 + j] + np.uint64(1)
    return h


def suffix_ngram_passes(prompt: Sequence[int], output: Sequence[int], nmin: int, nmax: int
                        ) -> tuple[np.ndarray, Iterator[tuple[int, np.ndarray, np.ndarray]]]:
    """The look-up's passes over context = prompt + output[:p] for every output position p at once:
    ``(ctx, passes)`` with ``ctx[p] = len(prompt) + p`` and, for n from ``nmax`` down to ``nmin`` (longest
    first, as vLLM tries them), ``(n, hashes of every n-window of prompt + output, start of position p's
    suffix n-gram = ctx - n)``."""
    tok = np.concatenate([np.asarray(prompt, dtype=np.uint64), np.asarray(output, dtype=np.uint64)])
    ctx = len(prompt) + np.arange(len(output))

    def passes():
        for n in range(nmax, nmin - 1, -1):
            if len(tok) - n + 1 > 0:
                yield n, window_hashes(tok, n), ctx - n

    return ctx, passes()


def ngram_lookup_lengths(prompt: Sequence[int], output: Sequence[int], nmin: int = NGRAM_MIN,
                         nmax: int = NGRAM_MAX, max_k: int = TRACE_MAX_K) -> np.ndarray:
    """Per output position ``p``: tokens vLLM's n-gram (prompt-lookup) proposer can propose, 0 = no match.

    Context = prompt + output[:p]; the longest suffix n-gram (``nmax`` down to
    ``nmin``) that occurs earlier in the context matches at its first occurrence,
    and the continuation after it (capped at ``max_k``) is the proposal. On the
    reference traces this lookup with ``max_k=20`` reproduces ``acc_ngram`` exactly.
    """
    ctx, passes = suffix_ngram_passes(prompt, output, nmin, nmax)
    avail = np.zeros(len(output), dtype=np.int64)
    found = np.zeros(len(output), dtype=bool)
    for n, h, s in passes:
        _, first_idx, inv = np.unique(h, return_index=True, return_inverse=True)
        first = first_idx[inv.ravel()]
        cand = np.flatnonzero((s >= 0) & ~found)
        i = first[s[cand]]
        hit = i < s[cand]
        idx = cand[hit]
        avail[idx] = np.minimum(ctx[idx] - (i[hit] + n), max_k)
        found[idx] = True
    return avail


def ngram_propose(context: Sequence[int], nmin: int = NGRAM_MIN, nmax: int = NGRAM_MAX, k: int = DEFAULT_K,
                  max_model_len: Optional[int] = None) -> list[int]:
    """vLLM's n-gram proposal for ``context`` by brute force (reference implementation, O(len^2)).

    Longest ``n`` in ``[nmin, nmax]`` whose suffix n-gram occurs earlier (start
    before the suffix's start, overlap allowed); its earliest occurrence; the up
    to ``k`` tokens after it (fewer near the end of the context or of
    ``max_model_len``); ``[]`` when nothing matches.
    """
    ctx = list(context)
    N = len(ctx)
    if N < nmin:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - N)
    if k <= 0:
        return []
    for n in range(min(nmax, N - 1), nmin - 1, -1):
        suffix = ctx[N - n:]
        for s in range(0, N - n):
            if ctx[s:s + n] == suffix:
                st = s + n
                return ctx[st:st + min(k, N - st)]
    return []


@dataclass
class NgramTrace:
    """Per output position ``p``: tokens proposed (``drafted``) and ``acc_len`` (see module docstring)."""

    acc_len: np.ndarray  # (L,) int64, entry 0 = 1
    drafted: np.ndarray  # (L,) int64, 0 = no match (entry 0 = 0: the prefill is no verify step)
    start: np.ndarray  # (L,) int64, index into prompt + output where the proposal starts; -1 = none


def _common_suffix(tok: np.ndarray, a: np.ndarray, b: np.ndarray, cap: int) -> np.ndarray:
    """Length (<= cap) of the common suffix of ``tok[:a]`` and ``tok[:b]``, elementwise."""
    out = np.zeros(a.shape, dtype=np.int64)
    live = np.ones(a.shape, dtype=bool)
    for j in range(1, cap + 1):
        ok = live & (a - j >= 0) & (b - j >= 0)
        ok[ok] = tok[a[ok] - j] == tok[b[ok] - j]
        out[ok] = j
        live = ok
    return out


def ngram_trace(prompt: Sequence[int], output: Sequence[int], k: int = DEFAULT_K, nmin: int = NGRAM_MIN,
                nmax: int = NGRAM_MAX, max_model_len: Optional[int] = None) -> NgramTrace:
    """Teacher-forced n-gram trace of one request, exactly as vLLM's n-gram proposer would draft.

    ``k``: num_speculative_tokens; ``nmin``/``nmax``: prompt_lookup_min/max;
    ``max_model_len``: vLLM's cap on proposals near the model length (None = no cap).
    """
    P, L = len(prompt), len(output)
    tok = np.asarray(list(prompt) + list(output), dtype=np.int64)
    N = len(tok)
    acc = np.ones(L, dtype=np.int64)
    drafted = np.zeros(L, dtype=np.int64)
    start = np.full(L, -1, dtype=np.int64)
    if L == 0:
        return NgramTrace(acc, drafted, start)
    ctx = P + np.arange(L, dtype=np.int64)
    # tokens available after the first occurrence of the longest matching suffix n-gram (uncapped)
    avail = ngram_lookup_lengths(list(prompt), list(output), nmin=nmin, nmax=nmax, max_k=max(N, 1))
    hit = avail > 0
    hit[0] = False  # position 0 is the prefill
    st = np.where(hit, ctx - avail, -1)
    # the lookup hashes n-grams: re-check every hit token by token, fall back to brute force if it fails
    idx = np.flatnonzero(hit)
    if idx.size:
        good = _common_suffix(tok, st[idx], ctx[idx], nmin) >= nmin
        for p in idx[~good]:
            prop = ngram_propose(tok[:ctx[p]].tolist(), nmin, nmax, N)
            st[p] = ctx[p] - len(prop) if prop else -1
    hit = st >= 0
    cap = np.full(L, k, dtype=np.int64)
    if max_model_len is not None:
        cap = np.minimum(cap, max_model_len - ctx)
    d = np.where(hit, np.clip(np.minimum(ctx - st, cap), 0, None), 0)
    d[0] = 0
    # leading proposed tokens equal to output[p:]
    m = np.zeros(L, dtype=np.int64)
    live = d > 0
    for j in range(int(d.max(initial=0))):
        ok = live & (j < d) & (ctx + j < N)
        ok[ok] = tok[st[ok] + j] == tok[ctx[ok] + j]
        m[ok] += 1
        live = ok
    acc = np.minimum(1 + m, L - np.arange(L))
    acc[0] = 1
    return NgramTrace(acc.astype(np.int64), d.astype(np.int64), np.where(d > 0, st, -1))


def ngram_acc_len(prompt: Sequence[int], output: Sequence[int], k: int = DEFAULT_K, nmin: int = NGRAM_MIN,
                  nmax: int = NGRAM_MAX, max_model_len: Optional[int] = None) -> list[int]:
    """``ngram_trace(...).acc_len`` as a list of ints."""
    return ngram_trace(prompt, output, k, nmin, nmax, max_model_len).acc_len.tolist()


def ngram_replay(prompt: Sequence[int], output: Sequence[int], k: int = DEFAULT_K, nmin: int = NGRAM_MIN,
                 nmax: int = NGRAM_MAX, max_model_len: Optional[int] = None) -> dict[str, list[int]]:
    """The steps a vLLM n-gram run that produced ``output`` took, predicted offline.

    Walks 0 -> 1 (prefill) -> ... with gain ``acc_len[p]``. Returns ``positions``
    and ``gains`` of every decode step, and ``drafted``/``accepted`` of the steps
    with a proposal (what vLLM's detailed metrics list; ``accepted`` capped by
    the tokens left, since vLLM counts drafts accepted past ``max_tokens``).
    """
    tr = ngram_trace(prompt, output, k, nmin, nmax, max_model_len)
    L = len(output)
    out: dict[str, list[int]] = {"positions": [], "gains": [], "drafted": [], "accepted": []}
    p = 1
    while p < L:
        g = int(tr.acc_len[p])
        out["positions"].append(p)
        out["gains"].append(g)
        if tr.drafted[p] > 0:
            out["drafted"].append(int(tr.drafted[p]))
            out["accepted"].append(g - 1)
        p += g
    return out
