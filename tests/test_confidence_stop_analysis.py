"""The confidence-stop sweep's per-arm measures (sdlib.analysis.confidence_stop) on a synthetic steps table whose
answers are worked out by hand."""

from __future__ import annotations

import pandas as pd

from sdlib.analysis.confidence_stop import arm_measures, prefix_agreement, step_units


def _tables():
    runs = pd.DataFrame({"run_id": ["a", "b"], "dataset": "d", "batch_size": 1, "method_label": ["k5", "cut"],
                         "engine_start": 0, "repeat": 0})
    steps = pd.DataFrame({
        "run_id": ["a"] * 4 + ["b"] * 4, "request_id": ["r1", "r1", "r2", "r2"] * 2, "step": [0, 1, 0, 1] * 2,
        "drafted": [5, 5, 5, 5, 2, 3, 1, 2], "accepted": [2, 5, 1, 0, 2, 3, 1, 0]})
    return runs, steps


def test_arm_measures_by_hand():
    runs, steps = _tables()
    req = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "request_id": ["r1", "r2"] * 2, "prompt_index": [0, 1] * 2})
    m = arm_measures(runs, req, steps, n_boot=200).set_index("method_label")
    assert m.loc["k5", "drafted_per_step"] == 5.0 and m.loc["cut", "drafted_per_step"] == 2.0
    assert m.loc["k5", "acceptance_rate"] == 8 / 20 and m.loc["cut", "acceptance_rate"] == 6 / 8
    assert m.loc["k5", "tokens_per_step"] == 1 + 8 / 4 and m.loc["cut", "tokens_per_step"] == 1 + 6 / 4
    assert (m["n_prompts"] == 2).all()


def test_step_units_count_steps_per_second():
    runs, _ = _tables()
    req = pd.DataFrame({"run_id": ["a", "b"], "prompt_index": [0, 0], "output_tokens": [30, 30],
                        "num_steps": [4, 8], "first_token_s": [0.0, 0.0], "finish_s": [2.0, 2.0]})
    u = step_units(runs, req).set_index("method_label")
    assert u.loc["k5", "rate"] == 2.0 and u.loc["cut", "rate"] == 4.0


def test_prefix_agreement_by_hand():
    runs = pd.DataFrame({"run_id": ["a", "b"], "dataset": "d", "batch_size": 1, "method_label": ["k5", "cut"],
                         "engine_start": 0, "repeat": 0})
    req = pd.DataFrame({"run_id": ["a", "b"], "request_id": ["r", "r"], "prompt_index": [0, 0]})
    steps = pd.DataFrame({"run_id": ["a", "a", "b", "b", "b"], "request_id": "r", "step": [0, 1, 0, 1, 2],
                          "position": [1, 4, 1, 3, 4], "drafted": [5, 5, 2, 2, 5], "accepted": [2, 5, 2, 0, 4]})
    # position 1: min(2, 2) = 2 agrees; position 4: min(5, 5) = 5, the cut arm accepted 4: disagrees; 3: unpaired
    p = prefix_agreement(runs, req, steps, reference="k5")
    assert p.to_dict("records") == [{"arm": "cut", "reference": "k5", "n_steps": 2, "agree": 0.5}]


def test_notebook_07_confidence_stop_tables_are_the_recomputation():
    """Notebook 07's CPU real-drafting section: its CSVs are cut_tables of the committed sweep, and what they
    say holds: every cut arm verifies fewer drafts per step than fixed k = 5 (interval clear of k = 5), the
    h = 1 control verifies exactly k, and no row is called established inside the A/A drift."""
    import numpy as np
    import pytest

    from sdlib.analysis.confidence_stop import cut_tables
    from sdlib.paths import FIGURES_DIR, REPO_ROOT

    sweep = REPO_ROOT / "data" / "sweeps" / "embedded_confidence_stop"
    f = FIGURES_DIR / "07_online_policy__confidence_stop_ratios.csv"
    if not (sweep.exists() and f.exists()):
        pytest.skip("no committed confidence-stop sweep or notebook 07 not run")
    t = cut_tables(sweep)
    got = pd.read_csv(f)
    key = ["measure", "batch_size", "arm", "reference"]
    m = got.merge(t["ratios"], on=key, suffixes=("", "_want"))
    assert len(m) == len(got) == len(t["ratios"]) > 0
    for col in ("ratio", "ratio_lo", "ratio_hi", "aa_drift"):
        np.testing.assert_allclose(m[col], m[f"{col}_want"], rtol=1e-9)
    assert (m["established"] == m["established_want"]).all()
    est = got[got.established]
    assert ((est.ratio_lo > 1 + est.aa_drift) | (est.ratio_hi < 1 - est.aa_drift)).all()
    arms = pd.read_csv(FIGURES_DIR / "07_online_policy__confidence_stop_arms.csv")
    cut = arms[arms.method_label.str.contains("-conf0")]
    assert len(cut) and (cut.drafted_per_step_hi < 5).all()
    assert (arms.loc[arms.method_label.str.endswith("-conf1"), "drafted_per_step"] == 5).all()
