"""Notebook 06's computations on hand-made tables (and notebook 01's step costs on a committed sweep): batch throughput, paired speedups and their intervals,
the calibration pairing, hiccup batches, the engine-step fits and the refit prediction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sdlib.analysis.replay import (batch_throughput, calibration_table, harness_hiccups, measured_stack, method_info,
                                   paired_speedups, sim_vs_measured, simulator_labels, step_costs)
from sdlib.paths import REPO_ROOT
from sdlib.sim.policy.baselines import DYNAMIC_SD_SCHEDULE, dynamic_sd_k
from sdlib.sim.prepared import prepare_traces
from sdlib.sim.replay import replay_plans
from sdlib.sim.prepared import truncate_traces
from sdlib.sim.replay_costs import StepFit, fit_engine_steps, refit_speedups
from sdlib.store import SweepStore

PROV = {"config": {"methods": [
    {"name": "none", "label": "none"},
    {"name": "eagle3", "num_spec_tokens": 3, "label": "eagle3-k3-fixed", "replay": "fixed"},
    {"name": "eagle3", "num_spec_tokens": 3, "label": "eagle3-k3-combine", "replay": "combine"},
    {"name": "eagle3", "num_spec_tokens": 3, "label": "eagle3-k3-accept_all", "replay": "accept_all"},
    {"name": "eagle3", "num_spec_tokens": 3, "label": "syn4", "options": {"synthetic_acceptance_length": 4.0}},
    {"name": "ngram", "num_spec_tokens": 5, "label": "ngram-k5-oracle", "replay": "oracle"}]}}


def _tables(rates: dict[str, list[float]], bs: int = 2):
    """runs + requests: each label runs prompts 0..n-1 as batches of ``bs`` copies; batch b of label ``lab``
    takes 10 * bs tokens in 10 * bs / rate seconds."""
    runs, req = [], []
    for lab, rs in rates.items():
        rid = f"run-{lab}"
        runs.append({"run_id": rid, "dataset": "d", "method": lab.split("-")[0], "method_label": lab,
                     "num_spec_tokens": 3, "batch_size": bs})
        t = 0.0
        for b, rate in enumerate(rs):
            dur = 10 * bs / rate
            for c in range(bs):
                req.append({"run_id": rid, "batch_index": b, "prompt_index": b, "output_tokens": 10,
                            "arrival_s": t, "finish_s": t + dur})
            t += dur
    return pd.DataFrame(runs), pd.DataFrame(req)


def test_batch_throughput_and_paired_speedup_with_interval():
    runs, req = _tables({"none": [100.0, 200.0, 100.0], "eagle3-k3-fixed": [150.0, 300.0, 150.0]})
    b = batch_throughput(runs, req)
    assert sorted(b[b.method_label == "none"]["tok_per_s"].round(6)) == [100.0, 100.0, 200.0]
    sp = paired_speedups(b, method_info(PROV))
    row = sp[sp.method_label == "eagle3-k3-fixed"].iloc[0]
    assert row.speedup == pytest.approx(1.5) and row.n_prompts == 3
    assert row.speedup_lo == pytest.approx(1.5) and row.speedup_hi == pytest.approx(1.5)  # every pair is 1.5
    assert row.replay == "fixed" and row.K == 3 and row.engine == "eagle3-k3"


def test_interval_widens_with_spread_and_covers_the_ratio():
    runs, req = _tables({"none": [100.0] * 6, "eagle3-k3-fixed": [100.0, 200.0, 120.0, 180.0, 140.0, 160.0]})
    row = paired_speedups(batch_throughput(runs, req), method_info(PROV)).set_index("method_label").loc[
        "eagle3-k3-fixed"]
    assert row.speedup == pytest.approx(1.5)
    assert row.speedup_lo < 1.5 < row.speedup_hi and row.speedup_hi - row.speedup_lo > 0.1


def test_calibration_pairs_replay_with_synthetic():
    runs, req = _tables({"eagle3-k3-accept_all": [400.0, 410.0], "syn4": [402.0, 400.0]})
    cal = calibration_table(batch_throughput(runs, req), method_info(PROV))
    assert len(cal) == 1 and cal.iloc[0].synthetic == "syn4" and cal.iloc[0].synthetic_L == 4
    assert cal.iloc[0].ratio == pytest.approx(810 / 802) and bool(cal.iloc[0].within_3pct)


def test_hiccup_batches_are_found_and_left_out():
    runs, req = _tables({"none": [100.0, 100.0]})
    es = pd.DataFrame({"run_id": "run-none", "start_s": [0.01, 0.05, 0.1, 0.25, 0.3],
                       "duration_s": [0.01, 0.01, 0.01, 0.9, 0.01]})
    h = harness_hiccups(req, es)
    assert h[["run_id", "batch_index"]].values.tolist() == [["run-none", 1]]  # 0.25 s lies in batch 1
    assert len(batch_throughput(runs, req, exclude=h)) == 1


def test_measured_stack_and_errors():
    sp = pd.DataFrame({"dataset": "d", "batch_size": 1, "method_label": ["eagle3-k3-fixed", "eagle3-k3-combine",
                                                                          "ngram-k5-oracle"],
                       "speedup": [1.5, 1.8, 1.2], "speedup_lo": [1.4, 1.6, 1.0], "speedup_hi": [1.6, 2.0, 1.4]})
    sp = sp.merge(method_info(PROV), on="method_label")
    st = measured_stack(sp).iloc[0]
    assert st.best_fixed == 1.5 and st.best_oracle == 1.2 and st.combine_oracle == 1.8
    assert st.oracle_gain == 0 and st.combine_gain == pytest.approx(0.3) and st.combine_oracle_lo == 1.6
    pred = pd.DataFrame([{"dataset": "d", "batch_size": 1, "method_label": "eagle3-k3-fixed", "cost_model": "m",
                          "variant": "ragged", "speedup_sim": 1.8}])
    cmp_ = sim_vs_measured(simulator_labels(sp), pred)
    assert cmp_.iloc[0].error == pytest.approx(0.2) and not cmp_.iloc[0].inside_ci
    assert cmp_.iloc[0].predictor == "m, ragged" and cmp_.iloc[0].predict_method == "FIXED_3"


def test_engine_step_fit_recovers_a_linear_model():
    rng = np.random.default_rng(0)
    kv, n = rng.uniform(100, 5000, 200), rng.integers(1, 500, 200)
    es = pd.DataFrame({"run_id": "r", "num_context_tokens": kv, "num_scheduled_tokens": n, "num_running": 1,
                       "duration_s": 0.004 + 2e-7 * kv + 3e-5 * n})
    runs = pd.DataFrame({"run_id": ["r"], "method_label": ["eagle3-k3-fixed"]})
    f = fit_engine_steps(runs, es, method_info(PROV))["eagle3-k3"]
    assert f.fixed_s == pytest.approx(0.004) and f.kv_s == pytest.approx(2e-7) and f.n_s == pytest.approx(3e-5)
    assert f.r2_all == pytest.approx(1.0) and f.inlier_share == 1.0


def test_refit_with_a_fixed_step_cost_is_tokens_per_step():
    rows = [{"dataset": "d", "request_id": "r0", "prompt_token_ids": [1, 2, 3], "output_token_ids": list(range(10)),
             "method": m, "acc_len": [1, 3, 2, 1, 2, 2, 2, 2, 2, 1]} for m in ("ngram", "eagle3")]
    prep = truncate_traces(prepare_traces(pd.DataFrame(rows), keep_tokens=True), None)
    info = method_info(PROV)
    fits = {e: StepFit(e, 0.01, 0.0, 0.0, 1, 1.0, 1.0, 1.0) for e in ("none", "eagle3-k3")}
    out = refit_speedups({"d": prep}, info[info.method_label == "eagle3-k3-fixed"], fits, [1, 4])
    (plan,) = replay_plans(prep, "eagle3", "fixed", 3)
    # every step (and the prefill) costs the same: speedup = (L - 1 + 1) / (steps + 1)
    assert out["speedup_sim"].tolist() == pytest.approx([10 / (plan.pos.size + 1)] * 2)


def test_per_position_rates_by_hand():
    from sdlib.sim.closed_form import per_position_rates

    rows = [{"dataset": "d", "request_id": "r0", "prompt_token_ids": [1, 2, 3], "output_token_ids": list(range(10, 16)),
             "method": m, "acc_len": a} for m, a in (("ngram", [1, 1, 1, 1, 1, 1]), ("eagle3", [1, 4, 2, 1, 3, 1]))]
    prep = prepare_traces(pd.DataFrame(rows))
    # decode positions 1..5 gain 4, 2, 1, 3, 1: at least 1 accepted in 3 of 5, at least 2 in 2, at least 3 in 1
    assert per_position_rates(prep, "eagle3", 3) == pytest.approx([0.6, 0.4, 0.2])
    with pytest.raises(ValueError, match="no ngram steps"):
        per_position_rates(prep, "ngram", 3)  # the look-up never proposes here


def test_dynamic_sd_verified_what_its_schedule_says_around_the_threshold_and_notebook_01_shows_it():
    """The committed H200 run of vLLM 0.34's Dynamic SD (configs/h200_v034_dynamic_sd.yaml): on its engine a row
    verified the K the schedule gives for the batch size (3 below the threshold, 2 from bs 64), on the fixed
    engine K = 3 throughout; notebook 01's step_costs table is this computation."""
    store = SweepStore(REPO_ROOT / "data/sweeps/h200_v034_dynamic_sd")
    costs = step_costs(store.read("runs"), store.read("engine_steps"), method_info(store.read_provenance()),
                       verified=True)
    schedule = next(m["options"]["num_speculative_tokens_per_batch_size"]
                    for m in store.read_provenance()["config"]["methods"] if m["label"] == "eagle3-k3-L2.5-dynamic")
    assert [tuple(x) for x in schedule] == [tuple(x) for x in DYNAMIC_SD_SCHEDULE]
    for row in costs.itertuples():
        want = {"none": 0, "eagle3-k3-L2.5": 3, "eagle3-k3-L2.5-dynamic": dynamic_sd_k(row.batch_size)}
        assert row.verified_per_row == want[row.method_label], row
    assert set(costs.loc[costs.method_label == "eagle3-k3-L2.5-dynamic", "verified_per_row"]) == {2, 3}
    csv = pd.read_csv(REPO_ROOT / "figures/01_throughput_sweep__step_costs__sweep=h200_v034_dynamic_sd.csv")
    pd.testing.assert_frame_equal(csv, costs.drop(columns=["replay"]).reset_index(drop=True), check_dtype=False)


