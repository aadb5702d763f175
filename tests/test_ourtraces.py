"""sdlib.run.traces: offline n-gram traces by hand and against vLLM, per-position model traces, file round trip.

Fast tier: hand-made sequences, a brute-force cross-check, a fake LLM for the
per-position logic. Engine tier (``-m engine``): vLLM's own n-gram function on
random sequences, vLLM n-gram runs vs the offline replay (every step), an
identical draft model gaining ``min(k + 1, tokens left)`` everywhere, and an
EAGLE / EAGLE-3 smoke run.
"""

from __future__ import annotations

import gzip
import json
import random
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sdlib.extract.ngram import (ngram_acc_len, ngram_lookup_lengths, ngram_propose, ngram_replay, ngram_trace)
from sdlib.run.traces import Greedy, greedy_from_sweep, model_acc_lens, position_prompts
from sdlib.sim.prepared import prepare_traces
from sdlib.sim.traces import (TRACE_KEYS, load_our_traces, mean_acc_len, read_trace_file, read_traces,
                              write_traces)


# --------------------------------------------------------------------------- n-gram proposal rule, by hand
def test_propose_longest_match_wins_over_a_later_shorter_one():
    #            0  1  2  3  4  5  6  7  8  9
    ctx = [5, 1, 2, 3, 7, 9, 2, 3, 0, 1, 2, 3]
    # suffix [1,2,3] occurs at 1 (-> 7 9 2 3 ...); [2,3] also at 6 (-> 0 ...): the longest wins
    assert ngram_propose(ctx, nmin=2, nmax=3, k=3) == [7, 9, 2]


def test_propose_earliest_occurrence_of_the_longest():
    ctx = [1, 2, 8, 1, 2, 9, 1, 2]
    assert ngram_propose(ctx, nmin=2, nmax=4, k=2) == [8, 1]  # [1,2] at 0 and 3: earliest


def test_propose_caps_and_thresholds():
    ctx = [4, 4, 4, 4]
    # [4,4,4] occurs at 0 (overlapping the suffix at 1): one token after it is left in the context
    assert ngram_propose(ctx, nmin=3, nmax=3, k=5) == [4]
    assert ngram_propose(ctx, nmin=2, nmax=2, k=5) == [4, 4]  # [4,4] at 0 -> tokens 2..3
    assert ngram_propose(ctx, nmin=2, nmax=2, k=1) == [4]  # k caps
    assert ngram_propose(ctx, nmin=2, nmax=2, k=5, max_model_len=5) == [4]  # room before max_model_len
    assert ngram_propose(ctx, nmin=2, nmax=2, k=5, max_model_len=4) == []
    assert ngram_propose([1, 2], nmin=3, nmax=4, k=5) == []  # context shorter than nmin
    assert ngram_propose([1, 2, 3, 4, 5], nmin=1, nmax=3, k=5) == []  # nothing repeats


def test_trace_by_hand():
    # tokens 1 2 3 4 | 1 2 3 4 9 (prompt | output); n in [2, 3], k = 4
    tr = ngram_trace([1, 2, 3, 4], [1, 2, 3, 4, 9], k=4, nmin=2, nmax=3)
    # p=1: context ends "4 1": no repeated suffix -> 1
    # p=2: "1 2" at 0 -> propose 3 4 1 2 vs output[2:] = 3 4 9: 2 match -> 3 (= tokens left, 3)
    # p=3: "1 2 3" at 0 -> propose 4 1 2 3 vs 4 9: 1 match -> 2
    # p=4: one token left -> 1
    assert tr.acc_len.tolist() == [1, 1, 3, 2, 1]
    assert tr.drafted.tolist() == [0, 0, 4, 4, 4]
    assert ngram_acc_len([1, 2, 3, 4], [1, 2, 3, 4, 9], k=2, nmin=2, nmax=3) == [1, 1, 3, 2, 1]
    assert ngram_acc_len([1, 2, 3, 4], [1, 2, 3, 4, 9], k=1, nmin=2, nmax=3) == [1, 1, 2, 2, 1]


