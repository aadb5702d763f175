"""What notebook 06's hook-off control and graph-mode comparison compute, on the committed H200 sweeps
(data/sweeps/h200_hookoff*, h200_ragged_full, h200_replay), each number recomputed here from the raw tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sdlib.analysis.replay import DEFAULT_GRAPH_MODE, graph_mode, hook_times
from sdlib.analysis.replay_report import graph_mode_comparison, hook_control
from sdlib.paths import resolve
from sdlib.store import SweepStore

HOOKOFF = [resolve("data/sweeps/h200_hookoff"), resolve("data/sweeps/h200_hookoff_piecewise")]
MODES = [resolve("data/sweeps/h200_replay"), resolve("data/sweeps/h200_ragged_full")]
LABELS = ["ngram-k3-fixed", "ngram-k5-fixed", "ngram-k10-oracle"]


def _run(store: SweepStore, label: str, bs: int, dataset: str = "gsm8k") -> str:
    runs = store.read("runs")
    r = runs[(runs["method_label"] == label) & (runs["batch_size"] == bs) & (runs["dataset"] == dataset)]
    assert len(r) == 1, (label, bs, dataset)
    return str(r["run_id"].iloc[0])


def test_hook_control_step_times_and_hook_seconds_are_the_raw_tables():
    ctl = hook_control(HOOKOFF)
    assert set(ctl["graph_mode"]) == {DEFAULT_GRAPH_MODE, "PIECEWISE"}
    assert ctl.loc[ctl["method_label"] == "ngram-k3-hookoff", "hooks"].eq(False).all()
    assert ctl.loc[ctl["method_label"] == "ngram-k3-accept_all", "hooks"].eq(True).all()
    store = SweepStore(HOOKOFF[0])
    es, req = store.read("engine_steps"), store.read("requests")
    for label, bs in (("none", 32), ("ngram-k3-propose_nothing", 1), ("ngram-k3-hookoff", 128),
                      ("custom-k3-nothing", 128)):
        # decode steps, defined here without the tables' token counts: the whole batch running and no
        # request getting its first token in the step (the n-gram path without hooks has no token counts)
        rid = _run(store, label, bs)
        s = es[es["run_id"] == rid]
        first = req.loc[req["run_id"] == rid, "first_token_s"].to_numpy(float)
        prefill = np.array([((first > a) & (first <= a + d + 1e-9)).any() for a, d in zip(s["start_s"], s["duration_s"])])
        d = s[(s["num_running"] == bs).to_numpy() & ~prefill]["duration_s"]
        row = ctl[(ctl["sweep"] == "h200_hookoff") & (ctl["method_label"] == label) & (ctl["batch_size"] == bs)]
        assert row["step_ms"].iloc[0] == pytest.approx(1000 * np.median(d))
        assert row["step_ms_q25"].iloc[0] <= row["step_ms"].iloc[0] <= row["step_ms_q75"].iloc[0]
        assert row["steps"].iloc[0] == len(d) > 50
    rid = _run(store, "ngram-k3-accept_all", 32)
    h = json.loads((store.dir / "replay" / f"{rid}.json").read_text())["hooks"]
    row = ctl[(ctl["sweep"] == "h200_hookoff") & (ctl["method_label"] == "ngram-k3-accept_all") & (ctl["batch_size"] == 32)]
    assert row["hook_ms"].iloc[0] == pytest.approx(1000 * h["hook_s"] / h["hook_calls"])
    assert row["vllm_ms"].iloc[0] < row["hook_ms"].iloc[0]
    assert row["own_ms"].iloc[0] == pytest.approx(1000 * (h["hook_s"] - h["vllm_s"]) / h["hook_calls"])
    assert ctl.loc[~ctl["hooks"], "hook_ms"].isna().all()


def test_hook_times_skip_cells_recorded_before_the_hooks_timed_themselves(tmp_path):
    (tmp_path / "replay").mkdir()
    (tmp_path / "replay" / "old.json").write_text(json.dumps({"hooks": {"steps": 3}}))
    (tmp_path / "replay" / "new.json").write_text(json.dumps({"hooks": {"hook_calls": 4, "hook_s": 0.002,
                                                                         "vllm_s": 0.001}}))
    t = hook_times(SweepStore(tmp_path))
    assert t["run_id"].tolist() == ["new"] and t["hook_ms"].iloc[0] == pytest.approx(0.5)
    assert graph_mode({"config": {"engine": {"extra": {"compilation_config": {"cudagraph_mode": "FULL"}}}}}) == "FULL"
    assert graph_mode({"config": {"engine": {}}}) == DEFAULT_GRAPH_MODE
    assert graph_mode({"config": {"engine": {"extra": {"compilation_config": '{"cudagraph_mode": "PIECEWISE"}'}}}}) \
        == "PIECEWISE"
    assert graph_mode({"config": {"engine": {"enforce_eager": True}}}) == "NONE"


def _tok_per_s(store: SweepStore, rid: str) -> pd.Series:
    """Per prompt: output tokens / (last finish - first arrival) of each batch (paper batch mode)."""
    req = store.read("requests")
    r = req[req["run_id"] == rid].groupby("batch_index").agg(p=("prompt_index", "first"), n=("output_tokens", "sum"),
                                                             t0=("arrival_s", "min"), t1=("finish_s", "max"))
    return pd.Series((r["n"] / (r["t1"] - r["t0"])).to_numpy(), index=r["p"].to_numpy())


def test_graph_mode_comparison_is_ratios_of_mean_throughput_on_the_same_prompts():
    gm = graph_mode_comparison(MODES, LABELS)
    assert list(dict.fromkeys(gm["graph_mode"])) == [DEFAULT_GRAPH_MODE, "FULL"]
    assert set(gm["method_label"]) == set(LABELS) and "none" not in set(gm["method_label"])
    full, dflt = SweepStore(MODES[1]), SweepStore(MODES[0])
    bs, ds = 128, "instructcoder"
    x = _tok_per_s(full, _run(full, "ngram-k10-oracle", bs, ds))
    base = _tok_per_s(full, _run(full, "none", bs, ds))
    old = _tok_per_s(dflt, _run(dflt, "ngram-k10-oracle", bs, ds))
    row = gm[(gm["graph_mode"] == "FULL") & (gm["dataset"] == ds) & (gm["batch_size"] == bs) &
             (gm["method_label"] == "ngram-k10-oracle")].iloc[0]
    c = x.index.intersection(base.index)
    assert row["speedup"] == pytest.approx(x[c].mean() / base[c].mean())
    c = x.index.intersection(old.index)
    assert len(c) == 3 and row["vs_first"] == pytest.approx(x[c].mean() / old[c].mean())
    best = row["best_fixed"]
    y = _tok_per_s(full, _run(full, best, bs, ds))
    assert row["vs_best_fixed"] == pytest.approx(x.mean() / y.mean())
    fixed = gm[(gm["graph_mode"] == "FULL") & (gm["dataset"] == ds) & (gm["batch_size"] == bs) & (gm["replay"] == "fixed")]
    assert fixed.loc[fixed["speedup"].idxmax(), "method_label"] == best
    for col in ("speedup", "vs_first", "vs_best_fixed"):
        ok = gm[col].isna() | ((gm[f"{col}_lo"] <= gm[col] + 1e-9) & (gm[col] <= gm[f"{col}_hi"] + 1e-9))
        assert ok.all(), gm.loc[~ok, ["graph_mode", "dataset", "method_label", "batch_size", col]]
    assert gm.loc[gm["graph_mode"] == DEFAULT_GRAPH_MODE, "vs_first"].eq(1.0).all()