def test_trace_cells_take_instance_labels_and_leave_out_twins():
    """A replay named by an instance label (``fixed-eagle3-k5``, as the powered configs name their fixed arms)
    is a fixed cell the simulator can price; an A/A twin (the same plan) and a policy it cannot price are not."""
    from sdlib.sim.replay_costs import trace_cells

    info = pd.DataFrame({"method_label": ["none", "eagle3-k5-fixed-eagle3-k5", "eagle3-k5-combine",
                                          "eagle3-k5-fixed-eagle3-k5-AA", "eagle3-k10-online", "eagle3-k5-fixed"],
                         "method": ["none", "eagle3", "eagle3", "eagle3", "eagle3", "eagle3"],
                         "K": [0, 5, 5, 5, 10, 5],
                         "replay": [None, "fixed-eagle3-k5", "combine", "fixed-eagle3-k5", "online", "fixed"],
                         "aa_of": [None, None, None, "eagle3-k5-fixed-eagle3-k5", None, None]})
    assert list(trace_cells(info)["method_label"]) == ["eagle3-k5-fixed-eagle3-k5", "eagle3-k5-combine",
                                                       "eagle3-k5-fixed"]


def test_powered_vs_simulated_pairs_the_headline_with_each_prediction():
    from sdlib.analysis.powered import powered_vs_simulated

    head = pd.DataFrame([{"dataset": "d", "batch_size": 1, "arm": "c", "best_fixed": "f", "ratio": 1.2,
                          "ratio_lo": 1.1, "ratio_hi": 1.3, "established": True, "n_prompts": 32, "n_starts": 2,
                          "n_cells": 4},
                         {"dataset": "d", "batch_size": 1, "arm": "online", "best_fixed": "f", "ratio": 1.0,
                          "ratio_lo": 0.9, "ratio_hi": 1.1, "established": False, "n_prompts": 32, "n_starts": 2,
                          "n_cells": 4}])
    pg = pd.DataFrame([{"dataset": "d", "batch_size": 1, "arm": "Oracle Combine", "arm_label": "c",
                        "predictor": p, "best_fixed_label": "f", "simulated": s, "fixed_overprediction": 0.2,
                        "measured": 9.0} for p, s in (("m1, ragged", 1.5), ("engine refit", 1.2))])
    out = powered_vs_simulated(head, pg)
    assert list(out["predictor"]) == ["m1, ragged", "engine refit"]  # the online arm has no prediction
    assert np.allclose(out["sim_over_measured"], [1.25, 1.0]) and out["same_fixed"].all()
    assert np.allclose(out["ratio"], 1.2)  # the powered ratio, not paired_gains' prompt-only one
    assert powered_vs_simulated(head, pg.iloc[:0]).empty