def test_trace_constant_run_caps_at_tokens_left_and_k():
    out = [7] * 12
    acc = ngram_acc_len([1, 2], out, k=3, nmin=3, nmax=3)
    # p=3: context 1 2 7 7 7: [7,7,7] only as the suffix -> 1; p=4: [7,7,7] at 2 -> 1 token (7) -> 2;
    # p=5: 2 tokens -> 3; p>=6: k=3 -> 4, until the tokens left (12 - p) cap it
    assert acc == [1, 1, 1, 1, 2, 3, 4, 4, 4, 3, 2, 1]
    assert ngram_replay([1, 2], out, k=3, nmin=3, nmax=3) == {
        "positions": [1, 2, 3, 4, 6, 10], "gains": [1, 1, 1, 2, 4, 2], "drafted": [1, 3, 3], "accepted": [1, 3, 1]}


def _random_case(rng, vocabs, max_p, max_l, max_nmin, max_k, max_mml_extra, mml_optional):
    """A random (prompt + output, P, L, nmin, nmax, k, max_model_len) for the n-gram look-up checks."""
    V = rng.choice(vocabs)
    P, L = rng.randint(0, max_p), rng.randint(1, max_l)
    seq = [rng.randrange(V) for _ in range(P + L)]
    nmin = rng.randint(1, max_nmin)
    nmax = nmin + rng.randint(0, 4)
    k = rng.randint(1, max_k)
    mml = P + L + rng.randint(0, max_mml_extra)
    if mml_optional:
        mml = rng.choice([None, mml])
    return seq, P, L, nmin, nmax, k, mml


def test_trace_agrees_with_brute_force_and_oracle_lookup():
    rng = random.Random(1)
    for _ in range(200):
        seq, P, L, nmin, nmax, k, mml = _random_case(rng, [2, 3, 6, 50], 25, 30, 3, 8, 4, mml_optional=True)
        tr = ngram_trace(seq[:P], seq[P:], k, nmin, nmax, mml)
        for p in range(1, L):
            prop = ngram_propose(seq[:P + p], nmin, nmax, k, mml)
            assert tr.drafted[p] == len(prop)
            assert seq[tr.start[p]:tr.start[p] + tr.drafted[p]] == prop if prop else tr.start[p] == -1
            m = 0
            while m < len(prop) and P + p + m < len(seq) and prop[m] == seq[P + p + m]:
                m += 1
            assert tr.acc_len[p] == min(1 + m, L - p)
        # the reused lookup: proposals available = tokens after the match, capped at k
        if mml is None:
            av = ngram_lookup_lengths(seq[:P], seq[P:], nmin, nmax, max_k=k)
            assert (np.minimum(av[1:], k) == tr.drafted[1:]).all()


