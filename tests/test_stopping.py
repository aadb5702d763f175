"""SpecDec++'s stop threshold and the Nightjar-style bandit over k (sdlib.sim.policy.stopping): the threshold rule
on hand-made probabilities, SpecDec++ with perfect confidences gains exactly Oracle Proposal's tokens, the bandit
turns speculation off where nothing is accepted and drafts long where everything is, and neither exceeds Oracle
Select on the embedded traces."""

from __future__ import annotations

import numpy as np
import pytest

from sdlib.paths import resolve
from sdlib.sim.policy.walk import EAGLE, NONE, PolicyInputs, position_steps
from sdlib.sim.prepared import prepare_traces, truncate_traces

TRACE = "data/traces/embedded_sharegpt.jsonl.gz"


@pytest.fixture(scope="module")
def inp():
    from sdlib.sim.traces import load_traces

    tr, k = load_traces(str(resolve(TRACE)))
    return PolicyInputs.of(truncate_traces(prepare_traces(tr, keep_tokens=True), None), k)


def test_specdecpp_stops_at_the_first_draft_whose_rejection_odds_pass_the_threshold():
    from sdlib.sim.policy.stopping import specdecpp_lengths

    a = np.array([[0.9, 0.9, 0.9, 0.9],    # P(any rejection): 0.1, 0.19, 0.271, 0.3439
                  [0.2, 1.0, 1.0, 1.0],    # 0.8 at once
                  [1.0, 1.0, 1.0, 0.0]])   # 0, 0, 0, 1
    np.testing.assert_array_equal(specdecpp_lengths(a, 0.3), [4, 1, 4])
    np.testing.assert_array_equal(specdecpp_lengths(a, 0.25), [3, 1, 4])
    np.testing.assert_array_equal(specdecpp_lengths(a, 0.5), [4, 1, 4])
    np.testing.assert_array_equal(specdecpp_lengths(a, 0.15), [2, 1, 4])
    with pytest.raises(ValueError, match="0 < h < 1"):
        specdecpp_lengths(a, 1.0)


def test_specdecpp_with_perfect_confidences_gains_oracle_proposals_tokens(inp):
    """Confidence 1 for a draft that will be accepted, 0 for one that will not: the calibrated probability of the
    first rejected draft is near 0, so SpecDec++ stops there (that draft proposed too) and every step gains the
    trace's acceptance length, at most one proposal past Oracle Proposal's."""
    from sdlib.sim.policy.confidence import attach_confidences
    from sdlib.sim.policy.stopping import specdecpp_steps
    from tests.test_confidence import _perfect

    attach_confidences(inp, _perfect(inp))
    try:
        s = specdecpp_steps(inp, 0.5)[0]
        orc = position_steps(inp, "oracle", "eagle3")
        a, b = np.lexsort((s.pos, s.req)), np.lexsort((orc.pos, orc.req))
        for f in ("req", "pos", "gain"):
            np.testing.assert_array_equal(getattr(s, f)[a], getattr(orc, f)[b], err_msg=f)
        extra = s.n_i[a] - orc.n_i[b]
        assert set(np.unique(extra)) <= {0, 1} and (extra == 1).mean() > 0.5
    finally:
        inp.extra.pop("conf_eagle", None)


def test_specdecpp_needs_confidences(inp):
    from sdlib.sim.policy.confidence import ConfidenceError
    from sdlib.sim.policy.stopping import specdecpp_steps

    with pytest.raises(ConfidenceError, match="confidences"):
        specdecpp_steps(inp, 0.5)


def _constant(inp, acc: int):
    """A copy of ``inp`` whose EAGLE-3 list accepts ``acc`` tokens (accepted + 1) at every position."""
    import copy

    out = copy.copy(inp)
    out.acc_eg = np.full_like(inp.acc_eg, acc)
    out.extra = {}
    return out


