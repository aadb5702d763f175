"""sdlib.sim.policy: walk / online / predictor / features / table on hand-made traces: step sequences,
prices and gap shares worked out in the comments."""

import numpy as np
import pandas as pd
import pytest

from sdlib.sim.engine_costs import EngineCostModel
from sdlib.sim.policy.features import ngram_match_features, share_so_far
from sdlib.sim.prepared import prepare_traces
from sdlib.sim.policy.online import OnlinePolicy
from sdlib.sim.policy.walk import (EAGLE, NGRAM, NONE, Policy, PolicyInputs, no_sd_times, position_steps,
                                  request_times, step_seconds, walk)
from sdlib.core.registry import expand_policies
from sdlib.sim.policy.table import simulate_policies, summarise
from sdlib.sim.policy.predictor import DEPTH, FEATURES, HazardModel, fit_hazard, hazard_rows
from sdlib.sim.policy.training import fold_of
from tests.conftest import toy_cost_model, toy_traces
from tests.sim_reference import reference_steps, reference_times, steps_as_tuples

CM = toy_cost_model()
long_form = toy_traces


# prompt 1 2 3 4, output 1 2 3 4 9 8: the n-gram look-up (min 3) matches at p = 3 ("1 2 3" first seen at 0, its
# continuation "4 1 2 3" reaches the context's end: 4 tokens) and at p = 4 ("1 2 3 4", continuation 4 tokens)
ONE = long_form([("toy", "r", [1, 2, 3, 4], [1, 2, 3, 4, 9, 8], [1, 1, 1, 2, 1, 1], [1, 3, 2, 1, 2, 1])])


def prep_one():
    return prepare_traces(ONE, keep_tokens=True)


class FixedEagle(Policy):
    lengths = "eagle3"

    def __init__(self, k):
        self.k = k

    def decide(self, inp, lanes):
        n = lanes.req.size
        return np.full(n, EAGLE, np.int8), np.full(n, self.k), np.full(n, self.k), 1.0, 0.0


def test_walk_equals_position_steps_and_hand_steps():
    prep = prep_one()
    inp = PolicyInputs.of(prep)
    assert inp.avail.tolist() == [0, 0, 0, 4, 4, 0]
    st = walk(inp, FixedEagle(2))[0]
    # k = 2 from p = 1: acc 3 -> gain 3 (p = 4); acc 2 -> gain 2 (p = 6, done)
    assert st.pos.tolist() == [1, 4] and st.gain.tolist() == [3, 2] and st.n_i.tolist() == [3, 3]
    ref = position_steps(inp, "fixed", "eagle3", 2)
    assert ref.pos.tolist() == st.pos.tolist() and ref.gain.tolist() == st.gain.tolist()
    assert steps_as_tuples(ref) == reference_steps(prep, "eagle3", 2)
    # price, bs 1: each step T = 1 + 0.1*3 = 1.3, + EAGLE 0.5 = 1.8; prefill T(0, 4) = 1.4
    np.testing.assert_allclose(request_times(inp, st, CM, 1), [1.4 + 2 * 1.8])
    np.testing.assert_allclose(request_times(inp, ref, CM, 1), [1.4 + 2 * 1.8])
    # no SD: prefill + 5 steps of T(., 1) = 1.1
    np.testing.assert_allclose(no_sd_times(inp, np.array([6]), CM, 1), [1.4 + 5 * 1.1])


def test_step_seconds_both_kinds():
    # linear, bs 2: T(kv, 2*3) = 1.6; EAGLE 0.5; n-gram 0.1*1.6
    assert step_seconds(CM, 2, np.array([10.0]), np.array([3]), np.array([2]), 1.0, np.array([3.0]), 1.0,
                        "padded")[0] == pytest.approx(1.6 + 0.5 + 0.16)
    e = toy_engine()
    # padded, k 2 at B 1: halfway between k 1 (2.0) and k 3 (4.0) -> 3.0, + a_kv*kv = 0.001*100
    assert e.step_time("padded", np.array([2]), 1, np.array([100.0]))[0] == pytest.approx(3.1)
    # k 0 is a plain decode step; B 4 halfway (in B) between 1 and 7 -> none 1.5
    assert e.step_time("padded", np.array([0]), 4, np.array([0.0]))[0] == pytest.approx(1.5)
    # k 5 beyond the largest measured (3): extrapolated from k 1..3 (slope 1 per k) -> 6.0
    assert e.alpha("padded", np.array([5]), 1)[0] == pytest.approx(6.0)
    # ragged: k below the smallest measured takes its value; + a_n * n
    assert e.step_time("ragged", np.array([1]), 1, np.array([0.0]), n=np.array([4]))[0] == pytest.approx(5.0 + 0.4)


