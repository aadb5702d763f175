"""Serving sweep, unit tier: arrivals, measures worked out by hand, router rules, /metrics parsing, the server
command line, config validation, the serving tables."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pandas as pd
import pytest

from sdlib.analysis import serving as M
from sdlib.config import ConfigError
from sdlib.serve.arrivals import arrival_times, realised_rate
from sdlib.serve.config import parse_serving
from sdlib.serve.router import Router, prompt_overlap_score
from sdlib.store.schema import columns
from sdlib.vllm import server as vs

# ------------------------------------------------------------------------------------------------ arrivals


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_rate_and_the_burstiness(b):
    rate, n = 8.0, 200_000
    gaps = np.diff(arrival_times(rate, n, burstiness=b, seed=1))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(b), rel=0.02)  # CV of gamma(b) = 1/sqrt(b)


@pytest.mark.parametrize("b", [0.25, 1.0])
def test_exact_rate_conditions_on_the_realised_rate_and_keeps_the_shape(b):
    t = arrival_times(4.0, 24, burstiness=b, seed=0, exact_rate=True)
    assert t[0] == 0 and realised_rate(t) == pytest.approx(4.0)
    # the gaps' shape is unchanged: CV over many rescaled short sequences ~ 1/sqrt(b) (Dirichlet spacings)
    gaps = np.concatenate([np.diff(arrival_times(4.0, 50, b, seed=s, exact_rate=True)) for s in range(400)])
    assert gaps.mean() == pytest.approx(0.25, rel=1e-9)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(b), rel=0.05)


def test_arrivals_seeded_and_shifted():
    a = arrival_times(2.0, 50, seed=3)
    assert np.array_equal(a, arrival_times(2.0, 50, seed=3))
    assert not np.array_equal(a, arrival_times(2.0, 50, seed=4))
    z = arrival_times(2.0, 50, seed=3, start_at_zero=True)
    assert z[0] == 0 and np.allclose(np.diff(z), np.diff(a))
    assert realised_rate([0.0, 1.0, 2.0, 4.0]) == pytest.approx(0.75)
    assert np.isnan(realised_rate([1.0]))
    with pytest.raises(ValueError):
        arrival_times(0.0, 5)
    with pytest.raises(ValueError):
        arrival_times(1.0, 5, burstiness=0)


# ------------------------------------------------------------------------------------------------ measures


def test_token_gaps_spread_a_message_over_its_tokens():
    # messages at 0.1 (1 token, the first), 0.2 (2 tokens), 0.5 (3 tokens): 6 tokens, 5 gaps
    g = M.token_gaps([0.1, 0.2, 0.5], [1, 2, 3])
    assert np.allclose(g, [0.05, 0.05, 0.1, 0.1, 0.1])
    assert g.sum() == pytest.approx(0.5 - 0.1)  # = E2E - TTFT
    # a first message with two tokens: the second token came with the first (gap 0)
    assert np.allclose(M.token_gaps([0.1, 0.3], [2, 1]), [0.0, 0.2])
    assert np.allclose(M.message_gaps([0.1, 0.2, 0.5]), [0.1, 0.3])


def _toy_cell():
    req = pd.DataFrame({
        "run_id": "c", "request_id": ["a", "b", "x"], "task": ["chat", "code", "chat"],
        "ttft_s": [0.1, 0.3, np.nan], "tpot_s": [0.01, 0.05, np.nan], "e2e_s": [0.2, 0.5, np.nan],
        "error": [None, None, "HTTP 500"]})
    ch = pd.DataFrame({"run_id": "c", "request_id": ["a", "a", "b", "b"], "message": [0, 1, 0, 1],
                       "t_s": [0.1, 0.2, 0.3, 0.5], "num_tokens": [1, 2, 1, 4]})
    return req, ch


def test_summarize_by_hand():
    req, ch = _toy_cell()
    s = M.summarize(req, ch, percentiles=(50, 100))
    assert s["ttft_p50_s"] == pytest.approx(0.2)  # failed request x left out
    assert s["ttft_p100_s"] == pytest.approx(0.3)
    # per-token ITLs: a: 0.05, 0.05; b: 0.05 x 4 -> all 0.05; message ITLs: 0.1, 0.2
    assert s["itl_p50_s"] == pytest.approx(0.05)
    assert s["msg_itl_p50_s"] == pytest.approx(0.15)
    assert s["e2e_p50_s"] == pytest.approx(0.35)


def test_bootstrap_interval_brackets_the_estimate():
    rng = np.random.default_rng(0)
    per = [rng.exponential(1.0, 5) for _ in range(40)]
    est, lo, hi = M.bootstrap_percentile(per, 50, n_boot=300)
    assert lo <= est <= hi and hi - lo > 0
    e2, l2, h2 = M.bootstrap_percentile([np.array([2.0])] * 10, 99, n_boot=50)
    assert e2 == l2 == h2 == 2.0
    assert np.isnan(M.bootstrap_percentile([], 50)[0])


def test_goodput_sla_capacity_and_cost_by_hand():
    sla = M.SLA(ttft_ms=200, itl_ms=30, percentile=50)
    runs = pd.DataFrame({"run_id": ["r1", "r2", "r4"], "kind": "method", "label": "m", "rate_rps": [1.0, 2.0, 4.0],
                         "num_servers": 2, "duration_s": [4.0, 2.0, 1.0], "request_throughput_rps": [1.0, 2.0, 4.0],
                         "output_tok_per_s": [100.0, 1000.0, 2000.0]})
    # r1: 4 requests, all good; r2: 4 requests, 2 good (one too slow TTFT, one too slow TPOT); r4: bad
    req = pd.DataFrame({
        "run_id": ["r1"] * 4 + ["r2"] * 4 + ["r4"] * 4,
        "request_id": list("abcd") * 3,
        "ttft_s": [0.1] * 4 + [0.1, 0.1, 0.5, 0.1] + [0.9] * 4,
        "tpot_s": [0.01] * 4 + [0.01, 0.01, 0.01, 0.04] + [0.1] * 4,
        "error": [None] * 12})
    g = M.goodput_table(runs, req, sla).set_index("run_id")
    assert g.loc["r1", "goodput_rps"] == pytest.approx(1.0)  # 4 good / 4 s
    assert g.loc["r2", "sla_share"] == pytest.approx(0.5)
    assert g.loc["r2", "goodput_rps"] == pytest.approx(1.0)  # 2 good / 2 s
    assert g.loc["r4", "goodput_rps"] == 0
    # SLA at P50 from intervals: r1 and r2 meet it, r4 does not -> capacity 2 req/s
    rows = []
    for rid, t, i in (("r1", 0.1, 0.01), ("r2", 0.1, 0.02), ("r4", 0.9, 0.1)):
        for metric, v in (("ttft", t), ("itl", i)):
            rows.append({"run_id": rid, "kind": "method", "label": "m", "rate_rps": float(rid[1]), "metric": metric,
                         "percentile": 50, "value_s": v, "lo_s": v * 0.9, "hi_s": v * 1.1})
    s = M.sla_table(pd.DataFrame(rows), sla)
    assert list(s.sort_values("rate_rps")["meets"]) == [True, True, False]
    cap = M.capacity_table(runs, s, g.reset_index(), price_per_hour=3.6).iloc[0]
    assert cap["max_rate_meeting_sla_rps"] == 2.0 and not cap["capacity_censored"]
    # 2 servers x $3.6/h at 1000 tok/s = 7.2 / 3.6e6 tokens -> $2 per million
    assert cap["cost_per_m_output_tokens"] == pytest.approx(2.0)
    assert M.cost_per_million_tokens(1000, 3.6) == pytest.approx(1.0)
    assert np.isnan(M.cost_per_million_tokens(0, 3.6))


# ------------------------------------------------------------------------------------------------ router


def test_prompt_overlap_score_by_hand():
    # positions 3..8; the suffix 3-gram of ids[:p] occurred earlier at p = 6, 7, 8 -> 3 of 6
    assert prompt_overlap_score([1, 2, 3, 1, 2, 3, 1, 2, 3], nmin=3, nmax=3) == pytest.approx(0.5)
    assert prompt_overlap_score(list(range(50))) == 0.0
    assert prompt_overlap_score([1, 2]) == 0.0


def test_router_rules():
    rr = Router("round_robin", 3)
    assert [rr.route() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    a = [Router("random", 2, seed=5).route() for _ in range(1)]
    r1, r2 = Router("random", 2, seed=5), Router("random", 2, seed=5)
    assert [r1.route() for _ in range(20)] == [r2.route() for _ in range(20)] and a
    t = Router("task", 2, routes={"code_edit": 0}, default=1)
    assert [t.route(task=x) for x in ("code_edit", "chat", "reasoning")] == [0, 1, 1]
    o = Router("overlap", 2, routes={"high": 0, "low": 1}, threshold=0.3)
    assert o.route(prompt=[1, 2, 3, 1, 2, 3, 1, 2, 3] * 3) == 0
    assert o.route(prompt=list(range(40))) == 1
    assert o.route(score=0.3) == 0 and o.route(score=0.29) == 1
    assert Router("single", 1).route(task="x") == 0
    with pytest.raises(ValueError):
        Router("nope", 2)


# ------------------------------------------------------------------------------------------------ vLLM side

METRICS_TEXT = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 15.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="target"} 5.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="target"} 1.7963e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 45.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 27.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="2"} 7.0
vllm:generation_tokens_total{engine="0",model_name="target"} 1234.0
vllm:num_requests_running{engine="0",model_name="target"} 3.0
"""


