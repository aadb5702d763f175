"""Step records of any per-step policy, priced by any cost model, and the loop that walks them.

A policy's run is a :class:`PolicySteps`: every verify step of every request with what it drafted, which
drafters ran, the engine path and the step's k. :func:`step_seconds` prices steps through the cost-model
protocol (:class:`~sdlib.sim.costmodel.StepCostModel`: a linear :class:`~sdlib.sim.costmodel.CostModel`, as
:func:`sdlib.sim.policy.walk.request_times` prices, or an :class:`~sdlib.sim.engine_costs.EngineCostModel`, by path and
k); :func:`request_times` adds the prefill.

Conventions (the ``corrected`` convention of :mod:`sdlib.sim.oracle`): a step starting with ``p`` output
tokens reads ``acc[p]``; a request that mixes drafters runs to its output length (``len(output_token_ids)``)
and reads EAGLE-3's ``acc`` as 1 where its list ends; EAGLE-3-only policies run on the EAGLE-3 list's length
and n-gram-only ones on the n-gram list's (as the fixed-k rows do). An n-gram draft is at most as long as
the look-up's continuation (``ngram_avail``).

:func:`walk` runs a policy over lanes = (configuration, request): a loop over steps, numpy over lanes; the
policy object decides (:meth:`Policy.decide`) and learns (:meth:`Policy.observe`) with arrays of the active
lanes only.

Usage:
    from sdlib.sim.policy.walk import PolicyInputs, position_steps, request_times
    inp = PolicyInputs.of(prep)
    steps = position_steps(inp, "fixed", "eagle3", k=3)
    t = request_times(inp, steps, cost_model, batch_size=8)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from sdlib.core.registry import KMAX
from sdlib.sim.conventions import AUTHORS_NGRAM_MATCH_DEFAULT, AUTHORS_NGRAM_MATCH_PROB, CORRECTED
from sdlib.sim.costmodel import StepCostModel
from sdlib.sim.prepared import PreparedTraces

#: Drafter codes in step records.
NONE, NGRAM, EAGLE = 0, 1, 2
DRAFTER_NAMES = {NONE: "none", NGRAM: "ngram", EAGLE: "eagle3"}


# --------------------------------------------------------------------------- inputs
@dataclass
class PolicyInputs:
    """Flat per-position arrays over each request's grid (``p = 0..G-1``, ``G`` the longest of the output and
    the two lists), built once per :class:`PreparedTraces` (cached on it)."""

    prep: PreparedTraces
    L: np.ndarray  # (R,) output length (mixed policies)
    L_eagle: np.ndarray  # (R,) EAGLE-3 list length (EAGLE-3-only policies)
    L_ngram: np.ndarray  # (R,) n-gram list length
    G: np.ndarray  # (R,) grid length: the longest of the three
    off: np.ndarray  # (R+1,) offsets of the flat grid
    acc_ng: np.ndarray  # flat acc_ngram
    acc_eg: np.ndarray  # flat acc_eagle3 (1 beyond its list)
    eg_known: np.ndarray  # flat bool: inside EAGLE-3's list
    avail: np.ndarray  # flat n-gram continuation length (0 = no match), capped at kmax
    kmax: int = KMAX  # the longest draft the traces score (their k)
    extra: dict = field(default_factory=dict)  # per-position features added by other modules (flat arrays)

    @classmethod
    def of(cls, prep: PreparedTraces, kmax: int = KMAX, need_lookup: bool = True) -> "PolicyInputs":
        """The inputs of ``prep`` (cached on it; ``kmax``: the traces' k, at most :data:`KMAX`).
        ``need_lookup``: the n-gram look-up's lengths must be there (``prepare_traces(..., ngram_lookup=True)``);
        without them ``avail`` is 0 everywhere (only the authors' convention, which never reads it, runs)."""
        cache = prep._flat
        kmax = min(int(kmax), KMAX)
        if need_lookup and prep.ngram_avail is None:
            raise ValueError("needs the n-gram look-up: prepare_traces(..., ngram_lookup=True)")
        if "policy_inputs" in cache and cache["policy_inputs"].kmax != kmax:
            del cache["policy_inputs"]
        if "policy_inputs" not in cache:
            O = prep.output_len.astype(np.int64)
            Le = np.array([len(a) for a in prep.acc["eagle3"]], np.int64)
            Ln = np.array([len(a) for a in prep.acc["ngram"]], np.int64)
            G = np.maximum(O, np.maximum(Le, Ln))
            off = np.zeros(len(G) + 1, dtype=np.int64)
            np.cumsum(G, out=off[1:])

            def padded(arrs, fill):
                return np.concatenate([np.concatenate([np.asarray(a, np.int64)[:n],
                                                       np.full(max(n - len(a), 0), fill, np.int64)])
                                       for a, n in zip(arrs, G)] + [np.zeros(0, np.int64)])

            ok = np.concatenate([np.arange(n) < e for n, e in zip(G, Le)] + [np.zeros(0, bool)])
            cache["policy_inputs"] = cls(prep, O, Le, Ln, G, off, np.maximum(padded(prep.acc["ngram"], 1), 1),
                                         np.maximum(padded(prep.acc["eagle3"], 1), 1), ok,
                                         np.minimum(padded(prep.ngram_avail or [[]] * len(G), 0), kmax), kmax)
        return cache["policy_inputs"]

    def lengths(self, kind: str) -> np.ndarray:
        """Output lengths a policy runs to: ``mixed`` (output), ``eagle3`` or ``ngram`` (that list's), ``shorter``
        (the shorter of the two lists: the authors' Combine)."""
        if kind == "shorter":
            return np.minimum(self.L_ngram, self.L_eagle)
        return {"mixed": self.L, "eagle3": self.L_eagle, "ngram": self.L_ngram}[kind]

    def at(self, name: str, req: np.ndarray, pos: np.ndarray, default=0) -> np.ndarray:
        """``name[req][pos]`` (flat array ``name`` of this object or of :attr:`extra`); ``default`` past the grid."""
        arr = self.extra[name] if name in self.extra else getattr(self, name)
        ok = pos < self.G[req]
        if ok.all():
            return arr[self.off[req] + pos]
        out = np.full(pos.shape, default, dtype=arr.dtype)
        out[ok] = arr[self.off[req[ok]] + pos[ok]]
        return out


# --------------------------------------------------------------------------- records
@dataclass
class PolicySteps:
    """The verify steps of one policy run (one configuration), every request."""

    req: np.ndarray
    pos: np.ndarray
    n_i: np.ndarray  # tokens per row fed to the target (proposed + 1)
    k: np.ndarray  # the engine's k at this step (draft slots per row; padded path verifies k)
    drafter: np.ndarray  # NONE / NGRAM / EAGLE: whose draft was verified
    eagle: np.ndarray  # 1.0 where EAGLE-3 drafted (charged)
    eagle_n: np.ndarray  # tokens EAGLE-3 processed when it drafted (n_i + tokens it skipped before)
    ngram: np.ndarray  # 1.0 where the n-gram look-up ran (charged)
    gain: np.ndarray
    weight: np.ndarray
    output_len: np.ndarray  # (R,)
    path: "str | np.ndarray"  # engine path: "padded" or "ragged", or one per step (an object array: Oracle Select)

    @property
    def num_steps(self) -> np.ndarray:
        return np.bincount(self.req, weights=self.weight, minlength=len(self.output_len))

    def take_requests(self, mask_req: np.ndarray) -> "PolicySteps":
        """Only the steps of requests where ``mask_req`` is true (request indices unchanged)."""
        m = mask_req[self.req]
        path = self.path[m] if isinstance(self.path, np.ndarray) else self.path
        return PolicySteps(*(getattr(self, f)[m] for f in ("req", "pos", "n_i", "k", "drafter", "eagle", "eagle_n",
                                                         "ngram", "gain", "weight")), self.output_len, path)


# --------------------------------------------------------------------------- pricing
def step_seconds(cm: StepCostModel, B: int, kv, n_i, k, eagle, eagle_n, ngram, path: str) -> np.ndarray:
    """Seconds of decode steps at batch size ``B`` (vectorised over steps):
    :meth:`~sdlib.sim.costmodel.StepCostModel.step_seconds`.

    Linear :class:`~sdlib.sim.costmodel.CostModel`: ``T(kv, B*n_i) + overhead + eagle*EAGLE(kv, eagle_n) +
    ngram*ngram_frac*T`` (as :func:`sdlib.sim.policy.walk.request_times`). :class:`~sdlib.sim.engine_costs.EngineCostModel`:
    ``alpha[path](k, B) + a_kv*kv + a_n*B*n_i`` (drafting is inside the measured steps; k = 0 is a plain decode step).
    """
    return cm.step_seconds(B, kv, n_i, k, eagle, eagle_n, ngram, path)


def request_times(inp: PolicyInputs, st: PolicySteps, cm: StepCostModel, B: int) -> np.ndarray:
    """Per-request wall time with SD at ``B`` copies, s (prefill included)."""
    prep = inp.prep
    kv = float(B) * (prep.prompt_len[st.req] + st.pos)
    if isinstance(st.path, np.ndarray):  # a path per step: price each path's steps apart
        t = np.zeros(st.req.size)
        for path in dict.fromkeys(st.path.tolist()):
            m = st.path == path
            t[m] = cm.step_seconds(B, kv[m], st.n_i[m], st.k[m], st.eagle[m], st.eagle_n[m], st.ngram[m], path)
    else:
        t = cm.step_seconds(B, kv, st.n_i, st.k, st.eagle, st.eagle_n, st.ngram, st.path)
    total = np.bincount(st.req, weights=st.weight * t, minlength=len(prep))
    return total + cm.prefill_seconds(float(B) * prep.prompt_len)


def no_sd_times(inp: PolicyInputs, L: np.ndarray, cm: StepCostModel, B: int) -> np.ndarray:
    """Per-request wall time without SD (prefill + ``L-1`` one-token steps), s."""
    prep = inp.prep

    steps = np.maximum(L - 1, 0)
    req = np.repeat(np.arange(len(prep)), steps)
    off = np.zeros(len(prep) + 1, dtype=np.int64)
    np.cumsum(steps, out=off[1:])
    c = np.arange(off[-1]) - off[req] + 1
    t = cm.no_sd_step_seconds(B, float(B) * (prep.prompt_len[req] + c))
    return np.bincount(req, weights=t, minlength=len(prep)) + cm.prefill_seconds(float(B) * prep.prompt_len)


def price_table(cm: StepCostModel, B: int, kmax: int = KMAX) -> dict:
    """Affine prices used by cost-aware policies: ``t(d, l, kv) = base[d][l] + slope[d]*kv (+ cu*catch-up)``
    (``cu``: :attr:`~sdlib.sim.costmodel.StepCostModel.catch_up_s`) for d in NONE/NGRAM/EAGLE and l = 0..kmax drafted tokens (EAGLE drafts on the padded path, n-gram alone on
    the padded path too: the policies that use this table mix drafters). Built from :func:`step_seconds`."""
    ls = np.arange(kmax + 1)
    out = {"base": {}, "slope": {}}
    for d in (NONE, NGRAM, EAGLE):
        e = 1.0 if d == EAGLE else 0.0
        args = dict(B=B, n_i=np.where(d == NONE, 1, ls + 1), k=np.where(d == NONE, 0, ls), eagle=e,
                    eagle_n=ls + 1, ngram=1.0, path="padded")
        t0 = step_seconds(cm, kv=np.zeros(ls.size), **args)
        t1 = step_seconds(cm, kv=np.ones(ls.size), **args)
        out["base"][d], out["slope"][d] = t0, float(t1[0] - t0[0])
    out["cu"] = cm.catch_up_s
    return out


# --------------------------------------------------------------------------- the walk
@dataclass
class Lanes:
    """The active lanes of a walk: configuration index, request index, position, the index of that position in
    the flat per-position arrays (``flat``), and the policy's state."""

    cfg: np.ndarray
    req: np.ndarray
    pos: np.ndarray
    end: np.ndarray
    state: dict
    flat: np.ndarray = None

    def keep(self, m: np.ndarray) -> None:
        self.cfg, self.req, self.pos, self.end = self.cfg[m], self.req[m], self.pos[m], self.end[m]
        for k, v in self.state.items():
            self.state[k] = v[m]


class Policy:
    """A per-step policy: :meth:`init_state` (arrays per lane), :meth:`decide`, :meth:`observe`.

    ``decide(inp, lanes) -> (drafter, proposed, k, eagle, ngram)`` arrays over the active lanes; ``observe``
    gets the gains. ``lengths`` = which output lengths it runs to (``mixed``, ``eagle3``, ``ngram``);
    ``path`` = the engine path its steps are priced on.
    """

    name = "policy"
    lengths = "mixed"
    path = "padded"

    def init_state(self, cfg: np.ndarray, req: np.ndarray) -> dict:
        return {}

    def decide(self, inp: PolicyInputs, lanes: Lanes):
        raise NotImplementedError

    def observe(self, inp: PolicyInputs, lanes: Lanes, decision, gain: np.ndarray) -> None:
        pass


class Capped(Policy):
    """``policy`` with every proposal (and the step's k) capped at ``K`` (an engine's num_speculative_tokens)."""

    def __init__(self, policy: Policy, K: int):
        self.inner, self.K = policy, int(K)
        self.name, self.lengths, self.path = policy.name, policy.lengths, policy.path

    def init_state(self, cfg, req):
        return self.inner.init_state(cfg, req)

    def decide(self, inp, lanes):
        d = list(self.inner.decide(inp, lanes))
        d[1] = np.minimum(d[1], self.K)
        d[2] = np.minimum(d[2], self.K)
        return tuple(d)

    def observe(self, inp, lanes, decision, gain):
        self.inner.observe(inp, lanes, decision, gain)


#: ``BuildRequest.resources`` key: a callable a registered build applies to its policy before it walks it (e.g.
#: :class:`sdlib.sim.policy.regret.Recording`, which keeps what the policy predicted at each step).
WRAP = "wrap_policy"


def wrapped(resources: dict, policy: Policy) -> Policy:
    """``policy`` through ``resources[WRAP]`` where a caller set one, else itself."""
    wrap = resources.get(WRAP)
    return policy if wrap is None else wrap(policy)


def capped(policy: Policy, K: Optional[int]) -> Policy:
    """``policy`` itself when ``K`` is None, else :class:`Capped`."""
    return policy if K is None else Capped(policy, K)


def gains_of(inp: PolicyInputs, req, pos, drafter, proposed, flat: Optional[np.ndarray] = None) -> np.ndarray:
    """Tokens gained by verifying ``proposed`` drafts of ``drafter`` at ``pos`` (1 when nothing is drafted)."""
    if flat is None:
        a_ng, a_eg = inp.at("acc_ng", req, pos, 1), inp.at("acc_eg", req, pos, 1)
    else:
        a_ng, a_eg = inp.acc_ng[flat], inp.acc_eg[flat]
    a = np.where(drafter == NGRAM, a_ng, np.where(drafter == EAGLE, a_eg, 1))
    return np.minimum(a, np.asarray(proposed) + 1)


_COLUMNS = ("cfg", "req", "pos", "n_i", "k", "drafter", "eagle", "eagle_n", "ngram", "gain")


def walk_positions(inp: PolicyInputs, gain: np.ndarray, lengths: str = "mixed") -> np.ndarray:
    """Flat grid indices a policy whose gain depends on the position alone visits (``gain``: flat, >= 1),
    every request from position 1 to its ``lengths`` output length; loop over steps, numpy over requests."""
    L = inp.lengths(lengths)
    cur, end = inp.off[:-1] + 1, inp.off[:-1] + L
    m = cur < end
    cur, end = cur[m], end[m]
    out = []
    while cur.size:
        out.append(cur)
        cur = cur + gain[cur]
        m = cur < end
        if not m.all():
            cur, end = cur[m], end[m]
    return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)


def _shifted(inp: PolicyInputs, name: str, default) -> np.ndarray:
    """Flat array ``name`` read one position earlier (``out[p] = arr[p - 1]``, ``default`` at p = 0): the
    authors' look-up index (a step starting with ``c`` output tokens reads ``acc[c - 1]``). Cached on ``inp``."""
    key = f"shifted:{name}"
    if key not in inp.extra:
        arr = getattr(inp, name)
        out = np.empty_like(arr)
        out[1:] = arr[:-1]
        out[inp.off[:-1]] = default  # position 0 of every request
        inp.extra[key] = out
    return inp.extra[key]


def position_steps(inp: PolicyInputs, kind: str, drafter: Optional[str] = None, k: Optional[int] = None,
                   cap: Optional[int] = None, convention=None) -> PolicySteps:
    """The steps of a policy whose choice depends on the position alone, on the grid: fixed k
    (``kind="fixed"``, ``drafter`` ``eagle3`` / ``ngram``, ``k``), Oracle Proposal (``"oracle"``, ``drafter``)
    and Oracle Combine (``"combine"``; with ``k``: the better drafter per step with k proposed, as the authors'
    code allows). This is the one simulator walk: :mod:`sdlib.sim.oracle` (both conventions), ``sdlib
    simulate`` and the trace replay all take their fixed / oracle / combine steps from here.

    ``cap``: every proposal at most ``cap`` tokens (an engine's num_speculative_tokens; the oracles' step k is
    then what they draft, fixed k's is ``min(k, cap)``). ``convention``: a
    :class:`sdlib.sim.conventions.Convention` (None: ``corrected``): the look-up index, Combine's drafting
    charge and output length, the n-gram's no-match rule (``authors``: a step with ``acc`` 1 matches with the
    dataset's probability, taken in expectation as two weighted rows) and whether an idle look-up is charged.
    """

    conv = CORRECTED if convention is None else convention
    if conv.index_shift:
        ng, eg, av = _shifted(inp, "acc_ng", 1), _shifted(inp, "acc_eg", 1), _shifted(inp, "avail", 0)
        eg_ok = _shifted(inp, "eg_known", False)
    else:
        ng, eg, av, eg_ok = inp.acc_ng, inp.acc_eg, inp.avail, inp.eg_known
    if kind == "fixed" and (k is None or k < 1):
        raise ValueError("fixed k needs k >= 1")
    if k is not None and cap is not None:
        k = min(k, cap)
    if kind in ("fixed", "oracle") and drafter not in ("eagle3", "ngram"):
        raise ValueError(f"position policy {kind!r} needs drafter eagle3 or ngram, not {drafter!r}")
    if kind not in ("fixed", "oracle", "combine"):
        raise ValueError(f"position policy {kind!r}: fixed, oracle or combine")
    if kind == "combine":
        a, lengths = np.maximum(ng, eg), ("shorter" if conv.combine_length == "shorter" else "mixed")
    else:
        a, lengths = (eg if drafter == "eagle3" else ng), drafter
    if k is None:  # an oracle: propose exactly what is accepted
        prop = a - 1 if cap is None else np.minimum(a - 1, cap)
    elif kind == "fixed" and drafter == "ngram" and conv.ngram_match == "tokens":
        prop = np.minimum(av, k)  # the look-up proposes at most its continuation
    else:
        prop = np.full(a.shape, k, dtype=np.int64)
    gain = np.minimum(a, prop + 1)
    idx = walk_positions(inp, gain, lengths)
    req = np.searchsorted(inp.off, idx, side="right") - 1
    pos = idx - inp.off[req]
    p = prop[idx]
    n = idx.size
    one, zero = np.ones(n), np.zeros(n)
    weight = one.copy()
    if lengths == "eagle3":
        drafter_, eagle, ngram, path = np.full(n, EAGLE), one, zero, "padded"
    elif lengths == "ngram":
        drafter_, eagle, path = np.where(p > 0, NGRAM, NONE), zero, "ragged"
        ngram = one.copy() if conv.ngram_idle_draft else (p > 0).astype(float)
    else:
        drafter_, path = np.where(ng[idx] >= eg[idx], NGRAM, EAGLE), "padded"
        if conv.combine_draft == "both":
            eagle, ngram = one, one.copy()
        elif conv.combine_draft == "ngram":
            eagle, ngram = zero, one.copy()
        elif conv.combine_draft == "winner":  # ties go to n-gram, as in their _get_winning_method
            ew = (eg[idx] > ng[idx]) & eg_ok[idx]
            eagle, ngram = ew.astype(float), (~ew).astype(float)
        else:
            raise ValueError(f"combine_draft {conv.combine_draft!r}")
    kk = np.full(n, k) if k is not None else p
    g = gain[idx].astype(np.int64)
    n_i = (p + 1).astype(np.int64)
    if kind == "fixed" and drafter == "ngram" and conv.ngram_match == "authors":
        # their rule: a step with acc 1 finds no n-gram with probability q -> propose nothing, draft free;
        # in expectation: the step as proposed with weight 1 - q, plus the no-match step with weight q
        q = 1.0 - np.array([AUTHORS_NGRAM_MATCH_PROB.get(d, AUTHORS_NGRAM_MATCH_DEFAULT)
                            for d in inp.prep.dataset])[req]
        s = np.flatnonzero(a[idx] == 1)
        weight = np.where(a[idx] == 1, 1.0 - q, 1.0)
        cat = lambda x, extra: np.concatenate([x, extra])  # noqa: E731
        req, pos, g = cat(req, req[s]), cat(pos, pos[s]), cat(g, g[s])
        weight = cat(weight, q[s])
        n_i, kk = cat(n_i, np.ones(s.size, np.int64)), cat(kk, np.zeros(s.size, kk.dtype))
        drafter_ = cat(drafter_, np.full(s.size, NONE))
        ngram = cat(ngram, np.full(s.size, 1.0 if conv.ngram_idle_draft else 0.0))
        eagle = np.zeros(req.size)
    return PolicySteps(req, pos, n_i, kk.astype(np.int64), drafter_.astype(np.int8), eagle, n_i.astype(float),
                       ngram, g, weight, inp.lengths(lengths).copy(), path)


def constant_steps(inp: PolicyInputs, proposed: int, accepted: int, path: str = "padded") -> PolicySteps:
    """Every request proposes ``proposed`` and accepts ``accepted`` at every step, up to its output length
    (calibration plans: acceptance fixed by the plan, not by the traces)."""
    L = inp.lengths("mixed")
    steps = [np.arange(1, max(int(x), 1), accepted + 1, dtype=np.int64) for x in L]
    req = np.repeat(np.arange(L.size), [s.size for s in steps])
    pos = np.concatenate(steps + [np.zeros(0, np.int64)])
    n = pos.size
    one = np.ones(n)
    drafter = EAGLE if proposed else NONE
    return PolicySteps(req.astype(np.int64), pos, np.full(n, proposed + 1, np.int64), np.full(n, proposed, np.int64),
                       np.full(n, drafter, np.int8), one * (proposed > 0), np.full(n, proposed + 1.0), 0 * one,
                       np.full(n, accepted + 1, np.int64), one.copy(), L.copy(), path)


def walk(inp: PolicyInputs, policy: Policy, n_configs: int = 1,
         requests: Optional[Sequence[int]] = None, start: Optional[np.ndarray] = None) -> list[PolicySteps]:
    """Run ``policy`` on every (configuration, request) lane; one :class:`PolicySteps` per configuration.

    Lanes run while their position is below the policy's output length (so ``lanes.flat`` is always inside
    the request's grid); decisions may be arrays over the lanes or scalars. ``start``: (R,) first position of
    each request (default 1, the first step after the prefill).
    """
    R = len(inp.prep)
    reqs = np.arange(R) if requests is None else np.asarray(requests, dtype=np.int64)
    L = inp.lengths(policy.lengths)
    cfg = np.repeat(np.arange(n_configs), reqs.size)
    req = np.tile(reqs, n_configs)
    pos0 = np.ones(req.size, np.int64) if start is None else np.maximum(np.asarray(start, np.int64)[req], 1)
    lanes = Lanes(cfg, req, pos0, L[req].astype(np.int64), {})
    lanes.state = policy.init_state(lanes.cfg, lanes.req)
    lanes.keep(lanes.pos < lanes.end)
    cols: dict[str, list] = {k: [] for k in _COLUMNS}
    while lanes.req.size:
        n = lanes.req.size
        lanes.flat = inp.off[lanes.req] + lanes.pos
        d = policy.decide(inp, lanes)
        drafter, proposed, k, eagle, ngram = d[:5]
        eagle_n = d[5] if len(d) > 5 else np.asarray(proposed) + 1.0
        gain = gains_of(inp, lanes.req, lanes.pos, drafter, proposed, lanes.flat)
        for name, v in zip(_COLUMNS, (lanes.cfg, lanes.req, lanes.pos, np.asarray(proposed) + 1, k, drafter, eagle,
                                      eagle_n, ngram, gain)):
            cols[name].append(v if isinstance(v, np.ndarray) and v.shape == (n,) else np.full(n, v))
        policy.observe(inp, lanes, d, gain)
        lanes.pos = lanes.pos + gain
        alive = lanes.pos < lanes.end
        if not alive.all():
            lanes.keep(alive)
    flat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}
    out = []
    for c in range(n_configs):
        m = flat["cfg"] == c if n_configs > 1 else slice(None)
        num = int(np.count_nonzero(m)) if n_configs > 1 else flat["cfg"].size
        out.append(PolicySteps(flat["req"][m].astype(np.int64), flat["pos"][m].astype(np.int64),
                               flat["n_i"][m].astype(np.int64), flat["k"][m].astype(np.int64),
                               flat["drafter"][m].astype(np.int8), flat["eagle"][m].astype(float),
                               flat["eagle_n"][m].astype(float), flat["ngram"][m].astype(float),
                               flat["gain"][m].astype(np.int64), np.ones(num), L.copy(), policy.path))
    return out
