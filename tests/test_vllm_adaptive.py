"""sdlib.sim.policy.vllm_adaptive (vLLM 0.34's adaptive verification): the estimator's Newton step against
numbers worked out by hand and against a dense solve, the top-B slot admission and the budget's argmax on
hand cases, the policy's steps on hand-made traces, and the policy on the embedded traces with their
confidences at every batch size under both cost models, below the oracle bounds."""

from __future__ import annotations

import numpy as np
import pytest

from sdlib.sim.policy.vllm_adaptive import (INIT_BIAS, INIT_SLOPE, L2, MAX_LOG_ODDS, NAME, REFIT_INTERVAL, Estimator,
                                            adaptive_steps, admit_drafts, choose_budget, copies_budget, cost_table,
                                            log_odds, refit)
from tests.conftest import toy_cost_model, toy_traces

DATASETS = ("sharegpt", "code_edit")


def test_log_odds_is_clamped():
    np.testing.assert_allclose(log_odds([0.5, 0.8, 0.0, 1.0]), [0.0, np.log(4.0), -MAX_LOG_ODDS, MAX_LOG_ODDS])


def test_refit_is_the_hand_computed_newton_step():
    # one position; two observations at p = 0.5 (IRLS weight 0.25): f = 2 accepted, f = 0 rejected.
    # a = 0.25*4 + 1e-3 = 1.001, b = 0.25*2 = 0.5, c = 0.25*2 + 1e-3 = 0.501, g0 = 0.5*2 = 1, g1 = 0.5 - 0.5 = 0
    # dw = (1 - 0.5*0/0.501) / (1.001 - 0.25/0.501) = 1.9920398, damped by n/(n+50) = 2/52 -> 0.0766169
    # db = (0 - 0.5*0.0766169) / 0.501 * 2/52 = -0.0029409
    est = Estimator.fresh(1, 1)
    lane = np.array([0])
    est.accumulate(lane, np.array([[2.0]]), np.array([[0.5]]), np.array([1]), np.array([1]))
    est.accumulate(lane, np.array([[0.0]]), np.array([[0.5]]), np.array([0]), np.array([1]))
    np.testing.assert_allclose(est.info[0, 0], [1.0, 0.5, 0.5])
    np.testing.assert_allclose(est.grad[0, 0], [1.0, 0.0])
    assert est.counts[0, 0] == 2
    dw = 1.0 / (1.001 - 0.25 / 0.501) * 2 / 52
    db = -0.5 * dw / 0.501 * 2 / 52
    assert dw == pytest.approx(0.0766169, abs=1e-7) and db == pytest.approx(-0.0029409, abs=1e-7)
    # nothing moves before the 100th step; then the step above, and the round's statistics are cleared
    for _ in range(REFIT_INTERVAL - 1):
        est.step(lane)
    assert est.slope[0] == INIT_SLOPE and est.intercepts[0, 0] == INIT_BIAS
    est.step(lane)
    assert est.slope[0] == pytest.approx(INIT_SLOPE + dw, rel=1e-12)
    assert est.intercepts[0, 0] == pytest.approx(INIT_BIAS + db, rel=1e-12)
    assert not est.info.any() and not est.grad.any() and not est.counts.any() and est.since[0] == 0


def test_refit_without_damping_is_the_dense_ridge_newton_solve():
    rng = np.random.default_rng(0)
    K, n = 3, 40
    f = rng.normal(0, 2, n)
    pos = rng.integers(0, K, n)
    p = rng.uniform(0.1, 0.9, n)
    y = (rng.uniform(size=n) < 0.6).astype(float)
    X = np.column_stack([f, np.eye(K)[pos]])
    w = p * (1 - p)
    H = X.T @ (w[:, None] * X) + L2 * np.eye(K + 1)
    d = np.linalg.solve(H, X.T @ (y - p))
    info = np.zeros((1, K, 3))
    grad = np.zeros((1, K, 2))
    counts = np.zeros((1, K))
    for fi, j, wi, ri in zip(f, pos, w, y - p):
        info[0, j] += [wi * fi * fi, wi * fi, wi]
        grad[0, j] += [ri * fi, ri]
        counts[0, j] += 1
    slope, icpt = refit(np.array([1.0]), np.zeros((1, K)), info, grad, counts, damping=0.0)
    np.testing.assert_allclose(np.concatenate([slope - 1.0, icpt[0]]), d, rtol=1e-10)


