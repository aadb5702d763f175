"""Oracle Select (sdlib.sim.policy.select): the dynamic program against a brute force over every action
sequence of tiny traces, and the bound against every registered policy on every trace file of the repository."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

import sdlib.sim.policy  # noqa: F401  (registers the policies)
from sdlib.core.registry import POLICIES, PolicyRef
from sdlib.paths import resolve
from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B
from sdlib.sim.costmodels import load_cost_model
from sdlib.sim.policy.confidence import load_confidences
from sdlib.sim.policy.select import K_PRICE_MAX, PRICE_MODES, oracle_select_steps, select_prices
from sdlib.sim.policy.table import simulate_policies, summarise
from sdlib.sim.policy.training import REFERENCE_PREDICTOR, load_predictor
from sdlib.sim.policy.walk import EAGLE, NGRAM, NONE, PolicyInputs, position_steps, request_times
from sdlib.sim.prepared import PreparedTraces, prepare_traces, select_requests, truncate_traces
from sdlib.sim.traces import load_our_traces, load_reference_traces
from tests.conftest import toy_cost_model
from tests.test_policies import toy_engine

BATCH_SIZES = (1, 8, 32, 128)
ENGINE = "h200_replay_engine"
REL = 1e-9


def tiny(rng, n_req: int = 3, L: int = 6, lmax: int = 3) -> PreparedTraces:
    """Random tiny requests: acceptances <= lmax + 1 and within the tokens left, a random n-gram look-up."""
    acc = {"ngram": [], "eagle3": []}
    avail = []
    for _ in range(n_req):
        left = L - np.arange(L)
        av = rng.integers(0, lmax + 1, L)
        acc["ngram"].append(np.minimum(np.minimum(rng.integers(1, lmax + 2, L), av + 1), left))
        acc["eagle3"].append(np.minimum(rng.integers(1, lmax + 2, L), left))
        avail.append(av)
    for a in acc.values():
        for x in a:
            x[0] = 1
    return PreparedTraces(np.array(["toy"] * n_req, object), np.array([f"r{i}" for i in range(n_req)], object),
                          rng.integers(1, 50, n_req).astype(np.int64), np.full(n_req, L, np.int64), acc, avail)


def brute_force(inp: PolicyInputs, r: int, cm, B: int, lmax: int) -> float:
    """Least decode time of request ``r`` over every action sequence, each action priced by every mode of
    :data:`PRICE_MODES` at every k it allows, straight through the cost model."""
    L, P = int(inp.L[r]), int(inp.prep.prompt_len[r])
    o = inp.off[r]

    @functools.lru_cache(maxsize=None)
    def price(p: int, d: int, l: int) -> float:
        best = np.inf
        for m in PRICE_MODES:
            if m.drafter != d:
                continue
            ks = {"zero": [0], "proposed": [l], "free": range(l, K_PRICE_MAX + 1)}[m.k]
            for k in ks:
                t = cm.step_seconds(B, np.array([B * (P + p)], float), np.array([l + 1.0]), np.array([k]), m.eagle,
                                    np.array([l + 1.0]), m.ngram, m.path)
                best = min(best, float(np.asarray(t).ravel()[0]))
        return best

    def actions(p: int):
        yield NONE, 0, 1
        for l in range(1, min(int(inp.avail[o + p]), lmax) + 1):
            yield NGRAM, l, min(int(inp.acc_ng[o + p]), l + 1)
        for l in range(1, lmax + 1):
            yield EAGLE, l, min(int(inp.acc_eg[o + p]), l + 1)

    best = np.inf
    # every sequence of actions: a sequence is a choice of action index at each step until L
    stack = [(1, 0.0)]
    while stack:
        p, t = stack.pop()
        if p >= L:
            best = min(best, t)
            continue
        for d, l, g in actions(p):
            stack.append((p + g, t + price(p, d, l)))
    return best


@pytest.mark.parametrize("cm_name", ["toy", "toy_engine", "authors"])
def test_program_equals_brute_force(cm_name):
    cm = {"toy": toy_cost_model(), "toy_engine": toy_engine(), "authors": AUTHORS_H100_LLAMA8B}[cm_name]
    if cm_name == "toy_engine":
        cm = cm.replace(prefill=AUTHORS_H100_LLAMA8B)
    rng = np.random.default_rng(7)
    lmax = 3
    for B in (1, 8):
        prep = tiny(rng, lmax=lmax)
        inp = PolicyInputs.of(prep, kmax=lmax)
        vals = {}
        st = oracle_select_steps(inp, cm, B, values=vals, lmax=lmax)
        for r in range(len(prep)):
            assert vals["V1"][r] == pytest.approx(brute_force(inp, r, cm, B, lmax), rel=1e-12)
        # the steps price back to the program's value (+ the prefill), and reach the end
        pre = cm.prefill_seconds(float(B) * prep.prompt_len)
        np.testing.assert_allclose(request_times(inp, st, cm, B), pre + vals["V1"], rtol=1e-12)
        ends = np.bincount(st.req, weights=st.gain, minlength=len(prep)) + 1
        assert (ends >= inp.L).all() and (ends - inp.L <= lmax).all()


def test_select_prices_by_hand():
    # toy: T = 1 + 0.1 * B * n_i; EAGLE +0.5; n-gram +0.1 T. bs 1, l = 2: EAGLE 1.3 + 0.5, n-gram 1.1 * 1.3
    pr = select_prices(toy_cost_model(), 1, 3)
    assert pr.base[NONE][0] == pytest.approx(1.1) and pr.base[NONE][1] == np.inf
    assert pr.base[EAGLE][2] == pytest.approx(1.8) and pr.base[NGRAM][2] == pytest.approx(1.43)
    # toy engine at B 1: n-gram l = 1 is cheaper on the padded path (alpha 2.0) than on the ragged one (5.0 + 0.2)
    e = toy_engine()
    pe = select_prices(e, 1, 3)
    assert pe.base[NGRAM][1] == pytest.approx(2.0) and PRICE_MODES[pe.mode[NGRAM][1]].path == "padded"


def _repo_traces():
    """Every trace file of the repository, small: the embedded traces whole, the reference traces 6 requests
    of each dataset cut to 384 tokens (truncated: every policy runs to the same length)."""
    emb = truncate_traces(prepare_traces(load_our_traces("data/traces/embedded_*.jsonl.gz"), keep_tokens=True), None)
    ref = prepare_traces(load_reference_traces(), keep_tokens=True)
    ref = truncate_traces(select_requests(ref, 6), 384)
    conf = load_confidences(str(resolve("data/traces/confidences/embedded_*.jsonl.gz")))
    return [("embedded", emb, 8, conf), ("reference", ref, 20, None)]


def _every_policy(with_confidences: bool, kmax: int) -> list[PolicyRef]:
    """Every instance of every simulated spec (k up to the traces' ``kmax``)."""
    out = []
    for spec in POLICIES.values():
        if not spec.simulate or ("confidences" in spec.needs and not with_confidences):
            continue
        out += [r for r in spec.refs() if r.k is None or r.k <= kmax]
    return out


def test_no_registered_policy_exceeds_oracle_select():
    cms = [AUTHORS_H100_LLAMA8B, load_cost_model(ENGINE)]
    for name, prep, kmax, conf in _repo_traces():
        inp = PolicyInputs.of(prep, kmax)
        refs = _every_policy(conf is not None, kmax)
        per = simulate_policies(prep, refs, BATCH_SIZES, cms, predictor=load_predictor(resolve(REFERENCE_PREDICTOR), inp),
                                kmax=kmax, confidences=conf)
        w = per.set_index(["cost_model", "batch_size", "dataset", "request_id", "policy"])["sd_tok_per_s"].unstack()
        sel = w["oracle-select"]
        over = w.drop(columns="oracle-select").gt(sel * (1 + REL), axis=0)
        assert not over.to_numpy().any(), f"{name}: {over.stack()[over.stack()].index.tolist()[:5]}"
        table, gaps = summarise(per, n_boot=20, upper="oracle-select")
        cell = table.pivot_table(index=["cost_model", "dataset", "batch_size"], columns="policy", values="speedup")
        assert (cell.drop(columns="oracle-select").le(cell["oracle-select"] * (1 + REL), axis=0)).all().all()
        assert (gaps["upper_speedup"] >= gaps["combine_speedup"] * (1 - REL)).all()
        assert (gaps["upper"] == "oracle-select").all() and gaps["combine_gap_share"].notna().any()


def test_select_at_least_the_single_drafter_oracles_and_combine():
    prep = truncate_traces(prepare_traces(load_our_traces("data/traces/embedded_*.jsonl.gz")), None)
    inp = PolicyInputs.of(prep, 8)
    for cm, B in itertools.product([toy_cost_model(), AUTHORS_H100_LLAMA8B], BATCH_SIZES):
        t = request_times(inp, oracle_select_steps(inp, cm, B), cm, B)
        for kind, d in (("oracle", "eagle3"), ("oracle", "ngram"), ("combine", None)):
            assert (request_times(inp, position_steps(inp, kind, d), cm, B) >= t * (1 - REL)).all()
