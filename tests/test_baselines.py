"""sdlib.sim.policy.baselines and sdlib.sim.policy.arctic: each rule on hand-made traces, with the steps worked out in the
comments; the suffix score against the test vectors produced by Arctic's own C++ (notes/baselines.md)."""

import numpy as np
import pandas as pd
import pytest

from sdlib.sim.policy.arctic import suffix_draft, suffix_scores
from sdlib.sim.policy.baselines import (NgramOrEagle, SGLangAdaptive, SpecDecodeAdaptive, dynamic_sd_k,
                                 sglang_recompute, sglang_recompute_many, sglang_slot)
from sdlib.sim.prepared import prepare_traces
from sdlib.sim.policy.walk import EAGLE, NGRAM, NONE, PolicyInputs, walk


def inputs(prompt, output, ng, eg):
    rows = [{"dataset": "toy", "request_id": "r", "prompt_token_ids": prompt, "output_token_ids": output,
             "method": m, "acc_len": acc} for m, acc in (("ngram", ng), ("eagle3", eg))]
    return PolicyInputs.of(prepare_traces(pd.DataFrame(rows), keep_tokens=True))


def test_specdecode_adaptive_eagle_by_hand():
    # k starts at 5. p = 1: acc 9 >= 6 -> gain 6, all accepted -> k 7; p = 7: acc 1 -> gain 1, k 6;
    # p = 8: acc 3 -> gain 3, k 5; p = 11: acc 1 -> gain 1 (done at 12)
    eg = [1, 9, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1]
    inp = inputs([5, 6], list(range(100, 112)), [1] * 12, eg)
    st = walk(inp, SpecDecodeAdaptive("eagle3"))[0]
    assert st.pos.tolist() == [1, 7, 8, 11] and st.n_i.tolist() == [6, 8, 7, 6] and st.gain.tolist() == [6, 1, 3, 1]


def test_specdecode_adaptive_ngram_no_match_keeps_k():
    # prompt 1 2 3 4, output 1 2 3 4 9 8: matches at p = 3, 4 only (4 tokens each). p = 1, 2: nothing proposed,
    # k stays 5; p = 3: min(5, 4) = 4 proposed, acc 2 -> gain 2, not all -> k 4; p = 5: no match
    inp = inputs([1, 2, 3, 4], [1, 2, 3, 4, 9, 8], [1, 1, 1, 2, 1, 1], [1] * 6)
    st = walk(inp, SpecDecodeAdaptive("ngram"))[0]
    assert st.pos.tolist() == [1, 2, 3, 5] and (st.n_i - 1).tolist() == [0, 0, 4, 0]
    assert st.k.tolist() == [5, 5, 5, 4] and st.drafter.tolist() == [NONE, NONE, NGRAM, NONE]


def test_sglang_thresholds_at_bs1():
    c, up, down = sglang_slot(1)
    assert c == [1, 3, 7]
    # from 3 (index 1): down to 1 iff ema <= 0.5 - 0.25; up to 7 iff ema > 2.5
    assert sglang_recompute(c, 1, 0.25, up, down)[0] == 0 and sglang_recompute(c, 1, 0.26, up, down)[0] == 1
    assert sglang_recompute(c, 1, 2.5, up, down)[0] == 1 and sglang_recompute(c, 1, 2.51, up, down)[0] == 2
    assert sglang_recompute(c, 2, 2.25, up, down)[0] == 1 and sglang_recompute(c, 0, 0.51, up, down)[0] == 1
    # slots by batch size (0.5.23), and the 0.5.11 tiers everywhere
    assert sglang_slot(7)[0] == [1, 3, 7] and sglang_slot(8)[0] == [0, 1, 3] and sglang_slot(40)[0] == [0, 1]
    assert sglang_slot(128)[0] == [0] and sglang_slot(128, "0.5.11")[0] == [1, 3, 7]
    # tier 0 probes the next tier and lifts a negative EMA to its k - 1
    assert sglang_recompute([0, 1, 3], 0, -1.0, 0.0, 0.0) == (1, 0.0)


def test_sglang_vectorised_equals_scalar():
    rng = np.random.default_rng(0)
    for bs in (1, 8, 32):
        c, up, down = sglang_slot(bs)
        idx = rng.integers(0, len(c), 500)
        ema = rng.uniform(-1, 8, 500)
        vi, ve = sglang_recompute_many(c, idx, ema, up, down)
        for i in range(500):
            assert (vi[i], ve[i]) == pytest.approx(sglang_recompute(c, int(idx[i]), float(ema[i]), up, down))