# --------------------------------------------------------------------------- per-position model traces (fake engine)
class FakeSDEngine:
    """A vLLM ``LLMEngine`` stand-in (DELTA outputs) whose per-position requests follow a table.

    ``acc[i][p]`` = accepted + 1 of the verify step at p of request i; each
    request emits its prefill token, then ``acc`` tokens, then ``k + 1`` per step
    until ``max_tokens`` (its params are just max_tokens). ``wrong[(i, p)]`` =
    how many submissions answer with a wrong prefill token; ``lie`` is added to
    the accepted counts of the detailed metrics.
    """

    def __init__(self, greedy, k, acc, wrong=None, lie=0):
        self.k, self.acc, self.wrong, self.lie = k, acc, dict(wrong or {}), lie
        self.index = {tuple(g.prompt_token_ids + g.output_token_ids[:p - 1]): (i, p)
                      for i, g in enumerate(greedy) for p in range(1, len(g.output_token_ids))}
        self.greedy = greedy
        self.live, self.added, self.aborted, self.emitted = {}, [], [], {}

    def add_request(self, rid, prompt, max_tokens):
        i, p = self.index[tuple(prompt["prompt_token_ids"])]
        toks = list(self.greedy[i].output_token_ids[p - 1:]) + [99] * 40
        if self.wrong.get((i, p), 0) > 0:
            self.wrong[(i, p)] -= 1
            toks[0] = 12345
        chunks, accepted, n = [toks[:1]], [], 1
        while n < max_tokens:
            gain = self.acc[i][p] if not accepted else self.k + 1
            accepted.append(gain - 1)
            chunks.append(toks[n:min(n + gain, max_tokens)])
            n += gain
        self.live[rid] = (chunks, accepted)
        self.added.append(rid)

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        outs = []
        for rid, (chunks, accepted) in list(self.live.items()):
            toks = chunks.pop(0)
            fin = not chunks
            det = SimpleNamespace(per_step_drafted=[self.k] * len(accepted),
                                  per_step_accepted=[a + self.lie for a in accepted]) if fin else None
            outs.append(SimpleNamespace(request_id=rid, finished=fin,
                                        outputs=[SimpleNamespace(token_ids=toks, spec_decode_metrics=det)]))
            self.emitted[rid] = self.emitted.get(rid, 0) + 1
            if fin:
                del self.live[rid]
        return outs

    def abort_request(self, rids):
        for r in rids:
            self.live.pop(r)
            self.aborted.append(r)


def _greedy_set():
    return [Greedy("a", [1, 2, 3], [10, 11, 12, 13, 14, 15]), Greedy("b", [4], [20, 21, 22]),
            Greedy("c", [5, 6], [30])]


def _mt(max_tokens):
    return max_tokens


def test_position_prompts():
    items = position_prompts(_greedy_set(), k=2)
    assert [(i, p, mt) for i, p, _, mt in items] == [(0, 1, 4), (0, 2, 4), (0, 3, 4), (0, 4, 3), (1, 1, 3)]
    assert items[1][2] == [1, 2, 3, 10]  # prompt + output[:p-1]: the prefill samples output[1]


def test_model_acc_lens_reads_first_step_stops_there_and_retries():
    g = _greedy_set()
    k = 2
    true = [[1, 3, 2, 3, 2, 1], [1, 2, 1], [1]]
    eng = FakeSDEngine(g, k, true, wrong={(0, 2): 1, (0, 3): 5})
    accs, unresolved, st = model_acc_lens(eng, g, k, retry_batch=4, make_params=_mt)
    assert [a.tolist() for a in accs] == true
    assert st.positions == 5 and st.mismatch_prefill == 2 and st.mismatch_verify == 0 and st.bad_structure == 0
    assert st.retried == 2 and st.unresolved == 1 and unresolved == [[3], [], []]
    assert len(eng.added) == 7
    assert max(eng.emitted.values()) == 2  # nobody ran past its first verify step
    # verify steps that fill max_tokens end by themselves: (0,1) 3 of 3 tokens, (0,3) 3 of 3, (0,4) 2 of 2,
    # (1,1) 2 of 2 (their detailed metrics are checked); (0,2) gains 2 of 3 and is aborted
    assert [r.split("-")[-1] for r in eng.aborted if "retry" not in r] == ["1"]
    assert st.detailed_checked == 4
    # without retry both stay unresolved
    eng = FakeSDEngine(g, k, true, wrong={(0, 2): 1})
    _, unresolved, st = model_acc_lens(eng, g, k, retry_batch=None, make_params=_mt)
    assert unresolved == [[2], [], []] and st.unresolved == 1 and len(eng.added) == 5