def test_a_step_that_would_make_the_slope_negative_is_dropped():
    # confident drafts rejected, unconfident accepted (1000 rows each): the Newton step on w is negative and
    # large; w stays at 0.5 and the intercept takes its step with dw = 0: db = g1 / c * n/(n+50)
    est = Estimator.fresh(1, 1)
    lane = np.array([0])
    est.accumulate(lane, np.array([[4.0]]), np.array([[0.5]]), np.array([0]), np.array([1]), rows=1000)
    est.accumulate(lane, np.array([[0.0]]), np.array([[0.5]]), np.array([1]), np.array([1]), rows=1000)
    g1, c = 0.0, 500.0 + L2  # residuals -0.5*1000 + 0.5*1000; weights 0.25*2000
    slope, icpt = refit(est.slope, est.intercepts, est.info, est.grad, est.counts)
    assert slope[0] == INIT_SLOPE and icpt[0, 0] == pytest.approx(INIT_BIAS + g1 / c * 2000 / 2050)
    # the undamped step would have driven it below 0
    free, _ = refit(np.array([10.0]), est.intercepts, est.info, est.grad, est.counts)
    assert free[0] < 10.0 - INIT_SLOPE


def test_labels_are_the_accepted_drafts_and_the_first_rejected_one():
    est = Estimator.fresh(2, 4)
    f = np.ones((2, 4))
    # lane 0: 3 verified, 2 accepted -> j = 0, 1 labelled 1, j = 2 labelled 0, j = 3 unobserved
    # lane 1: 3 verified, 3 accepted -> j = 0, 1, 2 labelled 1; the 4th draft was never verified
    est.accumulate(np.array([0, 1]), f, np.full((2, 4), 0.5), np.array([2, 3]), np.array([3, 3]))
    np.testing.assert_array_equal(est.counts, [[1, 1, 1, 0], [1, 1, 1, 0]])
    np.testing.assert_allclose(est.grad[..., 1], [[0.5, 0.5, -0.5, 0], [0.5, 0.5, 0.5, 0]])


def test_admit_drafts_takes_the_batchs_best_slots_and_hands_ties_out_in_row_order():
    S = np.array([[0.9, 0.8, 0.3], [0.95, 0.2, 0.1], [0.5, 0.5, 0.4]])
    # budget 4: 0.95, 0.9, 0.8 are above the threshold 0.5; one of row 2's two tied 0.5 -> [2, 1, 1]
    assert admit_drafts(S, [3, 3, 3], 4).tolist() == [2, 1, 1]
    assert admit_drafts(S, [3, 3, 3], 5).tolist() == [2, 1, 2]
    assert admit_drafts(S, [3, 3, 3], 6).tolist() == [2, 1, 3]
    # capacity bounds a row's eligible slots; budget 0 verifies nothing, a budget over the drafts all
    assert admit_drafts(S, [1, 3, 3], 3).tolist() == [1, 1, 1]
    assert admit_drafts(S, [3, 3, 3], 0).tolist() == [0, 0, 0] and admit_drafts(S, [3, 3, 2], 20).tolist() == [3, 3, 2]
    # a tie across rows: the first row gets it
    assert admit_drafts(np.array([[0.6, 0.1], [0.6, 0.1]]), [2, 2], 1).tolist() == [1, 0]