def toy_engine():
    return EngineCostModel(name="toy_engine", a_kv_s=0.001, a_n_s={"none": 0.0, "padded": 0.0, "ragged": 0.1},
                           ks={"none": [0], "padded": [1, 3], "ragged": [3]}, batch_sizes=[1, 7],
                           alpha_s={"none": [[1.0, 2.0]], "padded": [[2.0, 3.0], [4.0, 6.0]], "ragged": [[5.0, 5.0]]},
                           prefill_model="authors_h100_llama8b")


def test_engine_model_json_round_trip(tmp_path):
    e = toy_engine()
    from sdlib.sim.costmodels import load_cost_model

    p = e.save(tmp_path / "e.json")
    assert load_cost_model(p) == e


def test_features_by_hand_and_brute_force():
    n, c = ngram_match_features([1, 2, 3, 4], [1, 2, 3, 4, 9, 8])
    # p = 3: suffix "1 2 3" occurred once before; p = 4: "1 2 3 4" (n = 4) once before
    assert n.tolist() == [0, 0, 0, 3, 4, 0] and c.tolist() == [0, 0, 0, 1, 1, 0]
    rng = np.random.default_rng(0)
    for _ in range(20):
        P, O = rng.integers(0, 3, 8).tolist(), rng.integers(0, 3, 12).tolist()
        n, c = ngram_match_features(P, O)
        for p in range(len(O)):
            ctx = P + O[:p]
            want = (0, 0)
            for m in range(7, 2, -1):
                if len(ctx) >= m:
                    occ = [s for s in range(len(ctx) - m) if ctx[s:s + m] == ctx[-m:]]
                    if occ:
                        want = (m, len(occ))
                        break
            assert (n[p], c[p]) == want
    # share_so_far: hits at positions 1 and 3 of 1..3 -> cum at p = 4: 2/3
    cum, rec = share_so_far(np.array([1, 1, 0, 1, 0]), np.ones(5, bool), recent=2)
    assert cum[4] == pytest.approx(2 / 3) and rec[4] == pytest.approx(0.5)


def test_hazard_rows_and_fit_constant():
    # acc 3 with cap 5: rows j = 1, 2 accepted, j = 3 rejected; acc 6 with cap 5: 5 accepted (censored)
    X, j, y = hazard_rows(np.zeros((2, 1)), np.array([3, 6]), np.array([5, 5]))
    assert j.tolist() == [1, 2, 3, 1, 2, 3, 4, 5] and y.tolist() == [1, 1, 0, 1, 1, 1, 1, 1]
    # geometric acceptance 0.7 per token: the fit's expected gains are 1 + sum_{i<=l} 0.7^i
    rng = np.random.default_rng(1)
    acc = 1 + rng.geometric(0.3, 20000) - 1
    Xf = np.zeros((acc.size, len(FEATURES)))
    m = fit_hazard(*hazard_rows(Xf, np.minimum(acc, DEPTH + 1), np.full(acc.size, DEPTH)))
    eg = m.expected_gains(np.zeros((1, len(FEATURES))), 5)[0]
    np.testing.assert_allclose(eg, [1 + sum(0.7 ** i for i in range(1, l + 1)) for l in range(6)], rtol=0.02)


def const_model(p):
    F1 = len(FEATURES) + 1
    w = np.zeros(F1)
    w[0] = np.log(p / (1 - p))
    return HazardModel(w, np.zeros(DEPTH), np.zeros(F1))