def test_model_acc_lens_caps_at_tokens_left_and_checks_detailed():
    g = [Greedy("a", [1], [10, 11, 12, 13])]
    k = 4
    # the drafter accepts everything (k) at every position: gains capped by tokens left
    eng = FakeSDEngine(g, k, [[1, 5, 5, 5]])
    accs, _, st = model_acc_lens(eng, g, k, make_params=_mt)
    assert accs[0].tolist() == [1, 3, 2, 1] and st.unresolved == 0 and st.mismatch_verify == 0
    assert st.detailed_checked == 2 and st.bad_structure == 0
    # detailed metrics that disagree with the tokens gained are flagged
    eng = FakeSDEngine(g, k, [[1, 3, 2, 1]], lie=-1)
    accs, unresolved, st = model_acc_lens(eng, g, k, make_params=_mt, retry_batch=None)
    assert accs[0].tolist() == [1, 3, 2, 1] and st.bad_structure == 2 and unresolved == [[1, 2]]


# --------------------------------------------------------------------------- sweep input, file round trip
def test_greedy_from_sweep_tables():
    runs = pd.DataFrame({"run_id": ["n1", "n8", "g1", "n1b"], "method": ["none", "none", "ngram", "none"],
                         "batch_size": [1, 8, 1, 1], "dataset": ["d", "d", "d", "d"], "model": ["m"] * 4,
                         "repeat": [0, 0, 0, 1]})
    req = pd.DataFrame({"run_id": ["n1", "n1", "n8", "g1", "n1b"], "request_id": ["r0", "r1", "r0", "r0", "r0"],
                        "prompt_index": [0, 1, 0, 0, 0], "finish_reason": ["length"] * 5,
                        "prompt_token_ids": ["[1, 2]", "[3]", "[1, 2]", "[1, 2]", "[1, 2]"],
                        "output_token_ids": ["[5, 6]", "[7]", "[9, 9]", "[8, 8]", "[0, 0]"]})
    g = greedy_from_sweep((runs, req))
    assert [(x.request_id, x.prompt_token_ids, x.output_token_ids) for x in g] == [
        ("d-0", [1, 2], [5, 6]), ("d-1", [3], [7])]
    assert [x.output_token_ids for x in greedy_from_sweep((runs, req), batch_size=8)] == [[9, 9]]
    with pytest.raises(ValueError):
        greedy_from_sweep((runs, req), dataset="other")


def test_write_read_round_trip(tmp_path):
    g = _greedy_set()[:2]
    rows = []
    for m, accs in {"ngram": [[1, 2, 1, 1, 2, 1], [1, 1, 1]], "eagle3": [[1, 3, 2, 2, 2, 1], [1, 2, 1]],
                    "eagle": [[1, 1, 1, 1, 1, 1], [1, 1, 1]], "draft_model": [[1, 4, 3, 3, 2, 1], [1, 2, 1]]}.items():
        for x, a in zip(g, accs):
            rows.append({"dataset": "toy", "request_id": x.request_id, "prompt_token_ids": x.prompt_token_ids,
                         "output_token_ids": x.output_token_ids, "method": m, "acc_len": a, "k": 3,
                         "mismatch_positions": [2] if (m == "eagle" and x.request_id == "a") else []})
    df = pd.DataFrame(rows)
    path = write_traces(df, tmp_path / "t" / "toy.jsonl.gz", {"note": "test", "dataset": "toy", "k": 3})
    with gzip.open(path, "rt") as f:
        first = json.loads(f.readline())
    assert set(first) == {"id", "prompt_token_ids", "generated_token_ids", *TRACE_KEYS.values()}
    assert first["acc_eagle"]["acc_len"] == [1, 3, 2, 2, 2, 1]  # EAGLE-3 under the authors' key
    assert first["acc_eagle1"]["acc_len"] == [1, 1, 1, 1, 1, 1]
    back = read_traces(path, "toy")
    key = ["request_id", "method"]
    pd.testing.assert_frame_equal(back.sort_values(key).reset_index(drop=True)[back.columns],
                                  df.sort_values(key).reset_index(drop=True)[back.columns])
    # the glob loader takes dataset and k from the provenance file
    both = load_our_traces([str(tmp_path / "t" / "*.jsonl.gz"), str(tmp_path / "none-*.jsonl.gz")])
    assert len(both) == len(df) and set(both.k) == {3} and set(both.dataset) == {"toy"}
    assert load_our_traces(str(tmp_path / "missing-*.jsonl.gz")).empty
    # the default loader (authors' keys) sees ngram + eagle3 and feeds the simulator
    ref = read_trace_file(path, "toy")
    assert sorted(ref.method.unique()) == ["eagle3", "ngram"]
    assert len(prepare_traces(ref)) == 2
    prov = json.loads((tmp_path / "t" / "toy.provenance.json").read_text())
    assert prov["note"] == "test" and prov["mismatch_positions"] == {"eagle/a": [2]}
    assert mean_acc_len(df)["draft_model"] == pytest.approx((4 + 3 + 3 + 2 + 1 + 2 + 1) / 7)