def test_nightjar_turns_speculation_off_where_nothing_is_accepted_and_drafts_long_where_all_is(inp):
    from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B as cm
    from sdlib.sim.policy.stopping import NIGHTJAR_ARMS, nightjar_steps

    arms = [a for a in NIGHTJAR_ARMS if a <= inp.kmax]
    # the default (textbook UCB1) tries every arm, then on these short traces (12 requests, ~640 steps) keeps
    # exploring: the rewards of k = 0 and k = 1 differ by ~0.03 where the bonus is ~0.1 after 60 pulls
    nothing = nightjar_steps(_constant(inp, 1), [(cm, 32)])[0]
    assert set(np.unique(nothing.k)) == set(arms)
    # with little exploration, the mechanism settles on the right arm
    nothing = nightjar_steps(_constant(inp, 1), [(cm, 32)], c=0.02)[0]
    late = nothing.pos > np.median(nothing.pos)
    assert (nothing.drafter[late] == NONE).mean() > 0.8  # drafting only costs: k = 0 wins
    everything = nightjar_steps(_constant(inp, inp.kmax + 1), [(cm, 1)], c=0.02)[0]
    late = everything.pos > np.median(everything.pos)
    assert (everything.drafter[late] == EAGLE).all()
    assert np.median(everything.k[late]) == max(arms)  # every draft accepted: the longest arm
    # after steps without EAGLE-3 it processes the tokens it skipped (charged as the online policy does)
    assert (nothing.eagle_n[nothing.drafter == EAGLE] >= nothing.n_i[nothing.drafter == EAGLE]).all()


def test_neither_exceeds_oracle_select_on_the_embedded_traces(tmp_path):
    """Simulated with confidences, at bs 1 and 128 under both cost models: no request of either rule beats
    Oracle Select (the clairvoyant bound over the same actions)."""
    import pandas as pd

    from sdlib.cli import main

    out, per = tmp_path / "sim.csv", tmp_path / "per_request.parquet"
    assert main(["simulate", "--traces", str(resolve("data/traces/embedded_*.jsonl.gz")), "--confidences",
                 str(resolve("data/traces/confidences/embedded_*.jsonl.gz")), "--policies",
                 "specdecpp-h0.3,specdecpp-h0.7,nightjar-ucb,oracle-select", "--batch-sizes", "1,128",
                 "--cost-model", "authors_h100_llama8b,h200_replay_engine", "--out", str(out),
                 "--per-request", str(per)]) == 0
    d = pd.read_parquet(per)
    key = ["dataset", "request_id", "batch_size", "cost_model"]
    sel = d[d.policy == "oracle-select"].set_index(key)
    for pol in ("specdecpp-h0.3", "specdecpp-h0.7", "nightjar-ucb"):
        t = d[d.policy == pol].set_index(key).reindex(sel.index)
        assert len(t) == len(sel) > 0 and t["sd_tok_per_s"].notna().all()
        # a request's speedup over its own no-SD time (the policies run to different list lengths)
        assert (t["sd_tok_per_s"] / t["base_tok_per_s"] <= sel["sd_tok_per_s"] / sel["base_tok_per_s"] * (1 + 1e-9)).all(), pol


def test_head_to_head_on_hand_made_requests():
    """Two policies on three requests of one cell: the ratio is the ratio of their speedups (mean tokens per
    second with SD over without), and a policy twice as fast on every request is ahead beyond doubt."""
    import pandas as pd

    from sdlib.sim.policy.views import head_to_head

    rows = []
    for i, (a, b) in enumerate([(4.0, 2.0), (6.0, 3.0), (8.0, 4.0)]):
        for pol, v in (("a", a), ("b", b)):
            rows.append({"cost_model": "cm", "dataset": "d", "batch_size": 1, "request_id": f"r{i}", "policy": pol,
                         "sd_tok_per_s": v, "base_tok_per_s": 1.0})
    h = head_to_head(pd.DataFrame(rows), "a", "b", n_boot=200)
    assert len(h) == 1 and h.ratio[0] == pytest.approx(2.0) and h.ratio_lo[0] == pytest.approx(2.0)
    assert h.verdict[0] == "a ahead" and h.num_requests[0] == 3
    rows = [dict(r, sd_tok_per_s=r["sd_tok_per_s"] * (0.5 if (r["policy"] == "a" and r["request_id"] == "r0") else 1))
            for r in rows]
    rows += [dict(r, request_id=r["request_id"] + "x", sd_tok_per_s=r["sd_tok_per_s"] if r["policy"] == "a"
                  else 2 * r["sd_tok_per_s"]) for r in rows]
    assert head_to_head(pd.DataFrame(rows), "a", "b", n_boot=400).verdict[0] == "not established"
