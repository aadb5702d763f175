"""Trace replay through the CPU build of vLLM, exactly: a tiny random-weight target (pinned), synthetic traces
whose outputs copy prompt spans (so the n-gram look-up finds matches), replay sweeps on two engine paths
(n-gram: ragged drafts; draft model: K drafts). Every request's tokens per step equal its plan, the steps
table's accepted tokens equal ``min(acc[pos] - 1, proposed)`` and advance to ``pos + accepted + 1``, and
vLLM's counters equal the plans' sums."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

from sdlib.config import parse_sweep
from sdlib.extract.ngram import ngram_trace
from sdlib.paths import MODELS_DIR
from sdlib.run.sweep import run_sweep
from sdlib.sim.prepared import prepare_traces
from sdlib.sim.replay import replay_plans
from sdlib.sim.prepared import truncate_traces
from sdlib.sim.traces import read_traces, write_traces

pytestmark = pytest.mark.engine

L_MAX = 40


def synthetic_traces(path, n=5, vocab=4000, seed=0, L=48):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randrange(24, 40))]
        out: list[int] = []
        while len(out) < L:
            if rng.random() < 0.5:
                s = rng.randrange(0, len(prompt) - 8)
                out += prompt[s:s + rng.randrange(3, 8)]
            else:
                out += [rng.randrange(10, vocab) for _ in range(rng.randrange(1, 4))]
        out = out[:L]
        acc_ng = ngram_trace(prompt, out, k=20).acc_len.tolist()
        acc_e = [1] + [min(rng.randrange(1, 6), L - p) for p in range(1, L)]
        for m, a in (("ngram", acc_ng), ("eagle3", acc_e)):
            rows.append({"dataset": "code_edit", "request_id": f"syn{i}", "prompt_token_ids": prompt,
                         "output_token_ids": out, "method": m, "acc_len": a, "k": 20, "mismatch_positions": []})
    write_traces(pd.DataFrame(rows), path, {"dataset": "code_edit", "k": 20, "target": "synthetic"})
    return path


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    from sdlib.models.tinymodels import build_models

    build_models(MODELS_DIR)
    tmp = tmp_path_factory.mktemp("replay")
    traces = synthetic_traces(tmp / "syn.jsonl.gz")
    cfg = parse_sweep({
        "name": "replay_cpu", "results_dir": str(tmp / "out"),
        "models": [{"name": "tiny", "path": "@models/target", "dtype": "bfloat16", "max_model_len": 512}],
        "methods": [{"name": "none"},
                    {"name": "ngram", "num_spec_tokens": 3, "replay": "fixed"},
                    {"name": "ngram", "num_spec_tokens": 3, "replay": "oracle"},
                    {"name": "draft_model", "num_spec_tokens": 3, "model": "@models/draft", "replay": "fixed"},
                    {"name": "draft_model", "num_spec_tokens": 3, "model": "@models/draft", "replay": "combine"},
                    {"name": "draft_model", "num_spec_tokens": 3, "model": "@models/draft",
                     "replay": "accept_all"}],
        "workloads": [{"dataset": "code_edit", "source": "traces", "path": str(traces), "num_requests": 4,
                       "max_output_tokens": L_MAX, "full_traces": True, "ignore_eos": True}],
        "batch_sizes": [1, 3], "batch_mode": "paper", "warmup_requests": 1,
        "engine": {"gpu_memory_utilization": 0.1, "enforce_eager": True, "pin_target": True},
    })
    store = run_sweep(cfg, quiet=True)
    return cfg, store, traces


def test_every_replay_cell_is_exact(replayed):
    cfg, store, _ = replayed
    assert store.failures().empty, store.failures()
    runs = store.read("runs")
    assert len(runs) == len(cfg.cells())
    checks = {p.stem: json.loads(p.read_text()) for p in (store.dir / "replay").glob("*.json")}
    replay_runs = runs[runs["method"] != "none"]
    assert set(checks) == set(replay_runs["run_id"])
    for rid, c in checks.items():
        assert c["exact"] and c["requests_off_plan"] == 0 and c["counters_equal"], (rid, c)
        assert c["hooks"]["unknown"] == 0 and c["hooks"]["off_plan"] == 0, (rid, c["hooks"])
        assert c["hooks"]["ngram_len_mismatch"] == 0, (rid, c["hooks"])  # the real look-up agreed with the plan
        # the hooks timed the measured requests' steps (reset after the warm-up); vLLM's own call is part of it
        assert c["hooks"]["hook_calls"] > 0 and 0 < c["hooks"]["vllm_s"] <= c["hooks"]["hook_s"], (rid, c["hooks"])
    assert set(replay_runs["acceptance_source"]) == {"replay"}
    # the pinned target emits token 0 only
    req = store.read("requests")
    assert all(set(json.loads(o)) == {0} for o in req["output_token_ids"])


def test_steps_follow_the_trace_rule(replayed):
    cfg, store, traces = replayed
    runs, req, steps = store.read("runs"), store.read("requests"), store.read("steps")
    table = read_traces(traces, "code_edit")
    prep = truncate_traces(prepare_traces(table, keep_tokens=True), L_MAX)
    acc = {m: dict(zip(prep.request_id, prep.acc[m])) for m in ("ngram", "eagle3")}
    from sdlib.workloads import load_prompts

    prompts = load_prompts(cfg.workloads[0])
    source_of = {p.index: p.source_id for p in prompts}
    checked = 0
    for run in runs[runs["method"] != "none"].itertuples():
        policy = run.method_label.split("-")[-1]
        if policy == "accept_all":
            continue
        trace = "ngram" if run.method == "ngram" else "eagle3"
        r_req = req[req["run_id"] == run.run_id]
        for r in r_req.itertuples():
            a_ng, a_eg = acc["ngram"][source_of[r.prompt_index]], acc["eagle3"][source_of[r.prompt_index]]
            s = steps[(steps["run_id"] == run.run_id) & (steps["request_id"] == r.request_id)].sort_values("step")
            pos = 1
            for row in s.itertuples():
                assert row.position == pos
                a = max(a_ng[pos], a_eg[pos]) if policy == "combine" else (a_ng if trace == "ngram" else a_eg)[pos]
                want = min(int(a) - 1, int(row.drafted))
                assert row.accepted == min(want, r.output_tokens - pos - 1), (run.method_label, pos)
                pos += int(row.accepted) + 1
                checked += 1
            assert pos >= r.output_tokens
    assert checked > 200


def test_counters_equal_the_steps_sums(replayed):
    _, store, _ = replayed
    runs, steps = store.read("runs"), store.read("steps")
    for run in runs[runs["method"] != "none"].itertuples():
        s = steps[steps["run_id"] == run.run_id]
        drafted = s["drafted"].astype(int)
        assert run.counter_num_draft_tokens == int(drafted.sum())
        assert run.counter_num_drafts == int((drafted > 0).sum())
        # the last step of a request can accept drafts past max_tokens: vLLM counts them, the steps table not
        assert run.counter_num_accepted_tokens >= int(s["accepted"].sum())


def test_plans_match_the_simulator(replayed):
    """The engine replayed the simulator's own step sequence (so measured vs simulated differ only in cost)."""
    _, store, traces = replayed
    prep = truncate_traces(prepare_traces(read_traces(traces, "code_edit"), keep_tokens=True), L_MAX)
    plans = replay_plans(prep, "draft_model", "fixed", 3)
    runs, steps = store.read("runs"), store.read("steps")
    rid = runs[(runs["method_label"] == "draft_model-k3-fixed") & (runs["batch_size"] == 1)]["run_id"].iloc[0]
    got = steps[steps["run_id"] == rid].groupby("request_id")["accepted"].sum().sort_values().tolist()
    want = sorted(int(np.minimum(p.accepted + 1, p.output_len - p.pos).sum() - p.pos.size) for p in plans)
    assert all(g in want for g in got)
