"""The tidy tables a sweep writes: names, columns, dtypes and meanings (one source of truth).

``data/README.md`` documents the same tables (``sdlib schema`` prints them); ``tests/test_storage_tables.py``
checks they agree.

Usage:
    from sdlib.store.schema import TABLES, conform
    df = conform("runs", df)   # column order and dtypes as below; missing columns -> error
"""

from __future__ import annotations

import pandas as pd

#: Phases of the ``step_phases`` table, as the timers of :mod:`sdlib.vllm.phase_hooks` name them.
STEP_PHASES = ("draft", "verify", "sample", "step")
#: Values of ``step_phases.timer``: GPU stream time between CUDA events, or CPU wall time.
TIMERS = ("cuda_event", "perf_counter")

# table -> list of (column, pandas dtype, meaning with unit)
TABLES: dict[str, list[tuple[str, str, str]]] = {
    "runs": [
        ("run_id", "string", "unique id of the cell: model, method, dataset, batch size, repeat, config hash"),
        ("sweep", "string", "sweep name"),
        ("model", "string", "target model name"),
        ("method", "string", "SD method: none, ngram, eagle, eagle3, draft_model, mtp"),
        ("method_label", "string", "method with its k, e.g. ngram-k3"),
        ("num_spec_tokens", "Int64", "k, tokens proposed per step (0 without SD)"),
        ("dataset", "string", "workload name"),
        ("batch_size", "Int64", "B: requests in flight (closed_loop) or copies of one prompt (paper)"),
        ("batch_mode", "string", "closed_loop or paper"),
        ("repeat", "Int64", "repeat index, 0-based"),
        ("engine_start", "Int64", "which start of the cell's engine ran it, 0-based (sweep engine_starts; 0 in tables written before it)"),
        ("num_requests", "Int64", "requests measured (warm-up excluded)"),
        ("output_tokens", "Int64", "output tokens of the measured requests"),
        ("wall_s", "float64", "wall time from first admission to last completion, s"),
        ("window_s", "float64", "steady window length, s (closed_loop: B in flight; paper: sum of batch durations)"),
        ("window_output_tokens", "Int64", "output tokens produced inside the steady window"),
        ("tok_per_s", "float64", "output tokens/s over the steady window (paper mode: mean over batches)"),
        ("tok_per_s_total", "float64", "output_tokens / wall_s"),
        ("num_engine_steps", "Int64", "engine steps taken for the measured requests"),
        ("concurrency_mean", "float64", "measured concurrency: mean requests that produced output per engine step in the steady window (engine_steps.num_running; null in cells written before it was recorded)"),
        ("concurrency_max", "Int64", "most requests that produced output in one engine step of the window; below batch_size the engine never ran the batch (the cell is a failure, not a number)"),
        ("counter_num_drafts", "Int64", "vLLM vllm:spec_decode_num_drafts, differenced over the cell"),
        ("counter_num_draft_tokens", "Int64", "vLLM vllm:spec_decode_num_draft_tokens, differenced"),
        ("counter_num_accepted_tokens", "Int64", "vLLM vllm:spec_decode_num_accepted_tokens, differenced"),
        ("counter_accepted_per_pos", "string", "vLLM ..._num_accepted_tokens_per_pos, differenced, JSON list"),
        ("acceptance_source", "string", "where steps came from: detailed (vLLM per-request metrics), delta, or replay (trace replay: tokens gained, drafts from the plan)"),
        ("status", "string", "ok"),
        ("started_at", "string", "UTC ISO time the cell started"),
        ("git_commit", "string", "commit of the code that ran the cell, '-dirty' when the tree had changes (null in cells written before it was recorded)"),
        ("gpu_sm_mhz_start", "float64", "GPU SM clock just before the measured requests (after the warm-up, the card "
         "idle), MHz (nvidia-smi clocks.sm, "
         "sdlib.store.gpu_state; NaN without nvidia-smi, e.g. on CPU, and in cells written before it was recorded)"),
        ("gpu_sm_mhz_end", "float64", "GPU SM clock just after the measured requests (the card may be idling "
         "already), MHz (same)"),
        ("gpu_mem_mhz_end", "float64", "GPU memory clock just after the measured requests, MHz (nvidia-smi clocks.mem; "
         "same)"),
        ("gpu_temp_c_end", "float64", "GPU temperature just after the measured requests, degrees C (nvidia-smi "
         "temperature.gpu; same)"),
        ("gpu_power_w_end", "float64", "GPU power draw just after the measured requests, W (nvidia-smi power.draw; "
         "same)"),
        ("gpu_clock_events_end", "string", "clock-event (throttle) reasons active just after the measured requests, "
         "nvidia-smi's hex bitmask, e.g. 0x0000000000000004 = SW power cap (sdlib.store.gpu_state.clock_event_names); "
         "null without nvidia-smi and in cells written before it was recorded"),
        ("gpu_slowdown_ms", "float64", "ms the GPU's clocks were held down for power or thermal reasons between the "
         "two samples, i.e. over the measured requests: nvidia-smi's clocks_event_reasons_counters (SW power cap, "
         "SW and HW thermal, HW power brake) summed, differenced (sdlib.store.gpu_state.slowdown_ms); a moment when "
         "two reasons held counts for each, so it can exceed the window; NaN without nvidia-smi, on drivers without "
         "the counters, and in cells written before it was recorded"),
        ("gpu_held_sw_power_cap_ms", "float64", "ms the GPU's clocks were held down by the SW power cap (the power "
         "draw held under the power limit) between the two samples: nvidia-smi "
         "clocks_event_reasons_counters.sw_power_cap, differenced (sdlib.store.gpu_state.counters_ms; one of the "
         "four counters gpu_slowdown_ms sums); NaN without nvidia-smi, on drivers without the counters, when the "
         "counter went back "
         "(a driver reload), and in cells written before it was recorded"),
        ("gpu_held_sw_thermal_ms", "float64", "ms the GPU's clocks were held down by the SW thermal slowdown between "
         "the two samples: nvidia-smi clocks_event_reasons_counters.sw_thermal_slowdown, differenced (same)"),
        ("gpu_held_hw_thermal_ms", "float64", "ms the GPU's clocks were held down by the HW thermal slowdown between "
         "the two samples: nvidia-smi clocks_event_reasons_counters.hw_thermal_slowdown, differenced (same)"),
        ("gpu_held_hw_power_brake_ms", "float64", "ms the GPU's clocks were held down by the HW power brake (an "
         "external power-brake signal) between the two samples: nvidia-smi "
         "clocks_event_reasons_counters.hw_power_brake_slowdown, differenced (same)"),
        ("gpu_power_limit_w_end", "float64", "GPU software power limit just after the measured requests, "
         "W (nvidia-smi power.limit; the limit enforced, the lowest of all limiters, is enforced.power.limit, not "
         "recorded; sdlib.store.gpu_state; NaN without nvidia-smi, where the card reports [N/A], "
         "and in cells written before it was recorded)"),
    ],
    "requests": [
        ("run_id", "string", "cell id (runs.run_id)"),
        ("request_id", "string", "request id inside the cell"),
        ("prompt_index", "Int64", "index of the prompt in the workload sample"),
        ("batch_index", "Int64", "paper mode: which batch (prompt); closed_loop: admission order"),
        ("prompt_tokens", "Int64", "prompt length, tokens"),
        ("output_tokens", "Int64", "output length, tokens"),
        ("finish_reason", "string", "stop or length"),
        ("arrival_s", "float64", "admission time since the cell's start, s"),
        ("first_token_s", "float64", "time of the first output token since the cell's start, s"),
        ("finish_s", "float64", "completion time since the cell's start, s"),
        ("latency_s", "float64", "finish - arrival, s"),
        ("ttft_s", "float64", "time to first token, s"),
        ("num_steps", "Int64", "verify steps (decode steps after the prefill)"),
        ("num_drafted", "Int64", "tokens drafted over the request (null if unknown)"),
        ("num_accepted", "Int64", "tokens accepted over the request"),
        ("prompt_token_ids", "string", "the prompt as sent, JSON list of token ids"),
        ("output_token_ids", "string", "the output, JSON list of token ids"),
    ],
    "steps": [
        ("run_id", "string", "cell id"),
        ("request_id", "string", "request id"),
        ("step", "Int64", "verify step index within the request, 0-based (prefill not counted)"),
        ("engine_step", "Int64", "engine step of the cell in which this verify step ran (engine_steps.engine_step)"),
        ("position", "Int64", "output tokens the request had when the step started"),
        ("drafted", "Int64", "tokens drafted for this step (null if the source cannot tell)"),
        ("accepted", "Int64", "draft tokens accepted in this step"),
    ],
    "engine_steps": [
        ("run_id", "string", "cell id"),
        ("engine_step", "Int64", "engine step index within the cell"),
        ("start_s", "float64", "step start since the cell's start, s"),
        ("duration_s", "float64", "wall time of LLMEngine.step(), s"),
        ("num_running", "Int64", "requests that produced output in this step"),
        ("num_new_tokens", "Int64", "output tokens produced in this step, all requests"),
        ("num_context_tokens", "Int64", "prompt + output tokens held by the running requests at step start"),
        ("num_scheduled_tokens", "Int64", "tokens the target processed: prompts prefilled + (1 + drafted) per verify (null if drafted unknown)"),
        ("in_window", "boolean", "step lies inside the steady window"),
    ],
    "step_phases": [
        ("run_id", "string", "cell id (runs.run_id)"),
        ("phase", "string", "draft, verify, sample or step (sdlib.vllm.phase_hooks); other = step - draft - verify - sample"),
        ("calls", "Int64", "timed calls (step: execute_model calls)"),
        ("total_s", "float64", "time inside the phase over the measured requests, s; NaN if not hooked"),
        ("timer", "string", "cuda_event (GPU stream time) or perf_counter (CPU wall time)"),
    ],
}