def test_cli_from_sweep_ngram_only(tmp_path):
    """The CLI end to end without an engine: greedy outputs from a sweep folder, n-gram traces only."""
    from sdlib.cli import main
    from sdlib.store.schema import columns
    from sdlib.store import write_parquet_atomic

    def table(name, **cols):
        n = len(next(iter(cols.values())))
        return pd.DataFrame({c: cols.get(c, [None] * n) for c in columns(name)})

    sweep = tmp_path / "sw"
    runs = table("runs", run_id=["base", "ng"], method=["none", "ngram"], batch_size=[1, 1],
                 dataset=["code_edit"] * 2, model=["m"] * 2, repeat=[0, 0])
    prompts, outputs = [[1, 2, 3, 4], [5, 6]], [[1, 2, 3, 4, 9], [7, 7, 7, 7, 7, 7]]
    req = table("requests", run_id=["base", "base"], request_id=["r0", "r1"], prompt_index=[0, 1],
                finish_reason=["length"] * 2, prompt_token_ids=[json.dumps(p) for p in prompts],
                output_token_ids=[json.dumps(o) for o in outputs])
    from sdlib.store.schema import conform

    write_parquet_atomic(conform("runs", runs), sweep / "runs" / "x.parquet")
    write_parquet_atomic(conform("requests", req), sweep / "requests" / "x.parquet")
    out = tmp_path / "traces" / "t.jsonl.gz"
    assert main(["traces", "--from-sweep", str(sweep), "--dataset", "code_edit", "--methods", "ngram", "--k", "4",
                 "--ngram-min", "2", "--ngram-max", "3", "--out", str(out)]) == 0
    back = read_traces(out, "code_edit")
    assert back.method.tolist() == ["ngram", "ngram"]
    assert back.acc_len.tolist() == [[1, 1, 3, 2, 1], ngram_acc_len([5, 6], [7] * 6, 4, 2, 3)]
    prov = json.loads((tmp_path / "traces" / "t.provenance.json").read_text())
    assert prov["greedy_source"].startswith("sweep:") and prov["k"] == 4 and prov["keys"] == {"ngram": "acc_ngram"}


# =========================================================================== engine tier
K = 4
NGRAM_MIN, NGRAM_MAX = 2, 5


@pytest.fixture(scope="module")
def models():
    from sdlib.paths import MODELS_DIR
    from sdlib.models.tinymodels import build_models

    return build_models(MODELS_DIR)


@pytest.fixture(scope="module")
def prompts(models):
    from transformers import AutoTokenizer

    from sdlib.config import WorkloadConfig
    from sdlib.workloads import load_prompts

    tok = AutoTokenizer.from_pretrained(str(models["target"]))
    return load_prompts(WorkloadConfig(dataset="code_edit", source="package", num_requests=6,
                                       max_prompt_tokens=300), tok)