def test_online_policy_decides_by_expected_tokens_per_second():
    from sdlib.sim.policy.features import add_features

    prep = prep_one()
    inp = PolicyInputs.of(prep)
    add_features(inp)
    # n-gram almost surely right, EAGLE a coin flip (E[g] = 2 - 0.5^l). p = 1, no match: nothing (1 / 1.21 s =
    # 0.826), EAGLE l = 1: 1.5 / (1.2 + 0.5 + 0.12) = 0.824, l = 2: 1.75 / 1.93 = 0.907, l = 3: 1.875 / 2.04 =
    # 0.919, l = 4: 1.9375 / 2.15 = 0.901 -> EAGLE 3, acc 3: p = 4. There the n-gram's 4 tokens: ~4.99 / (1.5 *
    # 1.1) = 3.0 -> n-gram 4, acc_ngram[4] = 1: p = 5, no match: EAGLE 3 again, acc 1: done.
    pol = OnlinePolicy({"ngram": const_model(0.999), "eagle3": const_model(0.5)}, [CM], [1])
    st = walk(inp, pol)[0]
    assert st.pos.tolist() == [1, 4, 5] and st.drafter.tolist() == [EAGLE, NGRAM, EAGLE]
    assert st.n_i.tolist() == [4, 5, 4] and st.gain.tolist() == [3, 1, 1]
    # a hopeless EAGLE and no n-gram match: propose nothing (E[g] 1 at 1.1 s beats ~1.001 at >= 1.7 s)
    pol = OnlinePolicy({"ngram": const_model(0.001), "eagle3": const_model(0.001)}, [CM], [1])
    st = walk(inp, pol)[0]
    assert st.drafter.tolist() == [NONE] * 5 and st.gain.tolist() == [1] * 5


def test_gap_share_by_hand():
    # two requests; throughput with SD / without per policy; speedup = mean(sd) / mean(base)
    rows = []
    for pol, sd in (("fixed-eagle3-k1", [2, 2]), ("combine", [4, 4]), ("online", [3, 3])):
        for r, s in enumerate(sd):
            rows.append({"cost_model": "toy", "dataset": "d", "batch_size": 1, "request_id": str(r), "policy": pol,
                         "family": {"fixed-eagle3-k1": "fixed", "combine": "combine", "online": "online"}[pol],
                         "sd_tok_per_s": float(s), "base_tok_per_s": 1.0, "num_steps": 2.0, "gained": 6.0,
                         "drafted": 4.0})
    table, gaps = summarise(pd.DataFrame(rows), n_boot=50)
    assert table.set_index("policy").loc["online", "speedup"] == pytest.approx(3.0)
    assert table.set_index("policy").loc["online", "tokens_per_step"] == pytest.approx(3.0)
    g = gaps.set_index("policy")
    assert g.loc["online", "gap_share"] == pytest.approx(0.5) and g.loc["combine", "gap_share"] == pytest.approx(1.0)
    assert g.loc["online", "best_fixed"] == "fixed-eagle3-k1"


def test_expand_policies_and_folds():
    names = [r.label for r in expand_policies(["fixed", "combine", "ngram-eagle"], kmax=3)]
    assert names[:3] == ["fixed-eagle3-k1", "fixed-eagle3-k2", "fixed-eagle3-k3"] and names[-2:] == ["combine",
                                                                                                   "ngram-eagle"]
    with pytest.raises(ValueError):
        expand_policies(["bogus"])
    assert fold_of("gsm8k", "1") == fold_of("gsm8k", "1") and {fold_of("d", str(i)) for i in range(20)} == {0, 1}


def test_simulate_policies_small_table():
    prep = prep_one()
    per = simulate_policies(prep, ["fixed-eagle3-k2", "combine", "ngram-eagle"], [1, 4], [CM])
    assert set(per.policy) == {"fixed-eagle3-k2", "combine", "ngram-eagle"} and set(per.batch_size) == {1, 4}
    # fixed k = 2 at bs 1: 1.4 + 3.6 s for 6 tokens vs 1.4 + 5.5 s
    r = per[(per.policy == "fixed-eagle3-k2") & (per.batch_size == 1)].iloc[0]
    assert r.sd_time_s == pytest.approx(5.0) and r.base_time_s == pytest.approx(6.9)


def random_prep(n: int = 6, seed: int = 2):
    rng = np.random.default_rng(seed)
    from sdlib.extract.ngram import ngram_acc_len

    rows = []
    for r in range(n):
        P, O = rng.integers(0, 4, 12).tolist(), rng.integers(0, 4, 30).tolist()
        eg = [1] + rng.integers(1, 7, int(rng.integers(20, 30))).tolist()  # lists of other lengths than the output
        rows.append((["toy", "gsm8k"][r % 2], str(r), P, O, ngram_acc_len(P, O, k=20)[:int(rng.integers(22, 31))], eg))
    return prepare_traces(long_form(rows), keep_tokens=True)


