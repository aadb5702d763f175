"""Test helpers for the simulator: the authors' (proposer, predict method) names mapped to policy instances,
and a slow, loop-per-request reference of the simulator's step rule written straight from the definitions in
:mod:`sdlib.sim.oracle` (both conventions), to check the one vectorised walk against."""

from __future__ import annotations

import numpy as np

from sdlib.core.registry import PolicyRef
from sdlib.sim.conventions import AUTHORS_NGRAM_MATCH_DEFAULT, AUTHORS_NGRAM_MATCH_PROB, get_convention

#: the authors' predict-method names used in the tests -> k (None: the oracle)
PREDICT_K = {"FIXED_1": 1, "FIXED_2": 2, "FIXED_3": 3, "FIXED_5": 5, "ORACLE": None}


def ref_of(proposer: str, predict_method: str) -> PolicyRef:
    k = PREDICT_K[predict_method]
    if proposer == "combined":
        return PolicyRef("combine", None, k)
    return PolicyRef("fixed", proposer, k) if k is not None else PolicyRef("oracle", proposer)


def refs(proposers, predict_methods) -> list[PolicyRef]:
    """The instances of the authors' product proposers x predict methods, in their loop order."""
    return [ref_of(p, m) for p in proposers for m in predict_methods]


def reference_steps(prep, proposer: str, k, convention="corrected", cap=None) -> list[tuple]:
    """Every step of every request as ``(req, pos, n_i, gain, weight, eagle, ngram)``, one Python loop per
    request: a step at ``c`` output tokens reads ``acc[c]`` (``acc[c-1]`` under the authors' index shift, 1
    outside the list); ``k`` None = propose ``acc - 1`` (at most ``cap``)."""
    conv = get_convention(convention)
    out = []
    for r in range(len(prep)):
        ng, eg = list(prep.acc["ngram"][r]), list(prep.acc["eagle3"][r])
        av = list(prep.ngram_avail[r]) if prep.ngram_avail is not None else []
        if proposer == "ngram":
            L = len(ng)
        elif proposer == "eagle3":
            L = len(eg)
        else:
            L = min(len(ng), len(eg)) if conv.combine_length == "shorter" else int(prep.output_len[r])
        c = 1
        while c < L:
            s = c - 1 if conv.index_shift else c
            a_ng, ok_ng = (ng[s], True) if 0 <= s < len(ng) else (1, False)
            a_eg, ok_eg = (eg[s], True) if 0 <= s < len(eg) else (1, False)
            if proposer == "ngram":
                a = a_ng
            elif proposer == "eagle3":
                a = a_eg
            else:
                a = max(a_ng, a_eg) if ok_ng and ok_eg else (a_ng if ok_ng else a_eg)
            a = max(a, 1)
            if k is None:
                n_i = a if cap is None else min(a, cap + 1)
            else:
                n_i = k + 1
                if proposer == "ngram" and conv.ngram_match == "tokens":
                    n_i = min(k, av[s] if 0 <= s < len(av) else 0) + 1
            gain = min(a, n_i)
            if proposer == "eagle3":
                out.append((r, c, n_i, gain, 1.0, 1.0, 0.0))
            elif proposer == "ngram":
                charge = 1.0 if conv.ngram_idle_draft else float(n_i > 1)
                if k is not None and conv.ngram_match == "authors" and a == 1:
                    q = 1.0 - AUTHORS_NGRAM_MATCH_PROB.get(prep.dataset[r], AUTHORS_NGRAM_MATCH_DEFAULT)
                    out.append((r, c, n_i, gain, 1.0 - q, 0.0, charge))
                    out.append((r, c, 1, gain, q, 0.0, 1.0 if conv.ngram_idle_draft else 0.0))
                else:
                    out.append((r, c, n_i, gain, 1.0, 0.0, charge))
            else:
                if conv.combine_draft == "both":
                    e, g = 1.0, 1.0
                elif conv.combine_draft == "ngram":
                    e, g = 0.0, 1.0
                else:
                    e = float(a_eg > a_ng and ok_eg)
                    g = 1.0 - e
                out.append((r, c, n_i, gain, 1.0, e, g))
            c += gain
    return out


def steps_as_tuples(st) -> list[tuple]:
    """A :class:`~sdlib.sim.policy.walk.PolicySteps` in :func:`reference_steps`' form, sorted the same way."""
    rows = list(zip(st.req.tolist(), st.pos.tolist(), st.n_i.tolist(), st.gain.tolist(), st.weight.tolist(),
                    st.eagle.tolist(), st.ngram.tolist()))
    return sorted(rows, key=lambda x: (x[0], x[1], -x[4] if x[2] > 1 else 2))


def reference_times(prep, rows, cm, B: int) -> np.ndarray:
    """Per-request seconds of ``rows`` with a linear cost model, one step at a time (prefill included)."""
    tot = np.zeros(len(prep))
    for r, c, n_i, _, w, e, g in rows:
        kv = B * (prep.prompt_len[r] + c)
        v = cm.verify_time(kv, B * n_i)
        tot[r] += w * (v + cm.overhead_s + e * cm.draft_time("eagle3", kv, n_i) + g * cm.ngram_frac * v)
    return tot + cm.prefill_time(B * prep.prompt_len) + cm.overhead_s
