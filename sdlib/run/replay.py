"""Trace replay in a sweep cell: the plans a cell's requests follow, and the check that they were followed.

The worker (:mod:`sdlib.run.worker`) calls :func:`cell_plans` before a replay cell (its requests carry
``replay_key`` = their prompt index), sends the plans to the engine (:func:`sdlib.vllm.replay.set_plans`),
drives the cell, then :func:`check_cell` compares every request's tokens gained per step with its plan and
the cell's vLLM counters with the plans' sums. The result is written beside the cell's tables
(``replay/<run_id>.json``).

Usage:
    plans, by_index = cell_plans(cell, prompts, trace_table)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import pandas as pd

from sdlib.extract.ngram import NGRAM_MAX, NGRAM_MIN
from sdlib.sim.prepared import prepare_traces
from sdlib.core.registry import replay_ref
from sdlib.sim.replay import RequestPlan, replay_plans
from sdlib.sim.prepared import truncate_traces
from sdlib.vllm.replay import ReplayPlans


def cell_plans(cell, prompts: list, table: pd.DataFrame) -> tuple[ReplayPlans, dict[int, RequestPlan]]:
    """Plans for the cell's prompts (keyed by prompt index) from the workload's long-form traces."""
    method, K = cell.method, cell.method.num_spec_tokens
    want = {str(p.source_id): p for p in prompts}
    rows = table[table["request_id"].astype(str).isin(want)]
    prep = prepare_traces(rows, ngram_lookup=True, keep_tokens=True)
    prep = truncate_traces(prep, cell.workload.max_output_tokens)
    plans = replay_plans(prep, method.name, method.replay, K, batch_size=cell.batch_size, workload=cell.workload)
    by_index: dict[int, RequestPlan] = {}
    tokens, prompt_len = {}, {}
    for i, rid in enumerate(prep.request_id):
        p = want[str(rid)]
        if int(prep.output_len[i]) != int(p.max_output_tokens):
            raise ValueError(f"request {rid}: plan covers {prep.output_len[i]} tokens, prompt asks "
                             f"{p.max_output_tokens} (workload needs full_traces: true)")
        by_index[p.index] = plans[i]
        tokens[p.index] = np.asarray(list(prep.prompt_token_ids[i]) + list(prep.output_token_ids[i]), np.int32)
        prompt_len[p.index] = len(prep.prompt_token_ids[i])
    missing = [p.source_id for p in prompts if p.index not in by_index]
    if missing:
        raise ValueError(f"no traces for requests {missing[:5]}")
    spec = method.speculative_config() or {}
    lookup = (int(spec.get("prompt_lookup_min", NGRAM_MIN)), int(spec.get("prompt_lookup_max", NGRAM_MAX)))
    ref = replay_ref(method.replay, method.name, K)
    ngram = lookup if (method.spec.trace == "ngram" or ref.spec.mixes_drafters) else None
    rp = ReplayPlans(K=K, plans={k: (v.pos, v.proposed, v.accepted) for k, v in by_index.items()},
                     tokens=tokens if ngram else {}, prompt_len=prompt_len, ngram=ngram,
                     output_len={k: v.output_len for k, v in by_index.items()},
                     check_ngram_len=method.spec.trace == "ngram" and ref.name == "fixed")
    return rp, by_index


def keyed(prompts: list) -> list:
    """Copies of ``prompts`` that carry their plan key (their index) into the engine's request ids."""
    return [dataclasses.replace(p, replay_key=p.index) for p in prompts]


def drafted_per_step(plan: RequestPlan, K: int, padded: bool) -> dict[int, int]:
    """Output position -> tokens the engine verified there: the plan's proposal, or K where the engine
    pads every row to K (V2 runner)."""
    return {int(p): (K if padded else int(d)) for p, d in zip(plan.pos, plan.proposed)}


def check_cell(result, by_index: dict[int, RequestPlan], counters: dict[str, Any], K: int, padded: bool,
               hook_stats: Optional[dict] = None) -> dict[str, Any]:
    """Compare what the engine did with the plans: per request, the tokens gained per step; per cell,
    vLLM's counters with the plans' sums over the measured requests (copies included)."""
    bad = []
    for r in result.requests:
        plan = by_index.get(int(r.prompt_index))
        if plan is None or list(r.gains) != plan.gains():
            bad.append(r.request_id)
    plans = [by_index[int(r.prompt_index)] for r in result.requests if int(r.prompt_index) in by_index]
    drafted = [np.full(p.pos.size, K) if padded else p.proposed for p in plans]
    want = {
        "num_drafts": int(sum(int((d > 0).sum()) for d in drafted)),
        "num_draft_tokens": int(sum(int(d.sum()) for d in drafted)),
        "num_accepted_tokens": int(sum(int(p.accepted.sum()) for p in plans)),
        "accepted_per_pos": [int(sum(int((p.accepted > i).sum()) for p in plans)) for i in range(K)],
    }
    got = {k: counters.get(k) for k in want}
    got["accepted_per_pos"] = list(got["accepted_per_pos"] or [])[:K] + [0] * max(0, K - len(got["accepted_per_pos"] or []))
    return {"requests": len(result.requests), "requests_off_plan": len(bad), "off_plan_examples": bad[:5],
            "counters_expected": want, "counters_measured": got, "counters_equal": want == got,
            "runner_padded_to_k": padded, "hooks": hook_stats or {},
            "exact": not bad and want == got}


class ReplayOffPlan(RuntimeError):
    """The engine did not do what a replayed cell's plans prescribe (the cell is recorded as failed)."""


def raise_if_off_plan(check: dict[str, Any]) -> None:
    """:class:`ReplayOffPlan` with what differed, unless :func:`check_cell` found the cell exact."""
    if check["exact"]:
        return
    raise ReplayOffPlan(f"replay off plan: {check['requests_off_plan']} of {check['requests']} requests gained other "
                        f"tokens per step than planned (e.g. {check['off_plan_examples']}); vLLM's counters "
                        f"{check['counters_measured']} vs planned {check['counters_expected']}")
