"""Trace replay without an engine: plans (sdlib.sim.replay), request keys and drafts (sdlib.vllm.replay),
the per-cell check (sdlib.run.replay), the tables' replay path, and the config rules. Small hand-made
traces whose plans can be worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sdlib.config import ConfigError, parse_sweep
from sdlib.run.replay import ReplayOffPlan, check_cell, drafted_per_step, raise_if_off_plan
from sdlib.sim.prepared import prepare_traces
from sdlib.sim.replay import replay_plans
from sdlib.sim.prepared import truncate_traces
from sdlib.vllm.replay import drafts, plan_key

# one request: prompt 1..6, output of 10 tokens; acc_len[p] = tokens a step at p would gain
PROMPT = [1, 2, 3, 4, 5, 6]
OUTPUT = [9, 9, 1, 2, 3, 4, 5, 6, 7, 8]
ACC_NGRAM = [1, 1, 1, 6, 5, 4, 3, 2, 1, 1]
ACC_EAGLE = [1, 3, 2, 1, 2, 2, 2, 2, 2, 1]


def _prep(max_len=None):
    rows = [{"dataset": "d", "request_id": "r0", "prompt_token_ids": PROMPT, "output_token_ids": OUTPUT,
             "method": m, "acc_len": a} for m, a in (("ngram", ACC_NGRAM), ("eagle3", ACC_EAGLE))]
    return truncate_traces(prepare_traces(pd.DataFrame(rows), keep_tokens=True), max_len)


def _steps(plan):
    return list(zip(plan.pos.tolist(), plan.proposed.tolist(), plan.accepted.tolist()))


def test_fixed_eagle3_k3_follows_acc_capped_by_k():
    (plan,) = replay_plans(_prep(), "eagle3", "fixed", 3)
    # p=1: acc 3 -> 2 accepted, next 4; p=4: acc 2 -> 1, next 6; p=6: 1 -> 8; p=8: 1 -> 10 (end)
    assert _steps(plan) == [(1, 3, 2), (4, 3, 1), (6, 3, 1), (8, 3, 1)]
    assert plan.gains() == [1, 3, 2, 2, 2] and sum(plan.gains()) == 10


def test_oracle_ngram_is_ragged_and_capped_at_k():
    (plan,) = replay_plans(_prep(), "ngram", "oracle", 2)
    # p=1,2: acc 1 -> propose nothing; p=3: acc 6 -> min(5, 2) = 2, next 6; p=6: acc 3 -> 2, next 9; p=9: 1
    assert _steps(plan) == [(1, 0, 0), (2, 0, 0), (3, 2, 2), (6, 2, 2), (9, 0, 0)]


def test_fixed_ngram_proposes_what_the_lookup_finds():
    (plan,) = replay_plans(_prep(), "ngram", "fixed", 3)
    # the output copies the prompt from p=2 (tokens 1..6): the look-up needs a 3-gram match, first at p=5
    assert [(p, d) for p, d, _ in _steps(plan)][:3] == [(1, 0), (2, 0), (3, 0)]
    assert all(a <= d for _, d, a in _steps(plan))


def test_combine_takes_the_better_method_per_step():
    (plan,) = replay_plans(_prep(), "eagle3", "combine", 4)
    # p=1: max(1, 3) = 3 -> 2 accepted, next 4; p=4: max(5, 2) = 5 -> 4 (= K), next 9; p=9: 1
    assert _steps(plan) == [(1, 2, 2), (4, 4, 4), (9, 0, 0)]


def test_calibration_policies():
    (allp,) = replay_plans(_prep(), "eagle3", "accept_all", 3)
    assert _steps(allp) == [(1, 3, 3), (5, 3, 3), (9, 3, 3)]
    assert allp.gains() == [1, 4, 4, 1]  # the last step is cut by the output length
    (none,) = replay_plans(_prep(), "eagle3", "accept_none", 3)
    assert none.pos.tolist() == list(range(1, 10)) and set(none.accepted.tolist()) == {0}
    (nothing,) = replay_plans(_prep(), "ngram", "propose_nothing", 3)
    assert set(nothing.proposed.tolist()) == {0}


def test_truncation_caps_acceptance_by_tokens_left():
    prep = _prep(max_len=5)
    assert int(prep.output_len[0]) == 5
    assert prep.acc["ngram"][0].tolist() == [1, 1, 1, 2, 1]  # 6 -> 2 tokens left at p=3, 5 -> 1 at p=4
    (plan,) = replay_plans(prep, "ngram", "oracle", 8)
    assert plan.gains() == [1, 1, 1, 2] and sum(plan.gains()) == 5  # p=3 gains 2 and ends at L


def test_fixed_k_below_the_engines_k_by_label():
    """fixed-ngram-k3 on a K = 10 engine drafts what fixed k = 3 drafts (the n-gram path with FULL graphs charges
    what is drafted); its drafter must be the method's trace list and its k at most K."""
    from sdlib.core.registry import PolicyRef, replay_ref

    prep = _prep()
    a = replay_plans(prep, "ngram", "fixed-ngram-k3", 10)
    b = replay_plans(prep, "ngram", "fixed", 3)
    assert all((x.pos == y.pos).all() and (x.proposed == y.proposed).all() for x, y in zip(a, b))
    assert replay_ref("fixed-ngram-k3", "ngram", 10) == PolicyRef("fixed", "ngram", 3)
    with pytest.raises(ValueError, match="replays the ngram lists"):
        replay_ref("fixed-eagle3-k3", "ngram", 10)
    with pytest.raises(ValueError, match="more than the engine's K"):
        replay_ref("fixed-ngram-k5", "ngram", 3)


