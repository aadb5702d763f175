"""sdlib.sim.costmodel: the authors' numbers, composition of a step, JSON round trip, fitting."""

import numpy as np
import pandas as pd
import pytest

from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B as A, CostModel, fit_cost_model
from sdlib.sim.costmodels import load_cost_model

TOY = CostModel(name="toy", target_kv_s=0.01, target_n_s=0.1, target_fixed_s=1.0, eagle_kv_s=0.001,
                eagle_n_s=0.02, eagle_fixed_s=0.5, ngram_frac=0.1, overhead_s=0.05)


def test_authors_coefficients_and_verify_time():
    # PAPER.md / simulator@2fdccbd predictor.py
    assert A.target_kv_s == 3.92645679e-08 and A.target_n_s == 2.10103129e-05
    assert A.target_fixed_s == 5.88590713e-03 and A.overhead_s == 1.20683946e-03
    assert A.ngram_frac == 0.005875
    t = A.verify_time(1000, 4)
    assert t == pytest.approx(1000 * 3.92645679e-08 + 4 * 2.10103129e-05 + 5.88590713e-03)
    assert A.prefill_time(500) == pytest.approx(A.verify_time(0, 500))


def test_draft_and_step_time_by_hand():
    # T(kv=10, n=4) = 0.1 + 0.4 + 1 = 1.5
    assert TOY.verify_time(10, 4) == pytest.approx(1.5)
    # EAGLE: 0.001*10 + 0.02*4 + 0.5 = 0.59
    assert TOY.draft_time("eagle3", 10, 4) == pytest.approx(0.59)
    assert TOY.draft_time("ngram", 10, 4, n=4) == pytest.approx(0.15)
    assert TOY.draft_time("ngram+eagle3", 10, 4, n=4) == pytest.approx(0.74)
    assert TOY.draft_time("none", 10, 4) == 0
    # step at bs 2: n = 8, n_i = 4: T = 0.1 + 0.8 + 1 = 1.9; EAGLE 0.59; overhead 0.05
    assert TOY.step_time("eagle3", 10, 8, n_i=4) == pytest.approx(1.9 + 0.59 + 0.05)
    assert TOY.step_time("ngram", 10, 8, n_i=4) == pytest.approx(1.9 * 1.1 + 0.05)
    # vectorised
    np.testing.assert_allclose(TOY.verify_time(np.array([0, 10]), np.array([1, 4])), [1.1, 1.5])
    with pytest.raises(ValueError):
        TOY.draft_time("medusa", 1, 1)


def test_draft_cost_ratio():
    assert A.draft_cost_ratio("ngram", k=4) == pytest.approx(0.005875 / 4)
    # TOY, EAGLE, bs 1, kv 0, k 2: draft = 0.02*3 + 0.5 = 0.56, T(0, 1) = 1.1
    assert TOY.draft_cost_ratio("eagle3", k=2) == pytest.approx(0.56 / (2 * 1.1))


def test_json_round_trip(tmp_path):
    assert CostModel.from_dict(A.to_dict()) == A
    p = A.save(tmp_path / "cm" / "a.json")
    assert load_cost_model(p) == A and load_cost_model("authors_h100_llama8b") is A
    with pytest.raises(KeyError):
        CostModel.from_dict({**A.to_dict(), "bogus": 1})


def _synthetic_steps(rng, n=400, a_kv=4e-8, a_n=2e-5, c=7e-3, noise=5e-5):
    kv = rng.integers(100, 200_000, n)
    running = rng.integers(1, 129, n)
    y = a_kv * kv + a_n * running + c + rng.normal(0, noise, n)
    return pd.DataFrame({"duration_s": y, "num_new_tokens": running, "num_context_tokens": kv,
                         "num_running": running, "in_window": True})


def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    df = _synthetic_steps(rng)
    df.loc[:4, "duration_s"] += 0.5  # prefill-like outliers, dropped by the robust refit
    m = fit_cost_model(df, name="synthetic")
    assert m.target_kv_s == pytest.approx(4e-8, rel=0.02)
    assert m.target_n_s == pytest.approx(2e-5, rel=0.03)
    assert m.target_fixed_s == pytest.approx(7e-3, rel=0.01)
    assert m.meta["n_dropped"] >= 5 and m.meta["r2_inliers"] > 0.99 and m.meta["r2_all"] < m.meta["r2_inliers"]
    assert m.eagle_fixed_s == A.eagle_fixed_s  # drafting copied from the base model
    # known overhead subtracted
    m2 = fit_cost_model(df, name="s2", overhead_s=1e-3)
    assert m2.target_fixed_s == pytest.approx(6e-3, rel=0.02) and m2.overhead_s == 1e-3


def test_fit_tokens_per_request():
    # SD steps with k=3: the target sees running*(k+1) tokens, output tokens differ
    rng = np.random.default_rng(1)
    df = _synthetic_steps(rng, noise=0.0)
    df["duration_s"] = 4e-8 * df.num_context_tokens + 2e-5 * 4 * df.num_running + 7e-3
    df["num_new_tokens"] = df.num_running * 2
    m = fit_cost_model(df, name="sd", tokens_per_request=4, robust=False)
    assert m.target_n_s == pytest.approx(2e-5) and m.target_kv_s == pytest.approx(4e-8)