def test_metrics_parser_sums_engines_and_orders_positions():
    series = vs.parse_metrics(METRICS_TEXT)
    c = vs.spec_counters(series)
    assert c["num_drafts"] == 20  # two engines summed, _created skipped
    assert c["num_draft_tokens"] == 45 and c["num_accepted_tokens"] == 27
    assert c["accepted_per_pos"] == [12, 8, 7]
    assert c["generation_tokens"] == 1234 and c["prompt_tokens"] == 0
    d = vs.diff_spec_counters(c, {"num_drafts": 5, "accepted_per_pos": [2, 1], "num_draft_tokens": 0,
                                  "num_accepted_tokens": 0, "generation_tokens": 34, "prompt_tokens": 0,
                                  "num_preemptions": 0})
    assert d["num_drafts"] == 15 and d["accepted_per_pos"] == [10, 7, 7] and d["generation_tokens"] == 1200
    empty = vs.spec_counters(vs.parse_metrics(""))  # a server without SD
    assert empty["num_drafts"] == 0 and empty["accepted_per_pos"] == []


def _cfg(**over):
    base = {
        "name": "u", "results_dir": "/tmp/unused",
        "models": [{"name": "tiny", "path": "@trained/target"}],
        "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 5},
                    {"name": "eagle3", "num_spec_tokens": 3, "model": "@trained/eagle3"}],
        "mix": [{"task": "chat", "weight": 0.5, "workload": {"dataset": "sharegpt", "num_requests": 4}},
                {"task": "code_edit", "weight": 0.2, "workload": {"dataset": "code_edit", "num_requests": 4}}],
        "traffic": {"rates": [2, 1], "num_requests": 8},
        "fleets": [{"name": "routed", "servers": ["ngram-k5", "eagle3-k3"], "rule": "task",
                    "routes": {"code_edit": 0}, "default": 1},
                   {"name": "e3", "servers": ["eagle3-k3", "eagle3-k3"]}],
        "fleet_rates": [4],
        "server": {"gpu_memory_utilization": 0.2, "enforce_eager": True, "max_num_seqs": 64},
    }
    base.update(over)
    return parse_serving(base)


