"""The adaptive rules that engines and papers ship, on the simulator's traces; each cites its source.

Rules and their exact definitions, read from the code: ``/work/notes/baselines.md`` (summarised in each
class's docstring). All run under the ``corrected`` convention of :mod:`sdlib.sim.policy.walk`; their steps
are priced by the same cost models as every other policy.

==========================  ==========================================================================
name                        rule
==========================  ==========================================================================
``specdecode-adaptive-*``   SpecDecode-Bench ADAPTIVE (``eagle3`` / ``ngram``): per request k = 5, +2 when
                            every drafted token was accepted, else -1 (at least 1)
``sglang-adaptive``         SGLang 0.5.23 ``--speculative-adaptive``: EMA of accepted drafts, tiers per
                            batch-size slot (1: [1, 3, 7]; 8: [0, 1, 3]; 32: [0, 1]; 64: [0])
``sglang-adaptive-0.5.11``  the first release of it: tiers [1, 3, 7] at every batch size
``dynamic-sd``              vLLM Dynamic SD (``num_speculative_tokens_per_batch_size``), EAGLE-3 with the
                            schedule of its PR's example [[1, 16, 3], [64, 128, 2], [256, 4096, 0]]
``ngram-eagle``             vLLM PR #24344: n-gram (k 5) when its look-up matches, else EAGLE (k 3); both
                            drafters run every step
``ngram-eagle-long``        the same rule with the n-gram proposing its continuation up to 20 tokens and
                            EAGLE-3 k = 5 (issue #13's calculation)
``arctic``                  Arctic Inference's suffix-or-model rule (:mod:`sdlib.sim.policy.arctic`)
==========================  ==========================================================================

Each is registered in :mod:`sdlib.core.registry` (group ``baselines``).

Usage:
    from sdlib.sim.policy.baselines import sglang_steps
    steps = sglang_steps(inp, batch_size=8)   # a PolicySteps
"""

from __future__ import annotations

import bisect
from typing import Optional

import numpy as np

from sdlib.core.registry import KMAX, BuildRequest, PolicySpec, register_policy
from sdlib.sim.policy.walk import (EAGLE, NGRAM, NONE, Lanes, Policy, PolicyInputs, PolicySteps, capped, position_steps,
                                  walk)

# --------------------------------------------------------------------------- SpecDecode-Bench ADAPTIVE
#: SpecDecode-Bench/simulator branch dev/add-adaptive @4188de3, predictor.py L80-97: initial k, step up, step down.
ADAPTIVE_K0, ADAPTIVE_UP, ADAPTIVE_DOWN, ADAPTIVE_MIN = 5, 2, 1, 1


class SpecDecodeAdaptive(Policy):
    """SpecDecode-Bench's ADAPTIVE (branch ``dev/add-adaptive``, commit 4188de3, ``predictor.py`` L63-97,
    called from ``simulator.py`` L214-219): the HF assisted-generation heuristic. Per request k starts at 5;
    after a step that drafted, k += 2 if every drafted token was accepted, else k = max(1, k - 1); no upper
    clamp. n-gram (corrected convention): the look-up proposes ``min(k, continuation)``; a step with no match
    proposes nothing and leaves k unchanged; the step's engine k (draft slots, what an engine cost model prices)
    is k capped at the traces' longest draft, which the look-up never exceeds; "every drafted token accepted"
    is tested on what was proposed
    (their ``accepted >= input_len``). Each request starts at k = 5 (their simulator carries k across batch
    sizes: a quirk not followed).
    """

    def __init__(self, proposer: str):
        if proposer not in ("eagle3", "ngram"):
            raise ValueError(proposer)
        self.proposer = proposer
        self.name = f"specdecode-adaptive-{proposer}"
        self.lengths = proposer
        self.path = "padded" if proposer == "eagle3" else "ragged"

    def init_state(self, cfg, req):
        return {"k": np.full(req.size, ADAPTIVE_K0, dtype=np.int64)}

    def decide(self, inp, lanes):
        k = lanes.state["k"]
        if self.proposer == "eagle3":
            return np.full(k.size, EAGLE, np.int8), k, k, 1.0, 0.0
        prop = np.minimum(k, inp.avail[lanes.flat])
        # the engine's k: the look-up never proposes more than the traces' longest draft, so no engine needs more
        # slots (their k has no clamp; unclamped, an engine cost model would price K = 700 steps by extrapolation)
        return np.where(prop > 0, NGRAM, NONE).astype(np.int8), prop, np.minimum(k, inp.kmax), 0.0, 1.0

    def observe(self, inp, lanes, d, gain):
        prop = d[1]
        drafted = prop > 0
        full = gain >= prop + 1
        k = lanes.state["k"]
        lanes.state["k"] = np.where(drafted, np.where(full, k + ADAPTIVE_UP, np.maximum(ADAPTIVE_MIN, k - ADAPTIVE_DOWN)), k)


