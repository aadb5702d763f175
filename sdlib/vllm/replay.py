"""Trace replay inside vLLM: pin the target, then overwrite each row's drafts so that the engine accepts
exactly what a plan (:mod:`sdlib.sim.replay`) prescribes, on the method's own engine path.

How (read in vLLM 0.26.0, 0.32.0 and 0.34.0; version differences are in :mod:`sdlib.vllm.compat`):

* **Pinning.** The target's final norm weight is zeroed after load (dummy or real weights), so every logit
  is 0 and the greedy token is always 0. A draft token 0 is accepted, any other rejected: drafts
  ``[0]*a + [1]*(d-a)`` accept exactly ``a`` of ``d`` (greedy rejection sampling stops at the first
  mismatch).
* **Which request and position.** The driver appends ``@<key>`` to each request id (vLLM adds
  ``-<8 random chars>``); plans are keyed by ``key``. The output position is exact on every path:
  ``len(runner.requests[rid].output_token_ids)`` (V1, synchronous) or ``total_len - prompt_len`` on the
  GPU (V2).
* **V1 runner, synchronous** (vLLM 0.26 GPU: n-gram, draft model, ``custom_class``; every method on the
  0.32 CPU build): ``runner.take_draft_token_ids`` is wrapped; it runs after the step's bookkeeping, on
  the host, and its drafts go to the scheduler, so they may be shorter than K (ragged: the row verifies
  only what it drafted). For n-gram the proposer itself is wrapped too: vLLM's look-up runs for real, on
  the trace's own token ids (prompt + recorded output), and its proposal length is checked against the
  plan's.
* **V2 runner, asynchronous scheduling** (vLLM 0.26 GPU: EAGLE, EAGLE-3; vLLM 0.34: every method, n-gram and
  sdlib's custom proposers included, since 0.34 has no V1 runner): the scheduler holds only
  placeholders and drafts live on the GPU, so ``runner.speculator.propose`` is wrapped: the drafter runs
  for real, then its output is replaced on the GPU from a per-request table of ``a`` by output position
  (no host synchronisation; one scalar copy when a request takes a slot). Every row verifies K tokens:
  shorter proposals are padded with rejected drafts. With an n-gram look-up configured (Oracle Combine),
  vLLM's look-up also runs on the host every step on the trace's tokens, so the policy pays both drafters
  (on vLLM 0.34, whose n-gram look-up is a GPU kernel, the host look-up is vLLM 0.32's, kept in
  :mod:`sdlib.vllm.ngram_host`). The same V2 hook serves 0.34's ``propose(input_batch, ...)`` (called
  positionally from ``vllm/v1/worker/gpu/model_runner.py:2368``; ``dummy_run`` by keyword).
* **Adaptive verification** (vLLM 0.34, ``enable_adaptive_verification``): the engine verifies only a budget of
  slots ranked by the drafts' confidences, so a row verifies what the plan proposed rather than K. Its own
  confidences (an online-calibrated estimate from the draft logits, meaningless with dummy weights) are
  replaced after each ``propose`` by :func:`av_confidences` and its budget by :func:`av_budget` (at least the
  step's planned drafts, which the host counts from the plans), so that it verifies each row's planned proposal
  and drops the padding.

All hooks run in the engine's worker through ``llm.collective_rpc`` (module-level functions, pickled by
reference; the multi-process engine needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``).

Usage (the sweep worker does this for methods with ``replay:``):
    pin_target(llm); kind = install(llm, K)
    set_plans(llm, ReplayPlans(K, plans={key: (pos, proposed, accepted)}, tokens={key: ids}, ...))
    ... drive the engine ...;  stats(llm) -> {"steps": ..., "unknown": ..., "ngram_len_mismatch": ...}
"""

from __future__ import annotations

import pickle
import re
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from sdlib.vllm.compat import batch_ngram_propose

#: Separator between the driver's request id and the plan key.
KEY_SEP = "@"


@dataclass
class ReplayPlans:
    """What the hooks replay during one cell; plain data, pickled into the worker."""

    K: int
    plans: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # key -> (pos, proposed, accepted)
    tokens: dict[int, np.ndarray] = field(default_factory=dict)  # key -> prompt + output token ids (n-gram)
    prompt_len: dict[int, int] = field(default_factory=dict)
    ngram: Optional[tuple[int, int]] = None  # (prompt_lookup_min, max): run vLLM's look-up on the trace tokens
    output_len: dict[int, int] = field(default_factory=dict)  # key -> output length (no step at or past it)
    check_ngram_len: bool = False  # count n-gram proposals whose real length differs from the plan's (fixed)


