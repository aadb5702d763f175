"""Notebook 05's tables and figures (sdlib.sim.bounds, sdlib.core.crossover.crossover_table,
sdlib.plots.bounds) on small tables whose answers are worked out by hand."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from sdlib.core.crossover import crossover_table
from sdlib.plots import bounds as BP
from sdlib.sim import bounds as BND
from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B, CostModel
from sdlib.sim.costmodels import find_cost_models, load_cost_models
from sdlib.sim.oracle import simulate
from tests.sim_reference import ref_of, refs

# T(kv, n) = 1 + 0.1*n, EAGLE drafting 0.5 s, n-gram drafting 0.1*T (as in test_oracle)
CM = CostModel(name="toy", target_kv_s=0.0, target_n_s=0.1, target_fixed_s=1.0, eagle_kv_s=0.0, eagle_n_s=0.0,
               eagle_fixed_s=0.5, ngram_frac=0.1, overhead_s=0.0)


def one_request():
    """One request, prompt 2 tokens, 6 output tokens, both methods with the same acceptance list."""
    acc = [1, 3, 2, 1, 2, 1]
    return pd.DataFrame([{"dataset": "toy", "request_id": "r", "prompt_token_ids": [7, 8],
                          "output_token_ids": [1, 2, 3, 4, 5, 6], "method": m, "acc_len": acc}
                         for m in ("ngram", "eagle3")])


def sim_table(speedups: dict, cost_model: str = "toy", convention: str = "corrected") -> pd.DataFrame:
    """A speedup table from {(dataset, proposer, predict_method, batch_size): speedup}, with the simulator's
    ``kind`` and ``k`` of each (proposer, predict method)."""
    rows = []
    for (d, p, m, b), s in speedups.items():
        ref = ref_of(p, m)
        rows.append({"dataset": d, "proposer": p, "predict_method": m, "batch_size": b, "convention": convention,
                     "cost_model": cost_model, "speedup": s, "kind": ref.name,
                     "k": float("nan") if ref.k is None else float(ref.k)})
    return pd.DataFrame(rows)


# one dataset, bs 1: best fixed = ngram k=3 (1.5), best ORACLE = eagle3 (1.8), Combine 2.1
STACK = sim_table({("a", "eagle3", "FIXED_1", 1): 1.2, ("a", "ngram", "FIXED_3", 1): 1.5,
                   ("a", "eagle3", "ORACLE", 1): 1.8, ("a", "ngram", "ORACLE", 1): 1.6,
                   ("a", "combined", "ORACLE", 1): 2.1,
                   ("b_c", "eagle3", "FIXED_1", 1): 0.9, ("b_c", "ngram", "FIXED_3", 1): 0.8,
                   ("b_c", "eagle3", "ORACLE", 1): 1.0, ("b_c", "ngram", "ORACLE", 1): 0.7,
                   ("b_c", "combined", "ORACLE", 1): 0.95})


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ---------------------------------------------------------------------------
# crossover: one function for the measured (01) and the simulated (05) table
# ---------------------------------------------------------------------------

def measured_speedups() -> pd.DataFrame:
    rows = [("m", "ds", "none", "none", b, 1.0) for b in (1, 4, 16)]
    rows += [("m", "ds", "eagle", "eagle k3", b, s) for b, s in ((1, 1.5), (4, 1.1), (16, 0.9))]
    rows += [("m", "ds", "ngram", "ngram k3", b, s) for b, s in ((1, 1.3), (4, 1.2), (16, 1.05))]
    rows += [("m", "ds", "mtp", "mtp", b, s) for b, s in ((1, 0.8), (4, 0.7))]
    return pd.DataFrame(rows, columns=["model", "dataset", "method", "method_label", "batch_size", "speedup"])


def test_crossover_table_measured_form():
    c = crossover_table(measured_speedups()).set_index("method_label")
    assert list(c.columns) == ["model", "dataset", "speedup_at_min_bs", "speedup_at_max_bs",
                               "first_batch_size_below_1", "last_paying_batch_size"]
    assert "none" not in c.index  # the baseline is no method
    assert c.loc["eagle k3", "first_batch_size_below_1"] == 16
    assert c.loc["eagle k3", "last_paying_batch_size"] == 4
    assert c.loc["eagle k3", "speedup_at_max_bs"] == pytest.approx(0.9)
    assert c.loc["ngram k3", "first_batch_size_below_1"] is pd.NA  # pays everywhere measured
    assert c.loc["ngram k3", "last_paying_batch_size"] == 16
    assert c.loc["mtp", "first_batch_size_below_1"] == 1
    assert c.loc["mtp", "last_paying_batch_size"] is pd.NA  # never pays


def test_crossover_table_simulated_form_two_thresholds():
    t = sim_table({("a", "eagle3", "FIXED_3", b): s for b, s in ((1, 1.6), (8, 1.3), (64, 1.1), (512, 0.7))})
    c = crossover_table(t, by=("cost_model", "proposer", "dataset"), thresholds=(1.2, 1.0),
                        columns=BND.CROSSOVER_COLUMNS)
    assert list(c.columns) == ["cost_model", "proposer", "dataset", "speedup_bs1", "speedup_bs512",
                               "first_bs_below_1.2", "first_bs_below_1"]
    assert c.iloc[0].tolist() == ["toy", "eagle3", "a", 1.6, 0.7, 64, 512]


def test_crossover_by_cost_model_simulates_each_model():
    slow = CostModel(name="slow_draft", target_kv_s=0.0, target_n_s=0.1, target_fixed_s=1.0, eagle_kv_s=0.0,
                     eagle_n_s=0.0, eagle_fixed_s=5.0, ngram_frac=0.1, overhead_s=0.0)
    c = BND.crossover_by_cost_model(one_request(), [CM, slow], "corrected", batch_sizes=(1, 2),
                                    proposers=("eagle3",), k=1)
    assert list(c.cost_model) == ["slow_draft", "toy"]
    direct = simulate(one_request(), cost_models=[CM], batch_sizes=[1], policies=refs(["eagle3"], ["FIXED_1"]), conventions=["corrected"])
    assert c.set_index("cost_model").loc["toy", "speedup_bs1"] == pytest.approx(direct.speedup.item())
    # EAGLE drafting at 5 s a step never pays: below both thresholds from bs 1
    assert c.set_index("cost_model").loc["slow_draft", ["first_bs_below_1.2", "first_bs_below_1"]].tolist() == [1, 1]


# ---------------------------------------------------------------------------
# sdlib.sim.bounds tables
# ---------------------------------------------------------------------------

def test_fixed_k_rows_pick_one_cell_and_parse_k():
    t = pd.concat([STACK, sim_table({("a", "ngram", "FIXED_3", 8): 1.1}),
                   sim_table({("a", "ngram", "FIXED_3", 1): 9.0}, convention="authors")])
    f = BND.fixed_k_rows(t, "toy", "corrected", batch_size=1)
    assert sorted(zip(f.dataset, f.proposer, f.k)) == [("a", "eagle3", 1), ("a", "ngram", 3),
                                                       ("b_c", "eagle3", 1), ("b_c", "ngram", 3)]


def test_convention_summary_by_hand():
    cmp_ = pd.DataFrame({"cost_model": "toy", "proposer": ["ngram"] * 3, "predict_method": "ORACLE",
                         "ratio": [1.0, 1.2, 0.8], "diff": [0.0, 0.3, -0.5]})
    s = BND.convention_summary(cmp_).iloc[0]
    assert s.mean_ratio == pytest.approx(1.0)
    assert (s.min_diff, s.max_diff, s.max_abs_diff) == (-0.5, 0.3, 0.5)


def test_convention_ablation_table_columns_in_ablation_order():
    w = BND.convention_ablation_table(one_request(), CM, ["eagle3"], batch_sizes=(1,))
    convs = list(BND.convention_ablation("authors", "corrected"))
    assert list(w.columns) == ["dataset", "proposer", "predict_method", "batch_size"] + convs
    assert list(w.predict_method) == ["FIXED_5", "ORACLE"]
    direct = simulate(one_request(), cost_models=[CM], batch_sizes=[1], policies=refs(["eagle3"], ["ORACLE"]), conventions=["corrected"])
    assert w.set_index("predict_method").loc["ORACLE", "corrected"] == pytest.approx(direct.speedup.item())


def test_headline_table_best_fixed_and_combine():
    t = pd.concat([STACK, sim_table({("a", "eagle3", "FIXED_5", 1): 1.7}, cost_model="other")])
    h = BND.headline_table(t, "a", "toy")
    assert h.index.tolist() == [("corrected", 1)]
    row = h.iloc[0]
    assert (row.proposer, row.predict_method, row.best_fixed, row.combine_oracle) == ("ngram", "FIXED_3", 1.5, 2.1)


def test_find_and_load_cost_models(tmp_path):
    CM.save(tmp_path / "toy.json")
    files = find_cost_models([str(tmp_path / "*.json"), str(tmp_path / "to*.json")])
    assert files == [str(tmp_path / "toy.json")]  # each file once
    models = load_cost_models(files)
    assert [m.name for m in models] == [AUTHORS_H100_LLAMA8B.name, "toy"]
    assert [m.name for m in load_cost_models(files, first=None)] == ["toy"]
    assert find_cost_models([str(tmp_path / "none_*.json")]) == []
    (tmp_path / "engine.json").write_text('{"kind": "engine", "name": "engine"}')  # not linear: left out
    assert [m.name for m in load_cost_models(find_cost_models([str(tmp_path / "*.json")]), first=None)] == ["toy"]


# ---------------------------------------------------------------------------
# sdlib.plots.bounds
# ---------------------------------------------------------------------------

def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_bounds_stack_reference_view():
    st = BND.bounds_stack(STACK)
    fig = BP.plot_bounds_stack(st, ["a", "b_c"], [1], "title", BP.REFERENCE_STACK)
    ax = fig.axes[0]
    assert len(ax.patches) == 3 * 2  # three layers x two datasets
    heights = [p.get_height() for p in ax.patches]
    # a: fixed 1.5, + Oracle 0.3, + Combine 0.3; b_c: fixed 0.9, + Oracle 0.1, Combine below Oracle -> 0
    assert heights == pytest.approx([1.5, 0.9, 0.3, 0.1, 0.3, 0.0])
    assert texts(ax) == ["1.50\nngram k=3", "Combine 2.10", "0.90\neagle3 k=1", "Combine 0.95"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b\nc"]
    assert ax.get_ylabel() == "speedup over no SD"
    assert ax.get_legend() is not None


def test_bounds_stack_ours_view_same_bars_other_dress():
    st = BND.bounds_stack(STACK)
    fig = BP.plot_bounds_stack(st, None, [1, 1], "title", BP.OURS_STACK)
    first, last = fig.axes[0], fig.axes[1]
    assert [p.get_height() for p in first.patches] == pytest.approx([1.5, 0.9, 0.3, 0.1, 0.3, 0.0])
    assert texts(first) == ["2.10", "0.95"]  # Combine's own value only
    assert [t.get_text() for t in first.get_xticklabels()] == ["a", "b_c"]
    assert first.get_ylim() == pytest.approx((0, 1.15 * 2.1))
    assert last.get_ylabel() == "simulated speedup over no SD"
    assert first.get_legend() is None and last.get_legend() is not None


def test_plot_leviathan_one_line_and_markers_per_dataset():
    lev = pd.DataFrame([{"dataset": d, "method": m, "alpha": a, "k": k, "speedup": 1 + a * k / 10}
                        for d, a in (("x", 0.5), ("y", 0.7)) for m in ("eagle3", "ngram") for k in (1, 3, 5)])
    sim = pd.DataFrame([{"dataset": d, "proposer": m, "k": k, "speedup": 1.1}
                        for d in ("x", "y") for m in ("eagle3", "ngram") for k in (1, 3)])
    fig = BP.plot_leviathan(lev, sim, ["x", "y"], "t")
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    assert len(ax.lines) == 2 * 2 + 1  # closed form + simulator per dataset, and the line at 1
    assert list(ax.lines[0].get_xdata()) == [1, 3, 5]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["x (α=0.50)", "y (α=0.70)"]


def test_plot_vs_batch_and_combine_lines_and_legend():
    rows = {(d, p, m, b): 1.0 + b / 100 for d in ("x", "y") for p in ("eagle3", "ngram", "combined")
            for m in ("FIXED_1", "ORACLE") for b in (1, 8)}
    t = pd.concat([sim_table(rows, convention=c) for c in ("authors", "corrected")])
    fig = BP.plot_vs_batch(t, ["x", "y"], ["FIXED_1", "ORACLE"], ["authors", "corrected"], "corrected", [1, 8], "t")
    assert len(fig.axes) == 4
    ax = fig.axes[0]
    assert len(ax.lines) == 2 * 2 + 1
    assert [ln.get_linestyle() for ln in ax.lines[:2]] == ["--", "-"]  # authors dashed, corrected solid
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "FIXED_1 (authors)", "FIXED_1 (corrected)", "ORACLE (authors)", "ORACLE (corrected)"]
    paper = pd.DataFrame([{"dataset": "y", "batch_size": 1, "speedup": 4.9, "short": "Combine 4.9x"}])
    fig = BP.plot_combine(t[t.predict_method == "ORACLE"], ["x", "y"], ["eagle3", "ngram", "combined"],
                          ["authors", "corrected"], "corrected", [1, 8], "t", paper=paper)
    assert len(fig.axes[0].lines) == 3 * 2 + 1 and len(fig.axes[1].lines) == 3 * 2 + 1 + 1
    assert texts(fig.axes[1]) == ["paper (cited), bs 1:\n× Combine 4.9x"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[-1] == "paper (cited), bs 1" and len(labels) == len(set(labels)) == 7


def test_plot_conventions_diagonal_and_limits():
    cmp_ = pd.DataFrame({"proposer": ["ngram", "eagle3", "ngram"], "speedup_authors": [1.0, 2.0, 3.0],
                         "speedup_corrected": [1.5, 1.8, 2.5]})
    fig = BP.plot_conventions(cmp_, ["eagle3", "ngram"], "t")
    ax = fig.axes[0]
    assert [len(c.get_offsets()) for c in ax.collections] == [1, 2]
    assert ax.get_xlim() == pytest.approx((0.95, 3.15)) and ax.get_ylim() == ax.get_xlim()
    assert ax.get_xlabel() == "speedup, authors' convention"


def test_sim_title_says_simulated():
    assert BP.sim_title(CM, "what") == "what\nsimulated: authors' traces (Llama-3.1-8B, H100) + toy"


def test_stack_figure_size_per_panel():
    fig = BP.plot_bounds_stack(BND.bounds_stack(STACK), ["a"], [1, 1, 1], "t")
    assert tuple(fig.get_size_inches()) == pytest.approx((3 * 4.2, 4.0))