def test_budget_is_the_argmax_of_tokens_per_cost_on_a_toy_table():
    scores = [0.2, 0.9, 0.6]  # sorted: 0.9, 0.6, 0.2
    verify = 1.0 + 0.5 * np.arange(10)  # verify_cost[n] = 1 + 0.5 n; one row, draft 1
    # b = 0: 1 / 2.5 = 0.4; b = 1: 1.9 / 3 = 0.633; b = 2: 2.5 / 3.5 = 0.714; b = 3: 2.7 / 4 = 0.675
    assert choose_budget(scores, 1, 1.0, verify) == 2
    # no minimum: verification dear enough verifies nothing (b = 0: 1 / 11 = 0.0909 > b = 1: 1.9 / 21 = 0.0905)
    assert choose_budget(scores, 1, 1.0, 10.0 * np.arange(10)) == 0
    # two rows (2 tokens before drafts), scores over the batch: b = 0..4 give 2/3, 2.9/3.5, 3.8/4, 4.6/4.5, 4.7/5:
    # b = 3 (1.022) is the largest
    assert choose_budget([0.9, 0.9, 0.8, 0.1], 2, 1.0, 1.0 + 0.5 * np.arange(10)) == 3


@pytest.mark.parametrize("cm_name", ["toy", "authors_h100_llama8b", "h200_replay_engine"])
def test_copies_budget_is_vllms_budget_on_the_tiled_rows(cm_name):
    """B identical rows: vLLM's argmax over every b (its verify curve read at rows + b tokens, the cost model
    at b / B drafts per row) lands on a multiple of B, the per-row budget times B."""
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.policy.walk import step_seconds

    cm = toy_cost_model() if cm_name == "toy" else load_cost_model(cm_name)
    rng = np.random.default_rng(1)
    K = 6
    for B in (1, 3, 8, 32):
        n = np.arange(B, B * (K + 1) + 1)  # the step's target tokens: rows + b
        li = n / B - 1.0
        verify = np.zeros(B * (K + 1) + 1)
        verify[B:] = step_seconds(cm, B, kv=np.full(n.size, B * 8192.0), n_i=li + 1, k=li, eagle=np.ones(n.size),
                                  eagle_n=np.full(n.size, K + 1.0), ngram=np.zeros(n.size), path="padded")
        np.testing.assert_allclose(verify[B::B], cost_table(cm, B, K))
        for _ in range(30):
            S = np.cumprod(rng.uniform(0.2, 1.0, K))
            want = choose_budget(np.tile(S, B), B, 0.0, verify)
            assert want == B * copies_budget(S[None, :], cost_table(cm, B, K)[None, :])[0]


# --------------------------------------------------------------------------- the policy on hand-made traces
def _toy_inputs(conf: float, n_requests: int = 2, kmax: int = 4):
    from sdlib.sim.policy.confidence import attach_confidences
    from sdlib.sim.policy.walk import PolicyInputs
    from sdlib.sim.prepared import prepare_traces

    rows = [("toy", str(r), [5, 6], list(range(100, 112)), [1] * 12, [3] * 12) for r in range(n_requests)]
    inp = PolicyInputs.of(prepare_traces(toy_traces(rows), keep_tokens=True), kmax)
    attach_confidences(inp, {("toy", str(r)): [[conf] * kmax] * 12 for r in range(n_requests)})
    return inp


def test_the_budget_is_sized_from_the_previous_steps_predictions():
    # toy model, bs 1: a step verifying l costs 1 + 0.1 (l + 1) + 0.5. A new request's stale predictions are 1.0:
    # (1 + l) / (1.6 + 0.1 l) grows with l, so its first step verifies all K = 4 (acc 3 -> gain 3) though every
    # confidence is 0 (p = sigmoid(0.5 * -40 - 0.2) ~ 2e-9); from then on the stale predictions are ~0: l = 0.
    # The second request of the dataset starts again from 1.0.
    inp = _toy_inputs(0.0)
    (st,) = adaptive_steps(inp, [(toy_cost_model(), 1)])
    for r in (0, 1):
        m = st.req == r
        assert st.pos[m].tolist() == [1, 4, 5, 6, 7, 8, 9, 10, 11]
        assert (st.n_i[m] - 1).tolist() == [4] + [0] * 8 and st.gain[m].tolist() == [3] + [1] * 8
    assert (st.eagle_n == 5).all() and (st.eagle == 1).all() and (st.k == st.n_i - 1).all()