def test_server_command_line():
    cfg = _cfg()
    m = cfg.method("eagle3-k3")
    cmd = vs.server_command(cfg.models[0], m, cfg.server, port=8123, python="py", version="0.32.0")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    s = " ".join(cmd)
    for flag in ("--host 127.0.0.1", "--port 8123", "--gpu-memory-utilization 0.2", "--max-num-seqs 64",
                 "--enforce-eager", "--no-enable-prefix-caching", "--enable-per-request-metrics",
                 "--per-request-spec-decode-metrics detailed", "--served-model-name model"):
        assert flag in s, flag
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 3 and spec["model"].endswith("eagle3")
    old = vs.server_command(cfg.models[0], m, cfg.server, port=1, version="0.26.0")
    assert "--per-request-spec-decode-metrics" not in old and "--enable-per-request-metrics" in old
    none = vs.server_command(cfg.models[0], cfg.method("none"), cfg.server, port=1, version="0.32.0")
    assert "--speculative-config" not in none and "--per-request-spec-decode-metrics" not in none
    assert vs.supports_request_spec_metrics("0.32.0+cpu") and not vs.supports_request_spec_metrics("0.26.0")


# ------------------------------------------------------------------------------------------------ config


def test_min_duration_scales_requests_at_high_rates_only():
    base = {c.label + str(c.rate): c.run_id for c in _cfg().cells()}
    cfg = _cfg(traffic={"rates": [2, 1], "num_requests": 8, "min_duration_s": 6})
    cells = {c.label + str(c.rate): c for c in cfg.cells()}
    assert cells["none1.0"].num_requests == 8 and cells["none2.0"].num_requests == 12
    assert cells["none1.0"].run_id == base["none1.0"]  # unchanged where min_duration_s adds nothing
    assert cells["none2.0"].run_id != base["none2.0"]
    assert cells["routed4.0"].num_requests == 24