def test_unknown_policy_and_method_are_errors():
    with pytest.raises(ValueError, match="policy"):
        replay_plans(_prep(), "eagle3", "sometimes", 3)
    with pytest.raises(ValueError, match="method"):
        replay_plans(_prep(), "mtp", "fixed", 3)


def test_plan_keys_and_drafts():
    assert plan_key("r0c1@5-abcdefgh") == 5 and plan_key("warm-x__y-0@12") == 12 and plan_key("r3@7") == 7
    assert plan_key("r0c1-abcdefgh") is None and plan_key("x@y-abc") is None
    assert drafts(2, 3) == [0, 0, 1] and drafts(0, 2) == [1, 1] and drafts(1, 1) == [0] and drafts(0, 0) == []


def _result(plan, copies=2, break_one=False):
    reqs = []
    for c in range(copies):
        g = plan.gains()
        if break_one and c == 0:
            g = g[:-2] + [g[-2] + 1, g[-1] - 1] if g[-1] > 1 else [*g[:-1], 0]
        reqs.append(SimpleNamespace(request_id=f"r0c{c}@0", prompt_index=0, gains=g))
    return SimpleNamespace(requests=reqs)


def _counters(plans, K, padded):
    acc = np.concatenate([p.accepted for p in plans])
    dr = np.concatenate([np.full(p.pos.size, K) if padded else p.proposed for p in plans])
    return {"num_drafts": int((dr > 0).sum()), "num_draft_tokens": int(dr.sum()),
            "num_accepted_tokens": int(acc.sum()), "accepted_per_pos": [int((acc > i).sum()) for i in range(K)]}


@pytest.mark.parametrize("padded", [False, True])
def test_check_cell_exact_and_broken(padded):
    (plan,) = replay_plans(_prep(), "ngram", "oracle", 3)
    good = check_cell(_result(plan), {0: plan}, _counters([plan, plan], 3, padded), 3, padded)
    assert good["exact"] and good["requests_off_plan"] == 0 and good["counters_equal"]
    bad = check_cell(_result(plan, break_one=True), {0: plan}, _counters([plan, plan], 3, padded), 3, padded)
    assert not bad["exact"] and bad["requests_off_plan"] == 1
    off = dict(_counters([plan, plan], 3, padded), num_accepted_tokens=0)
    assert not check_cell(_result(plan), {0: plan}, off, 3, padded)["counters_equal"]
    assert drafted_per_step(plan, 3, padded)[1] == (3 if padded else 0)
    raise_if_off_plan(good)  # exact: no error
    with pytest.raises(ReplayOffPlan, match="1 of 2 requests"):  # the worker records the cell as failed
        raise_if_off_plan(bad)


BASE = {"name": "r", "models": [{"path": "/m", "load_format": "dummy"}],
        "workloads": [{"dataset": "gsm8k", "source": "reference", "full_traces": True}], "batch_sizes": [1],
        "engine": {"pin_target": True}}


def test_config_rules_for_replay():
    s = parse_sweep({**BASE, "methods": [{"name": "none"}, {"name": "eagle3", "model": "/h", "replay": "fixed"},
                                         {"name": "eagle3", "model": "/h", "replay": "combine"}]})
    labels = [m.label for m in s.methods]
    assert labels == ["none", "eagle3-k3-fixed", "eagle3-k3-combine"]
    groups = {c.group for c in s.cells()}
    assert groups == {("m", "none", 0), ("m", "eagle3-k3", 0)}  # the two replay policies share one engine
    with pytest.raises(ConfigError, match="pin_target"):
        parse_sweep({**BASE, "engine": {}, "methods": [{"name": "ngram", "replay": "fixed"}]})
    with pytest.raises(ConfigError, match="full_traces"):
        parse_sweep({**BASE, "workloads": [{"dataset": "gsm8k", "source": "reference"}],
                     "methods": [{"name": "ngram", "replay": "fixed"}]})
    with pytest.raises(ConfigError, match="replay"):
        parse_sweep({**BASE, "methods": [{"name": "ngram", "replay": "maybe"}]})
    with pytest.raises(ConfigError, match="configured twice"):
        parse_sweep({**BASE, "methods": [{"name": "ngram", "replay": "fixed"},
                                         {"name": "ngram", "replay": "oracle", "options": {"prompt_lookup_min": 2}}]})
