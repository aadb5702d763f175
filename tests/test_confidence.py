"""EAGLE-3 draft confidences (sdlib.run.confidences) and the confidence-stopping policy
(sdlib.sim.policy.confidence): the committed confidences are the head's and belong to the drafts vLLM
verified; a policy with perfect confidences walks exactly Oracle Proposal's steps; the calibration map is
monotone and right; missing confidences are one-line errors naming what is missing."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from sdlib.paths import resolve
from sdlib.sim.prepared import prepare_traces
from sdlib.sim.policy.walk import PolicyInputs, position_steps, walk
from sdlib.sim.prepared import truncate_traces

TRACE = "data/traces/embedded_sharegpt.jsonl.gz"
CONF = "data/traces/confidences/embedded_sharegpt.jsonl.gz"


def _rows(path):
    with gzip.open(resolve(path), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def inp():
    from sdlib.sim.traces import load_traces

    tr, k = load_traces(str(resolve(TRACE)))
    return PolicyInputs.of(truncate_traces(prepare_traces(tr, keep_tokens=True), None), k)


def test_committed_confidences_are_the_heads_and_agree_with_vllms_acceptance():
    from sdlib.run.confidences import chain_confidences, load_eagle3
    from sdlib.sim.traces import provenance_path

    trace, conf = {r["id"]: r for r in _rows(TRACE)}, _rows(CONF)
    prov = json.loads(provenance_path(resolve(CONF)).read_text())
    m = load_eagle3("@trained")
    r = conf[3]
    c, acc = chain_confidences(m, trace[r["id"]]["prompt_token_ids"], trace[r["id"]]["generated_token_ids"], prov["k"])
    assert acc == r["acc_eagle_offline"]
    assert len(c) == len(r["conf_eagle"]) and all(len(a) == len(b) for a, b in zip(c, r["conf_eagle"]))
    np.testing.assert_allclose(np.concatenate([x for x in c if x]), np.concatenate([x for x in r["conf_eagle"] if x]),
                               atol=2e-5)
    # the head's greedy acceptance is vLLM's (the trace) at almost every position, so the confidences belong to
    # the drafts vLLM verified; the provenance's count is the files' own
    eq = tot = 0
    for row in conf:
        ref = trace[row["id"]]["acc_eagle"]["acc_len"]
        n = min(len(ref), len(row["acc_eagle_offline"]))
        eq += sum(a == b for a, b in zip(row["acc_eagle_offline"][1:n], ref[1:n]))
        tot += n - 1
    assert prov["agreement_with_trace_acc_eagle"] == {"positions": tot, "equal": eq, "fraction": round(eq / tot, 6)}
    assert eq / tot > 0.95
    assert all(0.0 <= x <= 1.0 for row in conf for q in row["conf_eagle"] for x in q)


def test_confidences_after_a_rejected_draft_are_the_free_running_chains():
    """No look-ahead: at a position whose first draft is rejected, every later draft's confidence is the
    head's when it reads its own drafts (as an engine does), not the true output. Checked against the
    teacher-forced loop (unroll_head) run on the context followed by the chain's own drafts, built one
    draft at a time."""
    import torch

    from sdlib.models.train.llama import lm_features
    from sdlib.models.train.modules import rope, unroll_head
    from sdlib.run.confidences import load_eagle3

    trace, conf = {r["id"]: r for r in _rows(TRACE)}, _rows(CONF)
    m = load_eagle3("@trained")
    r, q = next((r, q) for r in conf for q in range(2, len(r["conf_eagle"]) - 12) if r["acc_eagle_offline"][q] == 1)
    t = trace[r["id"]]
    ctx = t["prompt_token_ids"] + t["generated_token_ids"][:q]
    b = len(ctx) - 2  # the chain's base: its last known token is ctx[-1]
    drafts, probs = [], []
    with torch.no_grad():
        for j in range(len(r["conf_eagle"][q])):
            seq = torch.tensor([ctx + drafts + [0]])  # the last token is a placeholder no chain step reads here
            T = seq.shape[1] - 1
            _, _, aux = lm_features(m.target, seq, m.aux_ids)
            cos, sin = rope(T, m.head.shape.head_dim, m.head.rope_theta, seq.device)
            xs = unroll_head(m.head, m.target.model.embed_tokens(seq[:, 1:]), m.head.combine([a[:, :T] for a in aux]),
                             cos, sin, j + 1)
            pr, a = m.head.logits(xs[j][:, b + j]).softmax(-1)[0].max(-1)
            probs.append(float(pr))
            drafts.append(int(m.draft_ids[a]))
    assert drafts[0] != t["generated_token_ids"][q]  # the first draft is the rejected one
    np.testing.assert_allclose(probs, r["conf_eagle"][q], atol=2e-5)


def _perfect(inp: PolicyInputs) -> dict:
    """Confidences that know the outcome: 1 for each draft that will be accepted, 0 from the first rejected."""
    out = {}
    for r, key in enumerate(zip(inp.prep.dataset, map(str, inp.prep.request_id))):
        acc = inp.acc_eg[inp.off[r]:inp.off[r] + inp.L_eagle[r]]
        out[key] = [[]] + [[1.0 if j < a - 1 else 0.0 for j in range(inp.kmax)] for a in acc[1:]]
    return out


def test_perfect_confidences_walk_oracle_proposals_steps(inp):
    from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B as cm
    from sdlib.sim.policy.confidence import RAW, ConfidencePolicy, attach_confidences

    attach_confidences(inp, _perfect(inp))
    try:
        st = walk(inp, ConfidencePolicy([cm, cm], [1, 128], inp, variant=RAW), n_configs=2)
        orc = position_steps(inp, "oracle", "eagle3")
        for s in st:
            a = np.lexsort((s.pos, s.req))
            b = np.lexsort((orc.pos, orc.req))
            for f in ("req", "pos", "gain", "n_i"):
                np.testing.assert_array_equal(getattr(s, f)[a], getattr(orc, f)[b], err_msg=f)
            # it drafted one token past each proposal (to see it would be rejected) unless all K were accepted
            np.testing.assert_array_equal(s.eagle_n[a], np.minimum(orc.n_i[b] + 1, inp.kmax + 1))
    finally:
        inp.extra.pop("conf_eagle", None)


def test_online_with_perfect_confidences_takes_every_eagle_step_to_its_acceptance(inp):
    """The full online policy with the length stopped on confidences: wherever it chose EAGLE-3, perfect
    confidences make it gain the trace's whole acceptance length, proposing it or one more, and it still
    chooses the n-gram where the predictor says so."""
    from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B as cm
    from sdlib.sim.policy.confidence import attach_confidences, confidence_steps
    from sdlib.sim.policy.features import add_features
    from sdlib.sim.policy.training import crossfit
    from sdlib.sim.policy.walk import EAGLE, NGRAM

    add_features(inp)
    pred = crossfit(inp)
    attach_confidences(inp, _perfect(inp))
    try:
        for s in confidence_steps(inp, "online-with-confidence", [(cm, 1), (cm, 128)], pred):
            e = s.drafter == EAGLE
            assert e.any() and (s.drafter == NGRAM).any()
            acc = inp.acc_eg[inp.off[s.req[e]] + s.pos[e]]
            np.testing.assert_array_equal(s.gain[e], acc)
            # calibrated (with the map's prior, a confidence of 0 is not quite 0): at most one draft past it
            assert set(np.unique(s.n_i[e] - acc)) <= {0, 1} and (s.n_i[e] == acc).mean() > 0.5
    finally:
        inp.extra.pop("conf_eagle", None)


def test_uninformative_confidences_give_one_length_per_cost():
    """Constant confidence: every step proposes the same length, longer when drafting is cheap relative to
    the step (bs 1) than at bs 128, where verification dominates."""
    from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B as cm
    from sdlib.sim.traces import load_traces
    from sdlib.sim.policy.confidence import RAW, ConfidencePolicy, attach_confidences

    tr, k = load_traces(str(resolve(TRACE)))
    inp = PolicyInputs.of(truncate_traces(prepare_traces(tr), None), k)
    attach_confidences(inp, {key: [[]] + [[0.7] * k] * 400 for key in zip(inp.prep.dataset, map(str, inp.prep.request_id))})
    s1, s128 = walk(inp, ConfidencePolicy([cm, cm], [1, 128], inp, variant=RAW), n_configs=2)
    full = s1.pos + inp.kmax < inp.L_eagle[s1.req]  # away from the end, where the zeros past the output stop it
    p1 = np.unique((s1.n_i - 1)[full])
    full = s128.pos + inp.kmax < inp.L_eagle[s128.req]
    p128 = np.unique((s128.n_i - 1)[full])
    assert p1.size == 1 and p128.size == 1 and p1[0] > p128[0] >= 1


def test_calibration_map_is_monotone_and_recovers_the_rate():
    from sdlib.sim.policy.confidence import CAL_BINS, fit_calibration

    rng = np.random.default_rng(0)
    c = rng.uniform(size=200_000)
    y = rng.uniform(size=c.size) < 0.2 + 0.7 * c  # true rate 0.2 + 0.7 c
    t = fit_calibration(c, y)
    assert t.size == CAL_BINS and np.all(np.diff(t) >= 0)
    mid = (np.arange(CAL_BINS) + 0.5) / CAL_BINS
    np.testing.assert_allclose(t, 0.2 + 0.7 * mid, atol=0.02)
    # a dip in the data is pooled, never kept
    y2 = y.copy()
    y2[(c > 0.5) & (c < 0.55)] = False
    assert np.all(np.diff(fit_calibration(c, y2)) >= 0)


def test_missing_confidences_are_one_line_errors(inp, tmp_path, capsys):
    from sdlib.cli import main
    from sdlib.sim.policy.confidence import attach_confidences

    with pytest.raises(ValueError, match="have no draft confidences, e.g."):
        attach_confidences(inp, {})
    out = str(tmp_path / "t.csv")
    assert main(["simulate", "--traces", str(resolve(TRACE)), "--policies", "online-confidence", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --confidences:")
    other = str(resolve("data/traces/confidences/embedded_code_edit.jsonl.gz"))  # another dataset's requests
    assert main(["simulate", "--traces", str(resolve(TRACE)), "--confidences", other, "--policies", "online-confidence",
                 "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --confidences:") and "not a --traces file" in err, err
    assert main(["simulate", "--traces", str(resolve(TRACE)), "--confidences", str(tmp_path / "none*.gz"), "--policies",
                 "online-confidence", "--out", out]) == 2
    assert "no file matches" in capsys.readouterr().err
    # confidences made from another version of the trace, or scoring fewer drafts than the trace: refused
    import shutil

    from sdlib.sim.traces import provenance_path

    for change, says in (({"traces_sha256": "0" * 64}, "sha256 differs"), ({"k": 3}, "scores 3 drafts")):
        d = tmp_path / change.__repr__().replace("'", "")[:8].strip("{:")
        d.mkdir()
        f = d / "c.jsonl.gz"
        shutil.copy(resolve(CONF), f)
        prov = json.loads(provenance_path(resolve(CONF)).read_text())
        provenance_path(f).write_text(json.dumps({**prov, **change}))
        assert main(["simulate", "--traces", str(resolve(TRACE)), "--confidences", str(f), "--policies",
                     "online-confidence", "--out", out]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error: --confidences:") and says in err, err


def test_simulate_runs_the_confidence_policies(tmp_path):
    import pandas as pd

    from sdlib.cli import main

    out = tmp_path / "t.csv"
    assert main(["simulate", "--traces", str(resolve(TRACE)), "--confidences", str(resolve(CONF)), "--policies",
                 "fixed-eagle3-k3,oracle-eagle3,online-confidence,online-confidence-raw", "--batch-sizes", "1,32",
                 "--out", str(out)]) == 0
    t = pd.read_csv(out)
    assert set(t.policy) == {"fixed-eagle3-k3", "oracle-eagle3", "online-confidence", "online-confidence-raw"}
    assert (t.speedup_lo <= t.speedup).all() and (t.speedup <= t.speedup_hi).all()
    # no policy that decides online beats the clairvoyant length
    sp = t.set_index(["batch_size", "policy"]).speedup
    for b in (1, 32):
        assert sp[(b, "online-confidence")] <= sp[(b, "oracle-eagle3")] + 1e-9


def test_offline_eagle3_traces_agree_with_vllms_and_are_their_confidences_chain():
    """``sdlib traces --eagle3-engine offline`` (the head's draft chain in torch float32) along the embedded
    sweep's greedy outputs: its acceptance equals the committed vLLM (bfloat16) trace's on at least 95% of the
    positions of both embedded datasets (97.8% and 98.8% when written), never exceeds the cap, and is exactly
    the ``acc_eagle_offline`` the committed confidences file holds (one chain, so the confidences belong to its
    drafts)."""
    from sdlib.run.traces import greedy_from_sweep, make_traces
    from sdlib.sim.traces import TRACE_KEYS, read_trace_file

    for ds in ("sharegpt", "code_edit"):
        greedy = greedy_from_sweep("data/sweeps/embedded_default", dataset=ds)[:12]
        run = make_traces("data/models", ds, 12, 64, 8, ["eagle3"], greedy=greedy, eagle3_engine="offline",
                          greedy_source="sweep")
        assert run.info["eagle3_engine"].startswith("offline") and run.info["model_stats"]["eagle3"]["engine"] == "offline"
        off = run.traces.set_index("request_id")["acc_len"]
        ref = read_trace_file(resolve(f"data/traces/embedded_{ds}.jsonl.gz"), ds,
                              methods={"eagle3": TRACE_KEYS["eagle3"]}).set_index("request_id")["acc_len"]
        conf = {str(r["id"]): r["acc_eagle_offline"] for r in _rows(f"data/traces/confidences/embedded_{ds}.jsonl.gz")}
        eq = tot = 0
        for g in greedy:
            a, b = np.asarray(off[g.request_id]), np.asarray(ref[g.request_id])
            L = len(g.output_token_ids)
            assert len(a) == L and a[0] == 1
            assert all(a[q] <= min(8 + 1, L - q) for q in range(1, L))
            n = min(len(a), len(b))
            eq, tot = eq + int((a[1:n] == b[1:n]).sum()), tot + n - 1
            assert list(a) == conf[g.request_id]
        assert tot > 600 and eq / tot >= 0.95, (ds, eq, tot)