def test_sglang_warmup_then_interval():
    # EAGLE always accepts everything (acc 21): the EMA climbs from 2 (k 3) by 0.2 * (k) per step; nothing moves
    # during the 10 warm-up steps, then at step 15 (the first interval) 3 -> 7
    L = 200
    inp = inputs([5], list(range(L)), [1] * L, [21] * L)
    st = walk(inp, SGLangAdaptive(1))[0]
    assert (st.n_i[:15] == 4).all() and st.n_i[15] == 8


def test_dynamic_sd_schedule():
    assert [dynamic_sd_k(b) for b in (1, 8, 16, 17, 63, 64, 128, 200, 256, 4096)] == [3, 3, 3, 3, 3, 2, 2, 2, 0, 0]


def test_ngram_or_eagle_by_hand():
    # p = 1, 2: no match -> EAGLE 3 (acc 1, 1); p = 3: n-gram min(5, 4) = 4 (acc 2 -> gain 2); p = 5: EAGLE 3
    inp = inputs([1, 2, 3, 4], [1, 2, 3, 4, 9, 8], [1, 1, 1, 2, 1, 1], [1, 1, 1, 1, 1, 1])
    st = walk(inp, NgramOrEagle())[0]
    assert st.pos.tolist() == [1, 2, 3, 5] and st.drafter.tolist() == [EAGLE, EAGLE, NGRAM, EAGLE]
    assert (st.n_i - 1).tolist() == [3, 3, 4, 3] and (st.eagle == 1).all() and (st.ngram == 1).all()


@pytest.mark.parametrize("ctx, kw, score, draft", [
    ([1, 2, 3, 4, 5, 1, 2, 3], {}, 1.5, [4, 5, 1]),
    ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], {}, 2.0, [4, 1, 2, 3]),
    ([1, 2, 3, 9, 1, 2, 3, 4, 1, 2, 3], {}, 1.0, [9, 1, 2]),
    ([7, 7, 7, 7, 7, 7], {}, 1.5, [7, 7, 7]),
    ([5, 6, 1, 2, 3, 4, 8, 9, 1, 2, 3, 4, 8, 9, 1, 2, 3, 4, 8, 9, 1, 2], {"max_spec": 32}, 14 / 3, None),
    ([5, 6, 1, 2, 3, 4, 8, 9, 1, 2, 3, 4, 8, 9, 1, 2, 3, 4, 8, 9, 1, 2], {"max_spec": 3}, 2.0, None),
    ([5, 6, 1, 2, 3, 4, 8, 9, 1, 2, 3, 4, 8, 9, 1, 2, 3, 4, 8, 9, 1, 2], {"max_spec": 32, "min_prob": 0.7}, 1.5, None),
])
def test_suffix_score_matches_arctic_cpp(ctx, kw, score, draft):
    s, d = suffix_draft(ctx, **kw)
    assert s == pytest.approx(score, abs=1e-3)
    if draft is not None:
        assert d == draft


def test_suffix_scores_fast_equals_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(15):
        P, O = rng.integers(0, 3, 10).tolist(), rng.integers(0, 3, 30).tolist()
        sc, ln, gain = suffix_scores(P, O, min_match=4)
        for p in range(len(O)):
            bs, bd = suffix_draft(P + O[:p], min_match=4)
            assert sc[p] == pytest.approx(bs) and ln[p] == len(bd)
            n = 0
            while n < len(bd) and p + n < len(O) and O[p + n] == bd[n]:
                n += 1
            assert gain[p] == 1 + n


def test_arctic_rule_uses_suffix_when_score_reaches_k():
    # the prompt repeats "1 2 3 4 5 6" four times and the output copies it twice, then leaves it: the suffix
    # draft (score >= 3) takes the copy in one step; the new tokens after it have no match: EAGLE's k = 3
    base = [1, 2, 3, 4, 5, 6]
    inp = inputs(base * 4, base * 2 + [7, 8, 9, 10], [1] * 16, [1] * 16)
    from sdlib.sim.policy.table import policy_steps_at

    st = policy_steps_at(inp, "arctic", [(None, 1)])[0]
    assert st.drafter[0] == NGRAM and st.gain[0] == 12
    assert (st.drafter == NGRAM).any() and (st.drafter == EAGLE).any()
    used = st.drafter == NGRAM
    assert (st.gain[used] > 1).all() and (st.eagle == 1).all()
