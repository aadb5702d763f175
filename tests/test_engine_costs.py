"""sdlib.sim.engine_costs: the fit to the committed H200 replay reproduces every measured cell's median step,
and the committed JSON is that fit."""

import numpy as np
import pytest

from sdlib.paths import SWEEPS_DIR
from sdlib.sim.costmodels import load_cost_model
from sdlib.sim.engine_costs import ENGINE_COST_MODEL_FILE, EngineCostModel, fit_engine_cost_model, measured_vs_model

SWEEP = SWEEPS_DIR / "h200_replay"
needs_sweep = pytest.mark.skipif(not (SWEEP / "engine_steps").exists(), reason="h200_replay sweep not present")


@needs_sweep
def test_fit_reproduces_measured_cells():
    ecm = fit_engine_cost_model(SWEEP)
    mv = measured_vs_model(ecm, SWEEP)
    assert set(mv.path) == {"none", "padded", "ragged"} and len(mv) == 32
    # medians of the model at each step's kv / n vs the measured median: within 5% in every cell
    assert np.all(np.abs(mv.model_ms / mv.measured_ms - 1) < 0.05)
    # the price of k on the padded path grows with k at every batch size
    for B in ecm.batch_sizes:
        a = ecm.alpha("padded", np.array([0, 1, 3, 5, 10]), B)
        assert np.all(np.diff(a) > 0)


@needs_sweep
def test_committed_model_is_the_fit():
    committed = load_cost_model(ENGINE_COST_MODEL_FILE)
    fit = fit_engine_cost_model(SWEEP, name=committed.name)
    for path in ("none", "padded", "ragged"):
        np.testing.assert_allclose(committed.alpha_s[path], fit.alpha_s[path])
    assert isinstance(committed, EngineCostModel) and committed.a_kv_s == pytest.approx(fit.a_kv_s)


def test_beyond_the_largest_measured_k_or_b_a_step_never_gets_cheaper():
    """The n-gram path's committed fit falls from k = 5 to 10 at bs 8-128: extrapolating that line priced
    k = 20 below k = 10 (and, far enough, below zero). Beyond the last measured point the price is held."""
    import numpy as np

    from sdlib.sim.costmodels import load_cost_model

    cm = load_cost_model("h200_replay_engine")
    for path in ("ragged", "padded"):
        kmax = max(cm.ks[path])
        for B in (1, 8, 32, 128, 512):
            a = cm.alpha(path, np.array([kmax, kmax + 2, 2 * kmax, 10 * kmax], dtype=float), B)
            assert np.all(np.diff(a) >= 0), (path, B, a)