@pytest.mark.engine
def test_offline_ngram_equals_vllm_function_on_random_sequences():
    from sdlib.vllm.compat import ngram_proposal

    rng = random.Random(0)
    checked = 0
    for _ in range(150):
        seq, P, L, nmin, nmax, k, mml = _random_case(rng, [2, 3, 5, 20], 30, 40, 4, 10, 5, mml_optional=False)
        tr = ngram_trace(seq[:P], seq[P:], k, nmin, nmax, mml)
        for p in range(1, L):
            want = ngram_proposal(seq[:P + p], nmin, nmax, mml, k)
            got = seq[tr.start[p]:tr.start[p] + tr.drafted[p]] if tr.drafted[p] else []
            assert got == want, (seq[:P + p], nmin, nmax, k)
            checked += 1
    assert checked > 2000


@pytest.fixture(scope="module")
def ngram_run(models, prompts):
    """A vLLM n-gram run (k=K) driven step by step, batch size 3, detailed per-request metrics."""
    from sdlib.vllm import compat as vc
    from sdlib.run.driver import drive
    from sdlib.vllm.engine import EngineSettings, close_engine, make_engine

    llm = make_engine(models["target"], "ngram", K, settings=EngineSettings(max_num_seqs=8),
                      ngram_min=NGRAM_MIN, ngram_max=NGRAM_MAX)
    try:
        res = drive(llm.llm_engine, prompts, 3, lambda p: vc.delta_sampling_params(40, 0.0, 0, False),
                    spec_metrics=vc.request_spec_metrics)
    finally:
        close_engine(llm)
    return res


@pytest.mark.engine
def test_offline_ngram_replays_every_vllm_step(ngram_run):
    from sdlib.extract.acceptance import steps_from_gains

    steps = drafted_steps = acc_agree = full_agree = 0
    for r in ngram_run.requests:
        assert r.detailed is not None, "vLLM gave no detailed per-request metrics"
        L = len(r.token_ids)
        tr = ngram_trace(r.prompt_token_ids, r.token_ids, K, NGRAM_MIN, NGRAM_MAX)
        rep = ngram_replay(r.prompt_token_ids, r.token_ids, K, NGRAM_MIN, NGRAM_MAX)
        # exact: tokens per engine step, and the (drafted, accepted) lists vLLM reports, step by step
        assert r.gains == [1] + rep["gains"]
        drafted_v, accepted_v = r.detailed
        assert drafted_v == rep["drafted"]
        pos_d = [p for p in rep["positions"] if tr.drafted[p] > 0]
        assert [min(a + 1, L - p) for a, p in zip(accepted_v, pos_d)] == [a + 1 for a in rep["accepted"]]
        # per step as the sweep's steps table sees it (position, drafted, accepted)
        for row in steps_from_gains(r.gains, r.detailed, k=K):
            p = row["position"]
            steps += 1
            drafted_steps += tr.drafted[p] > 0
            acc_ok = min(row["accepted"] + 1, L - p) == tr.acc_len[p]
            acc_agree += acc_ok
            if acc_ok and row["drafted"] == tr.drafted[p]:
                full_agree += 1
            else:
                # the only allowed difference: sdlib.extract.acceptance.align places a (drafted, 0 accepted) entry
                # on the earliest one-token step, which need not be the one that drafted
                assert acc_ok and row["accepted"] == 0, (r.request_id, row, tr.drafted[p], tr.acc_len[p])
    assert steps > 50 and drafted_steps > 10
    assert acc_agree == steps


@pytest.fixture(scope="module")
def self_draft(models):
    """make_traces end to end: greedy outputs (no-SD engine), n-gram offline, a draft model = the target."""
    from sdlib.run.traces import make_traces
    from sdlib.vllm.engine import EngineSettings

    return make_traces(models["target"].parent, "code_edit", num_requests=4, max_output_tokens=24, k=K,
                       methods=["ngram", "draft_model"], drafters={"draft_model": models["target"]},
                       settings=EngineSettings(max_num_seqs=64), source="package", max_prompt_tokens=300)


