"""Two more published ways of choosing the draft length online, on the simulator's traces (issue 24's list):
SpecDec++'s stop threshold and a Nightjar-style bandit over k. Each is registered in :mod:`sdlib.core.registry`
and priced by the same cost models as every other policy (EAGLE-3 on the padded engine path).

``specdecpp-h<h>`` -- **SpecDec++** (Huang, Guo and Wang, "SpecDec++: Boosting Speculative Decoding via Adaptive
Candidate Lengths", arXiv 2405.19715, COLM 2025). The draft model drafts one token at a time; after each it
predicts the conditional acceptance probability ``a_i`` of the new token, and it stops drafting (and verifies the
candidates it has, the last one included) as soon as the predicted probability that at least one candidate is
rejected exceeds a threshold ``h``: ``1 - a_1 * ... * a_j > h``; else it drafts up to the cap K. The paper shows
a threshold rule of this form is optimal for its Markov decision process and trains an acceptance-prediction head
for ``a_i``. Here ``a_i`` is the trained EAGLE-3 head's own top-1 confidence through the cross-fitted monotone
calibration map of :mod:`sdlib.sim.policy.confidence` (the predictor we have; a request is decided by the map of
the other fold), and K is the traces' k. Instances at ``h`` = 0.3, 0.5, 0.7 (:data:`SPECDECPP_THRESHOLDS`): the
paper treats ``h`` as a tuned hyperparameter, so no single value is its own. It needs confidences.

``nightjar-ucb`` -- **a Nightjar-style bandit** (Li et al., "Nightjar: Dynamic Adaptive Speculative Decoding for
Large Language Models Serving", arXiv 2512.22420): a multi-armed bandit that picks the speculative length per
batch size while serving, with k = 0 (speculation off) among its arms, so that SD turns itself off where it does
not pay. What is reproduced is that design, not the paper's code (which we have not read): one UCB1 bandit
(Auer, Cesa-Bianchi and Fischer 2002) per configuration (= batch size), arms k in :data:`NIGHTJAR_ARMS` (up to the
traces' k), one arm for all requests of a configuration at each step (they step together, as the rows of one
engine step would), each request's step one observation of that arm (so the bandit learns across requests, as a
server's does over its traffic), reward = the step's tokens per second under the cost model relative to a plain
decode step, divided by ``kmax + 1`` (so in [0, 1]); exploration constant :data:`NIGHTJAR_C`. Nightjar's other half,
moving the draft model off the GPU to free KV cache, has no counterpart in a trace simulation.

Usage:
    from sdlib.sim.policy.stopping import specdecpp_steps, nightjar_steps
    steps = specdecpp_steps(inp, 0.5, n_configs=1)[0]   # needs attach_confidences(inp, ...)
    steps = nightjar_steps(inp, [(cm, 32)])[0]
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from sdlib.core.registry import BuildRequest, PolicyRef, PolicySpec, register_policy
from sdlib.sim.policy.confidence import Calibration, ConfidenceError
from sdlib.sim.policy.walk import EAGLE, NONE, Lanes, Policy, PolicyInputs, capped, price_table, walk

#: The thresholds registered as ``specdecpp-h<h>``.
SPECDECPP_THRESHOLDS = (0.3, 0.5, 0.7)
#: The arms (k) of the Nightjar-style bandit, those up to the traces' k; 0 = speculation off.
NIGHTJAR_ARMS = (0, 1, 2, 3, 5, 7, 10)
#: UCB1's exploration constant (the textbook value).
NIGHTJAR_C = 1.0


def specdecpp_lengths(a: np.ndarray, h: float) -> np.ndarray:
    """Candidates proposed per lane by SpecDec++'s rule: the first ``j`` with ``1 - a_1 ... a_j > h`` (that draft
    included), else all ``K`` (``a``: (lanes, K) conditional acceptance probabilities)."""
    if not 0.0 < h < 1.0:
        raise ValueError(f"SpecDec++ threshold h={h}: want 0 < h < 1")
    K = a.shape[1]
    reject = 1.0 - np.cumprod(a, axis=1) > h
    return np.where(reject.any(axis=1), np.argmax(reject, axis=1) + 1, K).astype(np.int64)


class SpecDecPP(Policy):
    """SpecDec++'s stop threshold on EAGLE-3 (module docstring)."""

    lengths = "eagle3"
    path = "padded"

    def __init__(self, inp: PolicyInputs, h: float):
        self.h = float(h)
        self.name = specdecpp_name(h)
        self.calibration = Calibration(inp, calibrated=True)

    def decide(self, inp: PolicyInputs, lanes: Lanes):
        proposed = specdecpp_lengths(self.calibration(inp, lanes.req, lanes.flat), self.h)
        return np.full(proposed.size, EAGLE, np.int8), proposed, proposed, 1.0, 0.0


def specdecpp_name(h: float) -> str:
    return f"specdecpp-h{h:g}"


def specdecpp_steps(inp: PolicyInputs, h: float, n_configs: int = 1, K: Optional[int] = None) -> list:
    """SpecDec++ at threshold ``h`` (the same steps for every configuration: nothing in it depends on the batch
    size or the cost model), capped at ``K``."""
    if "conf_eagle" not in inp.extra:
        raise ConfidenceError(f"{specdecpp_name(h)} needs the requests' draft confidences (attach_confidences)")
    return [walk(inp, capped(SpecDecPP(inp, h), K))[0]] * n_configs


