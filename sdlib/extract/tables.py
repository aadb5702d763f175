"""Turn one cell's drive result and counters into the tidy tables of sdlib.store.schema.

Pure pandas (no vLLM), so it is tested on synthetic records.

Usage:
    from sdlib.extract.tables import build_tables
    tables = build_tables(cell, result, counters, sweep="s", started_at="...")
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any, Optional

import pandas as pd

from sdlib.extract.acceptance import AlignmentError, steps_from_gains
from sdlib.extract.ngram import NGRAM_MAX, NGRAM_MIN, ngram_trace
from sdlib.store.gpu_state import HELD_KEYS, SLOWDOWN_KEY, counter_growth
from sdlib.store.provenance import git_commit
from sdlib.store.schema import columns, conform

#: the code's commit, read once per process (a worker runs one engine group)
_commit = functools.lru_cache(maxsize=1)(git_commit)

log = logging.getLogger(__name__)


def _ngram_drafted_at(cell, r):
    """``position -> bool``: whether vLLM's n-gram proposer drafted at that output position.

    Recomputed exactly from the prompt and the output (:func:`sdlib.extract.ngram.ngram_trace`, which
    agrees with vLLM's per-step acceptance on every step checked); None if the ids are missing.
    """
    prompt = list(getattr(r, "prompt_token_ids", None) or [])
    out = list(getattr(r, "token_ids", None) or [])
    if not prompt or not out:
        return None
    spec = cell.method.speculative_config() or {}
    tr = ngram_trace(prompt, out, k=cell.method.k, nmin=int(spec.get("prompt_lookup_min", NGRAM_MIN)),
                     nmax=int(spec.get("prompt_lookup_max", NGRAM_MAX)), max_model_len=cell.model.max_model_len)
    drafted = tr.drafted
    return lambda p: 0 <= p < len(drafted) and drafted[p] > 0


def _custom_drafted_k_every_step(result, counters: dict[str, Any], k: int, run_id: str) -> bool:
    """Whether a user proposer (vLLM's ``custom_class``) drafted k tokens at every verify step, as the step
    tables would otherwise assume: vLLM's counters must say so (drafts = verify steps, draft tokens = k per
    draft). A proposer may draft less or nothing (``sdlib.vllm.proposers.ProposeNothing``); then ``drafted``
    is unknown rather than assumed."""
    n = sum(len(steps_from_gains(r.gains, None, k=k, drafter_always_proposes=True)) for r in result.requests)
    drafts, tokens = counters.get("num_drafts"), counters.get("num_draft_tokens")
    if drafts == n and tokens == k * n:
        return True
    log.warning("%s: vLLM counted %s drafts / %s draft tokens over %d verify steps (k=%d): drafted per step unknown",
                run_id, drafts, tokens, n, k)
    return False


def build_tables(cell, result, counters: dict[str, Any], sweep: str, started_at: str,
                 detailed_requested: bool, replay: Optional[dict[int, dict[int, int]]] = None,
                 gpu_start: Optional[dict[str, Any]] = None, gpu_end: Optional[dict[str, Any]] = None
                 ) -> dict[str, pd.DataFrame]:
    """``{"runs", "requests", "steps", "engine_steps"}`` DataFrames for one cell.

    ``replay`` (trace replay): per prompt index, output position -> tokens the engine verified there
    (:func:`sdlib.run.replay.drafted_per_step`); steps then come from the tokens gained per step
    (``accepted = gained - 1``) with ``drafted`` from the plan, and ``acceptance_source`` is ``replay``.

    ``gpu_start``, ``gpu_end``: the GPU's state just before and just after the measured requests
    (:func:`sdlib.store.gpu_state.gpu_state`); the ``gpu_*`` columns are unknown without them.
    """
    run_id = cell.run_id
    k = cell.method.k
    always = cell.method.spec.drafts_k
    if always is None:  # a user's proposer: k every step only where vLLM's counters confirm it
        always = replay is not None or not k or _custom_drafted_k_every_step(result, counters, k, run_id)
    # a confidence stop drafts 1..k tokens every verify step: how many comes from vLLM's per-step metrics
    # (without them, ``drafted`` is unknown rather than k); no n-gram steps to recompute
    cut = cell.method.confidence_stop is not None
    if cut:
        always = False
    req_rows, step_rows = [], []
    sched: dict[int, Any] = {}  # engine step -> tokens the target processed
    sources = set()
    for r in result.requests:
        if replay is not None:
            plan = replay.get(int(r.prompt_index), {})
            rows = steps_from_gains(r.gains, None, k=k, drafter_always_proposes=True) if k else []
            for row in rows:
                row["drafted"] = plan.get(int(row["position"]))
            sources.add("replay")
            _emit(run_id, r, rows, k, sched, step_rows)
            req_rows.append(_request_row(run_id, r, rows))
            continue
        detailed = r.detailed if detailed_requested else None
        drafted_at = _ngram_drafted_at(cell, r) if (detailed is not None and not always and not cut) else None
        try:
            try:
                rows = steps_from_gains(r.gains, detailed, k=k, drafter_always_proposes=always,
                                        drafted_at=drafted_at) if k else []
            except AlignmentError as err:
                if drafted_at is None:
                    raise
                log.warning("%s %s: n-gram steps recomputed offline do not fit vLLM's (%s); placing "
                            "zero-acceptance entries at the earliest fit", run_id, r.request_id, err)
                rows = steps_from_gains(r.gains, detailed, k=k, drafter_always_proposes=always)
            if k:
                sources.add("detailed" if detailed is not None else "delta")
        except AlignmentError as err:
            log.warning("%s %s: detailed metrics do not align (%s); using tokens gained", run_id, r.request_id, err)
            rows = steps_from_gains(r.gains, None, k=k, drafter_always_proposes=always)
            sources.add("delta")
        _emit(run_id, r, rows, k, sched, step_rows)
        req_rows.append(_request_row(run_id, r, rows))
    eng_rows = [{"run_id": run_id, **vars(s), "num_scheduled_tokens": sched.get(s.engine_step, 0)}
                for s in result.steps]
    out_tokens = sum(len(r.token_ids) for r in result.requests)
    conc_mean, conc_max = concurrency(result.steps)
    runs = pd.DataFrame([{
        "run_id": run_id,
        "sweep": sweep,
        "model": cell.model.name,
        "method": cell.method.name,
        "method_label": cell.method.label,
        "num_spec_tokens": k,
        "dataset": cell.workload.label,
        "batch_size": cell.batch_size,
        "batch_mode": cell.batch_mode,
        "repeat": cell.repeat,
        "engine_start": cell.start,
        "num_requests": len(result.requests),
        "output_tokens": out_tokens,
        "wall_s": result.wall_s,
        "window_s": result.window_s,
        "window_output_tokens": result.window_output_tokens,
        "tok_per_s": result.tok_per_s,
        "tok_per_s_total": out_tokens / result.wall_s if result.wall_s > 0 else float("nan"),
        "num_engine_steps": len(result.steps),
        "concurrency_mean": conc_mean,
        "concurrency_max": conc_max,
        "counter_num_drafts": counters["num_drafts"],
        "counter_num_draft_tokens": counters["num_draft_tokens"],
        "counter_num_accepted_tokens": counters["num_accepted_tokens"],
        "counter_accepted_per_pos": json.dumps(counters["accepted_per_pos"]),
        "acceptance_source": "none" if not k else ("+".join(sorted(sources)) or "none"),
        "status": "ok",
        "started_at": started_at,
        "git_commit": _commit(),
        **gpu_columns(gpu_start, gpu_end),
    }])
    steps = pd.DataFrame(step_rows, columns=columns("steps"))
    return {
        "runs": conform("runs", runs),
        "requests": conform("requests", pd.DataFrame(req_rows, columns=_cols("requests"))),
        "steps": conform("steps", steps),
        "engine_steps": conform("engine_steps", pd.DataFrame(eng_rows, columns=_cols("engine_steps"))),
    }


def gpu_columns(start: Optional[dict[str, Any]], end: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The ``runs`` row's ``gpu_*`` columns from two :func:`sdlib.store.gpu_state.sample` readings (NaN / None
    for a sample not taken or a value not known): the state at either end, and the clock-event counters' growth
    between them, summed (``gpu_slowdown_ms``) and reason by reason (``gpu_<key>`` for each key of
    :data:`sdlib.store.gpu_state.HELD_KEYS`: ``gpu_held_sw_power_cap_ms``, ...)."""
    start, end = start or {}, end or {}

    def num(d: dict[str, Any], key: str) -> float:
        x = d.get(key)
        return float("nan") if x is None else float(x)

    return {
        "gpu_sm_mhz_start": num(start, "sm_mhz"),
        "gpu_sm_mhz_end": num(end, "sm_mhz"),
        "gpu_mem_mhz_end": num(end, "mem_mhz"),
        "gpu_temp_c_end": num(end, "temp_c"),
        "gpu_power_w_end": num(end, "power_w"),
        "gpu_clock_events_end": end.get("clock_events") or None,
        "gpu_slowdown_ms": _held_down_ms(start, end),
        **{f"gpu_{key}": _held_down_ms(start, end, key) for key in HELD_KEYS},
        "gpu_power_limit_w_end": num(end, "power_limit_w"),
    }


def _held_down_ms(start: dict[str, Any], end: dict[str, Any], key: str = SLOWDOWN_KEY) -> float:
    """The clock-event counters' growth between the two samples (:func:`sdlib.store.gpu_state.sample`'s
    ``slowdown_ms``, their sum, or one reason's counter, ``key``); NaN when either is unknown or the counter went
    back (a driver reload): :func:`sdlib.store.gpu_state.counter_growth`."""
    return counter_growth(start, end, key)


def concurrency(steps) -> tuple[float, Optional[int]]:
    """Measured concurrency of a cell: (mean, max) requests that produced output per engine step of the steady
    window (``engine_steps.num_running``); (NaN, None) without steps."""
    win = [s.num_running for s in steps if s.in_window] or [s.num_running for s in steps]
    return (sum(win) / len(win), max(win)) if win else (float("nan"), None)


class ConcurrencyShortfall(RuntimeError):
    """The engine never ran a cell's batch size at once: the cell would measure a smaller batch under its label."""


def check_concurrency(cell, runs: pd.DataFrame) -> None:
    """:class:`ConcurrencyShortfall` when no engine step of the cell's window ran ``batch_size`` requests (an
    engine setting or the KV cache capped the batch below B): not a bs-B measurement."""
    mx = runs["concurrency_max"].iloc[0]
    if pd.isna(mx) or int(mx) >= cell.batch_size:
        return
    raise ConcurrencyShortfall(
        f"measured concurrency {runs['concurrency_mean'].iloc[0]:.2f} (at most {int(mx)} requests per engine step) "
        f"is below batch size {cell.batch_size}: the engine capped the batch (max_num_seqs, max_num_batched_tokens "
        "or a KV cache too small for the batch); not recorded as a bs "
        f"{cell.batch_size} cell")


def _emit(run_id: str, r, rows: list[dict], k: int, sched: dict, step_rows: list) -> None:
    """Append a request's step rows; add the tokens the target processed to each engine step it ran in."""
    # prefill: the whole prompt is processed in the step that produced the first token
    if r.gain_steps and sched.get(r.gain_steps[0], 0) is not None:
        sched[r.gain_steps[0]] = sched.get(r.gain_steps[0], 0) + r.prompt_tokens
    for row in rows:
        es = r.gain_steps[row["step"] + 1] if row["step"] + 1 < len(r.gain_steps) else None
        step_rows.append({"run_id": run_id, "request_id": r.request_id, "engine_step": es, **row})
        if es is not None:
            if row["drafted"] is None or sched.get(es, 0) is None:
                sched[es] = None
            else:
                sched[es] = sched.get(es, 0) + 1 + row["drafted"]
    if not k:  # no SD: every decode step processes one token per request
        for es in r.gain_steps[1:]:
            if sched.get(es, 0) is not None:
                sched[es] = sched.get(es, 0) + 1


def _request_row(run_id: str, r, rows: list[dict]) -> dict[str, Any]:
    drafted = [row["drafted"] for row in rows]
    return {
        "run_id": run_id,
        "request_id": r.request_id,
        "prompt_index": r.prompt_index,
        "batch_index": r.batch_index,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": len(r.token_ids),
        "finish_reason": r.finish_reason,
        "arrival_s": r.arrival_s,
        "first_token_s": r.first_token_s,
        "finish_s": r.finish_s,
        "latency_s": (r.finish_s - r.arrival_s) if r.finish_s is not None else None,
        "ttft_s": (r.first_token_s - r.arrival_s) if r.first_token_s is not None else None,
        "num_steps": len(rows),
        "num_drafted": None if any(d is None for d in drafted) else sum(drafted),
        "num_accepted": sum(row["accepted"] for row in rows),
        "prompt_token_ids": json.dumps(r.prompt_token_ids),
        "output_token_ids": json.dumps(r.token_ids),
    }


def _cols(table: str) -> list[str]:
    return columns(table)


def phases_frame(run_id: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One cell's timer rows (:meth:`sdlib.vllm.phase_hooks.PhaseTimers.collect`) as a typed ``step_phases`` frame."""
    df = pd.DataFrame(rows, columns=columns("step_phases")[1:])
    df.insert(0, "run_id", run_id)
    return conform("step_phases", df)
