"""SpecDec++'s confidence stop on vLLM's EAGLE-3 (sdlib.vllm.confidence_stop): the cut as a pure function
(answers worked out by hand), the option's validation (one line per bad value), and one real engine (the
CPU build, the trained target and EAGLE-3 head, k = 5): with a threshold every verify step drafts 1..5
tokens and the count varies; with h = 1 (never stop) every step's drafts and acceptance equal fixed-k
EAGLE-3's; the greedy output never changes; vLLM's counters equal the hook's."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from sdlib.config import ConfigError, MethodConfig, parse_sweep
from sdlib.paths import DATA_DIR, TRAINED_MODELS_DIR
from sdlib.vllm.confidence_stop import confidence_lengths, truncate


# --------------------------------------------------------------------------- the rule
def test_lengths_by_hand():
    p = np.array([[0.9, 0.9, 0.9, 0.9],    # 1 - prod: 0.1, 0.19, 0.271, 0.344 -> first > 0.25 is j = 3
                  [0.5, 0.99, 0.99, 0.99],  # 0.5 > 0.25 at j = 1: at least the first draft is kept
                  [1.0, 1.0, 1.0, 1.0],     # never crosses: all K
                  [0.8, 0.95, 0.9, 0.2]])   # 0.2, 0.24, 0.316 -> j = 3
    assert confidence_lengths(p, 0.25).tolist() == [3, 1, 4, 3]
    # h = 0.5: row 0 never crosses (0.344 at j = 4); row 1 is 0.5 at j = 1 (not above h), 0.505 at j = 2;
    # row 3 crosses at j = 4 (0.863)
    assert confidence_lengths(p, 0.5).tolist() == [4, 2, 4, 4]
    assert confidence_lengths(p, 1.0).tolist() == [4, 4, 4, 4]  # h = 1 never stops
    assert confidence_lengths(np.zeros((2, 0)), 0.5).tolist() == [0, 0]


def test_lengths_fall_as_h_falls():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.3, 1.0, size=(200, 5))
    means = [confidence_lengths(p, h).mean() for h in (0.9, 0.7, 0.5, 0.3, 0.1)]
    assert all(a >= b for a, b in zip(means, means[1:])) and means[0] > means[-1]
    assert confidence_lengths(p, 0.1).min() >= 1 and confidence_lengths(p, 0.9).max() <= 5


def test_truncate():
    assert truncate([[5, 6, 7], [8, 9, 10]], np.array([1, 3])) == [[5], [8, 9, 10]]


# --------------------------------------------------------------------------- the option
def _eagle3(**kw):
    return MethodConfig(name="eagle3", num_spec_tokens=5, model="@trained/eagle3", **kw)


def test_option_label_engine_and_spec():
    m = _eagle3(options={"confidence_stop": 0.5})
    assert m.label == "eagle3-k5-conf0.5" and m.confidence_stop == 0.5
    assert "confidence_stop" not in m.speculative_config()  # never reaches vLLM
    assert m.engine_key() == _eagle3().engine_key()  # shares fixed-k EAGLE-3's engine


def _sweep(methods):
    return {"name": "t", "models": [{"path": "@trained/target"}], "methods": methods,
            "workloads": [{"dataset": "code_edit", "source": "package", "num_requests": 2}], "batch_sizes": [1]}


@pytest.mark.parametrize("value, words", [
    (1.5, "0 < h <= 1"), (0, "0 < h <= 1"), (-0.2, "0 < h <= 1"), (True, "0 < h <= 1"), ("0.5", "0 < h <= 1"),
    (float("nan"), "0 < h <= 1"),
])
def test_bad_threshold_is_one_line(value, words):
    with pytest.raises(ConfigError) as e:
        parse_sweep(_sweep([{"name": "eagle3", "num_spec_tokens": 5, "model": "@trained/eagle3",
                             "options": {"confidence_stop": value}}]))
    msg = str(e.value)
    assert "\n" not in msg and words in msg and "confidence_stop" in msg


def test_only_eagle3_takes_it():
    with pytest.raises(ConfigError, match="only for method eagle3"):
        parse_sweep(_sweep([{"name": "ngram", "num_spec_tokens": 3, "options": {"confidence_stop": 0.5}}]))


def test_shares_the_fixed_k_engine():
    sw = parse_sweep(_sweep([{"name": "none"},
                             {"name": "eagle3", "num_spec_tokens": 5, "model": "@trained/eagle3"},
                             {"name": "eagle3", "num_spec_tokens": 5, "model": "@trained/eagle3",
                              "options": {"confidence_stop": 0.5}}]))
    groups = {c.method.label: c.group[1] for c in sw.cells()}
    assert groups == {"none": "none", "eagle3-k5": "eagle3-k5", "eagle3-k5-conf0.5": "eagle3-k5"}


# --------------------------------------------------------------------------- one real engine
def _prompts(n: int) -> list[list[int]]:
    with gzip.open(DATA_DIR / "traces" / "ours64_code_edit.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for _, line in zip(range(n), f)]
    return [r["prompt_token_ids"] for r in rows]


@pytest.mark.engine
def test_engine_cuts_and_h1_equals_fixed_k():
    pytest.importorskip("vllm")
    from sdlib.vllm import compat as vc
    from sdlib.vllm import confidence_stop as cs
    from sdlib.vllm.engine import EngineSettings, _generate, _greedy_params, close_engine, make_engine

    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    K = 5
    llm = make_engine(TRAINED_MODELS_DIR / "target", "eagle3", k=K, drafter=TRAINED_MODELS_DIR / "eagle3",
                      settings=EngineSettings(dtype="bfloat16", max_model_len=1024, max_num_seqs=4))
    try:
        assert cs.install(llm) == "EagleProposer"
        prompts = _prompts(4)

        def run(h):
            cs.set_threshold(llm, h)
            before = vc.read_spec_counters(llm)
            outs = _generate(llm, prompts, [_greedy_params(32, ignore_eos=True)] * len(prompts))
            counters = vc.diff_counters(vc.read_spec_counters(llm), before)
            steps = [vc.request_spec_metrics(o.outputs[0]) for o in outs]
            return [list(o.outputs[0].token_ids) for o in outs], steps, counters, cs.stats(llm)

        fixed = run(None)
        never = run(1.0)
        cut = run(0.5)
    finally:
        close_engine(llm)
    # fixed k: K drafts every step; the hook passed vLLM's calls through
    assert all(set(d) == {K} for d, _ in fixed[1]) and fixed[3]["calls"] == 0
    # h = 1: the same drafts and acceptance at every step as fixed k, and the same output
    assert never[1] == fixed[1] and never[0] == fixed[0]
    assert never[3]["drafted"] == never[3]["proposed"] and never[3]["unmatched"] == 0
    # h = 0.5: 1..K drafts per step, varying; greedy SD is lossless, so the output is the same
    drafted = [x for d, _ in cut[1] for x in d]
    assert min(drafted) >= 1 and max(drafted) <= K and len(set(drafted)) > 1
    assert np.mean(drafted) < K and cut[0] == fixed[0]
    # vLLM's counters equal the per-request steps; the hook cut what vLLM verified
    assert cut[2]["num_draft_tokens"] == sum(drafted)
    assert cut[2]["num_accepted_tokens"] == sum(a for _, acc in cut[1] for a in acc)
    assert cut[3]["unmatched"] == 0 and cut[3]["drafted"] >= sum(drafted)  # the hook also cuts unverified rows
