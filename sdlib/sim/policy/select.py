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
              "online-confidence (eagle_n >= proposed + 1)"),
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
        out.base[d], out.slope[d], out.mode[d], out.k[d] = best, slope, mode, kk
    return out


def _gain_costs(pr: SelectPrices, kv: np.ndarray, a_ng: np.ndarray, a_eg: np.ndarray, avail: np.ndarray,
                suffix: Optional[tuple] = None, actions: bool = False):
    """``(n, G + 1)`` least price of gaining ``g = 0..G`` tokens (``G = lmax + 1``; column 0 and gains no
    action reaches: inf) at positions with KV ``kv``, acceptances ``a_ng`` / ``a_eg`` (>= 1) and n-gram
    continuation ``avail``; ``suffix``: (gain, length) of Arctic's suffix draft there (None: not offered). With
    ``actions``: also (action, l) arrays of the cheapest action per gain."""
    n, G = kv.size, pr.lmax + 1
    ls, rows = np.arange(pr.lmax + 1), np.arange(n)
    cost = np.full((n, G + 1), np.inf)
    cost[:, 1] = pr.base[NONE][0] + pr.slope[NONE][0] * kv
    if actions:
        drafter = np.full((n, G + 1), NONE, np.int64)
        length = np.zeros((n, G + 1), np.int64)
    # the n-gram proposes up to its continuation, and up to acc - 1 (oracle-ngram's; on the repository's traces
    # acc - 1 <= avail everywhere: the trace's n-gram acceptance is the same look-up's)
    top_ng = np.minimum(np.maximum(avail, np.asarray(a_ng) - 1), pr.lmax)
    offers = [(NGRAM, a_ng, top_ng), (EAGLE, a_eg, np.full(n, pr.lmax))]
    if suffix is not None:  # any l up to the suffix draft's length gains min(its gain, l + 1)
        offers.append((SUFFIX, suffix[0], np.minimum(suffix[1], pr.lmax)))
    for d, acc, top in offers:
        acc = np.asarray(acc, np.int64)
        p = pr.base[d][None, :] + pr.slope[d][None, :] * kv[:, None]  # (n, lmax + 1): l proposed
        p[ls[None, :] > top[:, None]] = np.inf
        c = np.where(ls[None, 1:] + 1 < acc[:, None], p[:, 1:], np.inf)  # gains 2..G below saturation: l + 1
        c = np.concatenate([np.full((n, 2), np.inf), c], axis=1)
        # saturation: any l >= max(acc - 1, 1) gains acc; the cheapest of them (a suffix minimum over l)
        lo = np.maximum(acc - 1, 1)
        ok = lo <= pr.lmax
        suf = np.minimum.accumulate(p[:, ::-1], axis=1)[:, ::-1]
        sat = np.where(ok, suf[rows, np.minimum(lo, pr.lmax)], np.inf)
        gs = np.minimum(acc, G)
        c_sat = np.minimum(c[rows, gs], sat)
        c[rows, gs] = c_sat
        if actions:
            ln = np.broadcast_to(np.arange(G + 1)[None, :] - 1, (n, G + 1)).copy()
            lsat = np.argmin(np.where(ls[None, :] >= lo[:, None], p, np.inf), axis=1)
            ln[rows, gs] = np.where(ok & (c_sat == sat), lsat, gs - 1)
            better = c < cost
            drafter[better], length[better] = d, ln[better]
        np.minimum(cost, c, out=cost)
    return (cost, drafter, length) if actions else cost