@pytest.mark.parametrize("convention", ["corrected", "authors", "ablations"])
def test_position_steps_equal_the_loop_reference(convention):
    """The one vectorised walk of fixed k, Oracle Proposal and Combine is, step for step and weight for weight,
    the simulator's rule written as a loop per request (tests/sim_reference.py), under each convention and
    each of the authors' quirks alone; its prices equal the step-by-step sum."""
    from sdlib.sim import bounds
    from sdlib.sim.conventions import get_convention

    prep = random_prep()
    inp = PolicyInputs.of(prep)
    convs = list(bounds.convention_ablation("authors", "corrected").values()) if convention == "ablations" \
        else [get_convention(convention)]
    cases = [("fixed", "eagle3", 3, "eagle3"), ("fixed", "ngram", 2, "ngram"), ("oracle", "eagle3", None, "eagle3"),
             ("oracle", "ngram", None, "ngram"), ("combine", None, None, "combined"), ("combine", None, 3, "combined")]
    for conv in convs:
        for kind, drafter, k, prop in cases:
            st = position_steps(inp, kind, drafter, k, convention=conv)
            ref = reference_steps(prep, prop, k, conv)
            assert steps_as_tuples(st) == sorted(ref, key=lambda x: (x[0], x[1], -x[4] if x[2] > 1 else 2)), \
                (conv.name, kind, drafter, k)
            np.testing.assert_allclose(request_times(inp, st, CM, 4), reference_times(prep, ref, CM, 4))
    # capped at an engine's K (the replay): the oracles propose at most K
    st = position_steps(inp, "oracle", "eagle3", cap=2)
    assert steps_as_tuples(st) == reference_steps(prep, "eagle3", None, "corrected", cap=2)


def test_deployment_pool_counts_each_dataset_and_configuration_apart():
    from types import SimpleNamespace

    from sdlib.sim.policy.online import DeploymentPool, dynamic_features, init_state

    inp = SimpleNamespace(prep=SimpleNamespace(dataset=["a", "b", "a"]))
    lanes = SimpleNamespace(cfg=np.array([0, 0, 0, 1]), req=np.array([0, 1, 2, 0]), state=init_state(4))
    pool = DeploymentPool()
    pool.set_lanes(inp, lanes)  # nothing seen yet: every pooled count 0
    assert all(lanes.state[k].tolist() == [0.0] * 4 for k in ("pool_ng_acc", "pool_eg_rej"))
    seen = np.array([True, True, True, False])
    # n-gram: 2 accepted in lane 0, 1 in lane 1, 0 (rejected) in lane 2; EAGLE-3 unseen; lane 3 saw nothing
    pool.add(inp, lanes, [(seen, np.array([2, 1, 0, 5]), np.array([0, 0, 1, 1])),
                          (np.zeros(4, bool), np.zeros(4), np.zeros(4))])
    pool.set_lanes(inp, lanes)
    # lanes 0 and 2 are dataset a at configuration 0 (2 + 0 accepted, 1 rejected); lane 1 dataset b; lane 3 is
    # dataset a at configuration 1, which observed nothing
    assert lanes.state["pool_ng_acc"].tolist() == [2.0, 1.0, 2.0, 0.0]
    assert lanes.state["pool_ng_rej"].tolist() == [1.0, 0.0, 1.0, 0.0]
    X = dynamic_features(lanes.state)
    assert X.shape == (4, 8) and X[0, 6] == pytest.approx(np.log(3.0 / 1.5)) and X[3, 6] == pytest.approx(np.log(2.0))


def test_a_refit_that_differs_only_in_the_last_digit_keeps_the_committed_predictor():
    """The online cells' run ids hash the predictor file: a refit equal but for float noise must not rewrite it."""
    from sdlib.sim.policy.training import _same_fit

    a = {"info": {"x": 1}, "models": [{"w": [0.1, -0.6392921472229834]}]}
    assert _same_fit(a, {"info": {"x": 1}, "models": [{"w": [0.1, -0.6392921472229833]}]})
    assert not _same_fit(a, {"info": {"x": 1}, "models": [{"w": [0.1, -0.6393]}]})
    assert not _same_fit(a, {"info": {"x": 2}, "models": [{"w": [0.1, -0.6392921472229834]}]})