# --------------------------------------------------------------------------- SGLang adaptive
#: sglang 0.5.23 python/sglang/srt/speculative/adaptive_spec_params.py L28-53 (DEFAULT_ADAPTIVE_CONFIG).
SGLANG_SLOTS = {1: ([1, 3, 7], 0.0, -0.25), 8: ([0, 1, 3], 0.0, 0.0), 32: ([0, 1], 0.0, 0.0), 64: ([0], 0.0, 0.0)}
#: sglang 0.5.11 adaptive_spec_params.py L91-179: one controller, tiers [1, 3, 7].
SGLANG_0511 = ([1, 3, 7], 0.0, -0.25)
SGLANG_EMA_ALPHA, SGLANG_WARMUP, SGLANG_INTERVAL = 0.2, 10, 5
#: --speculative-num-steps the simulated server starts with (SGLang's EAGLE examples use 3).
SGLANG_INITIAL_STEPS = 3
#: Output positions of each request the carry-over pass runs (its final state starts the next request).
SGLANG_TAIL = 256


def sglang_slot(batch_size: int, version: str = "0.5.23") -> tuple:
    """(candidate steps, up hysteresis, down hysteresis) SGLang uses at ``batch_size``."""
    if version == "0.5.11":
        return SGLANG_0511
    keys = sorted(SGLANG_SLOTS)
    return SGLANG_SLOTS[keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]]


def sglang_recompute(cands: list, idx: int, ema: float, up: float, down: float) -> tuple[int, float]:
    """SGLang's ``_recompute_params`` (0.5.23 L153-273): the new tier index and EMA after an interval."""
    if cands[idx] == 0:  # probe the next tier after a no-spec interval
        t = min(idx + 1, len(cands) - 1)
        if cands[t] > 0 and ema < 0:
            ema = float(cands[t] - 1)
        return t, ema
    moved = False
    while idx > 0:
        drop = (0.5 if cands[idx - 1] == 0 else cands[idx - 1] - 0.5) + down
        if ema <= drop:
            idx -= 1
            moved = True
        else:
            break
    if not moved:
        while idx < len(cands) - 1 and ema > cands[idx] - 0.5 + up:
            idx += 1
    return idx, ema


