"""Arctic Inference's hybrid rule on the traces: a suffix-decoding draft when its score reaches the model
drafter's k, else the model's k drafts (here EAGLE-3, k = :data:`ARCTIC_MODEL_K`).

Source: snowflakedb/ArcticInference v0.1.0 (3145f23) ``arctic_inference/vllm/model_runner.py`` L557-614 and
v0.2.0 (e9bbbd0) L1004-1027: ``result.token_ids if result.score >= min_score else []`` with ``min_score`` =
the model drafter's ``num_speculative_tokens``; the suffix draft comes from ``csrc/suffix_decoding/
suffix_tree.cc`` (v0.1.0 L593-622, L825-853; ``cache.py`` L235-310). Their model drafter is Arctic's own
(``arctic`` / ``mlp_speculator``); pairing the rule with EAGLE-3 is our adaptation. Both drafters run every
step (v0.2.0) and both are charged.

The suffix draft at output position ``p`` (context C = prompt + output[:p]), as the C++ computes it on the
request's own tree (the *local* tree): for every suffix of C of length ``m`` (``m < len(C)``, at most 63
tokens) that occurred earlier, follow from its occurrences the most frequent next token while its share of
``occ(suffix)`` (the tail occurrence included) stays >= ``min_token_prob`` (0.1), for at most
``min(max_spec, m)`` tokens; the score is the sum of those shares, and the best score over ``m`` wins (ties:
the longer ``m``). The *global* tree (responses of other requests) is left out. ``max_spec`` = 20 (the
traces' longest draft; Arctic's 32). Only ``m >= k + 1`` can reach a score of ``k`` (a score is below the
draft length, which is at most ``m``), so :func:`suffix_scores` looks only there (``min_match``): exact for
the rule's decision and its draft. Acceptance of a suffix draft ``d``: ``1 + LCP(d, output[p:])``.

Usage:
    from sdlib.sim.policy.arctic import suffix_draft
    suffix_draft([1, 2, 3, 4, 5, 1, 2, 3])   # -> (1.5, [4, 5, 1])
"""

from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np

from sdlib.core.registry import KMAX, PolicySpec, register_policy
from sdlib.paths import CACHE_DIR
from sdlib.sim.policy.walk import EAGLE, NGRAM, Policy, PolicyInputs, PolicySteps, capped, walk

#: The model drafter's k (the rule's threshold) and the suffix parameters (ArcticInference config v0.1.0 L58-64).
ARCTIC_MODEL_K = 3
MAX_DEPTH = 64
MIN_TOKEN_PROB = 0.1
MAX_SPEC = KMAX
#: Bump when the suffix arrays' definition changes (invalidates the cache in .cache/sim/).
CACHE_VERSION = 1


class _Draft:
    """A draft followed from a set of occurrence ends, extendable when the limit grows (same set)."""

    def __init__(self, C: Sequence[int], e: int, ends: list, min_prob: float):
        self.C, self.e, self.denom, self.min_prob = C, e, len(ends) + 1, min_prob
        self.alive, self.d, self.probs, self.stopped, self.score = ends, [], [], False, 0.0

    def extend(self, limit: int) -> None:
        C, e = self.C, self.e
        while not self.stopped and len(self.d) < limit:
            t = len(self.d)
            counts: dict = {}
            for c in self.alive:
                if c + t < e:
                    tok = C[c + t]
                    counts[tok] = counts.get(tok, 0) + 1
            if not counts:
                self.stopped = True
                break
            tok = max(counts, key=counts.get)  # first-seen wins ties (dicts keep insertion order)
            prob = counts[tok] / self.denom
            if prob < self.min_prob:
                self.stopped = True
                break
            self.d.append(tok)
            self.probs.append(prob)
            self.score += prob
            self.alive = [c for c in self.alive if c + t < e and C[c + t] == tok]

    def truncate(self, limit: int) -> None:
        if len(self.d) > limit:
            self.d, self.probs = self.d[:limit], self.probs[:limit]
            self.score = float(sum(self.probs))


def _limit(m: int, max_spec: int) -> int:
    return min(max_spec, m, MAX_DEPTH - m)


