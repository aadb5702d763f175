"""Notebook 04's tables (sdlib.analysis.bleu) and figures (sdlib.plots.bleu) on small hand-made tables."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from sdlib.analysis import bleu as BL
from sdlib.plots import bleu as BP


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


BLEU = pd.DataFrame({"dataset": ["a", "a", "a", "b"], "request_id": ["0", "1", "2", "0"],
                     "bleu4": [0.1, 0.15, 0.9, 0.5], "prompt_tokens": [10, 4, 8, 3],
                     "output_tokens": [5, 4, 2, 0]})


def test_bin_counts_lists_every_bin():
    c = BL.bin_counts(BLEU, 0.2)
    assert len(c) == 2 * 5  # two datasets x five bins, empty ones included
    a = c[c.dataset == "a"].set_index("bin").num_requests
    assert a.tolist() == [2, 0, 0, 0, 1]
    assert c.num_requests.sum() == len(BLEU)


def test_sim_labels_reference_first():
    labels = BL.sim_labels(3, [3, 5])
    assert [(r.label, lab) for r, lab in labels.items()] == [("fixed-eagle3-k3", "EAGLE-3 k=3"),
                                                             ("fixed-ngram-k3", "n-gram k=3"),
                                                             ("fixed-ngram-k5", "n-gram k=5")]


def test_binned_by_convention_labels_and_drops_others():
    # request "0" in bin 0.0-0.2, request "1" in 0.8-1.0; n-gram twice / half as fast as EAGLE-3
    bleu = pd.DataFrame({"dataset": "d", "request_id": ["0", "1"], "bleu4": [0.1, 0.9]})
    rows = []
    for conv, ng in (("corrected", 2.0), ("authors", 0.5)):
        for rid in ("0", "1"):
            rows += [{"dataset": "d", "request_id": rid, "policy": "fixed-eagle3-k3", "convention": conv,
                      "sd_tok_per_s": 10.0},
                     {"dataset": "d", "request_id": rid, "policy": "fixed-ngram-k3", "convention": conv,
                      "sd_tok_per_s": 10.0 * ng},
                     {"dataset": "d", "request_id": rid, "policy": "fixed-ngram-k1", "convention": conv,
                      "sd_tok_per_s": 99.0}]  # not in the labels: dropped
    b = BL.binned_by_convention(pd.DataFrame(rows), bleu, BL.sim_labels(3, [3]), "EAGLE-3 k=3", width=0.2)
    assert set(b.label) == {"n-gram k=3"}
    assert sorted(zip(b.convention, b.bin.astype(str), b.relative_speedup)) == [
        ("authors", "0.0-0.2", -0.5), ("authors", "0.8-1.0", -0.5),
        ("corrected", "0.0-0.2", 1.0), ("corrected", "0.8-1.0", 1.0)]


def test_measured_relative_speedup_smallest_batch_and_eagle_reference():
    rows = [("d", "0", "eagle3-k3", "eagle3", 1, 10.0, 0.1), ("d", "0", "ngram-k3", "ngram", 1, 15.0, 0.1),
            ("d", "0", "eagle3-k3", "eagle3", 4, 1.0, 0.1), ("d", "0", "ngram-k3", "ngram", 4, 100.0, 0.1)]
    m = pd.DataFrame(rows, columns=["dataset", "request_id", "label", "method", "batch_size", "sd_tok_per_s",
                                    "bleu4"])
    mb, ref, bs = BL.measured_relative_speedup(m)
    assert (ref, bs) == ("eagle3-k3", 1)
    assert mb.relative_speedup.tolist() == pytest.approx([0.5]) and mb.pale.tolist() == [True]
    mb, ref, bs = BL.measured_relative_speedup(m[m.label == "ngram-k3"])
    assert ref is None and mb.empty


def test_brevity_penalty_by_hand():
    bp = BL.brevity_penalty([10, 4, 8, 3], [5, 4, 2, 0])
    assert bp == pytest.approx([math.exp(1 - 10 / 5), 1.0, math.exp(1 - 8 / 2), math.exp(1 - 3 / 1)])
    assert BL.brevity_penalty([2], [5]).tolist() == [1.0]  # longer output: no penalty


def test_brevity_penalty_matches_nltk():
    # a hypothesis that copies the first 5 of 10 reference tokens: precisions 1, so BLEU-4 = the penalty
    ref, hyp = list(range(10)), list(range(5))
    assert BL.bleu4(ref, hyp) == pytest.approx(BL.brevity_penalty([10], [5])[0])


def test_without_brevity_penalty_divides_out_and_caps_at_one():
    ob = BL.without_brevity_penalty(BLEU, 0.2)
    assert ob.bleu4_no_bp.iloc[0] == pytest.approx(0.1 / math.exp(-1))
    assert ob.bleu4_no_bp.iloc[1] == 0.15  # same length: unchanged
    assert ob.bleu4_no_bp.iloc[2] == 1.0  # 0.9 / exp(-3) capped
    assert ob.bin.astype(str).tolist() == ["0.2-0.4", "0.0-0.2", "0.8-1.0", "0.8-1.0"]
    assert "bleu4_no_bp" not in BLEU  # input untouched


def test_acceptance_per_request_and_bins():
    gains = pd.DataFrame({"dataset": "a", "method": ["ngram"] * 3 + ["eagle3"] * 2 + ["ngram"],
                          "request_id": ["0", "0", "0", "0", "0", "1"], "gained": [1, 2, 3, 4, 4, 1]})
    ob = BL.without_brevity_penalty(BLEU, 0.2)
    per = BL.acceptance_per_request(gains, ob)
    assert per.set_index(["method", "request_id"]).acc_len.to_dict() == {("eagle3", "0"): 4.0, ("ngram", "0"): 2.0,
                                                                       ("ngram", "1"): 1.0}
    b = BL.acceptance_bins(per)
    ng = b[b.method == "ngram"].set_index(b[b.method == "ngram"].bin.astype(str))
    assert ng.acc_len.to_dict() == {"0.0-0.2": 1.0, "0.2-0.4": 2.0}
    assert ng.num_requests.to_dict() == {"0.0-0.2": 1, "0.2-0.4": 1}


def test_plot_bleu_distribution_one_histogram_per_dataset():
    fig = BP.plot_bleu_distribution(BLEU, ["a", "b"], "t", bin_width=0.2)
    ax = fig.axes[0]
    assert len(ax.patches) == 2  # one step outline per dataset
    assert len(ax.lines) == 4  # bin edges 0.2 .. 0.8
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a (median 0.15)", "b (median 0.50)"]


def bins_table():
    return pd.DataFrame([{"dataset": ds, "label": lab, "convention": conv, "bin": b, "relative_speedup": 0.1 * i,
                          "num_requests": 3}
                         for ds in ("x", "y") for lab in ("n-gram k=3", "n-gram k=5")
                         for conv in ("corrected", "authors") for i, b in enumerate(["0.0-0.2", "0.8-1.0"])])


def test_plot_bins_paper_and_all():
    b = bins_table()
    labels = ["n-gram k=3", "n-gram k=5"]
    fig = BP.plot_bins_paper(b[b.dataset == "x"], labels, "corrected", "authors", "EAGLE-3 k=3", "t")
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 5
    cut = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert [ln.get_xdata()[0] for ln in cut] == [0.6 / 0.2 - 0.5]
    assert any(t.get_text() == BP.PAPER_NOTE for t in ax.texts)
    fig = BP.plot_bins_all(b, ["x", "y"], labels, "corrected", "authors", "EAGLE-3 k=3", "t")
    assert [a.get_title() for a in fig.axes] == ["x", "y"]
    assert fig.axes[1].get_ylabel() == "" and fig.axes[1].get_legend() is not None


def test_plot_measured_one_panel_per_dataset_pale_small_bins():
    mb = pd.DataFrame({"dataset": ["x", "x", "y"], "label": ["a", "a", "a"], "bin": ["0.0-0.2", "0.2-0.4", "0.0-0.2"],
                       "relative_speedup": [0.1, 0.2, -0.3], "relative_speedup_lo": [0.0, 0.1, -0.4],
                       "relative_speedup_hi": [0.2, 0.3, -0.2], "num_requests": [3, 9, 9]})
    fig = BP.plot_measured(mb, "eagle3-k3", "t")
    ax_x, ax_y = fig.axes[:2]
    assert [ax_x.get_title(), ax_y.get_title()] == ["x", "y"]
    assert ax_x.get_ylabel() == "throughput vs eagle3-k3 (%)"
    alphas = [p.get_alpha() for p in ax_x.patches[:2]]
    assert alphas[0] == pytest.approx(0.3) and alphas[1] is None  # n=3 pale, n=9 not
    assert [t.get_text() for t in ax_x.get_xticklabels()][:2] == ["0.0-0.2\nn=3", "0.2-0.4\nn=9"]


def test_bin_sentences_leave_out_small_bins_and_do_not_rank_overlaps():
    b = pd.DataFrame({"dataset": "d", "label": "n-gram k=3", "bin": ["0.0-0.2", "0.2-0.4", "0.8-1.0"],
                      "relative_speedup": [-0.2, 0.05, 0.9], "relative_speedup_lo": [-0.3, -0.01, 0.5],
                      "relative_speedup_hi": [-0.1, 0.1, 1.2], "num_requests": [50, 40, 3]})
    (line,) = BL.bin_sentences(b, "EAGLE-3")
    assert "slower than EAGLE-3 in 0.0-0.2" in line and "not established in 0.2-0.4" in line
    assert "0.8-1.0" not in line and "1 bin(s) with fewer than 5 requests left out" in line


def test_plot_acceptance_by_bleu_grouped_bars():
    acc = pd.DataFrame({"dataset": ["d"] * 3, "bin": pd.Categorical(["0.0-0.2", "0.0-0.2", "0.8-1.0"]),
                        "method": ["eagle3", "ngram", "ngram"], "acc_len": [2.0, 1.5, 3.0],
                        "num_requests": [4, 4, 1]})
    ax = BP.plot_acceptance_by_bleu(acc, "t", k=3).axes[0]
    assert len(ax.patches) == 2 * 5  # two methods x five bins
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ngram", "eagle3"]  # METHOD_ORDER
    ngram = [p.get_height() for p in ax.patches[:5]]
    assert ngram[0] == 1.5 and ngram[4] == 3.0 and np.isnan(ngram[1])
    assert [t.get_text() for t in ax.get_xticklabels()][::4] == ["0.0-0.2\nn=4", "0.8-1.0\nn=1"]
    assert ax.get_ylabel() == "tokens per verify step (k=3 chain)"