def test_cells_and_run_ids():
    cfg = _cfg()
    cells = cfg.cells()
    method_cells = [c for c in cells if c.kind == "method"]
    assert [c.label for c in method_cells][:2] == ["none", "none"]  # baseline first, rates ascending
    assert [c.rate for c in method_cells][:2] == [1.0, 2.0]
    assert len(method_cells) == 3 * 2 and len([c for c in cells if c.kind == "fleet"]) == 2
    assert len({c.run_id for c in cells}) == len(cells)
    same = [c for c in cells if c.rate == 2.0 and c.kind == "method"]
    assert len({c.seed for c in same}) == 1  # identical traffic for every method at one rate
    assert cells[0].run_id == _cfg().cells()[0].run_id


@pytest.mark.parametrize("over, field", [
    ({"fleets": [{"name": "f", "servers": ["eagle3-k9"]}]}, "fleets"),
    ({"fleets": [{"name": "f", "servers": ["none", "none"], "rule": "task", "routes": {"cooking": 0}}]}, "routes"),
    ({"fleets": [{"name": "f", "servers": ["none", "none"], "rule": "overlap", "routes": {"high": 0}}]}, "routes"),
    ({"fleets": [{"name": "f", "servers": ["none"]}, {"name": "g", "servers": ["none", "none"]}]}, "same number"),
    ({"traffic": {"rates": [0]}}, "traffic.rates"),
    ({"traffic": {"rates": [1], "burstiness": -1}}, "traffic.burstiness"),
    ({"fleet_rates": []}, "fleet_rates"),
    ({"mix": [{"task": "chat", "weight": 0, "workload": {"dataset": "sharegpt"}}]}, "mix.0.weight"),
])
def test_bad_config_is_one_line_naming_the_field(over, field):
    with pytest.raises(ConfigError) as e:
        _cfg(**over)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nmodels: [{path: '@trained/target'}]\nmethods: [{name: none}]\n"
                 "mix: [{task: chat, workload: {dataset: sharegpt}}]\ntraffic: {rates: [-1]}\n")
    r = subprocess.run([sys.executable, "-m", "sdlib", "serve", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "traffic.rates" in r.stderr


def test_cli_help_says_what_it_reads_and_writes():
    r = subprocess.run([sys.executable, "-m", "sdlib", "serve", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "Reads CONFIG" in r.stdout and "Writes" in r.stdout and "data/serving" in r.stdout


# ------------------------------------------------------------------------------------------------ tables


def test_stream_is_the_same_for_every_method_and_rate():
    from sdlib.serve.sweep import build_stream, route_stream

    cfg = _cfg()
    pool = [types.SimpleNamespace(prompt_token_ids=[i, i + 1, i + 2, i, i + 1, i + 2], max_output_tokens=None)
            for i in range(5)]
    pools = {"chat": pool, "code_edit": pool[:2]}
    cells = cfg.cells()
    a = build_stream(cells[0], pools)
    b = build_stream([c for c in cells if c.label == "ngram-k5" and c.rate == 1.0][0], pools)
    assert [(r.task, r.prompt_index, r.arrival_s) for r in a] == [(r.task, r.prompt_index, r.arrival_s) for r in b]
    c = build_stream([c for c in cells if c.rate == 2.0][0], pools)
    assert [r.task for r in a] == [r.task for r in c] and a[1].arrival_s != c[1].arrival_s
    routed = [c for c in cells if c.label == "routed"][0]
    s = build_stream(routed, pools)
    assert route_stream(routed, s) == [0 if r.task == "code_edit" else 1 for r in s]


def test_share_tables_and_summary_follow_the_schema():
    from sdlib.serve.client import RequestRecord
    from sdlib.serve.sweep import StreamRequest, cell_summary, share_tables

    cfg = _cfg()
    cell = cfg.cells()[0]
    st = [StreamRequest(f"req{i}", 0.5 * i, "chat", "sharegpt", i, [1, 2, 3], 4, 0.0, True, None, 0.0)
          for i in range(3)]
    recs = [RequestRecord(f"req{i}", 0, 0.5 * i, send_s=0.5 * i + 0.001, first_token_s=0.5 * i + 0.1,
                          finish_s=0.5 * i + 0.4, msg_t=[0.5 * i + 0.1, 0.5 * i + 0.2, 0.5 * i + 0.4], msg_n=[1, 2, 1],
                          prompt_tokens=3, output_tokens=4, finish_reason="length") for i in range(3)]
    recs[2] = RequestRecord("req2", 0, 1.0, send_s=1.001, error="HTTP 500: x")
    counters = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12, "accepted_per_pos": [6, 4, 2],
                "generation_tokens": 100, "prompt_tokens": 9, "num_preemptions": 0}
    zero = {k: ([0, 0, 0] if isinstance(v, list) else 0) for k, v in counters.items()}
    t = share_tables(cell, 0, st, recs, zero, counters, 0.01, "t")
    for name, df in t.items():
        assert list(df.columns) == columns(name)
    assert t["serve_requests"]["tpot_s"].iloc[0] == pytest.approx((0.4 - 0.1 + 0.001 - 0.001) / 3)
    assert len(t["serve_chunks"]) == 6 and t["serve_chunks"]["t_s"].iloc[0] == pytest.approx(0.099)
    row = cell_summary(cfg, cell, t).iloc[0]
    assert row["num_requests"] == 3 and row["completed"] == 2 and row["failed"] == 1 and row["status"] == "errors"
    assert row["output_tokens"] == 8 and row["counter_num_drafts"] == 10
    assert row["duration_s"] == pytest.approx(0.9)  # first arrival 0 -> last token 0.5 + 0.4
    assert row["ttft_p50_s"] == pytest.approx(0.099)


def test_provenance_command_lines_carry_no_absolute_paths():
    from sdlib.paths import REPO_ROOT
    from sdlib.serve.sweep import portable_cmd

    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(REPO_ROOT / "data/models/target"),
           "--speculative-config", json.dumps({"model": str(REPO_ROOT / "data/models/eagle3")})]
    out = portable_cmd(cmd)
    assert out[0] == "python" and out[4] == "data/models/target" and str(REPO_ROOT) not in " ".join(out)