class SGLangAdaptive(Policy):
    """SGLang ``--speculative-adaptive`` (PR sgl-project/sglang#21599; sglang 0.5.23
    ``adaptive_spec_params.py`` L28-53, L153-273, L342-358; 0.5.11 L91-179). EAGLE-3 chain of k = steps
    drafts; after each verify the EMA (alpha 0.2) of the batch's mean accepted drafts (bonus excluded) is
    updated when k > 0; after 10 warm-up batches, every 5 batches the tier moves down while
    ``ema <= cand[i-1] - 0.5 + down`` (0.5 for tier 0), else up while ``ema > cand[i] - 0.5 + up``; from tier 0
    it probes the next tier. In the paper's batch mode the batch is B copies of one request, so the batch mean
    is that request's. SGLang keeps one controller per server across requests; the simulator starts each
    request from the state the previous request (in trace order) ended in, taken from a first pass that
    runs every request's last :data:`SGLANG_TAIL` positions from a fresh controller (``carry_over``; the EMA
    forgets its start within a few dozen steps: 0.8^50 < 1e-4).
    """

    lengths = "eagle3"
    path = "padded"

    def __init__(self, batch_size: int, version: str = "0.5.23", initial_steps: int = SGLANG_INITIAL_STEPS,
                 start: Optional[dict] = None):
        self.name = "sglang-adaptive" if version == "0.5.23" else f"sglang-adaptive-{version}"
        self.cands, self.up, self.down = sglang_slot(batch_size, version)
        if version == "0.5.11":
            i0 = min(range(len(self.cands)), key=lambda i: (abs(self.cands[i] - initial_steps), -self.cands[i]))
        else:
            i0 = self.cands.index(initial_steps) if initial_steps in self.cands else len(self.cands) // 2
        self.i0, self.start = i0, start

    def init_state(self, cfg, req):
        n = req.size
        st = {"idx": np.full(n, self.i0, np.int64), "ema": np.full(n, float(self.cands[self.i0] - 1)),
              "count": np.zeros(n, np.int64)}
        if self.start is not None:
            for key in st:
                st[key] = self.start[key][req].astype(st[key].dtype)
        return st

    def decide(self, inp, lanes):
        k = np.asarray(self.cands)[lanes.state["idx"]]
        on = k > 0
        return np.where(on, EAGLE, NONE).astype(np.int8), k, k, on.astype(float), 0.0

    def observe(self, inp, lanes, d, gain):
        st, k = lanes.state, d[1]
        on = k > 0
        st["ema"] = np.where(on, (1 - SGLANG_EMA_ALPHA) * st["ema"] + SGLANG_EMA_ALPHA * (gain - 1), st["ema"])
        st["count"] = st["count"] + 1
        due = np.flatnonzero((st["count"] > SGLANG_WARMUP) & ((st["count"] - SGLANG_WARMUP) % SGLANG_INTERVAL == 0))
        if due.size:
            st["idx"][due], st["ema"][due] = sglang_recompute_many(self.cands, st["idx"][due], st["ema"][due],
                                                                   self.up, self.down)


