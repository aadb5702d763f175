"""Unit tests for sdlib.analysis.variance on inputs small enough to work out by hand."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sdlib.analysis import variance as V
from sdlib.plots.titles import fallback_sweep_title, our_sweep_title
from sdlib.store import read_table
from sdlib.store.schema import columns, conform


# ---------------------------------------------------------------------------
# A tiny sweep built by hand: runs / requests / steps as the runner writes them
# ---------------------------------------------------------------------------

def make_sweep(cells: list[dict]) -> dict[str, pd.DataFrame]:
    """Build runs/requests/steps DataFrames from a list of cells.

    Each cell: ``run_id, method, k, batch_size`` (optional ``dataset``, ``model``,
    ``status``) and ``requests``: a list of ``(prompt_index, output_ids, accepted_per_step,
    drafted_per_step)``; step positions follow from the gains (first step at position 1).
    """
    runs, requests, steps = [], [], []
    for c in cells:
        runs.append({
            "run_id": c["run_id"], "sweep": "synthetic", "model": c.get("model", "tiny-llama"),
            "method": c["method"], "method_label": f"{c['method']}-k{c['k']}" if c["k"] else c["method"],
            "num_spec_tokens": c["k"], "dataset": c.get("dataset", "toy"), "batch_size": c["batch_size"],
            "batch_mode": "closed_loop", "repeat": 0, "status": c.get("status", "ok"),
        })
        for i, (prompt_index, ids, accepted, drafted) in enumerate(c["requests"]):
            rid = f"{c['run_id']}-r{i}"
            requests.append({
                "run_id": c["run_id"], "request_id": rid, "prompt_index": prompt_index,
                "output_tokens": len(ids), "output_token_ids": json.dumps(ids),
            })
            pos = 1
            for s, (a, d) in enumerate(zip(accepted, drafted)):
                steps.append({"run_id": c["run_id"], "request_id": rid, "step": s,
                              "position": pos, "drafted": d, "accepted": a})
                pos += a + 1
    tables = {"runs": pd.DataFrame(runs), "requests": pd.DataFrame(requests),
              "steps": pd.DataFrame(steps, columns=["run_id", "request_id", "step", "position", "drafted", "accepted"])}
    # every schema column, typed as the runner writes them; the ones we do not need stay null
    return {t: conform(t, df.reindex(columns=columns(t))) for t, df in tables.items()}


def gains_table(rows: list[tuple]) -> pd.DataFrame:
    """A gains table from (request_id, output_len, position, gained, drafted) rows."""
    df = pd.DataFrame(rows, columns=["request_id", "output_len", "position", "gained", "drafted"])
    df["source"], df["model"], df["dataset"], df["method"] = "test", "m", "toy", "ngram"
    df["k"], df["batch_size"], df["run_id"] = 3, 1, "r"
    return V._typed(df)


# Request A (output 10 tokens): steps at positions 1, 3, 7 gaining 2, 4, 3.
# Request B (output 20 tokens): steps at positions 2, 6 gaining 1, 3; its first step drafted nothing.
TWO_REQUESTS = [
    ("A", 10, 1, 2, 3), ("A", 10, 3, 4, 3), ("A", 10, 7, 3, 3),
    ("B", 20, 2, 1, 0), ("B", 20, 6, 3, 3),
]


# ---------------------------------------------------------------------------
# chain_gains / trace_gains
# ---------------------------------------------------------------------------

ACC = [1, 3, 1, 5, 2, 1, 1]  # 7 output tokens; entry 0 = prefill


def test_chain_gains_k3():
    # p=1: min(3, 4, 6)=3 -> p=4: min(2, 4, 3)=2 -> p=6: min(1, 4, 1)=1 -> p=7 stop
    assert V.chain_gains(ACC, 3) == ([1, 4, 6], [3, 2, 1])


def test_chain_gains_k1():
    # p=1: min(3, 2)=2 -> p=3: min(5, 2)=2 -> p=5: 1 -> p=6: 1 -> p=7
    assert V.chain_gains(ACC, 1) == ([1, 3, 5, 6], [2, 2, 1, 1])


def test_chain_gains_authors_shift():
    # reads acc_len[p-1]: p=1: acc[0]=1 -> p=2: acc[1]=3 -> p=5: min(acc[4]=2, 4, 2)=2 -> p=7
    assert V.chain_gains(ACC, 3, authors_shift=True) == ([1, 2, 5], [1, 3, 2])


def test_chain_gains_capped_by_tokens_left():
    assert V.chain_gains([1, 21, 21], 20) == ([1], [2])
    assert V.chain_gains([1], 3) == ([], [])


@pytest.mark.parametrize("k", [1, 2, 3, 5, 20])
def test_chain_gains_cover_the_output(k):
    rng = np.random.default_rng(k)
    acc = [1] + list(rng.integers(1, 22, size=50))
    pos, gain = V.chain_gains(acc, k)
    assert sum(gain) == len(acc) - 1  # every output token after the prefill, once
    assert pos[0] == 1 and all(p2 == p1 + g for p1, p2, g in zip(pos, pos[1:], gain))
    assert max(gain) <= k + 1


def test_chain_gains_rejects_k_beyond_trace():
    with pytest.raises(ValueError):
        V.chain_gains(ACC, 21)


def test_trace_gains_long_table():
    traces = pd.DataFrame({
        "dataset": ["toy", "toy"], "request_id": ["0", "0"], "method": ["ngram", "eagle3"],
        "prompt_token_ids": [[5], [5]], "output_token_ids": [list(range(7))] * 2,
        "acc_len": [ACC, [1, 1, 1]],
    })
    g = V.trace_gains(traces, k=3)
    assert list(g.columns) == V.GAIN_COLUMNS
    ng = g[g["method"] == "ngram"]
    assert ng["position"].tolist() == [1, 4, 6]
    assert ng["gained"].tolist() == [3, 2, 1]
    assert set(ng["output_len"]) == {7}
    eg = g[g["method"] == "eagle3"]  # output length from its own list: 3 tokens, 2 steps
    assert eg["gained"].tolist() == [1, 1] and set(eg["output_len"]) == {3}
    assert set(g["k"]) == {3} and set(g["source"]) == {V.REFERENCE_SOURCE}
    assert g["drafted"].isna().all()


# ---------------------------------------------------------------------------
# sweep tables -> gains
# ---------------------------------------------------------------------------

def sd_cells():
    return [
        {"run_id": "base1", "method": "none", "k": 0, "batch_size": 1,
         "requests": [(0, [1, 2, 3], [0, 0], [0, 0])]},
        {"run_id": "ng1", "method": "ngram", "k": 3, "batch_size": 1,
         "requests": [(0, [1, 2, 3, 4, 5, 6], [3, 0, 0], [3, 3, 0])]},
    ]


def test_sweep_gains_join():
    t = make_sweep(sd_cells())
    g = V.sweep_gains(t["runs"], t["requests"], t["steps"], source="sweep:x")
    assert list(g.columns) == V.GAIN_COLUMNS
    assert set(g["method"]) == {"ngram"}  # baseline dropped
    assert g["gained"].tolist() == [4, 1, 1]
    assert g["position"].tolist() == [1, 5, 6]
    assert set(g["k"]) == {3} and set(g["output_len"]) == {6} and set(g["source"]) == {"sweep:x"}
    gb = V.sweep_gains(t["runs"], t["requests"], t["steps"], include_baseline=True)
    assert set(gb["method"]) == {"none", "ngram"}


def test_read_and_load_sweep(tmp_path, capsys):
    t = make_sweep(sd_cells() + [{"run_id": "bad", "method": "ngram", "k": 3, "batch_size": 8,
                                  "status": "failed", "requests": []}])
    for table, df in t.items():
        (tmp_path / table).mkdir()
        for rid, part in df.groupby("run_id"):  # one parquet file per run
            part.to_parquet(tmp_path / table / f"{rid}.parquet", index=False)
    loaded = V.load_sweep_tables(tmp_path)
    assert sorted(loaded["runs"]["run_id"]) == ["base1", "ng1"]  # failed run filtered
    assert len(loaded["steps"]) == len(t["steps"])
    assert read_table(tmp_path, "engine_steps").empty
    assert V.existing_dirs([tmp_path, tmp_path / "nope"]) == [tmp_path]
    assert "no sweep tables" in capsys.readouterr().out


PROVENANCE = {"sweep": "embedded_default", "config": {"models": [{"name": "tiny-llama"}]},
              "invocations": [{"models": {"tiny-llama": {"random_weights": True}}}]}


def test_fallback_sweep_title(tmp_path):
    runs = pd.DataFrame({"model": ["tiny-llama", "tiny-llama"]})
    d = tmp_path / "embedded_default"
    d.mkdir()
    assert fallback_sweep_title(d, runs) == "our sweep: embedded_default, tiny-llama"
    (d / "provenance.json").write_text(json.dumps(PROVENANCE))
    assert fallback_sweep_title(d, runs) == "our sweep: embedded_default, tiny-llama (random weights)"


def test_sweep_title_says_source_model_and_weights(tmp_path):
    d = tmp_path / "embedded_default"
    d.mkdir()
    (d / "provenance.json").write_text(json.dumps(PROVENANCE))
    title = our_sweep_title(d, pd.DataFrame({"model": ["tiny-llama"]}))
    assert title.startswith("our sweep: ") and "embedded_default" in title
    assert "tiny-llama" in title and "random weights" in title


# ---------------------------------------------------------------------------
# within a request: position bins
# ---------------------------------------------------------------------------

def test_position_bins_split_at_median():
    pb = V.position_bins(gains_table(TWO_REQUESTS))
    # median output length of (10, 20) = 15: A short, B long
    short = pb[pb["length_class"] == "short"].set_index("bin")["mean_gained"]
    long_ = pb[pb["length_class"] == "long"].set_index("bin")["mean_gained"]
    # A: 1/10 -> bin 1, 3/10 -> bin 3, 7/10 -> bin 7; B: 2/20 -> bin 1, 6/20 -> bin 3
    assert short.to_dict() == {1: 2.0, 3: 4.0, 7: 3.0}
    assert long_.to_dict() == {1: 1.0, 3: 3.0}
    assert set(pb["split_at"]) == {15.0}


def test_position_bins_pooled_and_coarse():
    pb = V.position_bins(gains_table(TWO_REQUESTS), split_at=100)
    assert set(pb["length_class"]) == {"short"}
    m = pb.set_index("bin")["mean_gained"].to_dict()
    assert m == {1: 1.5, 3: 3.5, 7: 3.0}
    assert pb.set_index("bin")["n_requests"].to_dict() == {1: 2, 3: 2, 7: 1}
    pb2 = V.position_bins(gains_table(TWO_REQUESTS), n_bins=2, split_at=100).set_index("bin")
    assert pb2["mean_gained"].to_dict() == {0: 2.5, 1: 3.0}  # (2+4+1+3)/4, 3
    assert pb2.loc[1, "bin_lo"] == 0.5 and pb2.loc[1, "bin_hi"] == 1.0


# ---------------------------------------------------------------------------
# across requests
# ---------------------------------------------------------------------------

def test_request_means():
    rm = V.request_means(gains_table(TWO_REQUESTS)).set_index("request_id")
    assert rm.loc["A", "mean_acc_len"] == 3.0  # (2+4+3)/3
    assert rm.loc["B", "mean_acc_len"] == 2.0  # (1+3)/2
    assert rm.loc["A", "n_steps"] == 3 and rm.loc["B", "output_len"] == 20


def test_percentile_ranges_of_a_small_list():
    rm = pd.DataFrame({k: v for k, v in zip(V.GROUP_KEYS, ["s", "m", "toy", "ngram", 3, 1])}, index=range(21))
    rm["mean_acc_len"] = np.arange(1, 22, dtype=float)  # 1..21
    pr = V.percentile_ranges(rm)
    row = pr.iloc[0]
    # linear interpolation: 5th pct at index 0.05*20 = 1 -> 2; 95th at index 19 -> 20
    assert row["p5"] == 2.0 and row["p95"] == 20.0
    assert row["median"] == 11.0 and row["mean"] == 11.0 and row["n_requests"] == 21
    pr2 = V.percentile_ranges(rm, lo=10, hi=90)
    assert pr2.iloc[0]["p10"] == 3.0 and pr2.iloc[0]["p90"] == 19.0


# ---------------------------------------------------------------------------
# across datasets: cheat sheet
# ---------------------------------------------------------------------------

def test_cheat_sheet_mean_over_steps_and_drafts():
    cs = V.cheat_sheet(gains_table(TWO_REQUESTS)).iloc[0]
    assert cs["mean_acc_len"] == pytest.approx(13 / 5)  # (2+4+3+1+3)/5, pooled over steps
    # accepted 1+3+2+0+2 = 8 over the 4 steps that drafted (B's first drafted nothing)
    assert cs["mean_acc_len_drafts"] == pytest.approx(1 + 8 / 4)
    assert cs["n_steps"] == 5 and cs["n_requests"] == 2


def test_cheat_sheet_traces_have_no_draft_column():
    traces = pd.DataFrame({"dataset": ["toy"], "request_id": ["0"], "method": ["ngram"], "acc_len": [ACC]})
    cs = V.cheat_sheet(V.trace_gains(traces, k=3)).iloc[0]
    assert cs["mean_acc_len"] == pytest.approx(2.0)  # (3+2+1)/3
    assert np.isnan(cs["mean_acc_len_drafts"])


def test_counter_acceptance():
    runs = pd.DataFrame({"run_id": ["a", "b"], "model": "m", "dataset": "toy", "method": ["ngram", "none"],
                         "num_spec_tokens": [3, 0], "batch_size": [1, 1],
                         "counter_num_drafts": [4, 0], "counter_num_accepted_tokens": [6, 0]})
    out = V.counter_acceptance(runs).set_index("run_id")["mean_acc_len_counters"]
    assert out["a"] == 2.5 and pd.isna(out["b"])


# ---------------------------------------------------------------------------
# greedy drift and lossless
# ---------------------------------------------------------------------------

def drift_cells():
    return [
        {"run_id": "none-bs1", "method": "none", "k": 0, "batch_size": 1,
         "requests": [(0, [1, 2, 3], [], []), (1, [4, 5], [], []), (2, [6, 7, 8, 9], [], [])]},
        {"run_id": "none-bs8", "method": "none", "k": 0, "batch_size": 8,
         "requests": [(0, [1, 2, 3], [], []), (1, [4, 5, 0, 0, 0], [], []), (2, [6, 7, 8, 9], [], [])]},
        {"run_id": "ng-bs8", "method": "ngram", "k": 3, "batch_size": 8,
         "requests": [(0, [1, 2, 3], [], []), (1, [4, 5, 0, 0, 0], [], []), (2, [6, 7, 8], [], [])]},
    ]


def test_greedy_drift_one_of_three_differs():
    t = make_sweep(drift_cells())
    d = V.greedy_drift(t["runs"], t["requests"]).set_index("batch_size")
    assert d.loc[1, "frac_differ"] == 0.0
    assert d.loc[8, "frac_differ"] == pytest.approx(1 / 3)
    assert d.loc[1, "mean_output_tokens"] == pytest.approx(3.0)  # (3+2+4)/3
    assert d.loc[8, "mean_output_tokens"] == pytest.approx(4.0)  # (3+5+4)/3
    assert d.loc[8, "n_compared"] == 3 and d.loc[8, "ref_batch_size"] == 1


def test_lossless_check_two_of_three_identical():
    t = make_sweep(drift_cells())
    # the JSON spacing must not matter: same ids written without spaces
    t["requests"].loc[0, "output_token_ids"] = "[1,2,3]"
    lc = V.lossless_check(t["runs"], t["requests"])
    assert len(lc) == 1
    row = lc.iloc[0]
    assert row["method"] == "ngram" and row["batch_size"] == 8
    assert row["n_compared"] == 3 and row["frac_identical"] == pytest.approx(2 / 3)


def test_lossless_check_without_baseline_at_that_batch_size():
    cells = drift_cells()
    cells[2]["batch_size"] = 32  # no no-SD run at bs 32
    t = make_sweep(cells)
    row = V.lossless_check(t["runs"], t["requests"]).iloc[0]
    assert row["n_compared"] == 0 and pd.isna(row["frac_identical"])
