"""vLLM 0.34's adaptive verification on the simulator's traces: EAGLE-3 drafts K tokens every step, an online
logistic estimator turns each draft's confidence into an acceptance probability, and the batch verifies only
the draft slots worth their price (policy ``vllm-adaptive-verification``; ``-k<K>`` instances draft K).

The rule, read from the vLLM 0.34.0 wheel (vllm-project/vllm#47808 "DSpark confidence-scheduled verification";
#52228 "Acceptance estimation for adaptive verification", which extends it to every draft-model speculator,
EAGLE-3 included, with the estimator below):

* ``vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`` (``OnlineAcceptanceEstimator``): per drafted token
  the feature ``f = logit(q(top token))`` of the draft distribution, clamped to +-40 (``_MAX_LOG_ODDS``); per
  draft position ``j`` the acceptance probability ``p_j = sigmoid(w * f + b_j)``, ``w = 0.5``, ``b_j = -0.2``
  at start (``_INIT_SLOPE``, ``_INIT_BIAS``). Labels (``_accumulate_kernel``): every accepted draft is 1, the
  first rejected one 0, later and unverified ones unobserved. Every 100 steps (``REFIT_INTERVAL``) one Newton
  (IRLS) step on the logistic loss with ridge ``L2 = 1e-3`` on the arrowhead system of ``[w, b_0..b_{K-1}]``
  (``_refit_kernel``): the slope step damped by ``n / (n + 50)`` with ``n`` the round's observations, each
  intercept step (solved with the damped slope step) by its position's ``n_j / (n_j + 50)``; a slope step
  that is NaN or would make ``w`` negative is dropped (``w`` kept); the round's statistics are then cleared.
* ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`` (``AdaptiveVerificationManager``): slot (row,
  position ``j``) score = survival ``S_j = p_1 * ... * p_j``. The budget (``get_num_tokens``) is
  ``B = argmax_b (rows + sum of the top-b scores) / (draft_cost[rows] + verify_cost[rows + b])`` over
  ``b = 0..`` the drafted slots (no minimum), scored on the *previous* step's predictions (``_stale_confidences``:
  ``sample_tokens`` of step N records the predictions of the drafts step N + 1 verifies, and ``prepare_inputs``
  of step N + 1 sizes the budget from the slot recorded at step N - 1, i.e. the drafts step N verified; a new
  request's are 1.0); the cost tables are profiled at start-up at a context of
  ``VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN = 8192`` tokens per row (``vllm/envs.py``). The top-B slots
  of the current step's scores are then verified (``assign_draft_token_budget``; ties handed out in request
  order); survival falls along a row, so each row verifies a prefix.

Mapped onto the simulator (and where it deviates from vLLM):

* **cost table**: vLLM's profiled ``draft_cost + verify_cost(rows + b)`` is the simulator's cost model (the
  one every policy is priced by, :func:`sdlib.sim.policy.walk.step_seconds`) for a step in which EAGLE-3
  drafted ``K`` (``eagle_n = K + 1``) and each of the ``B`` rows verifies ``l`` drafts (``n_i = l + 1``, the
  padded path's ``k = l``), at ``kv = B * 8192`` (:data:`PROFILE_CONTEXT_TOKENS`), one table per (cost
  model, batch size); the steps themselves are priced at their real KV size, as every policy's. On the
  linear (authors') model drafting all K is charged; the H200 engine model (:mod:`sdlib.sim.engine_costs`)
  has no drafting term (drafting sits inside its measured ``alpha(k, B)``, where k drafted = k verified), so
  there the K - l drafted-then-trimmed tokens cost nothing and a step verifying 0 is a plain decode step:
  its numbers are optimistic for this rule.
* **batch**: the simulator's batch is B copies of one request (the paper's batch mode), so every row has the
  same scores; the top ``B*l`` slots are then the first ``l`` of every copy. Both cost models are linear in
  the tokens a step verifies between whole multiples of B (the engine model interpolates ``alpha`` linearly
  in k), so ``(rows + top-b sum) / cost`` is a ratio of linear functions of ``b`` between multiples and its
  argmax is a multiple: the budget is searched over ``l = 0..K`` per row (:func:`copies_budget`, equal to
  :func:`choose_budget` on the tiled scores; a test checks it). Copies give the estimator B identical
  observations a step.
* **feature**: the trace's recorded top-1 probability ``c`` of each draft (:mod:`sdlib.sim.policy.confidence`,
  the head's softmax over its draft vocabulary, unscaled: vLLM leaves a greedy request's logits unscaled too) as
  ``log(c / (1 - c))``, clamped to +-40; vLLM computes it from the draft logits in float32 (the simulator in
  float64: no float32 ties at ``p = 1``).
* **estimator state**: one estimator per (configuration, dataset), carried across that dataset's requests
  in trace order (as one server's would be; 100 steps are counted over requests), each request starting
  with stale predictions of 1.0 (``add_request``).
* not modelled: the sampler's logit cap on the budget (``max_total_logits``), CUDA-graph padding of the cost
  curves (the cost models are smooth), and vLLM 0.34's configuration docstring, which still says "only
  supported for method='dspark'" (``docs/gpu_034.md``: any draft-model/EAGLE speculator runs it).

Needs the requests' draft confidences (``sdlib simulate --confidences``). A trace replay (``replay:
vllm-adaptive-verification`` on an EAGLE-3 engine with K) plans each request's verified drafts from this rule with
K drafted, decided with the engine cost model (:data:`sdlib.sim.replay.REPLAY_COST_MODEL`); the engine then
verifies what the plan proposes (or K, padded, where its runner pads).

Usage:
    from sdlib.sim.policy.vllm_adaptive import adaptive_steps
    attach_confidences(inp, conf)                        # sdlib.sim.policy.confidence
    steps = adaptive_steps(inp, [(cm, 1), (cm, 32)])     # one PolicySteps per (cost model, batch size)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from sdlib.core.registry import KMAX, BuildRequest, PolicyRef, PolicySpec, register_policy
from sdlib.sim.policy.confidence import ConfidenceError
from sdlib.sim.policy.walk import EAGLE, PolicyInputs, PolicySteps, step_seconds

NAME = "vllm-adaptive-verification"
#: acceptance_estimator.py: the feature's clamp, the cold-start slope and intercept.
MAX_LOG_ODDS, INIT_SLOPE, INIT_BIAS = 40.0, 0.5, -0.2
#: acceptance_estimator.py OnlineAcceptanceEstimator: refit every this many steps, damping n / (n + this), ridge.
REFIT_INTERVAL, DAMPING_OBSERVATIONS, L2 = 100, 50.0, 1e-3
#: vllm/envs.py VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN: context per row of the profiled cost curves.
PROFILE_CONTEXT_TOKENS = 8192


# --------------------------------------------------------------------------- the estimator
def log_odds(conf) -> np.ndarray:
    """``log(c / (1 - c))`` of top-1 probabilities, clamped to +-:data:`MAX_LOG_ODDS` (c = 0 or 1 included)."""
    c = np.asarray(conf, dtype=float)
    with np.errstate(divide="ignore"):
        f = np.log(c) - np.log1p(-c)
    return np.clip(np.nan_to_num(f, nan=0.0, posinf=MAX_LOG_ODDS, neginf=-MAX_LOG_ODDS), -MAX_LOG_ODDS, MAX_LOG_ODDS)


def sigmoid(x) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return np.exp(-np.logaddexp(0.0, -x))


@dataclass
class Estimator:
    """``OnlineAcceptanceEstimator``'s state for ``n`` independent estimators (lanes) of ``K`` positions:
    coefficients, the round's Newton statistics (``info`` = [a_j, b_j, c_j], ``grad`` = [g0_j, g1_j], ``counts``)
    and the steps since the last refit."""

    slope: np.ndarray  # (n,)
    intercepts: np.ndarray  # (n, K)
    info: np.ndarray  # (n, K, 3)
    grad: np.ndarray  # (n, K, 2)
    counts: np.ndarray  # (n, K)
    since: np.ndarray  # (n,) steps since the last refit

    @classmethod
    def fresh(cls, n: int, K: int) -> "Estimator":
        return cls(np.full(n, INIT_SLOPE), np.full((n, K), INIT_BIAS), np.zeros((n, K, 3)), np.zeros((n, K, 2)),
                   np.zeros((n, K)), np.zeros(n, np.int64))

    def predict(self, lanes: np.ndarray, feature: np.ndarray) -> np.ndarray:
        """(lanes, K) acceptance probabilities ``sigmoid(w * f + b_j)`` (``_predict_kernel``)."""
        return sigmoid(self.slope[lanes, None] * feature + self.intercepts[lanes])

    def accumulate(self, lanes: np.ndarray, feature: np.ndarray, pred: np.ndarray, accepted: np.ndarray,
                   verified: np.ndarray, rows=1.0) -> None:
        """Fold one verify step of each lane into its round (``_accumulate_kernel``): drafts ``j < accepted``
        are labelled 1, draft ``j = accepted`` 0 if it was verified; ``rows`` identical rows each."""
        j = np.arange(feature.shape[1])
        acc, ver = np.asarray(accepted)[:, None], np.asarray(verified)[:, None]
        observed = (j <= acc) & (j < ver)
        label = (j < acc).astype(float)
        r = np.broadcast_to(np.asarray(rows, dtype=float), (len(lanes),))[:, None]
        w = np.where(observed, pred * (1.0 - pred), 0.0) * r
        resid = np.where(observed, label - pred, 0.0) * r
        self.info[lanes] += np.stack([w * feature * feature, w * feature, w], axis=-1)
        self.grad[lanes] += np.stack([resid * feature, resid], axis=-1)
        self.counts[lanes] += observed * r

    def step(self, lanes: np.ndarray) -> None:
        """Count a step for ``lanes``; refit those that reached :data:`REFIT_INTERVAL` (``step``)."""
        self.since[lanes] += 1
        due = lanes[self.since[lanes] >= REFIT_INTERVAL]
        if due.size:
            self.slope[due], self.intercepts[due] = refit(self.slope[due], self.intercepts[due], self.info[due],
                                                          self.grad[due], self.counts[due])
            self.info[due], self.grad[due], self.counts[due], self.since[due] = 0.0, 0.0, 0.0, 0


def refit(slope, intercepts, info, grad, counts, l2: float = L2,
          damping: float = DAMPING_OBSERVATIONS) -> tuple[np.ndarray, np.ndarray]:
    """One damped Newton step of ``_refit_kernel`` per lane: solve ``(X'WX + l2*I) d = X'(y - p)`` for
    ``d = [dw, db_0..db_{K-1}]`` through the arrowhead's Schur complement, damp ``dw`` by ``n / (n + damping)``
    (``n`` = the round's observations), drop it if NaN or if ``w + dw < 0``, then ``db_j = (g1_j - b_j*dw) / c_j``
    damped by ``n_j / (n_j + damping)`` (NaN -> 0). Returns (slope, intercepts)."""
    info, grad, counts = np.asarray(info, float), np.asarray(grad, float), np.asarray(counts, float)
    a = info[..., 0].sum(-1) + l2
    b, c = info[..., 1], info[..., 2] + l2
    g0, g1 = grad[..., 0].sum(-1), grad[..., 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        dw = (g0 - (b * g1 / c).sum(-1)) / (a - (b * b / c).sum(-1))
        total = counts.sum(-1)
        dw = dw * total / (total + damping)
        dw = np.where(~np.isnan(dw) & (slope + dw >= 0.0), dw, 0.0)
        db = (g1 - b * dw[..., None]) / c * (counts / (counts + damping))
    return slope + dw, intercepts + np.where(np.isnan(db), 0.0, db)


# --------------------------------------------------------------------------- budget and selection
def choose_budget(scores, rows: int, draft_cost: float, verify_cost) -> int:
    """``get_num_tokens``'s budget: ``argmax_b (rows + top-b score sum) / (draft_cost + verify_cost[rows + b])``
    over ``b = 0..len(scores)`` (``scores``: every eligible slot's survival; ``verify_cost`` indexed by the
    step's target tokens; the first maximum wins, as ``np.argmax``)."""
    s = np.sort(np.asarray(scores, dtype=float))[::-1]
    gain = rows + np.concatenate([[0.0], np.cumsum(s)])
    cost = draft_cost + np.asarray(verify_cost, dtype=float)[rows:rows + s.size + 1]
    return int(np.argmax(gain / cost))


def copies_budget(survival: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Per lane, the drafts each of its B identical rows verifies: ``argmax_l (1 + S_1 + ... + S_l) / table[l]``
    (``survival`` (lanes, K); ``table`` (lanes, K + 1) the step's price verifying ``l`` per row): vLLM's budget
    over whole multiples of B (module docstring)."""
    gain = 1.0 + np.concatenate([np.zeros((survival.shape[0], 1)), np.cumsum(survival, axis=1)], axis=1)
    return np.argmax(gain / table, axis=1).astype(np.int64)


def admit_drafts(survival, capacity, budget: int) -> np.ndarray:
    """``assign_draft_token_budget``: the drafts each row verifies when the batch's ``budget`` best slots are
    admitted (``survival`` (rows, K), slots ``j >= capacity[row]`` ineligible); every slot above the
    threshold, then tied slots handed out in row order. A row's count is a prefix: survival never rises."""
    S = np.asarray(survival, dtype=float)
    cap = np.asarray(capacity, dtype=np.int64)
    ok = np.arange(S.shape[1])[None, :] < cap[:, None]
    if budget <= 0:
        return np.zeros(len(cap), np.int64)
    if budget >= int(ok.sum()):
        return np.minimum(cap, S.shape[1])
    s = np.where(ok, S, -1.0)
    thr = np.sort(s, axis=None)[::-1][budget - 1]
    above = (s > thr).sum(axis=1)
    tied = (s == thr).sum(axis=1)
    left = budget - int(above.sum())
    before = np.cumsum(tied) - tied
    return (above + np.minimum(tied, np.maximum(left - before, 0))).astype(np.int64)


def cost_table(cm, B: int, K: int) -> np.ndarray:
    """(K + 1,) price of a step of ``B`` rows that drafted ``K`` and verifies ``l = 0..K`` per row, at the
    profiled :data:`PROFILE_CONTEXT_TOKENS` per row (vLLM's start-up cost curves, on the simulator's model)."""
    ls = np.arange(K + 1)
    return step_seconds(cm, B, kv=np.full(ls.size, float(B) * PROFILE_CONTEXT_TOKENS), n_i=ls + 1, k=ls,
                        eagle=np.ones(ls.size), eagle_n=np.full(ls.size, K + 1.0), ngram=np.zeros(ls.size),
                        path="padded")


# --------------------------------------------------------------------------- the walk
def _chains(inp: PolicyInputs) -> list[np.ndarray]:
    """Each dataset's requests in trace order that have a step to run (one server's queue)."""
    L = inp.lengths("eagle3")
    ds = np.asarray(inp.prep.dataset)
    return [np.flatnonzero((ds == d) & (L > 1)) for d in dict.fromkeys(ds)]


def adaptive_steps(inp: PolicyInputs, cfg: Sequence[tuple], K: Optional[int] = None) -> list[PolicySteps]:
    """The rule's steps at each (cost model, batch size) of ``cfg`` with EAGLE-3 drafting ``K`` (default the
    traces' kmax): lanes = (configuration, dataset), each running its dataset's requests one after another with
    one estimator (module docstring); loop over steps, numpy over lanes."""
    if "conf_eagle" not in inp.extra:
        raise ConfidenceError(f"{NAME} needs the requests' draft confidences (attach_confidences)")
    K = inp.kmax if K is None else int(K)
    if not 1 <= K <= inp.kmax:
        raise ValueError(f"{NAME}: K = {K} outside 1..{inp.kmax} (the drafts the traces score)")
    feat = log_odds(inp.extra["conf_eagle"][:, :K])
    L = inp.lengths("eagle3")
    chains = _chains(inp)
    n_cfg, n_ch = len(cfg), len(chains)
    lane_cfg = np.repeat(np.arange(n_cfg), n_ch)
    queue = [chains[d] for _ in range(n_cfg) for d in range(n_ch)]
    rows = np.array([float(b) for _, b in cfg])[lane_cfg]
    table = np.stack([cost_table(cm, int(b), K) for cm, b in cfg])[lane_cfg]
    n = lane_cfg.size
    est = Estimator.fresh(n, K)
    nxt = np.zeros(n, np.int64)  # index of the lane's current request in its queue
    req = np.array([q[0] if q.size else -1 for q in queue], np.int64)
    pos = np.ones(n, np.int64)
    stale = np.ones((n, K))
    cols: dict[str, list] = {c: [] for c in ("cfg", "req", "pos", "l", "gain")}
    live = np.flatnonzero(req >= 0)
    while live.size:
        flat = inp.off[req[live]] + pos[live]
        f = feat[flat]
        pred = est.predict(live, f)
        l = copies_budget(np.cumprod(stale[live], axis=1), table[live])
        gain = np.minimum(inp.acc_eg[flat], l + 1)
        for c, v in zip(cols, (lane_cfg[live], req[live], pos[live], l, gain)):
            cols[c].append(v)
        est.accumulate(live, f, pred, gain - 1, l, rows[live])
        est.step(live)
        stale[live] = pred
        pos[live] += gain
        done = live[pos[live] >= L[req[live]]]
        for i in done:  # the lane's next request (a fresh request's stale predictions are 1.0)
            nxt[i] += 1
            req[i] = queue[i][nxt[i]] if nxt[i] < queue[i].size else -1
            pos[i], stale[i] = 1, 1.0
        live = np.flatnonzero(req >= 0)
    flat_cols = {c: (np.concatenate(v) if v else np.zeros(0, np.int64)) for c, v in cols.items()}
    out = []
    for c in range(n_cfg):
        m = flat_cols["cfg"] == c
        r, p, l, g = (flat_cols[x][m].astype(np.int64) for x in ("req", "pos", "l", "gain"))
        one = np.ones(r.size)
        out.append(PolicySteps(r, p, l + 1, l, np.full(r.size, EAGLE, np.int8), one, np.full(r.size, K + 1.0),
                               0.0 * one, g, one.copy(), L.copy(), "padded"))
    return out


def _build(req: BuildRequest, ref: PolicyRef) -> list:
    if req.K is not None and ref.k is not None and ref.k > req.K:
        raise ValueError(f"{ref.label}: drafts {ref.k}, more than the engine's K = {req.K}")
    return adaptive_steps(req.inputs, [tuple(c) for c in req.configs], ref.k if ref.k is not None else req.K)


# family "baseline" like the shipped rules of sdlib.sim.policy.baselines, but not in their group: the group runs
# on traces without confidences (the reference traces, notebooks), this rule needs them (as the confidence policies)
register_policy(PolicySpec(
    NAME, "baseline", _build,
    "vLLM 0.34 adaptive verification (v1/worker/gpu/spec_decode/acceptance_estimator.py, adaptive_verification.py; "
    "PRs #47808, #52228), EAGLE-3 drafting K", ks=(None,) + tuple(range(1, KMAX + 1)), batch_dependent=True,
    replays_on=("eagle3",), replay_k=True, needs=frozenset({"confidences", "engine_files"})))


__all__ = ["NAME", "log_odds", "Estimator", "refit", "choose_budget", "copies_budget", "admit_drafts", "cost_table",
           "adaptive_steps"]
