"""Per-position features an engine sees before verifying: the n-gram match and the prompt/output overlap so far.

At output position ``p`` (context = prompt + output[:p]) the n-gram look-up (:mod:`sdlib.extract.ngram`,
min 3, max 7) finds the longest suffix n-gram that occurred earlier. Beside how far its continuation reaches
(``ngram_avail``, computed by the look-up itself) this module gives

* ``match_n``: that n-gram's length (0 = no match);
* ``match_count``: how many times it occurred earlier in the context (its suffix occurrence excluded);
* ``ovl_cum``: the share of output positions ``1..p-1`` whose look-up found a match (prompt/output overlap
  so far), ``ovl_recent`` the same over the last :data:`RECENT` positions;
* ``ng_hit_prev``, ``ng_hit_recent``, ``ng_hit_cum``: whether the look-up's proposal at ``p-1`` got its first
  token right, and the share of matched positions among the last :data:`RECENT` (all) before ``p`` whose
  proposal did (checked against tokens already produced: an engine can keep this count as it goes).

Kept apart from the predictor's columns (its committed fits hash them), :func:`continuation_agreement` gives
per position how far the continuations after the matched n-gram's first and latest earlier occurrences agree
(``-1``: no match, or the n-gram occurred once), which :mod:`sdlib.sim.policy.agreement` reads.

All are functions of the tokens before ``p`` only. :data:`STATIC_FEATURES` stacks them (with the output
position) into one matrix, in the predictor's column order. :func:`add_features` stores them as flat arrays on a
:class:`~sdlib.sim.policy.walk.PolicyInputs` (``inp.extra``).

Usage:
    from sdlib.sim.policy.features import ngram_match_features, add_features
    n, count = ngram_match_features([1, 2, 3, 1, 2, 3], [1, 2, 3])   # per output position
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sdlib.extract.ngram import NGRAM_MAX, NGRAM_MIN, suffix_ngram_passes

#: Window of ``ovl_recent`` and ``ng_hit_recent`` (output positions).
RECENT = 16
#: Per-position features, in the predictor's column order (sdlib.sim.policy.predictor.FEATURES starts with these).
STATIC_FEATURES = ("has_match", "log_avail", "avail_at_cap", "match_n", "log_count", "ovl_cum", "ovl_recent",
                   "ng_hit_prev", "ng_hit_recent", "ng_hit_cum", "log_pos")


def ngram_match_features(prompt: Sequence[int], output: Sequence[int], nmin: int = NGRAM_MIN,
                         nmax: int = NGRAM_MAX) -> tuple[np.ndarray, np.ndarray]:
    """Per output position: (length of the matched n-gram, 0 = none; earlier occurrences of it)."""
    ctx, passes = suffix_ngram_passes(prompt, output, nmin, nmax)
    match_n = np.zeros(len(output), dtype=np.int64)
    count = np.zeros(len(output), dtype=np.int64)
    found = np.zeros(len(output), dtype=bool)
    for n, h, s in passes:
        order = np.argsort(h, kind="stable")
        hs = h[order]
        start = np.r_[0, np.flatnonzero(hs[1:] != hs[:-1]) + 1]
        grp = np.zeros(hs.size, dtype=np.int64)
        grp[start[1:]] = 1
        grp = np.cumsum(grp)
        rank = np.empty(hs.size, dtype=np.int64)
        rank[order] = np.arange(hs.size) - start[grp]  # earlier occurrences of the same n-gram
        cand = np.flatnonzero((s >= 0) & ~found)
        r = rank[s[cand]]
        hit = r > 0
        idx = cand[hit]
        match_n[idx] = n
        count[idx] = r[hit]
        found[idx] = True
    return match_n, count


def continuation_agreement(prompt: Sequence[int], output: Sequence[int], nmin: int = NGRAM_MIN,
                           nmax: int = NGRAM_MAX, cap: int = 20) -> np.ndarray:
    """Per output position ``p``: over how many tokens (at most ``cap``) the continuation after the look-up's
    match (the longest suffix n-gram of prompt + output[:p] that occurred earlier, at its *first* occurrence:
    what vLLM proposes) equals the continuation after that n-gram's *latest* earlier occurrence, both read
    inside the context; ``-1`` where nothing matches or the n-gram occurred only once before (nothing to agree
    with). Two earlier copies of the same text that go on alike are a repeat the target is likely to follow;
    where they part, so may it."""
    ctx, passes = suffix_ngram_passes(prompt, output, nmin, nmax)
    tok = np.concatenate([np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)])
    out = np.full(len(output), -1, dtype=np.int64)
    found = np.zeros(len(output), dtype=bool)
    for n, h, s in passes:
        order = np.argsort(h, kind="stable")  # occurrences of one n-gram in index order
        hs = h[order]
        same = np.r_[False, hs[1:] == hs[:-1]]
        prev = np.full(h.size, -1, dtype=np.int64)
        prev[order[same]] = order[np.flatnonzero(same) - 1]  # the latest earlier occurrence of each window
        _, first_idx, inv = np.unique(h, return_index=True, return_inverse=True)
        first = first_idx[inv.ravel()]
        cand = np.flatnonzero((s >= 0) & ~found)
        f = first[s[cand]]
        hit = f < s[cand]
        idx, f = cand[hit], f[hit]
        found[idx] = True
        last = prev[s[idx]]
        two = last > f  # a second, later occurrence before the suffix
        idx, f, last = idx[two], f[two], last[two]
        agree = np.zeros(idx.size, dtype=np.int64)
        going = np.ones(idx.size, dtype=bool)
        for k in range(cap):  # the later copy's continuation ends first (at the context's end)
            ok = going & (last + n + k < ctx[idx])
            ok[ok] = tok[f[ok] + n + k] == tok[last[ok] + n + k]
            agree += ok
            going = ok
            if not going.any():
                break
        out[idx] = agree
    return out


def share_so_far(hit: np.ndarray, over: np.ndarray, recent: int = RECENT) -> tuple[np.ndarray, np.ndarray]:
    """Per position p: sum(hit[1:p]) / sum(over[1:p]) and the same over the last ``recent`` positions (0 if
    the denominator is 0)."""
    L = hit.size
    h = hit.astype(float).copy()
    o = over.astype(float).copy()
    h[:1] = o[:1] = 0.0
    ch = np.concatenate([[0.0], np.cumsum(h)])
    co = np.concatenate([[0.0], np.cumsum(o)])
    p = np.arange(L)
    lo = np.maximum(p - recent, 0)
    cum = np.divide(ch[p], co[p], out=np.zeros(L), where=co[p] > 0)
    rec = np.divide(ch[p] - ch[lo], co[p] - co[lo], out=np.zeros(L), where=(co[p] - co[lo]) > 0)
    return cum, rec


def static_matrix(avail: np.ndarray, acc_ng: np.ndarray, match_n: np.ndarray, count: np.ndarray,
                  kmax: int) -> np.ndarray:
    """(L, len(STATIC_FEATURES)) features of one request's positions (see the module docstring)."""
    L = avail.size
    has = avail > 0
    ovl_cum, ovl_rec = share_so_far(has, np.ones(L, bool))
    hit = has & (acc_ng >= 2)
    hit_cum, hit_rec = share_so_far(hit, has)
    prev = np.concatenate([[0.0], hit[:-1].astype(float)]) if L else np.zeros(0)
    prev[:2] = 0.0
    p = np.arange(L)
    return np.column_stack([has.astype(float), np.log1p(avail), (avail >= kmax).astype(float),
                            has * (match_n - 3) / 4.0, np.log1p(count), ovl_cum, ovl_rec, prev, hit_rec, hit_cum,
                            np.log1p(p) / 8.0])


def add_features(inp) -> None:
    """Compute the features of every request of ``inp`` (a PolicyInputs): ``inp.extra["static_X"]`` (flat
    positions x :data:`STATIC_FEATURES`)."""
    if "static_X" in inp.extra:
        return
    # deferred: sdlib.sim.policy.walk loads pandas, and only this path needs it
    from sdlib.sim.policy.walk import KMAX

    prep = inp.prep
    if prep.prompt_token_ids is None:
        raise ValueError("features need the token ids: prepare_traces(..., keep_tokens=True)")
    mats = []
    for i in range(len(prep)):
        G = int(inp.G[i])
        out = list(prep.output_token_ids[i])
        n, c = ngram_match_features(prep.prompt_token_ids[i], out)
        pad = max(G - len(out), 0)
        n, c = np.pad(n[:G], (0, pad)), np.pad(c[:G], (0, pad))
        sl = slice(inp.off[i], inp.off[i + 1])
        mats.append(static_matrix(inp.avail[sl], inp.acc_ng[sl], n, c, KMAX))
    inp.extra["static_X"] = np.concatenate(mats) if mats else np.zeros((0, len(STATIC_FEATURES)))