#: Percentiles every serving cell's summary carries (``serve_runs``: ``<metric>_p<q>_s``).
SERVE_PERCENTILES = (50, 90, 99)
#: Latency metrics summarised per serving cell: per-request (ttft, tpot, e2e) and per-token (itl) or per
#: message (msg_itl, vLLM bench's ITL) gaps; definitions in sdlib.analysis.serving.
SERVE_METRICS = ("ttft", "itl", "msg_itl", "tpot", "e2e")

# The serving sweep's tables (sdlib.serve; data/serving/<name>/). One file per (cell, server share).
TABLES.update({
    "serve_runs": [
        ("run_id", "string", "cell id: model, method or fleet, rate, repeat, config hash"),
        ("serving", "string", "serving sweep name"),
        ("model", "string", "target model name"),
        ("kind", "string", "method (one server) or fleet (one server per entry of backends, a routing rule)"),
        ("label", "string", "method label (e.g. eagle3-k3) or fleet name"),
        ("backends", "string", "method label of each server, JSON list (index = server)"),
        ("num_servers", "Int64", "servers in the cell (the hardware: one server = one device or machine share)"),
        ("rule", "string", "routing rule: single, round_robin, random, task, overlap"),
        ("execution", "string", "sequential (one server at a time, each replaying its share) or concurrent"),
        ("rate_rps", "float64", "requested arrival rate into the cell, requests/s"),
        ("burstiness", "float64", "gamma shape of the gaps (1 = Poisson)"),
        ("repeat", "Int64", "repeat index, 0-based"),
        ("seed", "Int64", "arrival and mix seed (the same for every method and fleet at this rate and repeat)"),
        ("num_requests", "Int64", "requests sent (warm-up excluded)"),
        ("completed", "Int64", "requests that streamed to the end without error"),
        ("failed", "Int64", "requests with an error (serve_requests.error)"),
        ("scheduled_rate_rps", "float64", "realised rate of the scheduled arrivals: (n - 1) / (last - first)"),
        ("sent_rate_rps", "float64", "realised rate of the sends the client made, same formula"),
        ("send_lag_p99_s", "float64", "99th percentile of send - scheduled arrival, s (client lag)"),
        ("duration_s", "float64", "first scheduled arrival to last token, s (stream time)"),
        ("request_throughput_rps", "float64", "completed / duration_s"),
        ("output_tokens", "Int64", "output tokens of completed requests (usage.completion_tokens)"),
        ("output_tok_per_s", "float64", "output_tokens / duration_s"),
        *[(f"{m}_p{q}_s", "float64", f"{q}th percentile of {m} over completed requests, s (sdlib.analysis.serving)")
          for m in SERVE_METRICS for q in SERVE_PERCENTILES],
        ("counter_num_drafts", "Int64", "vllm:spec_decode_num_drafts from /metrics, differenced, summed over servers"),
        ("counter_num_draft_tokens", "Int64", "vllm:spec_decode_num_draft_tokens, same"),
        ("counter_num_accepted_tokens", "Int64", "vllm:spec_decode_num_accepted_tokens, same"),
        ("client_cpu_s", "float64", "CPU time of the client process during the cell, s (with one full garbage collection before the first send)"),
        ("status", "string", "ok (no request failed) or errors"),
        ("started_at", "string", "UTC ISO time the cell started"),
    ],
    "serve_requests": [
        ("run_id", "string", "cell id (serve_runs.run_id)"),
        ("request_id", "string", "request id inside the cell (the same request in every cell of one rate and repeat)"),
        ("server", "Int64", "index of the server it was routed to (serve_runs.backends)"),
        ("backend", "string", "method label of that server"),
        ("task", "string", "task of the mix (e.g. chat, reasoning, code_edit)"),
        ("dataset", "string", "workload the prompt came from"),
        ("prompt_index", "Int64", "index of the prompt in the task's prompt pool"),
        ("overlap_score", "float64", "prompt-overlap score at admission (sdlib.serve.router.prompt_overlap_score)"),
        ("arrival_s", "float64", "scheduled arrival since the cell's start, s"),
        ("send_s", "float64", "when the client sent it, since the cell's start, s"),
        ("first_token_s", "float64", "first message carrying a token, since the cell's start, s"),
        ("finish_s", "float64", "last message carrying a token, since the cell's start, s"),
        ("ttft_s", "float64", "first_token_s - send_s, s"),
        ("e2e_s", "float64", "finish_s - send_s, s"),
        ("tpot_s", "float64", "(e2e_s - ttft_s) / (output_tokens - 1), s (= mean per-token ITL)"),
        ("prompt_tokens", "Int64", "usage.prompt_tokens"),
        ("output_tokens", "Int64", "usage.completion_tokens"),
        ("max_tokens", "Int64", "the request's max_tokens"),
        ("num_messages", "Int64", "stream messages that carried tokens (serve_chunks rows)"),
        ("finish_reason", "string", "length or stop"),
        ("server_queue_s", "float64", "server's queue time (per-request metrics), s; null if not reported"),
        ("num_drafts", "Int64", "verify steps that drafted (server per-request metrics; null if not reported)"),
        ("num_draft_tokens", "Int64", "tokens drafted for the request (same)"),
        ("num_accepted_tokens", "Int64", "draft tokens accepted (same)"),
        ("error", "string", "why the request failed (null if it did not)"),
    ],
    "serve_chunks": [
        ("run_id", "string", "cell id"),
        ("request_id", "string", "request id"),
        ("message", "Int64", "index of the token-bearing stream message within the request, 0-based"),
        ("t_s", "float64", "arrival of the message since the request was sent, s (message 0: the TTFT)"),
        ("num_tokens", "Int64", "tokens in the message (one engine step: 1 + accepted under SD)"),
    ],
    "serve_counters": [
        ("run_id", "string", "cell id"),
        ("server", "Int64", "server index"),
        ("backend", "string", "method label of the server"),
        ("num_requests", "Int64", "requests this server got in the cell"),
        ("span_s", "float64", "first send to last token of this server's requests, s"),
        ("num_drafts", "Int64", "vllm:spec_decode_num_drafts, /metrics after - before this server's share"),
        ("num_draft_tokens", "Int64", "vllm:spec_decode_num_draft_tokens, differenced"),
        ("num_accepted_tokens", "Int64", "vllm:spec_decode_num_accepted_tokens, differenced"),
        ("accepted_per_pos", "string", "vllm:spec_decode_num_accepted_tokens_per_pos, differenced, JSON list"),
        ("generation_tokens", "Int64", "vllm:generation_tokens, differenced"),
        ("prompt_tokens", "Int64", "vllm:prompt_tokens, differenced"),
        ("num_preemptions", "Int64", "vllm:num_preemptions, differenced"),
        ("client_cpu_s", "float64", "CPU time of the client process while it sent this share, s"),
        ("started_at", "string", "UTC ISO time this server's share started"),
    ],
})