def sglang_recompute_many(cands: list, idx: np.ndarray, ema: np.ndarray, up: float,
                          down: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`sglang_recompute` for many lanes at once, vectorised (the tiers are few)."""
    c = np.asarray(cands, dtype=float)
    n = len(cands)
    due = np.ones(idx.shape, bool)
    idx, ema = idx.copy(), ema.copy()
    zero = due & (c[idx] == 0)  # probe the next tier after a no-spec interval
    t = np.minimum(idx + 1, n - 1)
    ema = np.where(zero & (c[t] > 0) & (ema < 0), c[t] - 1, ema)
    new = np.where(zero, t, idx)
    live = due & ~zero
    moved = np.zeros(idx.shape, bool)
    for _ in range(n):  # walk down while the EMA is at or below the next tier's threshold
        lower = np.maximum(new - 1, 0)
        drop = np.where(c[lower] == 0, 0.5, c[lower] - 0.5) + down
        step = live & (new > 0) & (ema <= drop)
        new = np.where(step, new - 1, new)
        moved |= step
        live = live & step
    live = due & ~zero & ~moved
    for _ in range(n):  # else walk up while the EMA is above this tier's threshold
        step = live & (new < n - 1) & (ema > c[new] - 0.5 + up)
        new = np.where(step, new + 1, new)
        live = live & step
    return new, ema


def sglang_steps(inp: PolicyInputs, batch_size: int, version: str = "0.5.23", carry_over: bool = True,
                 K: Optional[int] = None) -> PolicySteps:
    """SGLang's rule at ``batch_size``; with ``carry_over`` each request starts where the previous ended;
    ``K`` caps the drafts (an engine's num_speculative_tokens)."""
    pol = SGLangAdaptive(batch_size, version)
    if len(pol.cands) == 1 and pol.cands[0] == 0:  # no speculation at this batch size
        return _plain_decode(inp, pol.lengths, pol.path)
    if not carry_over:
        return walk(inp, capped(pol, K))[0]
    final = {}

    class Recorder(SGLangAdaptive):
        def observe(self, inp_, lanes, d, gain):
            super().observe(inp_, lanes, d, gain)
            for key in ("idx", "ema", "count"):
                final.setdefault(key, np.zeros(len(inp_.prep)))[lanes.req] = lanes.state[key]

    L = inp.lengths("eagle3")
    walk(inp, capped(Recorder(batch_size, version), K), start=np.maximum(L - SGLANG_TAIL, 1))
    prev = _previous_in_order(inp)
    start = {}
    for key, v in final.items():
        s = np.asarray(v)[prev]
        first = prev < 0
        s[first] = {"idx": pol.i0, "ema": pol.cands[pol.i0] - 1.0, "count": 0}[key]
        start[key] = s
    return walk(inp, capped(SGLangAdaptive(batch_size, version, start=start), K))[0]


def _previous_in_order(inp: PolicyInputs) -> np.ndarray:
    """Index of the request run before each one (same dataset, trace order); -1 for each dataset's first."""
    ds = inp.prep.dataset
    prev = np.full(len(ds), -1, dtype=np.int64)
    last: dict = {}
    for i, d in enumerate(ds):
        prev[i] = last.get(d, -1)
        last[d] = i
    return prev


def _plain_decode(inp: PolicyInputs, lengths: str, path: str) -> PolicySteps:
    L = inp.lengths(lengths)
    steps = np.maximum(L - 1, 0)
    req = np.repeat(np.arange(L.size), steps)
    off = np.zeros(L.size + 1, np.int64)
    np.cumsum(steps, out=off[1:])
    pos = np.arange(off[-1]) - off[req] + 1
    one, zero = np.ones(req.size, np.int64), np.zeros(req.size)
    return PolicySteps(req, pos, one, 0 * one, np.zeros(req.size, np.int8), zero, one.astype(float), zero, one,
                       np.ones(req.size), L.copy(), path)


# --------------------------------------------------------------------------- vLLM Dynamic SD
#: vLLM PR #32374's example schedule (range_start, range_end, k), inclusive ranges (vllm 0.26.0
#: config/speculative.py L177-182; dynamic/utils.py L77-148 fills gaps with the previous range's k).
DYNAMIC_SD_SCHEDULE = ((1, 16, 3), (64, 128, 2), (256, 4096, 0))


def dynamic_sd_k(batch_size: int, schedule=DYNAMIC_SD_SCHEDULE, num_speculative_tokens: Optional[int] = None) -> int:
    """k that vLLM's Dynamic SD lookup gives at ``batch_size`` (gaps carry the previous range's k; clamped to
    ``num_speculative_tokens``, default the schedule's largest k)."""
    kmax = max(k for _, _, k in schedule) if num_speculative_tokens is None else num_speculative_tokens
    k = schedule[0][2]
    for lo, hi, kk in schedule:
        if batch_size >= lo:
            k = kk
    return int(min(k, kmax))


# --------------------------------------------------------------------------- vLLM #24344 (position-only)
class NgramOrEagle(Policy):
    """vLLM PR #24344 "[Spec Decode][Hybrid] Add ngram-eagle SD method" (head e291af3,
    ``gpu_model_runner.py`` ``propose_draft_token_ids``): both drafters run for every request; a request
    takes the n-gram draft when the look-up found one, else the EAGLE draft. PR settings: n-gram k = 5,
    EAGLE k = 3 (look-up 2..5 in the PR; the traces' 3..7 here). Both drafters are charged every step."""

    path = "padded"
    lengths = "mixed"

    def __init__(self, k_ngram: int = 5, k_eagle: int = 3, name: str = "ngram-eagle"):
        self.k_ngram, self.k_eagle, self.name = k_ngram, k_eagle, name

    def decide(self, inp, lanes):
        av = np.minimum(inp.avail[lanes.flat], self.k_ngram)
        ng = av > 0
        prop = np.where(ng, av, self.k_eagle)
        return np.where(ng, NGRAM, EAGLE).astype(np.int8), prop, prop, 1.0, 1.0


# --------------------------------------------------------------------------- registry
#: #24344's settings (n-gram k, EAGLE k) and issue #13's long variant's (the n-gram proposing its continuation up to
#: the traces' longest scored draft).
NGRAM_EAGLE_K, NGRAM_EAGLE_LONG_K = (5, 3), (KMAX, 5)


def _per_batch_size(req: BuildRequest, steps_at) -> list:
    """``steps_at(B)`` once per distinct batch size of the request's configurations."""
    by_b = {B: steps_at(B) for B in dict.fromkeys(int(b) for _, b in req.configs)}
    return [by_b[int(b)] for _, b in req.configs]


def _same(req: BuildRequest, steps) -> list:
    return [steps] * len(req.configs)


def dynamic_sd_steps(inp: PolicyInputs, batch_size: int, K: Optional[int] = None) -> PolicySteps:
    """vLLM's Dynamic SD at ``batch_size``: EAGLE-3 with the schedule's k (capped at ``K``), plain decode at k 0."""
    k = dynamic_sd_k(batch_size)
    k = k if K is None else min(k, K)
    if k == 0:
        return _plain_decode(inp, "eagle3", "padded")
    return position_steps(inp, "fixed", "eagle3", k)


register_policy(PolicySpec(
    "specdecode-adaptive", "baseline",
    lambda req, ref: _same(req, walk(req.inputs, capped(SpecDecodeAdaptive(ref.drafter), req.K))[0]),
    "SpecDecode-Bench ADAPTIVE (dev/add-adaptive @4188de3, predictor.py L63-97)", drafters=("eagle3", "ngram"),
    replays_on=("eagle3", "ngram"), replay_drafter=True, groups=("baselines",)))
register_policy(PolicySpec(
    "sglang-adaptive", "baseline",
    lambda req, ref: _per_batch_size(req, lambda B: sglang_steps(req.inputs, B, "0.5.23", K=req.K)),
    "SGLang 0.5.23 --speculative-adaptive (adaptive_spec_params.py)", replays_on=("eagle3",),
    batch_dependent=True, groups=("baselines",)))
register_policy(PolicySpec(
    "sglang-adaptive-0.5.11", "baseline",
    lambda req, ref: _same(req, sglang_steps(req.inputs, 1, "0.5.11", K=req.K)),
    "SGLang 0.5.11 --speculative-adaptive (one controller, tiers [1, 3, 7])", groups=("baselines",)))
register_policy(PolicySpec(
    "dynamic-sd", "baseline",
    lambda req, ref: _per_batch_size(req, lambda B: dynamic_sd_steps(req.inputs, B, req.K)),
    "vLLM Dynamic SD (num_speculative_tokens_per_batch_size, PR #32374's example schedule)",
    replays_on=("eagle3",), batch_dependent=True, groups=("baselines",)))
register_policy(PolicySpec(
    "ngram-eagle", "baseline",
    lambda req, ref: _same(req, walk(req.inputs, capped(NgramOrEagle(*NGRAM_EAGLE_K), req.K))[0]),
    "vLLM PR #24344 ngram-eagle (n-gram k 5 when it matches, else EAGLE k 3)", replays_on=("eagle3",),
    mixes_drafters=True, groups=("baselines",)))
register_policy(PolicySpec(
    "ngram-eagle-long", "baseline",
    lambda req, ref: _same(req, walk(req.inputs, capped(NgramOrEagle(min(NGRAM_EAGLE_LONG_K[0], req.inputs.kmax),
                                                                     NGRAM_EAGLE_LONG_K[1], "ngram-eagle-long"),
                                                        req.K))[0]),
    "PR #24344's rule with the n-gram continuation up to 20 tokens and EAGLE-3 k 5 (issue #13)",
    replays_on=("eagle3",), mixes_drafters=True, groups=("baselines",)))


__all__ = ["SpecDecodeAdaptive", "SGLangAdaptive", "NgramOrEagle", "dynamic_sd_k", "dynamic_sd_steps", "sglang_slot",
           "sglang_recompute", "sglang_steps", "Lanes"]