def oracle_select_steps(inp: PolicyInputs, cm: StepCostModel, B: int, chunk: int = 1 << 16,
                        values: Optional[dict] = None, lmax: Optional[int] = None) -> PolicySteps:
    """Oracle Select's steps at batch size ``B`` under ``cm`` (module docstring). ``values``: a dict that gets
    ``V1`` (R,), the program's least decode time of each request from position 1 (s, without the prefill).
    ``lmax``: the longest proposal (default :data:`KMAX`, the longest any registered policy proposes; the
    tests' brute force takes fewer)."""
    prep = inp.prep
    pr = select_prices(cm, B, max(int(inp.kmax), KMAX) if lmax is None else int(lmax))
    G = pr.lmax + 1
    L = inp.lengths("mixed").astype(np.int64)
    R = L.size
    # compact layout of positions p < L: o3[r] + p; the value array has G zeros after each request
    o3 = np.zeros(R + 1, np.int64)
    np.cumsum(L, out=o3[1:])
    o2 = np.zeros(R + 1, np.int64)
    np.cumsum(L + G, out=o2[1:])
    req_c = np.repeat(np.arange(R), L)
    pos_c = np.arange(o3[-1]) - o3[req_c]
    flat_c = inp.off[req_c] + pos_c
    kv_c = float(B) * (prep.prompt_len[req_c] + pos_c)
    cost = np.empty((o3[-1], G + 1))
    sfx = _suffix_arrays(inp)

    def at(f):
        return None if sfx is None else (sfx[0][f], sfx[1][f])

    for s in range(0, o3[-1], chunk):
        e = min(s + chunk, o3[-1])
        f = flat_c[s:e]
        cost[s:e] = _gain_costs(pr, kv_c[s:e], inp.acc_ng[f], inp.acc_eg[f], inp.avail[f], at(f))
    V = np.zeros(o2[-1])
    best = np.zeros(o3[-1], np.int64)
    order = np.argsort(-L, kind="stable")
    Ls = L[order]
    gains = np.arange(1, G + 1)
    for p in range(int(L.max(initial=0)) - 1, 0, -1):
        ra = order[:int(np.searchsorted(-Ls, -p, side="left"))]  # requests with L > p
        ic, iv = o3[ra] + p, o2[ra] + p
        cand = cost[ic, 1:] + V[iv[:, None] + gains[None, :]]
        j = np.argmin(cand, axis=1)
        V[iv] = cand[np.arange(ra.size), j]
        best[ic] = j + 1
    if values is not None:
        values["V1"] = np.where(L > 1, V[o2[:-1] + 1], 0.0)
    # forward: the chosen steps from position 1
    cur = o3[:-1] + 1
    m = L > 1
    cur, end = cur[m], o3[1:][m]
    idx = []
    while cur.size:
        idx.append(cur)
        cur = cur + best[cur]
        keep = cur < end
        cur, end = cur[keep], end[keep]
    idx = np.sort(np.concatenate(idx)) if idx else np.zeros(0, np.int64)
    req, pos, g = req_c[idx], pos_c[idx], best[idx]
    f = flat_c[idx]
    _, act, ln = _gain_costs(pr, kv_c[idx], inp.acc_ng[f], inp.acc_eg[f], inp.avail[f], at(f), actions=True)
    rows = np.arange(idx.size)
    act, l = act[rows, g], ln[rows, g]
    mode, k = np.zeros(idx.size, np.int64), np.zeros(idx.size, np.int64)
    for a in ACTIONS:
        m_ = act == a
        mode[m_], k[m_] = pr.mode[a][l[m_]], pr.k[a][l[m_]]
    drafter = np.where(act == SUFFIX, NGRAM, act)
    modes = [PRICE_MODES[i] for i in mode]
    n = idx.size
    path = np.array([m_.path for m_ in modes], dtype=object) if n else np.zeros(0, object)
    eagle = np.array([m_.eagle for m_ in modes], float)
    ngram = np.array([m_.ngram for m_ in modes], float)
    n_i = (l + 1).astype(np.int64)
    return PolicySteps(req.astype(np.int64), pos.astype(np.int64), n_i, k.astype(np.int64), drafter.astype(np.int8),
                       eagle, n_i.astype(float), ngram, g.astype(np.int64), np.ones(n), L.copy(), path)


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
    by_cfg: dict = {}
    out = []
    for cm, B in req.configs:
        key = (id(cm), int(B))
        if key not in by_cfg:
            by_cfg[key] = oracle_select_steps(req.inputs, cm, int(B))
        out.append(by_cfg[key])
    return out


register_policy(PolicySpec(
    "oracle-select", "oracle", _build, "Oracle Select: per step the best of no SD, n-gram (any l <= its look-up) "
    "and EAGLE-3 (any l <= kmax), only the chosen drafter charged; an exact per-request dynamic program "
    "(sdlib.sim.policy.select)", mixes_drafters=True, batch_dependent=True, groups=("oracle",)))
