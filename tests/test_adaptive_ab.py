"""The adaptive-verification A/B (sdlib.analysis.adaptive_ab): the interval's arithmetic, and notebook 06's
table recomputed from the committed session record."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sdlib.analysis import adaptive_ab as A
from sdlib.paths import FIGURES_DIR, REPO_ROOT

RECORD = "data/gpu/h200_v034_2026-12-04d.json"


def test_log_ratio_interval_is_welch_on_the_log_scale():
    a, b = np.array([10.0, 11.0, 12.0]), np.array([20.0, 22.0, 21.0])
    r, lo, hi = A.log_ratio_interval(a, b)
    assert r == pytest.approx(11 / 21)
    va, vb = a.var(ddof=1) / (3 * 11 ** 2), b.var(ddof=1) / (3 * 21 ** 2)
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    from scipy.stats import t

    half = t.ppf(0.975, df) * np.sqrt(va + vb)
    assert (lo, hi) == pytest.approx((r * np.exp(-half), r * np.exp(half)))
    assert hi < 1  # half the step time: established with three calls each
    # the same samples: ratio 1, the interval straddles it; one call: no interval
    r, lo, hi = A.log_ratio_interval(a, a[::-1])
    assert r == 1 and lo < 1 < hi
    assert np.isnan(A.log_ratio_interval(a[:1], b)[1])


def test_ratios_mark_established_only_when_the_interval_excludes_one():
    calls = pd.DataFrame({"arm": ["x"] * 3 + ["y"] * 3 + ["z"] * 3, "bs": 128, "k": 5, "drafted": 2, "adaptive": False,
                          "step_ms": [10, 11, 12, 20, 22, 21, 10.5, 12.5, 10.0]})
    r = A.ab_ratios(calls, pairs=(("x", "y"), ("x", "z"))).set_index("reference")
    assert bool(r.loc["y", "established"]) and not bool(r.loc["z", "established"])


@pytest.fixture(scope="module")
def record():
    if not (REPO_ROOT / RECORD).exists():
        pytest.skip("no committed A/B record")
    return A.read_ab_record(RECORD)


def test_the_committed_ab_has_three_arms_gaining_the_same_tokens(record):
    calls = A.ab_calls(record)
    assert set(calls.arm) == {"k5n2-adaptive", "k5n2-fixed", "k2n2-fixed"}
    assert (calls.tokens_per_row_step == 3.0).all()  # the arms differ only in what is verified
    t = A.cost_table(record)
    v = t[t.what == "verify"].sort_values("n")
    assert len(v) > 10 and v.ms.is_monotonic_increasing  # verifying more never costs less in the table


def test_notebook_06_adaptive_ab_csv_is_the_recomputation(record):
    f = FIGURES_DIR / "06_trace_replay__adaptive_ab.csv"
    if not f.exists():
        pytest.skip("run notebook 06 first")
    got = pd.read_csv(f)
    want = A.ab_ratios(A.ab_calls(record))
    for col in ("ratio", "ratio_lo", "ratio_hi", "step_ms_arm", "step_ms_reference"):
        np.testing.assert_allclose(got[col].to_numpy(float), want[col].to_numpy(float), rtol=1e-9)
    assert got["established"].tolist() == want["established"].tolist()