@pytest.mark.engine
def test_identical_draft_gains_everything(self_draft):
    df, info = self_draft.traces, self_draft.info
    d = df[df.method == "draft_model"]
    assert len(d) == 4
    for r in d.itertuples():
        L = len(r.output_token_ids)
        assert L > 2
        assert r.acc_len == [1] + [min(K + 1, L - p) for p in range(1, L)]
        assert r.mismatch_positions == []
    st = info["model_stats"]["draft_model"]
    assert st["positions"] == sum(len(o) - 2 for o in d.output_token_ids)
    assert st["mismatch_prefill"] == st["mismatch_verify"] == st["bad_structure"] == 0
    # every verify step fills max_tokens, so every request ends by itself and vLLM's detailed
    # per-step acceptance was checked against the tokens gained at every position
    assert st["detailed_checked"] == st["positions"]
    ng = df[df.method == "ngram"]
    for r in ng.itertuples():
        assert r.acc_len == ngram_acc_len(r.prompt_token_ids, r.output_token_ids, K)


@pytest.mark.engine
def test_eagle_heads_give_valid_traces(models, self_draft, tmp_path):
    from sdlib.run.traces import make_traces
    from sdlib.vllm.engine import EngineSettings

    ng = self_draft.traces[self_draft.traces.method == "ngram"].head(2)
    greedy = [Greedy(r.request_id, r.prompt_token_ids, r.output_token_ids) for r in ng.itertuples()]
    run = make_traces(models["target"].parent, "code_edit", k=K, methods=["eagle", "eagle3"], greedy=greedy,
                      settings=EngineSettings(max_num_seqs=64))
    df = run.traces
    assert sorted(df.method.unique()) == ["eagle", "eagle3"]
    for r in df.itertuples():
        L = len(r.output_token_ids)
        a = np.asarray(r.acc_len)
        assert len(a) == L and a[0] == 1 and (a >= 1).all()
        assert (a <= np.minimum(K + 1, L - np.arange(L))).all()
    for m in ("eagle", "eagle3"):
        st = run.info["model_stats"][m]
        assert st["bad_structure"] == 0 and st["positions"] == sum(len(g.output_token_ids) - 2 for g in greedy)
    path = write_traces(pd.concat([self_draft.traces[self_draft.traces.request_id.isin(df.request_id)], df]),
                        tmp_path / "x.jsonl", run.info)
    assert set(read_traces(path, "code_edit").method) == {"ngram", "draft_model", "eagle", "eagle3"}


def test_committed_sweep_ngram_steps_sit_where_the_offline_lookup_drafts():
    """data/sweeps/embedded_default: every n-gram step drafted iff the offline look-up drafts there."""
    import json as _json

    from sdlib.config import load_sweep
    from sdlib.paths import CONFIGS_DIR, SWEEPS_DIR
    from sdlib.store import read_table

    d = SWEEPS_DIR / "embedded_default"
    runs, req, st = read_table(d, "runs"), read_table(d, "requests"), read_table(d, "steps")
    ng = runs[runs.method == "ngram"]
    if ng.empty:
        pytest.skip("no n-gram cells in the committed sweep")
    ids = lambda x: _json.loads(x) if isinstance(x, str) else list(x)  # noqa: E731
    cfg = load_sweep(CONFIGS_DIR / "embedded_default.yaml")
    spec = next(m for m in cfg.methods if m.name == "ngram").speculative_config()
    checked = 0
    for r in ng.itertuples():
        for q in req[req.run_id == r.run_id].itertuples():
            tr = ngram_trace(ids(q.prompt_token_ids), ids(q.output_token_ids), k=int(r.num_spec_tokens),
                             nmin=spec["prompt_lookup_min"], nmax=spec["prompt_lookup_max"],
                             max_model_len=cfg.models[0].max_model_len)
            s = st[(st.run_id == r.run_id) & (st.request_id == q.request_id)]
            assert ((s.drafted > 0).to_numpy() == (tr.drafted[s.position.to_numpy()] > 0)).all(), q.request_id
            checked += len(s)
    assert checked > 1000