def _draft_from(C: Sequence[int], e: int, ends: list, m: int, max_spec: int, min_prob: float) -> tuple[float, list]:
    """Follow the most frequent continuation of the occurrences ending at ``ends`` (the tail excluded)."""
    dr = _Draft(C, e, ends, min_prob)
    dr.extend(_limit(m, max_spec))
    return float(sum(dr.probs)), dr.d


def suffix_draft(context: Sequence[int], min_match: int = 1, max_spec: int = MAX_SPEC,
                 min_prob: float = MIN_TOKEN_PROB) -> tuple[float, list]:
    """(score, draft) of the local suffix tree for ``context`` (brute force over its earlier occurrences)."""
    C = list(context)
    e = len(C)
    best = (0.0, [])
    ends = [c for c in range(1, e) if C[c - 1] == C[e - 1]]  # occurrences of the last token, ending before e
    m = 1
    while ends and m < min(e, MAX_DEPTH):
        if m >= min_match:
            sc, d = _draft_from(C, e, ends, m, max_spec, min_prob)
            if sc >= best[0]:
                best = (sc, d)
        m += 1
        ends = [c for c in ends if c - m >= 0 and C[c - m] == C[e - m]]
    return best


def suffix_scores(prompt: Sequence[int], output: Sequence[int], min_match: int = ARCTIC_MODEL_K + 1,
                  max_spec: int = MAX_SPEC, min_prob: float = MIN_TOKEN_PROB) -> tuple[np.ndarray, ...]:
    """Per output position: the best suffix score over matches of at least ``min_match`` tokens (0: none),
    its draft's length, and the tokens the draft would gain (``1 + LCP(draft, output[p:])``)."""
    C = [int(x) for x in prompt] + [int(x) for x in output]
    P, L = len(prompt), len(output)
    score = np.zeros(L)
    gain = np.ones(L, dtype=np.int64)
    length = np.zeros(L, dtype=np.int64)
    index: dict = {}
    for c in range(min_match, P + 1):  # min_match-grams of the prompt, by end
        index.setdefault(tuple(C[c - min_match:c]), []).append(c)
    for p in range(L):
        e = P + p
        if p > 0:
            index.setdefault(tuple(C[e - min_match:e]), []).append(e) if e >= min_match else None
        if e < min_match + 1:
            continue
        ends = [c for c in index.get(tuple(C[e - min_match:e]), ()) if c < e]
        if not ends:
            continue
        top = min(e - 1, MAX_DEPTH - 1)
        ml = []  # how far back each occurrence matches the tail (capped so that m < e and m < MAX_DEPTH)
        for c in ends:
            k = min_match
            while k < top and c - k - 1 >= 0 and C[c - k - 1] == C[e - k - 1]:
                k += 1
            ml.append(min(k, top))
        m_max = max(ml)
        # evaluate m only where the draft can change: the limit grows (m <= max_spec) or shrinks
        # (m > MAX_DEPTH - max_spec), or the set of occurrences shrinks (just past a match length)
        todo = set(range(min_match, min(max_spec, m_max) + 1)) | set(range(MAX_DEPTH - max_spec + 1, m_max + 1))
        todo |= {x + 1 for x in ml if min_match <= x < m_max}
        best, bd, blen = 0.0, [], 0
        dr = None
        for m in sorted(todo):
            cur = [c for c, x in zip(ends, ml) if x >= m]
            lim = _limit(m, max_spec)
            if dr is None or len(cur) != dr.denom - 1:  # the set of occurrences changed: follow it anew
                dr = _Draft(C, e, cur, min_prob)
            else:  # same occurrences: the draft only grows or shrinks with the limit
                dr.truncate(lim)
            dr.extend(lim)
            if dr.score >= best:
                best, bd, blen = dr.score, dr.d, len(dr.d)
        bd = bd[:blen]
        score[p] = best
        length[p] = len(bd)
        n = 0
        for j, tok in enumerate(bd):
            if p + j < L and C[e + j] == tok:
                n += 1
            else:
                break
        gain[p] = 1 + n
    return score, length, gain


