"""The replayed policies that decide from draft confidences (online-with-agreement, vLLM's adaptive verification
rule), through the CPU build of vLLM on our traces with the trained target pinned and the trained EAGLE-3 head:
both share one K = 10 engine, every request follows its plan and vLLM's counters equal the plans' sums
(issue 24 item 4's H200 config, configs/h200_v034_powered_policies_ours.yaml, in miniature)."""

from __future__ import annotations

import json

import pytest

from sdlib.config import parse_sweep
from sdlib.paths import resolve
from sdlib.run.sweep import run_sweep

pytestmark = pytest.mark.engine


def test_confidence_policies_replay_exactly(tmp_path):
    cfg = parse_sweep({
        "name": "replay_conf_cpu", "results_dir": str(tmp_path / "out"),
        "models": [{"name": "tiny-target", "path": "@trained/target", "dtype": "bfloat16", "max_model_len": 1024}],
        "methods": [{"name": "eagle3", "num_spec_tokens": 10, "model": "@trained/eagle3", "replay": p}
                    for p in ("online-with-agreement", "vllm-adaptive-verification")],
        "workloads": [{"dataset": "sharegpt", "source": "traces", "path": str(resolve("data/traces/ours64_sharegpt.jsonl.gz")),
                       "confidences": str(resolve("data/traces/confidences/ours64_sharegpt.jsonl.gz")),
                       "predictor": str(resolve("data/predictors/online_ours64.json")),
                       "full_traces": True, "num_requests": 3, "max_output_tokens": 48, "ignore_eos": True}],
        "batch_sizes": [3], "batch_mode": "closed_loop", "requests_per_slot": 1, "warmup_requests": 1,
        "engine": {"gpu_memory_utilization": 0.2, "enforce_eager": True, "pin_target": True},
    })
    store = run_sweep(cfg, quiet=True)
    assert store.failures().empty, store.failures()
    assert len(store.done_ids()) == 2
    prov = store.read_provenance()["invocations"][-1]
    assert len(prov["engines"]) == 1  # one engine for both replays
    checks = [json.loads(f.read_text()) for f in sorted((store.dir / "replay").glob("*.json"))]
    assert len(checks) == 2
    for c in checks:
        assert c["exact"] and c["counters_equal"] and c["requests_off_plan"] == 0, c
    steps = store.read("steps")
    assert steps.groupby("run_id").drafted.mean().nunique() == 2  # the two rules drafted differently