_KEY_RE = re.compile(re.escape(KEY_SEP) + r"(\d+)(?:-[^-" + re.escape(KEY_SEP) + r"]*)?$")


def plan_key(internal_request_id: str) -> Optional[int]:
    """The plan key of an engine request id ``<driver id>@<key>`` (vLLM may append ``-<random>``)."""
    m = _KEY_RE.search(internal_request_id)
    return int(m.group(1)) if m else None


def drafts(a: int, d: int) -> list[int]:
    """``a`` accepted drafts (token 0) then ``d - a`` rejected ones (token 1)."""
    return [0] * a + [1] * (d - a)


#: Confidences :func:`av_confidences` gives: a slot the budget counts (a draft; a padded slot, ranked after every
#: draft), a draft it does not count (halved along the row, still above padding), a padded slot it does not count.
AV_DRAFT, AV_PAD_COUNTED, AV_DRAFT_UNCOUNTED, AV_PAD = 1.0, 0.999, 1e-3, 0.0
#: :func:`av_budget` counts the slots whose running product is above this.
AV_COUNT_ABOVE = 0.5


def av_confidences(d_now, d_next, K: int):
    """The draft confidences a replay gives vLLM 0.34's adaptive verification so that it verifies every row's
    planned proposal: ``d_now`` (rows,) the lengths proposed for the drafts written now, ``d_next`` (rows,) the
    same rows' next plan step's lengths; returns (rows, K) float32 (torch tensors in, torch out).

    Adaptive verification uses one published set of confidences twice, a step apart (vLLM 0.34.0
    ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``). The *next* step hands its slot budget out with
    them (``reallocate_drafts``: the globally highest running products of confidences win), so the drafts
    written now must rank above every padded slot. But the budget itself, how many slots the batch verifies, is
    chosen on the host from the confidences published a step *earlier* (``get_num_tokens`` reads the stale copy:
    ``record_confidences`` swaps two buffers), so the count these confidences carry must be the one the step
    after next needs: ``sum(d_next)`` slots. (The plain 1 for a draft and 0 for padding carries this step's count
    instead, and lost drafts whenever a step proposed more than the one before: data/gpu/h200_v034_2026-12-05b.json.)

    Over the batch, in column order (every row's first slot, then every row's second, ...; each row's taken
    slots are then a prefix, as running products need): if ``sum(d_next) <= sum(d_now)``, the first
    ``sum(d_next)`` drafts get :data:`AV_DRAFT` and the others :data:`AV_DRAFT_UNCOUNTED`; otherwise every draft
    gets :data:`AV_DRAFT` and ``sum(d_next) - sum(d_now)`` padded slots :data:`AV_PAD_COUNTED`. Other padded
    slots: :data:`AV_PAD`. The count is read back by :func:`av_budget`. A request's first step is verified in
    full (vLLM's ``add_request`` sets its confidences to 1): more than the plan, never less.
    """
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

    d_now, d_next = d_now.long(), d_next.long()
    rows = d_now.shape[0]
    cols = torch.arange(K, device=d_now.device).unsqueeze(0).expand(rows, K)
    draft = cols < d_now.unsqueeze(1)

    def rank(mask):  # each slot's rank among the ``mask`` slots in column order
        return (torch.cumsum(mask.t().reshape(-1).long(), 0) - 1).reshape(K, rows).t()

    want = d_next.sum()
    counted_draft = draft & (rank(draft) < want)
    counted_pad = ~draft & (rank(~draft) < want - draft.sum())
    conf = torch.full((rows, K), AV_PAD, dtype=torch.float32, device=d_now.device)
    conf = torch.where(counted_draft, AV_DRAFT, conf)
    conf = torch.where(draft & ~counted_draft, AV_DRAFT_UNCOUNTED, conf)
    return torch.where(counted_pad, AV_PAD_COUNTED, conf)


