"""The continuation agreement (sdlib.sim.policy.features.continuation_agreement) and the policy that reads it
(sdlib.sim.policy.agreement): the vectorised agreement equals a brute force on random token sequences; the
classes, the offsets' cross-fitting (a request is never decided by counts of its own fold) and the gains
shift behave as documented; the policy runs on the committed traces."""

from __future__ import annotations

import numpy as np
import pytest

from sdlib.sim.policy.agreement import (AgreementOffsets, agreement_classes, class_rates, offsets_from,
                                        shift_gains)
from sdlib.sim.policy.features import continuation_agreement


def brute_agreement(prompt, output, nmin, nmax, cap):
    tok = list(prompt) + list(output)
    out = []
    for p in range(len(output)):
        N = len(prompt) + p
        val = -1
        for n in range(nmax, nmin - 1, -1):
            if N - n < 0:
                continue
            suf = tok[N - n:N]
            starts = [s for s in range(N - n) if tok[s:s + n] == suf]
            if starts:
                f, last = starts[0], starts[-1]
                if last > f:
                    k = 0
                    while k < cap and last + n + k < N and tok[f + n + k] == tok[last + n + k]:
                        k += 1
                    val = k
                break
        out.append(val)
    return np.array(out)


@pytest.mark.parametrize("seed", range(6))
def test_agreement_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    vocab = 3 + seed % 3  # few symbols: many repeats, agreements of every length
    prompt = rng.integers(0, vocab, 20 + 5 * seed).tolist()
    # a repeated motif with mutations, as a looping model writes
    motif = rng.integers(0, vocab, 6).tolist()
    output = []
    while len(output) < 80:
        output += [t if rng.random() > 0.15 else int(rng.integers(0, vocab)) for t in motif]
    nmin, nmax, cap = (1, 3, 5) if seed % 2 else (3, 7, 10)
    got = continuation_agreement(prompt, output, nmin, nmax, cap)
    np.testing.assert_array_equal(got, brute_agreement(prompt, output, nmin, nmax, cap))
    assert (got >= 0).any() and (got == -1).any()


def test_classes():
    c = agreement_classes(np.array([-1, 0, 2, 5]), 4)
    np.testing.assert_array_equal(c, [[0, 0, 0, 0], [2, 3, 3, 3], [1, 1, 2, 3], [1, 1, 1, 1]])


def test_offsets_are_log_odds_against_the_pooled_rate():
    acc = np.array([[8.0], [18.0], [1.0], [0.0]])
    seen = np.array([[10.0], [20.0], [10.0], [0.0]])
    d = offsets_from(acc, seen)
    lo = lambda p: np.log(p / (1 - p))  # noqa: E731
    pooled = (27 + 1) / (40 + 2)
    assert d[1, 0] == pytest.approx(lo(19 / 22) - lo(pooled))
    assert d[2, 0] < 0 < d[1, 0] and d[3, 0] == pytest.approx(lo(0.5) - lo(pooled))


def test_shift_gains_identity_and_direction():
    h = np.array([[0.9, 0.8, 0.7], [0.5, 0.5, 0.5]])
    e = np.ones((2, 4))
    e[:, 1:] = 1 + np.cumsum(np.cumprod(h, axis=1), axis=1)
    np.testing.assert_allclose(shift_gains(e, np.zeros((2, 3))), e, rtol=1e-12)
    up, down = shift_gains(e, np.full((2, 3), 1.0)), shift_gains(e, np.full((2, 3), -1.0))
    assert (up[:, 1:] > e[:, 1:]).all() and (down[:, 1:] < e[:, 1:]).all()


@pytest.fixture(scope="module")
def embedded():
    from sdlib.paths import resolve
    from sdlib.sim.policy.confidence import load_confidences
    from sdlib.sim.policy.walk import PolicyInputs
    from sdlib.sim.prepared import prepare_traces, truncate_traces
    from sdlib.sim.traces import load_traces

    tr, k = load_traces(str(resolve("data/traces/embedded_*.jsonl.gz")))
    prep = truncate_traces(prepare_traces(tr, keep_tokens=True), None)
    return prep, k, load_confidences(str(resolve("data/traces/confidences/embedded_*.jsonl.gz")))


def test_offsets_are_cross_fitted(embedded):
    """Changing the n-gram acceptance of fold-0 requests changes the offsets fold 1 is decided by, never fold 0's."""
    from sdlib.sim.policy.walk import PolicyInputs

    prep, k, _ = embedded
    inp = PolicyInputs.of(prep, k)
    off = AgreementOffsets(inp)
    r0 = np.flatnonzero(off.fold == 0)
    assert r0.size and (off.fold == 1).any()
    saved = inp.acc_ng.copy()
    try:
        for r in r0:
            sl = slice(inp.off[r], inp.off[r + 1])
            inp.acc_ng[sl] = 1  # every fold-0 n-gram draft rejected
        again = AgreementOffsets(inp)
    finally:
        inp.acc_ng[:] = saved
    np.testing.assert_array_equal(again.tables[0], off.tables[0])  # fitted on fold 1: unchanged
    assert not np.allclose(again.tables[1], off.tables[1])
    acc, seen = class_rates(inp, np.arange(len(prep)))
    assert (acc <= seen).all() and seen.sum() > 0


def test_policy_runs_and_is_named(embedded):
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.policy.table import simulate_policies

    prep, k, conf = embedded
    per = simulate_policies(prep, ["online-with-agreement", "online-with-confidence", "oracle-select"], [1, 32],
                            [load_cost_model("h200_replay_engine")], kmax=k, confidences=conf)
    assert set(per.policy) == {"online-with-agreement", "online-with-confidence", "oracle-select"}
    w = per.pivot_table(index=["batch_size", "dataset", "request_id"], columns="policy", values="sd_tok_per_s")
    assert (w["online-with-agreement"] <= w["oracle-select"] * (1 + 1e-9)).all()
    assert (w["online-with-agreement"] != w["online-with-confidence"]).any()  # the shift changes decisions


def test_committed_predictor_of_our_traces_is_their_crossfit():
    """data/predictors/online_ours64.json (notebook 07's simulation and the H200 replay decide with it) is what
    cross-fitting on the committed traces gives now (``make predictor`` keeps the file when the fit is the same)."""
    import json

    from sdlib.paths import resolve
    from sdlib.sim.policy.online import models_to_dict
    from sdlib.sim.policy.training import _same_fit, crossfit, load_predictor
    from sdlib.sim.policy.walk import PolicyInputs
    from sdlib.sim.prepared import prepare_traces, truncate_traces
    from sdlib.sim.traces import load_traces

    tr, k = load_traces(str(resolve("data/traces/ours64_*.jsonl.gz")))
    inp = PolicyInputs.of(truncate_traces(prepare_traces(tr, keep_tokens=True), None), k)
    fresh = crossfit(inp)
    saved = json.loads(resolve("data/predictors/online_ours64.json").read_text())
    assert _same_fit(json.loads(json.dumps([models_to_dict(m) for m in fresh.models])), saved["models"])
    assert (load_predictor(resolve("data/predictors/online_ours64.json"), inp).fold == fresh.fold).all()
