"""SpecDec++'s confidence stop on vLLM's own EAGLE-3 drafter (``options: {confidence_stop: h}``), measured for
real on vLLM's V1 runner (the 0.32 CPU build).

The head drafts as vLLM does: K greedy steps of ``EagleProposer.propose``
(``vllm/v1/spec_decode/llm_base_proposer.py`` 512-774), each step's token ``compute_logits(h).argmax(-1)``
(``_greedy_sample``, lines 438-448). The hook records each step's top-1 softmax probability ``p_j`` of the same
logits (the token is vLLM's argmax, unchanged), and cuts each row's draft list after the first ``j`` with
``1 - p_1 ... p_j > h`` (:func:`confidence_lengths`: the simulator's SpecDec++ rule,
:func:`sdlib.sim.policy.stopping.specdecpp_lengths`, with ``a_j = p_j`` raw, uncalibrated). A row keeps at
least one draft (the rule stops *after* the draft that crosses h, as SpecDec++ verifies the candidate it
stopped on) and at most K; ``h = 1`` never stops (the hook-on, fixed-k control).

What it saves: verification only. The drafting loop still runs all K head steps for every row (the cut is
made on the K drafts afterwards), so the draft phase costs what fixed-k EAGLE-3 costs, plus one softmax per
head step.

How the ragged lists reach the engine (read in vLLM 0.32.0's source, CPU build):

* ``GPUModelRunner.propose_draft_token_ids`` (``vllm/v1/worker/gpu_model_runner.py`` 4748-5025) is wrapped on
  the runner instance: it returns the ``[B, K]`` draft tensor; the wrapper returns ``list[list[int]]`` instead,
  as the n-gram proposer does. ``_copy_draft_token_ids_to_cpu`` (4633-4668) and ``_get_draft_token_ids_cpu``
  (4670-4683) pass a list through unchanged, and the engine core hands it to
  ``Scheduler.update_draft_token_ids`` (``vllm/v1/engine/core.py`` 689-696, ``vllm/v1/core/sched/scheduler.py``
  2550-2569), which stores each request's list as it is.
* The next step verifies what each row drafted: ``num_draft_tokens`` per row comes from the scheduled lists
  (``gpu_model_runner.py`` 2198-2208), and the EAGLE input preparation for that step counts rejections per row
  from them, not from K (``vllm/v1/spec_decode/utils.py`` 209-220: ``num_rejected = num_draft_tokens + 1 -
  valid_count``, 0 for a row with no drafts; the CPU build runs the same rule in C++,
  ``vllm/platforms/cpu.py`` 693-695). ``propose`` itself is called with K every step and drafts K for every row.
* The CPU build forces synchronous scheduling (``vllm/platforms/cpu.py`` 330-331), so the asynchronous
  paths that keep drafts on the device (``_prepare_input_ids``, ``gpu_model_runner.py`` 1736-1870; 3455-3457) do not run.

The hooks are installed through ``llm.collective_rpc`` (module-level functions, pickled by reference; the
multi-process engine needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). With no threshold set (a fixed-k cell on
the same engine) both wrappers pass vLLM's own calls through.

Usage (the sweep worker does this for methods with ``options.confidence_stop``):
    install(llm); set_threshold(llm, 0.5); ... drive the engine ...; stats(llm)
    -> {"rows": ..., "drafted": ..., "proposed": ..., "kept": {"1": ..., ...}}
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from sdlib.sim.policy.stopping import specdecpp_lengths


def confidence_lengths(p: np.ndarray, h: float) -> np.ndarray:
    """Drafts each row keeps: the first ``j`` (1-based) with ``1 - p_1 ... p_j > h``, else all ``K``
    (``p``: (rows, K) top-1 probabilities of the drafts). ``h >= 1`` never stops."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"confidences: want (rows, K), got shape {p.shape}")
    if h >= 1.0 or p.shape[1] == 0:
        return np.full(p.shape[0], p.shape[1], dtype=np.int64)
    return specdecpp_lengths(p, h)


def truncate(drafts: list[list[int]], lengths) -> list[list[int]]:
    """Each row's drafts cut to its length."""
    return [list(d[: int(n)]) for d, n in zip(drafts, lengths)]


class _State:
    """The hook's threshold and counts, attached to the model runner."""

    def __init__(self):
        self.h: Optional[float] = None
        self.probs: list = []
        self.reset()

    def reset(self) -> None:
        self.counts: dict[str, Any] = {"calls": 0, "rows": 0, "drafted": 0, "proposed": 0, "unmatched": 0,
                                       "hook_s": 0.0, "kept": {}}