def av_budget(stale, scheduled, cap: int, need: int = 0) -> int:
    """The batch's draft budget in a replay: the stale confidences' count of slots (:func:`av_confidences`),
    ``stale`` (rows, K) as vLLM's ``get_num_tokens`` reads them, ``scheduled`` (rows,) the drafts each row
    scheduled, raised to ``need`` (the drafts the plans verify this step, :meth:`_State.av_need`), at most
    ``cap`` (vLLM's logit limit). vLLM's own rule (the ``argmax`` of expected tokens over a cost that steps at
    CUDA-graph buckets) leaves out the last slots before a bucket's edge even when each is worth a token, which a
    plan that says what to verify cannot allow; the hand-out, the compaction and the variable-length graphs stay
    vLLM's.

    Why ``need``: the stale count is the batch's total, spread over its rows in column order, so it holds only
    while the batch keeps its requests. In the closed loop a request that finishes takes the marks it carried for
    others with it, and the budget comes short (the seventh session, on an H100: 7 to 30 of 64 requests off plan
    in each cell of the K = 10 EAGLE-3 engine, 0.3 to 0.8% of the accepted tokens lost, data/gpu/h100_v034_2026-12-05.json;
    tests/test_replay_av.py runs the closed loop). The host knows each request's plan and how many steps it has
    verified, so it knows the step's drafts exactly; the stale count stays as the floor."""
    surv = np.cumprod(np.asarray(stale, dtype=np.float64), axis=1)
    valid = np.arange(surv.shape[1])[None, :] < np.asarray(scheduled)[:, None]
    count = max(int((surv[valid] > AV_COUNT_ABOVE).sum()), int(need))
    return int(min(count, int(np.sum(scheduled)), max(int(cap), 0)))


# --------------------------------------------------------------------------- state in the worker
class _State:
    """The hooks' view of the current cell, attached to the model runner."""

    def __init__(self, runner: Any, kind: str, K: int):
        self.runner, self.kind, self.K = runner, kind, K
        self.plans: Optional[ReplayPlans] = None
        self.by_pos: dict[int, dict[int, tuple[int, int]]] = {}
        self.counts = {"steps": 0, "unknown": 0, "off_plan": 0, "ngram_len_mismatch": 0}
        # host seconds in the V1 hooks (the hook-off control, configs/h200_hookoff.yaml): the whole wrapped
        # call, and the part inside vLLM's own proposer / take_draft_token_ids
        self.counts.update({"hook_calls": 0, "hook_s": 0.0, "vllm_s": 0.0})
        # adaptive verification: steps whose budget the plans' drafts raised above the stale count, and the slots
        self.counts.update({"av_raised_steps": 0, "av_raised_slots": 0})
        self._rows: dict[int, str] = {}  # n-gram buffer row -> request id whose tokens it holds
        self._tok: Optional[np.ndarray] = None
        # V2
        self._table = None
        self._slot_row = None
        self._slot_owner: dict[int, str] = {}
        self._host_calls: dict[str, int] = {}
        self._av_steps: dict[str, int] = {}  # request id -> steps it verified (adaptive verification's budget)
        self.adaptive = False  # vLLM 0.34's enable_adaptive_verification is on (V2): av_confidences

    def set(self, plans: ReplayPlans) -> None:
        if plans.K != self.K:
            raise ValueError(f"plans for K={plans.K} on an engine with K={self.K}")
        self.plans = plans
        self.by_pos = {k: {int(p): (int(d), int(a)) for p, d, a in zip(*v)} for k, v in plans.plans.items()}
        self._rows.clear()
        self._host_calls.clear()
        self._av_steps.clear()
        for c in self.counts:
            self.counts[c] = 0.0 if c.endswith("_s") else 0
        if plans.ngram is not None:
            width = max((len(t) for t in plans.tokens.values()), default=1) + 1
            n_rows = int(getattr(self.runner, "max_num_reqs", 0) or _max_num_reqs(self.runner))
            self._tok = np.zeros((n_rows, width), dtype=np.int32)
        if self.kind == "v2":
            self._set_v2_table(plans)
            if plans.ngram is not None:  # compile vLLM's n-gram kernel now, not inside a measured step
                _v2_ngram_lookups(self, [])

    # ---- V1 (synchronous, host) ---------------------------------------------------------------------
    def lookup(self, rid: str, pos: int) -> Optional[tuple[int, int]]:
        key = plan_key(rid)
        if key is None or key not in self.by_pos:
            self.counts["unknown"] += 1
            return None
        step = self.by_pos[key].get(pos)
        if step is None:
            if pos < self.plans.output_len.get(key, 1 << 30):  # past the end: the request is finishing
                self.counts["off_plan"] += 1
            return None
        self.counts["steps"] += 1
        return step

    def trace_tokens(self, row: int, rid: str) -> None:
        """Keep buffer row ``row`` holding the trace tokens of request ``rid``."""
        if self._rows.get(row) == rid:
            return
        self._rows[row] = rid
        key = plan_key(rid)
        toks = self.plans.tokens.get(key) if (self.plans and key is not None) else None
        self._tok[row, :] = 0
        if toks is not None:
            self._tok[row, :len(toks)] = toks

    def av_need(self, req_ids: list, scheduled) -> int:
        """The drafts the plans verify in this step (adaptive verification's budget, :func:`av_budget`): a
        request's v-th step with drafts scheduled verifies its plan's v-th proposal (a replay on plan verifies
        every plan step in order, a no-SD step included, and nothing else); a request without a plan, or past
        its plan's end, counts what it scheduled. Counts the step for each request with drafts scheduled."""
        need = 0
        for rid, n in zip(req_ids, scheduled):
            n = int(n)
            if n <= 0:
                continue
            v = self._av_steps.get(rid, 0)
            self._av_steps[rid] = v + 1
            key = plan_key(rid)
            plan = self.plans.plans.get(key) if (self.plans is not None and key is not None) else None
            need += n if plan is None or v >= len(plan[1]) else min(int(plan[1][v]), n)
        return need

    # ---- V2 (asynchronous, GPU) ---------------------------------------------------------------------
    def _set_v2_table(self, plans: ReplayPlans) -> None:
        # deferred: torch takes seconds to import, and only this path needs it
        import torch

        keys = sorted(plans.plans)
        self._key_row = {k: i for i, k in enumerate(keys)}
        L = max((int(v[0].max()) + 1 for v in plans.plans.values() if len(v[0])), default=1) + 1
        table = np.zeros((len(keys) + 1, L), dtype=np.int32)  # last row: unknown requests accept nothing
        proposed = np.zeros_like(table)  # the plan's proposal length by position (adaptive verification)
        for k, (pos, prop, acc) in plans.plans.items():
            table[self._key_row[k], pos] = acc
            proposed[self._key_row[k], pos] = prop
        dev = self.runner.device
        self._table = torch.as_tensor(table, device=dev)
        self._proposed = torch.as_tensor(proposed, device=dev)
        self._cols = torch.arange(self.K, device=dev, dtype=torch.int32)
        self._slot_row = torch.full((_max_num_reqs(self.runner),), len(keys), dtype=torch.int64, device=dev)
        self._slot_owner.clear()
        self._L = L


