"""Oracle Select: the clairvoyant bound on the per-step choice of drafter and draft length, by an exact
dynamic program over each request's output positions.

At every step of every request the bound knows every drafter's acceptance at that position (the traces) and
takes the best of: no SD, the n-gram with any ``l <= `` its look-up's continuation (``avail``), EAGLE-3 with any
``1 <= l <= kmax``, and Arctic's suffix draft cut to any ``l <= `` its length (where the traces carry token ids:
:mod:`sdlib.sim.policy.arctic` drafts with it, and its gains can exceed the n-gram trace's); a step is charged
only for the drafter it chose (Oracle Combine pays both every step, so Select >= Combine under the
``corrected`` convention; :mod:`sdlib.sim.oracle`).

The program: state = output position ``p``; value ``V(p)`` = the least time to finish the request from ``p``
(``V(p) = 0`` for ``p >= L``); an action (drafter, ``l``) at ``p`` gains ``g = min(acc[p], l + 1)`` tokens
(1 for no SD) and costs its price ``c(p, action)``: ``V(p) = min_action c(p, action) + V(p + g)``, solved
backwards from ``L - 1`` to 1 (numpy over requests), then walked forwards from position 1 into
:class:`~sdlib.sim.policy.walk.PolicySteps` that :func:`~sdlib.sim.policy.walk.request_times` prices to the
same seconds (+ the prefill). Only the cheapest action of each gain matters, so ``c(p, g)`` (a ``(positions,
kmax + 2)`` table) is built once, vectorised.

Prices (:data:`PRICE_MODES`). Each action is priced at the cheapest step record any registered policy can
write for it: per drafter, the minimum over the modes below of the cost model's
:meth:`~sdlib.sim.costmodel.StepCostModel.step_seconds` (engine k free in ``[l, K_PRICE_MAX]`` where a
policy sets the engine's k apart from what it proposes). So a policy's step is never cheaper than the
bound's step of the same gain at the same position, and any policy's walk is a path of the program that
costs at least as much: no policy's per-request time is below Select's, at any batch size and cost model.

* **Batch.** The simulator's batch is ``B`` copies of one request (:mod:`sdlib.sim.oracle`): every copy
  advances by the same gain and a step's price is that of ``B`` identical rows at ``kv = B * (P + p)``. The
  per-request program is therefore exact at every ``B`` (no coupling between requests to relax).
* **Catch-up** (EAGLE-3 re-reading tokens it skipped while the n-gram drafted): relaxed, free. The bound
  charges EAGLE-3 ``eagle_n = l + 1`` as the fixed-k policies pay; the online policy pays more after skipped
  steps. Free catch-up can only lower the bound's times: still an upper bound on throughput.
* **Lengths.** Select runs to the request's output length (the ``mixed`` length, as Combine). It bounds
  single-drafter policies where they run to the same length: on truncated traces
  (:func:`sdlib.sim.prepared.truncate_traces`, as ``sdlib simulate`` and the policy table run them).
* **Engine k beyond** :data:`K_PRICE_MAX` (= the traces' longest draft): not looked at; no registered
  policy's step goes there in simulation (specdecode-adaptive-ngram's k, which has no clamp, is capped there as
  the engine's k: its look-up never proposes more). :class:`~sdlib.sim.engine_costs.EngineCostModel`
  extrapolates ``alpha[ragged](k, B)`` beyond its largest measured k (10) from the last two points; where that
  slope is negative (B 8 to 128 of the committed fit) a ragged step gets cheaper with k without end (below zero
  near K = 50 at B 32), so no bound exists over unbounded k: :attr:`SelectPrices.tail_cheaper` records it.

Usage:
    from sdlib.sim.policy.select import oracle_select_steps
    steps = oracle_select_steps(PolicyInputs.of(prep), cost_model, batch_size=8)
    # or through the registry: PolicyRef("oracle-select"), label "oracle-select"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from sdlib.core.registry import KMAX, BuildRequest, PolicyRef, PolicySpec, register_policy
from sdlib.sim.costmodel import StepCostModel
from sdlib.sim.policy.arctic import ARCTIC_MODEL_K, add_suffix_features
from sdlib.sim.policy.walk import EAGLE, NGRAM, NONE, PolicyInputs, PolicySteps

#: The largest engine k a k-free price mode is priced at: the traces' longest draft (no registered policy's
#: engine k goes beyond it in simulation; specdecode-adaptive-ngram's is capped there, its look-up proposing no more).
K_PRICE_MAX = KMAX
#: Actions: the drafter codes of :mod:`sdlib.sim.policy.walk`, and Arctic's suffix draft (recorded as the
#: n-gram slot, as :mod:`sdlib.sim.policy.arctic` records it).
SUFFIX = 3
ACTIONS = (NONE, NGRAM, EAGLE, SUFFIX)
#: KV sizes the affine check of the prices uses (tokens in the batch's cache).
_KV_CHECK = (0.0, 1.0e6, 3.7e5)


@dataclass(frozen=True)
class PriceMode:
    """One way a registered policy's step record prices an action: engine ``path``, the engine's ``k``
    (``zero``: 0; ``proposed``: k = l; ``free``: any k in ``[l, K_PRICE_MAX]``), drafting flags. ``who``: the
    policies that write such steps."""

    drafter: int
    path: str
    k: str
    eagle: float
    ngram: float
    who: str


#: Every step record a registered policy writes, per drafter (n_i = l + 1 and eagle_n = l + 1 in all).
PRICE_MODES = (
    PriceMode(NONE, "padded", "zero", 0.0, 0.0, "plain decode: sglang-adaptive and dynamic-sd at k 0"),
    PriceMode(NONE, "padded", "zero", 0.0, 1.0, "online, online-ngram: no draft, the look-up ran"),
    PriceMode(NONE, "ragged", "free", 0.0, 1.0, "no n-gram match: fixed-ngram-k (k), specdecode-adaptive-ngram "
              "(its k), oracle-ngram (k 0)"),
    PriceMode(NGRAM, "ragged", "free", 0.0, 1.0, "fixed-ngram-k (k >= proposed), specdecode-adaptive-ngram, "
              "oracle-ngram (k = proposed)"),
    PriceMode(NGRAM, "padded", "proposed", 0.0, 1.0, "online, online-ngram (EAGLE-3 not charged)"),
    PriceMode(EAGLE, "padded", "proposed", 1.0, 0.0, "fixed-eagle3-k, oracle-eagle3, sglang-adaptive, dynamic-sd, "
              "online-confidence, vllm-adaptive-verification (eagle_n >= proposed + 1, k >= proposed)"),
    PriceMode(SUFFIX, "padded", "proposed", 1.0, 1.0, "arctic: the suffix draft, both drafters run"),
)


@dataclass
class SelectPrices:
    """Affine prices ``base + slope * kv`` (s) of the cheapest mode per drafter and proposal ``l = 0..lmax``
    (NONE: l = 0 only; inf where no mode prices it), with the mode (index into :data:`PRICE_MODES`) and the
    engine k it is priced at."""

    base: dict
    slope: dict
    mode: dict
    k: dict
    lmax: int
    tail_cheaper: bool = False  # a free-k mode's price still falls past K_PRICE_MAX (no cheapest price exists)


def select_prices(cm: StepCostModel, B: int, lmax: int = KMAX) -> SelectPrices:
    """Prices of every action at batch size ``B`` under ``cm`` (through :meth:`StepCostModel.step_seconds`).

    The price of a mode must be affine in ``kv`` with a slope that does not depend on k (both cost-model
    kinds are), else ``ValueError``. ``tail_cheaper`` records a free-k mode whose price still falls past
    :data:`K_PRICE_MAX` (the committed engine fit's ragged path at B >= 8)."""
    ls = np.arange(lmax + 1)
    ks = np.arange(K_PRICE_MAX + 1)
    out = SelectPrices({}, {}, {}, {}, lmax)
    for d in ACTIONS:
        best = np.full(lmax + 1, np.inf)
        slope, mode, kk = np.zeros(lmax + 1), np.full(lmax + 1, -1), np.zeros(lmax + 1, np.int64)
        min_slope = np.full(lmax + 1, np.inf)
        for j, m in enumerate(PRICE_MODES):
            if m.drafter != d:
                continue
            if m.k == "zero":
                kgrid = np.zeros((lmax + 1, 1), np.int64)
            elif m.k == "proposed":
                kgrid = ls[:, None]
            else:  # free: every k from l up
                kgrid = np.where(ks[None, :] >= ls[:, None], ks[None, :], ls[:, None])
            n_i = np.broadcast_to(ls[:, None] + 1, kgrid.shape).astype(float)

            def price(kv, kg=kgrid, n=n_i, m=m):
                return np.asarray(cm.step_seconds(B, np.full(kg.shape, float(kv)), n, kg, m.eagle, n, m.ngram, m.path),
                                  dtype=float).reshape(kg.shape)

            p0 = price(_KV_CHECK[0])
            sl = (price(_KV_CHECK[1]) - p0) / _KV_CHECK[1]
            if not np.allclose(price(_KV_CHECK[2]), p0 + sl * _KV_CHECK[2], rtol=1e-9, atol=0) or \
                    not np.allclose(sl, sl[:, :1], rtol=1e-6, atol=1e-18):
                raise ValueError(f"{cm.name}: the price of {m} is not affine in kv with one slope per k")
            if m.k == "free":  # does the price still fall past K_PRICE_MAX? (recorded, see the module docstring)
                far = np.asarray(cm.step_seconds(B, np.zeros(lmax + 1), ls + 1.0, np.full(lmax + 1, 4 * K_PRICE_MAX),
                                                 m.eagle, ls + 1.0, m.ngram, m.path), dtype=float)
                out.tail_cheaper = out.tail_cheaper or bool(np.any(far < p0.min(axis=1) * (1 - 1e-12)))
            if d == NONE:  # no SD proposes nothing; a drafter proposes at least one token
                p0[1:] = np.inf
            else:
                p0[0] = np.inf
            jk = np.argmin(p0, axis=1)
            pb = p0[ls, jk]
            better = pb < best
            best = np.where(better, pb, best)
            slope = np.where(better, sl[ls, jk], slope)
            mode = np.where(better, j, mode)
            kk = np.where(better, kgrid[ls, jk], kk)
            min_slope = np.minimum(min_slope, np.where(np.isfinite(pb), sl[ls, jk], np.inf))
        out.base[d], out.slope[d], out.mode[d], out.k[d] = best, slope, mode, kk
        fin = np.isfinite(best)
        # the cheapest mode at kv = 0 must be the cheapest at every kv (its slope the least), and a drafter's
        # price must not fall with l (so the cheapest way to gain acc tokens proposes acc - 1)
        if np.any(slope[fin] > min_slope[fin] * (1 + 1e-9) + 1e-18) or \
                (d != NONE and (np.any(np.diff(best[1:]) < 0) or np.any(np.diff(slope[1:]) < -1e-18))):
            raise ValueError(f"{cm.name} at B {B}: action {d}'s prices are not ordered (one mode cheapest at "
                             "every kv, not falling with l): the program's shortcut does not hold")
    return out


@dataclass
class Candidates:
    """Every (position, gain) the program weighs, with the action that reaches the gain most cheaply (under
    prices that do not fall with l, :func:`select_prices`: ``l = g - 1``, or ``l = 1`` for a gain of 1 from a
    drafter), position-major: candidates of output position ``p`` lie in ``cs[p]:cs[p + 1]``, grouped by
    position (``seg``: each candidate's position id; ``tgt``: the position id it leads to, ``npos`` = done).
    The same for every cost model and batch size."""

    req: np.ndarray  # (npos,) per position id
    pos: np.ndarray
    seg: np.ndarray  # (ncand,)
    tgt: np.ndarray
    gain: np.ndarray
    action: np.ndarray
    l: np.ndarray
    cs: np.ndarray  # (Lmax + 1,)
    first: np.ndarray  # (npos,) each position id's first candidate
    L: np.ndarray


def candidates(inp: PolicyInputs, lmax: int) -> Candidates:
    """:class:`Candidates` of ``inp``'s requests (run to the mixed length), proposals up to ``lmax``."""
    L = inp.lengths("mixed").astype(np.int64)
    n_p = np.maximum(L - 1, 0)  # positions 1 .. L - 1
    req = np.repeat(np.arange(L.size), n_p)
    start = np.zeros(L.size + 1, np.int64)
    np.cumsum(n_p, out=start[1:])
    pos = np.arange(start[-1]) - start[req] + 1
    o = np.lexsort((req, pos))  # position-major ids
    req, pos = req[o], pos[o]
    npos = req.size
    pid = np.empty(npos, np.int64)  # id of (r, p) = rank in the position-major order
    pid[o] = np.arange(npos)
    flat = inp.off[req] + pos
    a_ng = inp.acc_ng[flat]
    offers = [(NGRAM, a_ng, np.minimum(np.maximum(inp.avail[flat], a_ng - 1), lmax)),
              (EAGLE, inp.acc_eg[flat], np.full(npos, lmax))]
    sfx = _suffix_arrays(inp)
    if sfx is not None:  # any l up to the suffix draft's length gains min(its gain, l + 1)
        offers.append((SUFFIX, sfx[0][flat], np.minimum(sfx[1][flat], lmax)))
    segs, gains, acts, ls = [np.arange(npos)], [np.ones(npos, np.int64)], [np.full(npos, NONE)], [np.zeros(npos, np.int64)]
    for a, acc, top in offers:
        top = np.asarray(top, np.int64)
        hi = np.minimum(np.asarray(acc, np.int64), top + 1)  # gains 2..hi, proposing g - 1 <= top
        cnt = np.maximum(hi - 1, 0)
        sid = np.repeat(np.arange(npos), cnt)
        off = np.zeros(npos + 1, np.int64)
        np.cumsum(cnt, out=off[1:])
        g = np.arange(sid.size) - off[sid] + 2
        one = np.flatnonzero((np.asarray(acc) == 1) & (top >= 1))  # gain 1 from the drafter, l = 1
        segs += [sid, one]
        gains += [g, np.ones(one.size, np.int64)]
        acts += [np.full(sid.size + one.size, a)]
        ls += [g - 1, np.ones(one.size, np.int64)]
    seg, gain = np.concatenate(segs), np.concatenate(gains)
    action, l = np.concatenate(acts), np.concatenate(ls)
    o2 = np.argsort(seg, kind="stable")
    seg, gain, action, l = seg[o2], gain[o2], action[o2], l[o2]
    r, p = req[seg], pos[seg] + gain
    # target position id: (r, p + g) while p + g < L, else done (npos)
    tgt = np.full(seg.size, npos, np.int64)
    live = p < L[r]
    tgt[live] = pid[start[r[live]] + p[live] - 1]
    first = np.searchsorted(seg, np.arange(npos))
    cs = np.searchsorted(seg, np.searchsorted(pos, np.arange(int(L.max(initial=1)) + 1)))
    return Candidates(req, pos, seg, tgt, gain, action, l, cs, first, L)


def oracle_select_many(inp: PolicyInputs, configs: list, values: Optional[list] = None,
                       lmax: Optional[int] = None) -> list:
    """Oracle Select's steps at each (cost model, batch size) of ``configs`` (module docstring), one program
    for all of them. ``values``: a list that gets, per configuration, ``V1`` (R,), the program's least decode
    time of each request from position 1 (s, without the prefill). ``lmax``: the longest proposal (default
    :data:`KMAX`, the longest any registered policy proposes; the tests' brute force takes fewer)."""
    prep = inp.prep
    lmax = max(int(inp.kmax), KMAX) if lmax is None else int(lmax)
    c = candidates(inp, lmax)
    prs = [select_prices(cm, int(B), lmax) for cm, B in configs]
    nl = lmax + 1
    base = np.stack([np.concatenate([pr.base[a] for a in ACTIONS]) for pr in prs], axis=1)  # (action * l, cfg)
    slope = np.stack([np.concatenate([pr.slope[a] for a in ACTIONS]) for pr in prs], axis=1)
    key = c.action * nl + c.l
    kv = (prep.prompt_len[c.req[c.seg]] + c.pos[c.seg]).astype(float)[:, None] * \
        np.array([float(B) for _, B in configs])[None, :]
    cost = base[key] + slope[key] * kv  # (ncand, cfg): rows gathered contiguously
    del kv
    npos = c.req.size
    V = np.zeros((npos + 1, len(configs)))
    ps = np.searchsorted(c.pos, np.arange(c.cs.size))  # position ids of output position p: ps[p]:ps[p + 1]
    for p in range(c.cs.size - 2, 0, -1):
        lo, hi = c.cs[p], c.cs[p + 1]
        if lo == hi:
            continue
        vals = cost[lo:hi] + V[c.tgt[lo:hi]]
        V[ps[p]:ps[p + 1]] = np.minimum.reduceat(vals, c.first[ps[p]:ps[p + 1]] - lo, axis=0)
    # the chosen candidate of every position: the first whose value is the position's (same arithmetic)
    out = []
    R = c.L.size
    first_pid = np.full(R, -1, np.int64)
    at1 = c.pos == 1
    first_pid[c.req[at1]] = np.flatnonzero(at1)
    for j, (cm, B) in enumerate(configs):
        hit = (cost[:, j] + V[c.tgt, j]) == V[c.seg, j]
        hs = np.flatnonzero(hit)
        best = np.full(npos, -1, np.int64)
        best[c.seg[hs[::-1]]] = hs[::-1]  # the first hit of each position wins
        if values is not None:
            values.append(np.where(first_pid >= 0, V[np.maximum(first_pid, 0), j], 0.0))
        chosen = []
        cur = first_pid[first_pid >= 0]
        while cur.size:
            chosen.append(best[cur])
            cur = c.tgt[best[cur]]
            cur = cur[cur < npos]
        ch = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
        ch = ch[np.lexsort((c.pos[c.seg[ch]], c.req[c.seg[ch]]))]
        out.append(_steps(prs[j], c, ch))
    return out


def _steps(pr: SelectPrices, c: Candidates, ch: np.ndarray) -> PolicySteps:
    """The chosen candidates ``ch`` as step records (each priced as its cheapest mode writes it)."""
    act, l = c.action[ch], c.l[ch]
    mode, k = np.zeros(ch.size, np.int64), np.zeros(ch.size, np.int64)
    for a in ACTIONS:
        m_ = act == a
        mode[m_], k[m_] = pr.mode[a][l[m_]], pr.k[a][l[m_]]
    n = ch.size
    n_i = (l + 1).astype(np.int64)
    eagle = np.array([m_.eagle for m_ in PRICE_MODES])[mode]
    ngram = np.array([m_.ngram for m_ in PRICE_MODES])[mode]
    path = np.array([m_.path for m_ in PRICE_MODES], dtype=object)[mode]
    return PolicySteps(c.req[c.seg[ch]].astype(np.int64), c.pos[c.seg[ch]].astype(np.int64), n_i, k,
                       np.where(act == SUFFIX, NGRAM, act).astype(np.int8), eagle, n_i.astype(float), ngram,
                       c.gain[ch].astype(np.int64), np.ones(n), c.L.copy(), path)


def oracle_select_steps(inp: PolicyInputs, cm: StepCostModel, B: int, values: Optional[dict] = None,
                        lmax: Optional[int] = None) -> PolicySteps:
    """:func:`oracle_select_many` at one (cost model, batch size); ``values`` (a dict) gets ``V1``."""
    v: list = []
    st = oracle_select_many(inp, [(cm, B)], v, lmax)[0]
    if values is not None:
        values["V1"] = v[0]
    return st


def _suffix_arrays(inp: PolicyInputs) -> Optional[tuple]:
    """(gain, length) flat arrays of Arctic's suffix draft (:func:`~sdlib.sim.policy.arctic.add_suffix_features`,
    at the rule's k, cached in .cache/sim/), or None where the traces carry no token ids (Arctic cannot run)."""
    if inp.prep.prompt_token_ids is None or inp.prep.output_token_ids is None:
        return None
    add_suffix_features(inp, ARCTIC_MODEL_K + 1)
    return inp.extra["suffix_gain"], inp.extra["suffix_len"]


def _build(req: BuildRequest, ref: PolicyRef) -> list:
    if req.K is not None:
        raise ValueError(f"{ref.label} is a clairvoyant bound: simulation only, no engine replay")
    return oracle_select_many(req.inputs, [(cm, int(B)) for cm, B in req.configs])


register_policy(PolicySpec(
    "oracle-select", "oracle", _build, "Oracle Select: per step the best of no SD, n-gram (any l <= its look-up) "
    "and EAGLE-3 (any l <= kmax), only the chosen drafter charged; an exact per-request dynamic program "
    "(sdlib.sim.policy.select)", mixes_drafters=True, batch_dependent=True, groups=("oracle",)))