#: Columns added after tables were committed, with what a file written before them means: null (unknown) unless a
#: value is given here. The committed files are never rewritten to add them.
ADDED_COLUMNS: dict[str, dict[str, object]] = {
    "runs": {"concurrency_mean": None, "concurrency_max": None, "engine_start": 0, "git_commit": None,
             "gpu_sm_mhz_start": None, "gpu_sm_mhz_end": None, "gpu_mem_mhz_end": None, "gpu_temp_c_end": None,
             "gpu_power_w_end": None, "gpu_clock_events_end": None, "gpu_slowdown_ms": None,
             "gpu_held_sw_power_cap_ms": None, "gpu_held_sw_thermal_ms": None, "gpu_held_hw_thermal_ms": None,
             "gpu_held_hw_power_brake_ms": None, "gpu_power_limit_w_end": None},
}


def columns(table: str) -> list[str]:
    """Column names of ``table`` in order."""
    return [c for c, _, _ in TABLES[table]]


def conform(table: str, df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with the table's columns, order and dtypes; raise on missing columns (those of
    :data:`ADDED_COLUMNS` take their documented value: unknown, or e.g. engine start 0, in older files)."""
    added = {c: v for c, v in ADDED_COLUMNS.get(table, {}).items() if c not in df.columns}
    if added:
        df = df.assign(**added)
    missing = [c for c in columns(table) if c not in df.columns]
    if missing:
        raise KeyError(f"{table}: missing columns {missing}")
    out = df[columns(table)].copy()
    for c, dtype, _ in TABLES[table]:
        out[c] = out[c].astype(dtype)
    return out.reset_index(drop=True)


def markdown(table: str) -> str:
    """The table's columns as a Markdown table (used to write data/README.md)."""
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{c}` | {t} | {m} |" for c, t, m in TABLES[table]]
    return "\n".join(lines)


def readme_markdown() -> str:
    """Every table as Markdown (``sdlib schema`` prints it for data/README.md)."""
    return "\n".join(f"### `{name}`\n\n{markdown(name)}\n" for name in TABLES)