def _max_num_reqs(runner: Any) -> int:
    for path in ("max_num_reqs", "req_states.max_num_reqs", "input_batch.max_num_reqs",
                 "scheduler_config.max_num_seqs"):
        obj = runner
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj:
            return int(obj)
    return 1024


# --------------------------------------------------------------------------- hooks
def _install_v1(runner: Any, st: _State) -> None:
    # deferred: vllm takes seconds to import, and only this path needs it
    from vllm.v1.outputs import DraftTokenIds

    drafter = getattr(runner, "drafter", None)
    if type(drafter).__name__ == "NgramProposer":
        orig_propose = drafter.propose

        def propose(num_spec, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
            t0 = time.perf_counter()
            out = _propose(num_spec, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
            st.counts["hook_calls"] += 1
            st.counts["hook_s"] += time.perf_counter() - t0
            return out

        def _propose(num_spec, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings):
            ib = runner.input_batch
            if st.plans is not None and st.plans.ngram is not None and st._tok is not None:
                for i, rid in enumerate(ib.req_ids[:len(sampled_token_ids)]):
                    st.trace_tokens(i, rid)
                token_ids_cpu = st._tok
            t0 = time.perf_counter()
            real = orig_propose(num_spec, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                                slot_mappings=slot_mappings)
            st.counts["vllm_s"] += time.perf_counter() - t0
            if st.plans is None:
                return real
            out = []
            for i, rid in enumerate(ib.req_ids[:len(sampled_token_ids)]):
                if not sampled_token_ids[i]:
                    out.append([])
                    continue
                pos = int(num_tokens_no_spec[i]) - int(ib.num_prompt_tokens[i])
                step = st.lookup(rid, pos)
                if step is None:
                    out.append([])
                    continue
                d, a = step
                if st.plans.check_ngram_len and len(real[i]) != d:
                    st.counts["ngram_len_mismatch"] += 1
                out.append(drafts(a, d))
            return out

        drafter.propose = propose
        return

    orig_take = runner.take_draft_token_ids

    def take():
        t0 = time.perf_counter()
        out = orig_take()
        t1 = time.perf_counter()
        st.counts["vllm_s"] += t1 - t0
        if out is not None and st.plans is not None:
            out = _replace(out)
        if out is not None:
            st.counts["hook_calls"] += 1
            st.counts["hook_s"] += time.perf_counter() - t0
        return out

    def _replace(out):
        new = []
        for rid, d_old in zip(out.req_ids, out.draft_token_ids):
            req = runner.requests.get(rid)
            step = st.lookup(rid, len(req.output_token_ids)) if req is not None else None
            new.append(d_old if req is None else ([] if step is None else drafts(step[1], step[0])))
        return DraftTokenIds(out.req_ids, new)

    runner.take_draft_token_ids = take


def _install_v2(runner: Any, st: _State) -> None:
    spec = runner.speculator
    orig = spec.propose

    def propose(*args, **kw):
        out = orig(*args, **kw)
        if kw.get("dummy_run", False) or st.plans is None or st._table is None:
            return out
        ib = kw["input_batch"] if "input_batch" in kw else args[0]
        n = ib.num_reqs
        rids = ib.req_ids[:n]
        for rid, slot in zip(rids, ib.idx_mapping_np[:n].tolist()):
            if st._slot_owner.get(slot) != rid:
                st._slot_owner[slot] = rid
                key = plan_key(rid)
                st._slot_row[slot] = st._key_row.get(key, len(st._key_row)) if key is not None else len(st._key_row)
        if st.plans.ngram is not None:
            _v2_ngram_lookups(st, rids)
        st.counts["steps"] += n
        idx = ib.idx_mapping[:n].long()
        rs = runner.req_states
        pos = (rs.total_len.gpu[idx] - rs.prompt_len.gpu[idx]).long().clamp_(0, st._L - 1)
        row = st._slot_row[idx]
        a = st._table[row, pos]
        k = out.shape[1]
        if st.adaptive:  # what adaptive verification ranks: the plan's lengths, not the drafter's estimates
            nxt = (pos + a.long() + 1).clamp_(max=st._L - 1)  # the row's next plan step (this one gains a + 1)
            conf = av_confidences(st._proposed[row, pos], st._proposed[row, nxt], k)
            spec.draft_token_confidence_probs[:n, :k].copy_(conf)
        return (st._cols[:k].unsqueeze(0) >= a.unsqueeze(1)).to(out.dtype)

    spec.propose = propose


def _v2_ngram_lookups(st: _State, rids: list[str]) -> None:
    """vLLM's n-gram look-up for every row, on the trace's tokens at the row's host-side position (each
    propose call is one verify step of the row, so the k-th call of a request is its plan's k-th step)."""

    batch_propose_numba = batch_ngram_propose()  # vLLM's host look-up (< 0.34) or sdlib's copy of it (>= 0.34)
    nmin, nmax = st.plans.ngram
    n = max(len(rids), 1)
    num_tokens = np.zeros(n, dtype=np.int32)
    for i, rid in enumerate(rids):
        st.trace_tokens(i, rid)
        key = plan_key(rid)
        c = st._host_calls.get(rid, 0)
        st._host_calls[rid] = c + 1
        plan = st.plans.plans.get(key) if key is not None else None
        if plan is None or not len(plan[0]):
            continue
        pos = int(plan[0][min(c, len(plan[0]) - 1)])
        num_tokens[i] = min(st.plans.prompt_len.get(key, 0) + pos, st._tok.shape[1] - 1)
    draft = np.zeros((n, st.K), dtype=np.int32)
    ndraft = np.zeros(n, dtype=np.int32)
    batch_propose_numba(list(range(n)), num_tokens, st._tok, nmin, nmax, st._tok.shape[1], st.K, draft, ndraft)


# --------------------------------------------------------------------------- run in the worker
def _runner(worker: Any) -> Any:
    return worker.model_runner


def _w_pin(worker: Any) -> str:
    model = worker.get_model()
    inner = getattr(model, "model", model)
    norm = getattr(inner, "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        raise RuntimeError(f"pin: {type(model).__name__} has no final norm weight at .model.norm")
    norm.weight.data.zero_()
    return type(model).__name__


def _w_install(worker: Any, K: int) -> str:
    runner = _runner(worker)
    kind = "v2" if hasattr(runner, "req_states") and hasattr(runner, "speculator") else "v1"
    if kind == "v1":
        sc = getattr(getattr(runner, "vllm_config", None), "scheduler_config", None)
        if getattr(sc, "async_scheduling", False):
            raise RuntimeError("replay: V1 runner with async scheduling: drafts stay on the GPU; not supported")
    st = _State(runner, kind, K)
    st.adaptive = kind == "v2" and getattr(runner, "adaptive_verification", None) is not None
    if st.adaptive:
        _install_av_budget(runner.adaptive_verification, st)
    runner._sdlib_replay = st
    (_install_v2 if kind == "v2" else _install_v1)(runner, st)
    return kind


def _install_av_budget(av: Any, st: Optional[_State] = None) -> None:
    """Wrap vLLM 0.34's ``AdaptiveVerificationManager.get_num_tokens`` so that the budget it stashes for the
    step is :func:`av_budget`'s, raised to the plans' drafts when ``st`` holds them (read in 0.34.0: it returns
    the step's token count and stashes ``(drafts per request, non-draft tokens per request, budget)`` in
    ``_batch_budget`` for ``reallocate_drafts``)."""
    need = ("get_num_tokens", "_stale_confidences", "_stale_idx", "req_states", "_max_total_logits",
            "num_bonus_tokens")
    missing = [a for a in need if not hasattr(av, a)]
    if missing:
        raise RuntimeError(f"replay: adaptive verification without {missing}: this vLLM's manager is not 0.34's")
    orig = av.get_num_tokens

    def get_num_tokens(num_tokens_per_req, draft_tokens):
        orig(num_tokens_per_req, draft_tokens)
        per_req, non_draft, _ = av._batch_budget
        req_ids = list(num_tokens_per_req)
        slots = [av.req_states.req_id_to_index[r] for r in req_ids]
        scheduled = np.array([per_req[r] for r in req_ids], dtype=np.int64)
        stale = av._stale_confidences[av._stale_idx].np[slots]
        cap = av._max_total_logits - len(req_ids) * av.num_bonus_tokens
        floor = av_budget(stale, scheduled, cap)
        need = st.av_need(req_ids, scheduled) if st is not None else 0
        b = av_budget(stale, scheduled, cap, need)
        if st is not None and b > floor:
            st.counts["av_raised_steps"] += 1
            st.counts["av_raised_slots"] += b - floor
        av._batch_budget = (per_req, non_draft, b)
        return sum(non_draft.values()) + b

    av.get_num_tokens = get_num_tokens


def _w_set(worker: Any, blob: bytes) -> None:
    _runner(worker)._sdlib_replay.set(pickle.loads(blob))


def _w_reset_timers(worker: Any) -> None:
    c = _runner(worker)._sdlib_replay.counts
    c.update({"hook_calls": 0, "hook_s": 0.0, "vllm_s": 0.0, "av_raised_steps": 0, "av_raised_slots": 0})


def _w_stats(worker: Any) -> dict[str, float]:
    return dict(_runner(worker)._sdlib_replay.counts)


def _rpc(llm: Any, fn, *args) -> list:
    return llm.collective_rpc(fn, args=args)


def pin_target(llm: Any) -> str:
    """Zero the target's final norm in every worker (greedy output is then always token 0)."""
    return _rpc(llm, _w_pin)[0]


def install(llm: Any, K: int) -> str:
    """Install the replay hooks; returns the runner kind (``v1`` or ``v2``)."""
    return _rpc(llm, _w_install, K)[0]


def set_plans(llm: Any, plans: ReplayPlans) -> None:
    """Make ``plans`` the current cell's plans in every worker (outside any timed window)."""
    _rpc(llm, _w_set, pickle.dumps(plans))  # bytes: arrays do not survive vLLM's message encoding


def reset_timers(llm: Any) -> None:
    """Zero the hooks' host-time counters and adaptive verification's raised budgets (not the plan checks): the
    worker calls it after a cell's warm-up, so ``hook_s`` / ``vllm_s`` / ``av_raised_*`` cover the measured
    requests only."""
    _rpc(llm, _w_reset_timers)


def stats(llm: Any) -> dict[str, float]:
    """Counts since the last :func:`set_plans`: steps replayed, requests without a plan, steps off plan,
    n-gram proposals whose real length differed from the plan's; on the V1 runner also the wrapped calls
    (``hook_calls``), the host seconds they took (``hook_s``) and the part inside vLLM's own call
    (``vllm_s``)."""
    return _rpc(llm, _w_stats)[0]
