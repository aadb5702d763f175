"""Replay plans: the steps each request must take in an engine whose acceptance is pinned to a trace.

A plan is the simulator's own step sequence (:func:`sdlib.sim.oracle.step_records`, corrected
convention) for one request: at every verify step its output position ``pos``, the tokens drafted
``proposed`` and the tokens accepted ``accepted``. The engine replays it exactly
(:mod:`sdlib.vllm.replay`): ``accepted = min(acc[pos] - 1, proposed)`` and the next step starts at
``pos + accepted + 1``. So a measured replay and the simulator's prediction share every step, and differ
only where the engine's costs differ from the cost model's.

Policies (``method.replay`` in a sweep config), for an engine with ``num_speculative_tokens = K``:

==================  ======================================================================================
``fixed``           the method with k = K: EAGLE-3 lists for model drafters, n-gram lists (and the real
                    look-up's proposal length) for n-gram (simulator ``FIXED_K``)
``oracle``          Oracle Proposal capped at K: propose exactly ``min(acc - 1, K)`` (``ORACLE_K``)
``combine``         Oracle Combine capped at K: per step the better of n-gram and EAGLE-3
                    (proposer ``combined``, ``ORACLE_K``)
``accept_all``      calibration: K drafted, all accepted (equals synthetic acceptance L = K + 1)
``accept_none``     calibration: K drafted, none accepted (equals synthetic acceptance L = 1)
``propose_nothing`` calibration: nothing drafted (the path's fixed cost over no SD; ragged paths only)
``online``          the project's online policy (:mod:`sdlib.sim.policy.online`), proposals capped at K, at the
                    cell's batch size (:mod:`sdlib.sim.policy.replay_plans`); ``online-at-k`` the same
                    policy pricing every step at the engine's K (the EAGLE-3 path's cost in vLLM 0.26)
baseline names      ``ngram-eagle``, ``ngram-eagle-long``, ``arctic``, ``sglang-adaptive``, ``dynamic-sd``,
                    ``specdecode-adaptive`` (:mod:`sdlib.sim.policy.baselines`), capped at K likewise
==================  ======================================================================================

Where the engine cannot verify fewer than K tokens (vLLM 0.26's V2 runner: EAGLE, EAGLE-3), a plan's
shorter proposals are padded to K with drafts that are rejected; acceptance is unchanged.

Usage:
    from sdlib.sim.replay import replay_plans, truncate_traces
    prep = truncate_traces(prepare_traces(traces), max_len=128)
    plans = replay_plans(prep, method="eagle3", policy="fixed", K=3)   # one RequestPlan per request
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from sdlib.sim.oracle import PreparedTraces, step_records
from sdlib.sim.policy.replay_plans import POLICY_METHODS

#: Per-step policies: those of sdlib.sim.policy.replay_plans.POLICY_METHODS (with the methods each can replay on).
STEP_POLICIES = tuple(POLICY_METHODS)
#: Policies the engine replay knows (sdlib.vllm.replay), with what each replays.
POLICIES = ("fixed", "oracle", "combine", "accept_all", "accept_none", "propose_nothing") + STEP_POLICIES
#: Calibration policies: acceptance fixed by the policy, not by the traces.
CALIBRATION = ("accept_all", "accept_none", "propose_nothing")
#: SD methods whose engine path a replay can stand for, and the trace lists each replays.
TRACE_OF_METHOD = {"ngram": "ngram", "eagle3": "eagle3", "eagle": "eagle3", "draft_model": "eagle3"}


@dataclass
class RequestPlan:
    """The verify steps of one request: output position at the step, tokens drafted, tokens accepted."""

    pos: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    output_len: int

    def gains(self) -> list[int]:
        """Tokens each engine step adds: the prefill's 1, then ``accepted + 1`` per step (the last one cut at
        the output length, as ``max_tokens`` cuts it)."""
        left = self.output_len - self.pos
        return [1] + np.minimum(self.accepted + 1, left).astype(int).tolist()


def simulator_spec(method: str, policy: str, K: int) -> tuple[str, str]:
    """(proposer, predict method) of :func:`sdlib.sim.oracle.step_records` that a trace policy replays."""
    if method not in TRACE_OF_METHOD:
        raise ValueError(f"method {method!r}: replay knows {sorted(TRACE_OF_METHOD)}")
    if policy == "fixed":
        return TRACE_OF_METHOD[method], f"FIXED_{K}"
    if policy == "oracle":
        return TRACE_OF_METHOD[method], f"ORACLE_{K}"
    if policy == "combine":
        return "combined", f"ORACLE_{K}"
    raise ValueError(f"policy {policy!r} is not a trace policy (fixed, oracle, combine)")


def truncate_traces(prep: PreparedTraces, max_len: Optional[int]) -> PreparedTraces:
    """Every request cut to ``L = min(max_len, its output, both acceptance lists)`` output tokens, so that
    every method and the no-SD baseline generate the same L; ``acc[p]`` capped by the tokens left
    (``L - p``). The n-gram look-up lengths need no change (they depend on the context before ``p``)."""
    lens = [min(int(prep.output_len[i]), len(prep.acc["ngram"][i]), len(prep.acc["eagle3"][i]),
                max_len if max_len else 1 << 62) for i in range(len(prep))]
    acc = {m: [np.minimum(a[:L], L - np.arange(L)).astype(np.int64) for a, L in zip(arrs, lens)]
           for m, arrs in prep.acc.items()}
    avail = None if prep.ngram_avail is None else [a[:L] for a, L in zip(prep.ngram_avail, lens)]
    out = None if prep.output_token_ids is None else [list(o[:L]) for o, L in zip(prep.output_token_ids, lens)]
    return PreparedTraces(prep.dataset.copy(), prep.request_id.copy(), prep.prompt_len.copy(),
                          np.asarray(lens, dtype=np.int64), acc, avail, prep.prompt_token_ids, out)


def _walk_constant(L: int, proposed: int, accepted: int) -> RequestPlan:
    pos = np.arange(1, max(L, 1), accepted + 1, dtype=np.int64)
    return RequestPlan(pos, np.full(pos.size, proposed, np.int64), np.full(pos.size, accepted, np.int64), int(L))


def replay_plans(prep: PreparedTraces, method: str, policy: str, K: int, batch_size: int = 1) -> list[RequestPlan]:
    """One :class:`RequestPlan` per request of ``prep`` (see the module docstring for the policies);
    ``batch_size``: the cell's (per-step policies that depend on it)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {POLICIES}")
    if K < 1:
        raise ValueError("K must be >= 1")
    L = prep.output_len.astype(np.int64)
    if policy == "accept_all":
        return [_walk_constant(int(x), K, K) for x in L]
    if policy == "accept_none":
        return [_walk_constant(int(x), K, 0) for x in L]
    if policy == "propose_nothing":
        return [_walk_constant(int(x), 0, 0) for x in L]
    if policy in STEP_POLICIES:
        from sdlib.sim.policy.replay_plans import policy_steps

        rec = policy_steps(prep, method, policy, K, batch_size)
    else:
        proposer, pm = simulator_spec(method, policy, K)
        rec = step_records(prep, proposer, pm, "corrected")
    order = np.argsort(rec.req, kind="stable")
    bounds = np.searchsorted(rec.req[order], np.arange(len(prep) + 1))
    plans = []
    for r in range(len(prep)):
        sel = order[bounds[r]:bounds[r + 1]]
        plans.append(RequestPlan(rec.pos[sel], rec.n_i[sel] - 1, rec.gain[sel] - 1, int(rec.output_len[r])))
    return plans
