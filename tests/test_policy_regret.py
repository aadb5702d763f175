"""The regret view (sdlib.sim.policy.regret): the clairvoyant rate equals a brute force over every action through
the cost model; every step's regret is >= 0 and its seconds are what the simulator charges; recording a policy's
predictions does not change its steps; the table's shares add up per cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B
from sdlib.sim.policy.regret import OUTCOMES, best_rates, recorded_steps, regret_table, step_regret
from sdlib.sim.policy.table import policy_steps_at
from sdlib.sim.policy.select import K_PRICE_MAX, PRICE_MODES
from sdlib.sim.policy.walk import EAGLE, NGRAM, NONE, PolicyInputs, position_steps, request_times
from tests.conftest import toy_cost_model
from tests.test_policies import toy_engine
from tests.test_select import tiny


def brute_rate(inp, r: int, p: int, cm, B: int) -> float:
    """Best tokens per second of one action at position ``p`` of request ``r``, each action at the least price any
    mode of :data:`PRICE_MODES` gives it at any k it allows, straight through the cost model."""
    o, P = inp.off[r], int(inp.prep.prompt_len[r])
    kv = np.array([float(B) * (P + p)])

    def t(d, l):
        best = np.inf
        for m in PRICE_MODES:
            if m.drafter != d:
                continue
            for k in {"zero": [0], "proposed": [l], "free": range(l, K_PRICE_MAX + 1)}[m.k]:
                best = min(best, float(np.asarray(cm.step_seconds(B, kv, np.array([l + 1.0]), np.array([k]), m.eagle,
                                                                  np.array([l + 1.0]), m.ngram, m.path)).ravel()[0]))
        return best

    best = 1.0 / t(NONE, 0)
    for l in range(1, int(inp.avail[o + p]) + 1):
        best = max(best, (min(l, int(inp.acc_ng[o + p]) - 1) + 1.0) / t(NGRAM, l))
    for l in range(1, inp.kmax + 1):
        best = max(best, (min(l, int(inp.acc_eg[o + p]) - 1) + 1.0) / t(EAGLE, l))
    return best


@pytest.mark.parametrize("cm_name", ["toy", "toy_engine", "authors"])
def test_best_rate_equals_brute_force_and_regret_is_not_negative(cm_name):
    cm = {"toy": toy_cost_model(), "toy_engine": toy_engine().replace(prefill=AUTHORS_H100_LLAMA8B),
          "authors": AUTHORS_H100_LLAMA8B}[cm_name]
    rng = np.random.default_rng(3)
    prep = tiny(rng, n_req=4, L=9, lmax=3)
    inp = PolicyInputs.of(prep, kmax=3)
    for B in (1, 8):
        for drafter, k in (("eagle3", 2), ("ngram", 3)):
            st = position_steps(inp, "fixed", drafter, k=k)
            r = best_rates(inp, st, cm, B)
            want = [brute_rate(inp, int(q), int(p), cm, B) for q, p in zip(st.req, st.pos)]
            np.testing.assert_allclose(r, want, rtol=1e-12)
            s = step_regret(inp, st, cm, B)
            assert (s.regret_s >= -1e-12 * s.seconds).all()
            pre = cm.prefill_seconds(float(B) * prep.prompt_len)
            per_req = np.bincount(st.req, weights=s.seconds.to_numpy(), minlength=len(prep)) + pre
            np.testing.assert_allclose(per_req, request_times(inp, st, cm, B), rtol=1e-12)
            assert set(s.outcome) <= set(OUTCOMES)


@pytest.fixture(scope="module")
def embedded():
    from sdlib.paths import resolve
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.policy.confidence import attach_confidences, load_confidences
    from sdlib.sim.policy.training import crossfit
    from sdlib.sim.prepared import prepare_traces, truncate_traces
    from sdlib.sim.traces import load_traces

    tr, k = load_traces(str(resolve("data/traces/embedded_*.jsonl.gz")))
    inp = PolicyInputs.of(truncate_traces(prepare_traces(tr, keep_tokens=True), None), k)
    attach_confidences(inp, load_confidences(str(resolve("data/traces/confidences/embedded_*.jsonl.gz"))))
    return inp, crossfit(inp), [(load_cost_model("h200_replay_engine"), b) for b in (1, 32)]


def test_recording_keeps_the_steps_and_predicts_probabilities(embedded):
    inp, pred, cfg = embedded
    names = ["online", "online-with-confidence", "online-with-agreement"]
    for name in names:
        plain = policy_steps_at(inp, name, cfg, pred)  # the registered build, nothing recorded
        recorded, preds = recorded_steps(inp, pred, name, cfg)
        for a, b, p in zip(plain, recorded, preds):
            for f in ("req", "pos", "n_i", "drafter", "gain", "eagle_n"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
            assert p.size == a.req.size
            drafted = a.n_i > 1  # nothing drafted: no SD, or a confidence stop at 0 (drafter EAGLE-3)
            assert np.isnan(p[~drafted]).all()
            assert ((p[drafted] >= 0) & (p[drafted] <= 1)).all()


def test_table_adds_up(embedded):
    inp, pred, cfg = embedded
    names = ["online-with-agreement", "online-with-confidence"]
    tab = regret_table(inp, pred, names, cfg)
    assert set(tab.policy) == set(names) and set(tab.batch_size) == {1, 32}
    cell = ["cost_model", "dataset", "batch_size", "policy"]
    np.testing.assert_allclose(tab.groupby(cell).share_of_regret.sum(), 1.0, rtol=1e-9)
    assert (tab.regret_s >= 0).all() and (tab.regret_s <= tab.seconds).all()
    assert ((tab.cell_regret_share > 0) & (tab.cell_regret_share < 1)).all()
    # the steps are the policy's own: as many as the simulator's table counts
    from sdlib.sim.policy.table import simulate_policies

    per = simulate_policies(inp.prep, names, [1, 32], [cfg[0][0]], predictor=pred, kmax=inp.kmax,
                            confidences=None)
    want = per.groupby(["policy", "batch_size", "dataset"]).num_steps.sum()
    got = tab.groupby(["policy", "batch_size", "dataset"]).steps.sum()
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False, check_dtype=False)
    # accepted_first is the share of drafted steps whose first draft was accepted
    d = tab[tab.outcome == "first rejected"]
    assert (d.accepted_first == 0).all()
    assert (tab[tab.outcome.isin(["partial", "whole"])].accepted_first == 1).all()


def test_a_policy_that_does_not_say_what_it_predicted_is_refused(embedded):
    inp, pred, cfg = embedded
    with pytest.raises(ValueError, match="does not say what it predicted"):
        recorded_steps(inp, pred, "online-confidence", cfg)
    with pytest.raises(ValueError, match="takes no recorder"):
        recorded_steps(inp, pred, "fixed-eagle3-k3", cfg)


def test_first_draft_calibration_pools_drafted_steps():
    from sdlib.sim.policy.regret import first_draft_calibration

    tab = pd.DataFrame({"cost_model": "m", "dataset": "d", "batch_size": 8, "policy": "p",
                        "drafter": ["ngram", "ngram", "ngram", "eagle3"],
                        "outcome": ["first rejected", "whole", "no draft", "partial"], "steps": [1, 3, 5, 2],
                        "predicted_first": [0.9, 0.7, np.nan, 0.5], "accepted_first": [0.0, 1.0, np.nan, 1.0]})
    c = first_draft_calibration(tab).set_index("drafter")
    assert c.loc["ngram", "steps"] == 4 and c.loc["ngram", "predicted_first"] == pytest.approx((0.9 + 2.1) / 4)
    assert c.loc["ngram", "accepted_first"] == pytest.approx(0.75) and c.loc["eagle3", "accepted_first"] == 1.0
