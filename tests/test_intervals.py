"""Intervals on measured throughput and speedup (sdlib.analysis.intervals): cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sdlib.analysis import intervals as I


def _runs(rows):
    base = {"model": "m", "dataset": "d", "batch_mode": "closed_loop", "repeat": 0, "num_spec_tokens": 3}
    out = pd.DataFrame([{**base, **r} for r in rows])
    out["method_label"] = out.get("method_label", out["method"])
    return out


def _steps(run_id, tokens, secs, in_window=None):
    """Engine steps whose starts are the cumulative seconds (so each step's share is its ``secs``)."""
    start = np.concatenate([[0.0], np.cumsum(secs)[:-1]])
    return pd.DataFrame({"run_id": run_id, "engine_step": np.arange(len(tokens)), "start_s": start,
                         "duration_s": secs, "num_new_tokens": tokens,
                         "in_window": True if in_window is None else in_window})


def test_n_blocks_is_about_the_cube_root_rule():
    assert I.n_blocks(1) == 0  # too few steps: no interval
    assert I.n_blocks(8) == 4  # blocks of 2
    assert I.n_blocks(27) == 9  # blocks of 3
    assert I.n_blocks(2) == 2


def test_step_sample_reproduces_window_throughput():
    # 4 window steps, the last one's share is its own duration; steps outside the window are left out
    es = _steps("a", [1, 2, 2, 2, 9], [9.0, 1.0, 1.0, 2.0, 5.0], in_window=[False, True, True, True, True])
    s = I._step_sample(es)
    assert s.num.tolist() == [2, 2, 2, 9] and s.den.tolist() == [1.0, 1.0, 2.0, 5.0]
    assert s.num.sum() / s.den.sum() == pytest.approx(15 / 9)


def test_constant_steps_give_a_zero_width_interval():
    runs = _runs([{"run_id": "a", "method": "none", "batch_size": 1, "tok_per_s": 2.0}])
    samples = I.cell_samples(runs, _steps("a", [2] * 30, [1.0] * 30))
    tp = I.throughput_intervals(runs, samples, n_boot=200)
    assert tp.loc[0, ["tok_per_s_lo", "tok_per_s_hi"]].tolist() == pytest.approx([2.0, 2.0])
    assert tp.loc[0, "n_units"] == I.n_blocks(30)


def test_paired_speedup_cancels_variation_the_two_cells_share():
    # the SD cell makes twice the tokens of the baseline in each step of the same (noisy) duration:
    # every paired replicate is exactly 2, although each throughput alone varies a lot
    rng = np.random.default_rng(1)
    secs = rng.uniform(0.5, 5.0, 64)
    runs = _runs([{"run_id": "b", "method": "none", "batch_size": 4, "tok_per_s": 1 * 64 / secs.sum()},
                  {"run_id": "s", "method": "eagle3", "batch_size": 4, "tok_per_s": 2 * 64 / secs.sum()}])
    es = pd.concat([_steps("b", [1] * 64, secs), _steps("s", [2] * 64, secs)])
    samples = I.cell_samples(runs, es)
    sp = I.speedup_intervals(runs, samples, n_boot=500)
    row = sp[sp.method == "eagle3"].iloc[0]
    assert row.speedup == pytest.approx(2.0)
    assert [row.speedup_lo, row.speedup_hi] == pytest.approx([2.0, 2.0])
    assert row.tok_per_s_hi - row.tok_per_s_lo > 0.05 * row.tok_per_s  # the throughput alone is uncertain


def test_paper_mode_resamples_prompts_and_pairs_them():
    # two prompts; the SD cell is 3x faster on prompt 0 and 1x on prompt 1: replicates 3, 2 or 1
    def req(run_id, rates):
        rows = []
        for b, r in enumerate(rates):
            rows.append({"run_id": run_id, "batch_index": b, "prompt_index": 10 + b, "output_tokens": int(r * 2),
                         "arrival_s": 0.0, "finish_s": 2.0})
        return pd.DataFrame(rows)
    runs = _runs([{"run_id": "b", "method": "none", "batch_size": 1, "batch_mode": "paper", "tok_per_s": 10.0},
                  {"run_id": "s", "method": "ngram", "batch_size": 1, "batch_mode": "paper", "tok_per_s": 20.0}])
    samples = I.cell_samples(runs, requests=pd.concat([req("b", [10, 10]), req("s", [30, 10])]))
    assert samples["s"].kind == "batches" and samples["s"].keys.tolist() == [10, 11]
    sp = I.speedup_intervals(runs, samples, n_boot=2000)
    row = sp[sp.method == "ngram"].iloc[0]
    assert row.speedup == pytest.approx(2.0)
    assert [row.speedup_lo, row.speedup_hi] == pytest.approx([1.0, 3.0])


def test_repeats_are_resampled_too():
    # two repeats at 100 and 200 tok/s, constant within: replicates are means of two draws: 100, 150, 200
    runs = _runs([{"run_id": "r0", "method": "none", "batch_size": 1, "repeat": 0, "tok_per_s": 100.0},
                  {"run_id": "r1", "method": "none", "batch_size": 1, "repeat": 1, "tok_per_s": 200.0}])
    es = pd.concat([_steps("r0", [100] * 20, [1.0] * 20), _steps("r1", [200] * 20, [1.0] * 20)])
    tp = I.throughput_intervals(runs, I.cell_samples(runs, es), n_boot=2000)
    assert tp.loc[0, "tok_per_s"] == pytest.approx(150.0)
    assert tp.loc[0, ["tok_per_s_lo", "tok_per_s_hi"]].tolist() == pytest.approx([100.0, 200.0])
    assert "2 repeats" in tp.loc[0, "ci_units"]


def test_intervals_are_reproducible():
    rng = np.random.default_rng(0)
    runs = _runs([{"run_id": "a", "method": "none", "batch_size": 1, "tok_per_s": 1.0}])
    es = _steps("a", rng.integers(1, 4, 40), rng.uniform(0.5, 1.5, 40))
    a = I.throughput_intervals(runs, I.cell_samples(runs, es), n_boot=300)
    b = I.throughput_intervals(runs, I.cell_samples(runs, es), n_boot=300)
    assert a.equals(b)


def test_verdicts_follow_the_intervals():
    assert I.versus_baseline(1.05, 1.3) == "faster than no SD"
    assert I.versus_baseline(0.7, 0.95) == "slower than no SD"
    assert I.versus_baseline(0.9, 1.1).startswith("not established")
    assert I.overlaps(1.0, 1.2, 1.1, 1.4) and not I.overlaps(1.0, 1.05, 1.1, 1.4)
    sp = pd.DataFrame({"model": "m", "dataset": "d", "batch_size": 1, "method": ["none", "a", "b", "c"],
                       "method_label": ["none", "a", "b", "c"], "speedup": [1.0, 1.5, 1.4, 0.8],
                       "speedup_lo": [np.nan, 1.3, 1.2, 0.7], "speedup_hi": [np.nan, 1.7, 1.6, 0.9]})
    cmp_ = I.compare_methods(sp)
    v = {(r.a, r.b): r.verdict for r in cmp_.itertuples()}
    assert v[("a", "b")] == "not established (intervals overlap)"
    assert v[("a", "c")] == "a faster" and v[("c", "none")] == "slower than no SD"
    text = " ".join(I.comparison_sentences(cmp_))
    assert "a vs b" in text and "order not established" in text and "established (intervals apart): a > c" in text


def test_acceptance_interval_over_requests():
    # two requests of one run: 2 drafts with 2 accepted each -> L = 2 for both -> no spread
    steps = pd.DataFrame({"run_id": "r", "request_id": ["q1", "q1", "q2", "q2", "q2"],
                          "drafted": [3, 3, 3, 3, 0], "accepted": [1, 1, 1, 1, 0]})
    runs = pd.DataFrame({"run_id": ["r"], "model": "m", "dataset": "d", "method": "eagle3", "method_label": "e",
                         "num_spec_tokens": 3, "batch_size": 1, "batch_mode": "closed_loop", "repeat": 0,
                         "counter_num_drafts": 4, "counter_num_draft_tokens": 12, "counter_num_accepted_tokens": 4})
    acc = I.acceptance_intervals(steps, runs, n_boot=200)
    assert acc.loc[0, "mean_acceptance_length"] == pytest.approx(2.0)
    assert acc.loc[0, ["mean_acceptance_length_lo", "mean_acceptance_length_hi"]].tolist() == pytest.approx([2, 2])


def test_established_crossover():
    sp = pd.DataFrame({"model": "m", "dataset": "d", "method": "e", "method_label": "e", "batch_size": [1, 8, 64],
                       "speedup": [1.5, 1.02, 0.8], "speedup_lo": [1.3, 0.9, 0.7], "speedup_hi": [1.7, 1.1, 0.9]})
    c = I.established_crossover(sp).iloc[0]
    assert c.first_batch_size_below_1 == 64 and c.last_established_gain_batch_size == 1
    assert c.first_established_loss_batch_size == 64


@pytest.mark.parametrize("sweep", ["embedded_powered", "embedded_powered_policies_ours"])
def test_engine_starts_are_repeats_of_their_own(sweep):
    """A powered sweep runs each cell once per engine start with the same repeat index: the speedup's interval
    resamples every (start, repeat) run (it kept one run per repeat index and left its point estimate, the mean
    over all of them, outside the interval: 1.95 [0.45, 0.70] on embedded_powered's A/A twin at bs 4)."""
    from sdlib.store import read_table

    runs = read_table(f"data/sweeps/{sweep}", "runs")
    assert runs["engine_start"].nunique() == 2
    _, sp = I.sweep_intervals(f"data/sweeps/{sweep}", n_boot=400)
    sd = sp[sp.method != "none"]
    assert len(sd) and ((sd.speedup_lo <= sd.speedup) & (sd.speedup <= sd.speedup_hi)).all(), sd
    with pytest.raises(ValueError, match="share an engine start and repeat"):
        I._runs_by_repeat(pd.DataFrame({"engine_start": [0, 0], "repeat": [0, 0], "run_id": ["a", "b"]}))