def test_confident_drafts_are_verified_to_k():
    # confidence 0.999: f = 6.9, p = sigmoid(3.25) = 0.963 per draft: every step verifies all K; gain 3 each
    inp = _toy_inputs(0.999)
    (st,) = adaptive_steps(inp, [(toy_cost_model(), 1)])
    assert (st.n_i == 5).all() and st.pos[st.req == 0].tolist() == [1, 4, 7, 10]


# --------------------------------------------------------------------------- the policy on the embedded traces
@pytest.fixture(scope="module")
def embedded():
    from sdlib.paths import resolve
    from sdlib.sim.policy.confidence import load_confidences
    from sdlib.sim.prepared import prepare_traces, truncate_traces
    from sdlib.sim.traces import load_traces

    out = {}
    for ds in DATASETS:
        tr, k = load_traces(str(resolve(f"data/traces/embedded_{ds}.jsonl.gz")))
        prep = truncate_traces(prepare_traces(tr, ngram_lookup=True, keep_tokens=True), None)
        out[ds] = (prep, k, load_confidences(str(resolve(f"data/traces/confidences/embedded_{ds}.jsonl.gz")), k))
    return out


def test_registered_as_a_baseline_that_replays_on_eagle3_at_the_engines_k():
    import sdlib.sim.policy  # noqa: F401
    from sdlib.core.registry import RegistryError, expand_policies, replay_ref, resolve_policy

    ref = resolve_policy(NAME)
    assert ref.k is None and ref.spec.family == "baseline" and "confidences" in ref.spec.needs
    assert resolve_policy(f"{NAME}-k3").k == 3
    assert NAME not in {r.name for r in expand_policies(["baselines"])}  # that group runs without confidences
    assert replay_ref(NAME, "eagle3", 3).k == 3  # a replay drafts the engine's K
    with pytest.raises(RegistryError, match="replays on"):
        replay_ref(NAME, "ngram", 3)


@pytest.mark.parametrize("K", [1, 3, None])
def test_never_verifies_more_than_k_per_row(embedded, K):
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.policy.confidence import attach_confidences
    from sdlib.sim.policy.walk import PolicyInputs

    prep, k, conf = embedded["sharegpt"]
    inp = PolicyInputs.of(prep, k)
    attach_confidences(inp, conf)
    KK = k if K is None else K
    cfg = [(load_cost_model(n), b) for n in ("authors_h100_llama8b", "h200_replay_engine") for b in (1, 128)]
    for st in adaptive_steps(inp, cfg, K):
        assert (st.n_i >= 1).all() and (st.n_i - 1 <= KK).all() and (st.eagle_n == KK + 1).all()
        assert (st.gain <= st.n_i).all()
        for r in range(len(prep)):  # every step starts where the previous one's tokens end, up to the list's end
            m = st.req == r
            p, g = st.pos[m], st.gain[m]
            assert p[0] == 1 and (np.diff(p) == g[:-1]).all() and p[-1] + g[-1] >= inp.L_eagle[r]


def test_runs_at_every_batch_size_under_both_cost_models_below_the_oracles(embedded):
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.policy.table import simulate_policies, summarise

    cms = [load_cost_model("authors_h100_llama8b"), load_cost_model("h200_replay_engine")]
    bs = [1, 8, 32, 128]
    for ds, (prep, k, conf) in embedded.items():
        per = simulate_policies(prep, ["fixed-eagle3-k3", "oracle-eagle3", "combine", NAME], bs, cms, kmax=k,
                                confidences=conf)
        t, _ = summarise(per)
        a = t[t.policy == NAME]
        assert len(a) == len(bs) * len(cms) and (a.family == "baseline").all()
        assert (a.speedup_lo <= a.speedup).all() and (a.speedup <= a.speedup_hi).all() and (a.speedup > 0.5).all()
        sp = t.set_index(["cost_model", "batch_size", "policy"]).speedup
        for cm in cms:
            for b in bs:
                # no rule that decides online beats the clairvoyant length or Oracle Combine
                assert sp[(cm.name, b, NAME)] <= sp[(cm.name, b, "oracle-eagle3")] + 1e-9, (ds, cm.name, b)
                assert sp[(cm.name, b, NAME)] <= sp[(cm.name, b, "combine")] + 1e-9, (ds, cm.name, b)
