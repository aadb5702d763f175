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
        self._rows: dict[int, str] = {}  # n-gram buffer row -> request id whose tokens it holds
        self._tok: Optional[np.ndarray] = None
        # V2
        self._table = None
        self._slot_row = None
        self._slot_owner: dict[int, str] = {}
        self._host_calls: dict[str, int] = {}

    def set(self, plans: ReplayPlans) -> None:
        if plans.K != self.K:
            raise ValueError(f"plans for K={plans.K} on an engine with K={self.K}")
        self.plans = plans
        self.by_pos = {k: {int(p): (int(d), int(a)) for p, d, a in zip(*v)} for k, v in plans.plans.items()}
        self._rows.clear()
        self._host_calls.clear()
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

    # ---- V2 (asynchronous, GPU) ---------------------------------------------------------------------
    def _set_v2_table(self, plans: ReplayPlans) -> None:
        # deferred: torch takes seconds to import, and only this path needs it
        import torch

        keys = sorted(plans.plans)
        self._key_row = {k: i for i, k in enumerate(keys)}
        L = max((int(v[0].max()) + 1 for v in plans.plans.values() if len(v[0])), default=1) + 1
        table = np.zeros((len(keys) + 1, L), dtype=np.int32)  # last row: unknown requests accept nothing
        for k, (pos, _, acc) in plans.plans.items():
            table[self._key_row[k], pos] = acc
        dev = self.runner.device
        self._table = torch.as_tensor(table, device=dev)
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
        a = st._table[st._slot_row[idx], pos]
        k = out.shape[1]
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
    runner._sdlib_replay = st
    (_install_v2 if kind == "v2" else _install_v1)(runner, st)
    return kind


def _w_set(worker: Any, blob: bytes) -> None:
    _runner(worker)._sdlib_replay.set(pickle.loads(blob))


def _w_reset_timers(worker: Any) -> None:
    c = _runner(worker)._sdlib_replay.counts
    c.update({"hook_calls": 0, "hook_s": 0.0, "vllm_s": 0.0})


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
    """Zero the hooks' host-time counters (not the plan checks): the worker calls it after a cell's warm-up,
    so ``hook_s`` / ``vllm_s`` cover the measured requests only."""
    _rpc(llm, _w_reset_timers)


def stats(llm: Any) -> dict[str, float]:
    """Counts since the last :func:`set_plans`: steps replayed, requests without a plan, steps off plan,
    n-gram proposals whose real length differed from the plan's; on the V1 runner also the wrapped calls
    (``hook_calls``), the host seconds they took (``hook_s``) and the part inside vLLM's own call
    (``vllm_s``)."""
    return _rpc(llm, _w_stats)[0]