def _install_v1(runner: Any, st: _State) -> None:
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

    drafter = getattr(runner, "drafter", None)
    if type(drafter).__name__ != "EagleProposer":
        raise RuntimeError(f"confidence_stop: needs vLLM's EagleProposer, the runner has {type(drafter).__name__}")
    if getattr(drafter, "use_local_argmax_reduction", False) or getattr(drafter, "use_heterogeneous_vocab", False):
        raise RuntimeError("confidence_stop: the drafter samples through local argmax or a mapped vocabulary; "
                           "its top-1 probability is not read here")
    orig_sample = drafter._greedy_sample
    orig_propose = runner.propose_draft_token_ids

    def greedy_sample(hidden_states):
        if st.h is None:
            return orig_sample(hidden_states)
        logits = drafter.model.compute_logits(hidden_states)  # what vLLM's _greedy_sample computes
        st.probs.append(torch.softmax(logits.float(), dim=-1).amax(dim=-1))
        return logits.argmax(dim=-1)

    def propose_draft_token_ids(*args, **kwargs):
        st.probs = []
        out = orig_propose(*args, **kwargs)
        if st.h is None or not torch.is_tensor(out) or out.ndim != 2 or out.shape[1] == 0:
            return out
        t0 = time.perf_counter()
        c = st.counts
        c["calls"] += 1
        if len(st.probs) != out.shape[1]:  # a path that did not sample through _greedy_sample: left as it is
            c["unmatched"] += 1
            return out
        p = torch.stack(st.probs, dim=1)[: out.shape[0]].cpu().numpy()
        n = confidence_lengths(p, st.h)
        rows = truncate(out.tolist(), n)
        c["rows"] += len(rows)
        c["drafted"] += int(n.sum())
        c["proposed"] += int(out.shape[0] * out.shape[1])
        for v in n.tolist():
            c["kept"][str(v)] = c["kept"].get(str(v), 0) + 1
        c["hook_s"] += time.perf_counter() - t0
        return rows

    drafter._greedy_sample = greedy_sample
    runner.propose_draft_token_ids = propose_draft_token_ids


# --------------------------------------------------------------------------- run in the worker
def _w_install(worker: Any) -> str:
    runner = worker.model_runner
    if hasattr(runner, "req_states") and hasattr(runner, "speculator"):
        raise RuntimeError("confidence_stop: needs vLLM's V1 runner (ragged drafts); this is the V2 runner, where "
                           "every row verifies K")
    sc = getattr(getattr(runner, "vllm_config", None), "scheduler_config", None)
    if getattr(sc, "async_scheduling", False):
        raise RuntimeError("confidence_stop: V1 runner with async scheduling: drafts stay on the device; not supported")
    st = _State()
    runner._sdlib_confidence_stop = st
    _install_v1(runner, st)
    return type(runner.drafter).__name__


def _w_set(worker: Any, h: Optional[float]) -> None:
    st = worker.model_runner._sdlib_confidence_stop
    st.h = None if h is None else float(h)
    st.reset()


def _w_reset(worker: Any) -> None:
    worker.model_runner._sdlib_confidence_stop.reset()


def _w_stats(worker: Any) -> dict[str, Any]:
    st = worker.model_runner._sdlib_confidence_stop
    return {"h": st.h, **st.counts, "kept": dict(st.counts["kept"])}


def _rpc(llm: Any, fn, *args) -> list:
    return llm.collective_rpc(fn, args=args)


def install(llm: Any) -> str:
    """Install the hooks in every worker (inactive until :func:`set_threshold`); returns the drafter's class."""
    return _rpc(llm, _w_install)[0]


def set_threshold(llm: Any, h: Optional[float]) -> None:
    """Make ``h`` the threshold of the next requests (None: vLLM's fixed k, passed through); zeroes the counts."""
    _rpc(llm, _w_set, h)


def reset(llm: Any) -> None:
    """Zero the counts (after a cell's warm-up, so they cover the measured requests only)."""
    _rpc(llm, _w_reset)


def stats(llm: Any) -> dict[str, Any]:
    """Counts since the last reset: wrapped calls with a threshold set (``calls``), draft rows cut (``rows``),
    drafts kept (``drafted``) of those the head made (``proposed`` = rows x K), calls whose confidences did not
    match the drafts (``unmatched``: left uncut), host seconds in the cut (``hook_s``), rows by drafts kept."""
    return _rpc(llm, _w_stats)[0]