def add_suffix_features(inp: PolicyInputs, min_match: int = ARCTIC_MODEL_K + 1) -> None:
    """``suffix_score`` / ``suffix_len`` / ``suffix_gain`` flat arrays on ``inp.extra`` (output positions)."""
    if "suffix_score" in inp.extra:
        return
    prep = inp.prep
    if prep.prompt_token_ids is None:
        raise ValueError("the suffix rule needs the token ids: prepare_traces(..., keep_tokens=True)")
    path = _cache_path(inp, min_match)
    if path.exists():
        with np.load(path) as z:
            inp.extra.update(suffix_score=z["score"], suffix_len=z["len"], suffix_gain=z["gain"])
        return
    sc, ln, gn = [], [], []
    for i in range(len(prep)):
        G = int(inp.G[i])
        s, n, g = suffix_scores(prep.prompt_token_ids[i], prep.output_token_ids[i], min_match, max_spec=inp.kmax)
        sc.append(np.pad(s[:G], (0, max(G - s.size, 0))))
        ln.append(np.pad(n[:G], (0, max(G - n.size, 0))))
        gn.append(np.pad(g[:G], (0, max(G - g.size, 0)), constant_values=1))
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    inp.extra.update(suffix_score=cat(sc, float), suffix_len=cat(ln, np.int64), suffix_gain=cat(gn, np.int64))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, score=inp.extra["suffix_score"], len=inp.extra["suffix_len"], gain=inp.extra["suffix_gain"])
    tmp.replace(path)


def _cache_path(inp: PolicyInputs, min_match: int):
    """The suffix arrays are slow to make (~20 s for the reference traces): cached by the tokens and settings."""

    h = hashlib.sha256(repr((CACHE_VERSION, min_match, inp.kmax, MIN_TOKEN_PROB, MAX_DEPTH)).encode())
    for i in range(len(inp.prep)):
        h.update(np.asarray(inp.prep.prompt_token_ids[i], np.int64).tobytes())
        h.update(b"|")
        h.update(np.asarray(inp.prep.output_token_ids[i], np.int64).tobytes())
        h.update(np.int64(inp.G[i]).tobytes())
    return CACHE_DIR / "sim" / f"suffix_{h.hexdigest()[:16]}.npz"


class ArcticRule(Policy):
    """Suffix draft iff its score >= k (the model drafter's k), else EAGLE-3's k drafts; both drafters run."""

    path = "padded"
    lengths = "mixed"
    name = "arctic"

    def __init__(self, k: int = ARCTIC_MODEL_K):
        self.k = k

    def decide(self, inp, lanes):
        sc = inp.extra["suffix_score"][lanes.flat]
        suf = (sc >= self.k) & (sc > 0)
        prop = np.where(suf, inp.extra["suffix_len"][lanes.flat], self.k)
        return np.where(suf, NGRAM, EAGLE).astype(np.int8), prop, prop, 1.0, 1.0


def arctic_steps(inp: PolicyInputs, k: int = ARCTIC_MODEL_K, K: Optional[int] = None) -> PolicySteps:
    """Arctic's rule walked on ``inp`` (the suffix draft's gain replaces the n-gram trace's); ``K`` caps every
    proposal (an engine's num_speculative_tokens; a capped suffix draft gains ``min(gain, K + 1)``)."""
    add_suffix_features(inp, k + 1)
    saved = inp.acc_ng
    try:  # the suffix draft stands in the n-gram slot: its gains come from the suffix arrays
        inp.acc_ng = inp.extra["suffix_gain"]
        st = walk(inp, capped(ArcticRule(k), K))[0]
    finally:
        inp.acc_ng = saved
    return st


register_policy(PolicySpec(
    "arctic", "baseline",
    lambda req, ref: [arctic_steps(req.inputs, ARCTIC_MODEL_K if req.K is None else min(ARCTIC_MODEL_K, req.K),
                                   req.K)] * len(req.configs),
    "Arctic Inference's suffix-or-model rule (arctic_inference suffix decoding)", replays_on=("eagle3",),
    mixes_drafters=True, groups=("baselines",)))
