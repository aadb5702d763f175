import numpy as np
import pandas as pd
import pytest

from sdlib.sim.costfit import fit_joint


def test_joint_fit_recovers_known_coefficients():
    # steps generated from T = 2e-7*kv + 1.5e-5*n + 4e-3, drafting 7e-8*kv + 1.3e-3 on SD steps
    rng = np.random.default_rng(0)
    rows = []
    for sd in (0, 1):
        for b in (1, 8, 32, 128):
            kv = b * rng.uniform(100, 400, 50)
            n = b * (4 if sd else 1) + rng.integers(0, 3, 50)
            y = 2e-7 * kv + 1.5e-5 * n + 4e-3 + sd * (7e-8 * kv + 1.3e-3)
            rows.append(pd.DataFrame({"num_context_tokens": kv, "num_scheduled_tokens": n, "duration_s": y, "sd": sd}))
    d = pd.concat(rows)
    coef, meta = fit_joint(d[d.sd == 0], d[d.sd == 1])
    assert coef == pytest.approx([2e-7, 1.5e-5, 4e-3, 7e-8, 1.3e-3], rel=1e-6)
    assert meta["r2_all"] == pytest.approx(1.0) and meta["inlier_share"] == 1.0


def test_r2_over_all_steps_is_reported_beside_the_inliers():
    from sdlib.sim.costmodel import fit_summary

    rng = np.random.default_rng(2)
    kv = rng.uniform(1e3, 1e5, 200)
    n = rng.integers(1, 64, 200).astype(float)
    y = 2e-7 * kv + 1.5e-5 * n + 4e-3 + rng.normal(0, 1e-5, 200)
    y[:10] += 0.05  # ten hiccups the robust refit drops
    d = pd.DataFrame({"num_context_tokens": kv, "num_scheduled_tokens": n, "duration_s": y})
    coef, meta = fit_joint(d.iloc[:100], d.iloc[100:])
    assert meta["n_steps"] == 200 and meta["n_dropped"] == 10 and meta["inlier_share"] == pytest.approx(0.95)
    assert meta["r2_inliers"] > 0.99 > meta["r2_all"]  # the outliers stay in the all-steps R^2
    assert meta["rms_residual_all_s"] > meta["rms_residual_inliers_s"]
    s = fit_summary(meta)
    assert "over all 200 steps" in s and "95% inliers" in s


def test_committed_cost_models_are_what_make_costmodels_writes():
    """data/costmodels/*.json: each listed in COMMITTED_FITS, names its producer, and refits to the same numbers."""
    from sdlib.paths import REPO_ROOT
    from sdlib.sim.costfit import COMMITTED_ENGINE_FITS, COMMITTED_FITS, fit_sweep_cost_model
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.engine_costs import fit_engine_cost_model

    files = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "data" / "costmodels").glob("*.json"))
    assert files == sorted([*COMMITTED_FITS, *COMMITTED_ENGINE_FITS])
    for out, sweep in COMMITTED_ENGINE_FITS.items():
        saved = load_cost_model(REPO_ROOT / out)
        assert saved.meta["producer"].startswith("make costmodels")
        fresh = fit_engine_cost_model(sweep, saved.name)
        assert saved.alpha_s == fresh.alpha_s and saved.a_kv_s == pytest.approx(fresh.a_kv_s, rel=1e-12)
        assert saved.meta["steps_per_cell"] == fresh.meta["steps_per_cell"]
    for out, (sweep, method) in COMMITTED_FITS.items():
        saved = load_cost_model(REPO_ROOT / out)
        assert saved.meta["producer"].startswith("make costmodels")
        fresh = fit_sweep_cost_model(sweep, saved.name, eagle_method=method)
        for f in ("target_kv_s", "target_n_s", "target_fixed_s", "eagle_kv_s", "eagle_fixed_s"):
            assert getattr(saved, f) == pytest.approx(getattr(fresh, f), rel=1e-9), f
        assert saved.meta["r2_all"] == pytest.approx(fresh.meta["r2_all"], rel=1e-9)