class NightjarUCB(Policy):
    """A UCB1 bandit over k per configuration (module docstring). Its state is the configuration's, shared by
    every request of it (one choice per step for the whole batch), so it lives on the policy, not on the lanes."""

    name = "nightjar-ucb"
    lengths = "eagle3"
    path = "padded"

    def __init__(self, cost_models: Sequence, batch_sizes: Sequence[int], kmax: int,
                 arms: Sequence[int] = NIGHTJAR_ARMS, c: float = NIGHTJAR_C):
        self.arms = np.array([a for a in arms if a <= kmax], np.int64)
        self.kmax, self.c = int(kmax), float(c)
        n = len(batch_sizes)
        self.B = np.asarray(batch_sizes, float)
        tabs = [price_table(cm, int(b), self.kmax) for cm, b in zip(cost_models, batch_sizes)]
        self.base = np.stack([t["base"][EAGLE] for t in tabs])  # (configs, kmax + 1): a step proposing l
        self.base0 = np.array([t["base"][NONE][0] for t in tabs])  # a plain decode step
        self.slope = np.array([t["slope"][EAGLE] for t in tabs])
        self.slope0 = np.array([t["slope"][NONE] for t in tabs])
        self.pulls = np.zeros((n, self.arms.size))
        self.total = np.zeros((n, self.arms.size))
        self.rounds = np.zeros(n)
        self.chosen = np.zeros(n, np.int64)

    def _choose(self) -> None:
        """Each configuration's arm for this step: an arm never pulled first (in order), else UCB1."""
        for g in range(self.pulls.shape[0]):
            unseen = np.flatnonzero(self.pulls[g] == 0)
            if unseen.size:
                self.chosen[g] = unseen[0]
                continue
            mean = self.total[g] / self.pulls[g]
            bonus = self.c * np.sqrt(2.0 * np.log(max(self.rounds[g], 1.0)) / self.pulls[g])
            self.chosen[g] = int(np.argmax(mean + bonus))

    def init_state(self, cfg: np.ndarray, req: np.ndarray) -> dict:
        return {"eg_seen": np.ones(req.size)}  # output tokens EAGLE-3 has processed (it catches up after k = 0)

    def decide(self, inp: PolicyInputs, lanes: Lanes):
        self._choose()
        k = self.arms[self.chosen[lanes.cfg]]
        eagle = (k > 0).astype(float)
        drafter = np.where(k > 0, EAGLE, NONE).astype(np.int8)
        # after steps without speculation, EAGLE-3 first processes the tokens it skipped (as the online policy
        # charges it: sdlib.sim.policy.online)
        eagle_n = k + 1.0 + np.maximum(lanes.pos - lanes.state["eg_seen"], 0) * eagle
        return drafter, k, k, eagle, 0.0, eagle_n

    def observe(self, inp: PolicyInputs, lanes: Lanes, decision, gain: np.ndarray) -> None:
        k = decision[1]
        cfg = lanes.cfg
        kv = self.B[cfg] * (inp.prep.prompt_len[lanes.req] + lanes.pos)
        t = np.where(k > 0, self.base[cfg, k] + self.slope[cfg] * kv, self.base0[cfg] + self.slope0[cfg] * kv)
        t0 = self.base0[cfg] + self.slope0[cfg] * kv
        reward = gain / t * t0 / (self.kmax + 1.0)
        lanes.state["eg_seen"] = np.where(k > 0, lanes.pos + gain, lanes.state["eg_seen"])
        for g in np.unique(cfg):  # each request's step is one observation of the configuration's arm
            m = cfg == g
            a, n = self.chosen[g], int(m.sum())
            self.pulls[g, a] += n
            self.total[g, a] += float(reward[m].sum())
            self.rounds[g] += n


def nightjar_steps(inp: PolicyInputs, configs: Sequence[tuple], K: Optional[int] = None,
                   c: float = NIGHTJAR_C) -> list:
    """The Nightjar-style bandit at each (cost model, batch size), capped at ``K``; one bandit per configuration
    (``c``: UCB1's exploration constant; with the default, telling arms apart whose rewards differ by ``d``
    takes on the order of ``2 ln(n) / d**2`` observations each, so on short traces it mostly explores)."""
    kmax = inp.kmax if K is None else min(inp.kmax, K)
    pol = NightjarUCB([c_ for c_, _ in configs], [int(b) for _, b in configs], kmax, c=c)
    return walk(inp, pol, n_configs=len(configs))


def _build_specdecpp(h: float):
    def build(req: BuildRequest, ref: PolicyRef) -> list:
        if req.K is not None:
            raise ValueError(f"{ref.label}: no engine replay (simulation only)")
        return specdecpp_steps(req.inputs, h, len(req.configs))
    return build


def _build_nightjar(req: BuildRequest, ref: PolicyRef) -> list:
    if req.K is not None:
        raise ValueError(f"{ref.label}: no engine replay (simulation only)")
    return nightjar_steps(req.inputs, [tuple(c) for c in req.configs])


for _h in SPECDECPP_THRESHOLDS:
    register_policy(PolicySpec(
        specdecpp_name(_h), "baseline", _build_specdecpp(_h),
        f"SpecDec++ (arXiv 2405.19715): stop when P(any candidate rejected) > {_h:g}; acceptance from EAGLE-3's "
        "calibrated confidence (sdlib.sim.policy.stopping)", needs=frozenset({"confidences"})))
register_policy(PolicySpec(
    "nightjar-ucb", "baseline", _build_nightjar,
    "Nightjar-style UCB1 bandit over k (0 = SD off) per batch size (arXiv 2512.22420; sdlib.sim.policy.stopping)",
    batch_dependent=True))

__all__ = ["SPECDECPP_THRESHOLDS", "NIGHTJAR_ARMS", "specdecpp_lengths", "SpecDecPP", "specdecpp_steps",
           "NightjarUCB", "nightjar_steps"]
