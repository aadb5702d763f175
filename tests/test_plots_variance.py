"""Notebook 03's sources and figures (sdlib.plots.variance) on hand-made gains and sweep tables."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from sdlib.analysis import variance as V
from sdlib.plots import variance as VP
from tests.test_variance import TWO_REQUESTS, drift_cells, gains_table, make_sweep, sd_cells


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def write_sweep(tmp_path, cells) -> "pd.DataFrame":
    """Write a hand-made sweep as parquet tables (one file per run) under ``tmp_path / "mysweep"``."""
    d = tmp_path / "mysweep"
    for table, df in make_sweep(cells).items():
        (d / table).mkdir(parents=True)
        for rid, part in df.groupby("run_id"):
            part.to_parquet(d / table / f"{rid}.parquet", index=False)
    (d / "provenance.json").write_text(json.dumps({"sweep": "mysweep", "config": {"models": [{"name": "tiny"}]}}))
    return d


def two_bs_cells():
    cells = sd_cells()
    cells.append({"run_id": "ng8", "method": "ngram", "k": 3, "batch_size": 8,
                  "requests": [(0, [1, 2, 3, 4, 5, 6], [1, 1, 0], [3, 3, 3])]})
    return cells


def test_series_label():
    df = pd.DataFrame({"method": ["ngram", "eagle3"], "k": [3, 5]})
    assert VP.series_label(df).tolist() == ["ngram (k=3)", "eagle3 (k=5)"]


def test_at_batch_size_smallest_by_default():
    g = pd.DataFrame({"batch_size": [8, 1, 1, 4], "gained": [1, 2, 3, 4]})
    sel, bs = VP.at_batch_size(g)
    assert bs == 1 and sel.gained.tolist() == [2, 3]
    sel, bs = VP.at_batch_size(g, 4)
    assert bs == 4 and sel.gained.tolist() == [4]


def test_sweep_source_plots_one_batch_size(tmp_path):
    s = VP.sweep_source(write_sweep(tmp_path, two_bs_cells()))
    assert s.is_sweep and s.key == "mysweep" and s.tag == {"source": "mysweep"}
    assert sorted(s.gains.batch_size.unique()) == [1, 8]
    assert set(s.plot_gains.batch_size) == {1}
    assert s.plot_title == s.title + ", bs 1" and s.title.startswith("our sweep: ")
    assert s.summary() == f"{s.title}: 6 verify steps, 2 (request, method) pairs"
    s8 = VP.sweep_source(tmp_path / "mysweep", batch_size=8)
    assert set(s8.plot_gains.batch_size) == {8} and s8.plot_title.endswith(", bs 8")


def test_variance_sources_order_and_notes(tmp_path, capsys):
    d = write_sweep(tmp_path, two_bs_cells())
    sources = VP.variance_sources(use_reference=False, our_traces=[str(tmp_path / "none_*.jsonl.gz")], sweep_dirs=[d])
    assert [s.key for s in sources] == ["mysweep"]
    assert "no trace files match" in capsys.readouterr().out


def test_reference_source_title_and_tag():
    s = VP.reference_source(["gsm8k"], k=3)
    assert s.title == "authors' traces, Llama-3.1-8B, H100 (k=3)" and s.tag == {"source": "reference", "k": 3}
    assert not s.is_sweep and s.plot_gains is s.gains and s.plot_title == s.title
    assert set(s.gains.method) == {"ngram", "eagle3"} and s.gains.gained.max() <= 4


def test_cheat_sheet_grid_rows_per_method_and_batch_size():
    cs = pd.DataFrame({"method": ["ngram", "eagle3", "ngram", "eagle3"], "k": 3, "batch_size": [1, 1, 8, 1],
                       "dataset": ["a", "a", "a", "b"], "mean_acc_len": [2.0, 3.0, 1.5, 2.5]})
    grid = VP.cheat_sheet_grid(cs)
    assert grid.index.tolist() == ["eagle3 (k=3), bs 1", "ngram (k=3), bs 1", "ngram (k=3), bs 8"]
    assert grid.loc["ngram (k=3), bs 8", "a"] == 1.5 and pd.isna(grid.loc["ngram (k=3), bs 8", "b"])
    one_bs = VP.cheat_sheet_grid(cs[cs.batch_size == 1])
    assert one_bs.index.tolist() == ["eagle3 (k=3)", "ngram (k=3)"]  # no batch size when there is one


def test_plot_cheat_sheet_annotates_every_cell():
    grid = pd.DataFrame({"a": [2.0, 1.5], "b": [3.25, 1.0]}, index=["x (k=3)", "y (k=3)"])
    fig = VP.plot_cheat_sheet(grid, "src")
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["1.00", "1.50", "2.00", "3.25"]
    assert ax.get_title() == "Mean acceptance length\nsrc"
    assert tuple(fig.get_size_inches()) == pytest.approx((1.6 * 2 + 2.5, 0.55 * 2 + 1.6))


def test_plot_position_bins_panel_per_dataset():
    g = gains_table(TWO_REQUESTS)
    g2 = g.assign(dataset="other")
    pb = V.position_bins(pd.concat([g, g2]), n_bins=2)
    fig = VP.plot_position_bins(pb, "src")
    assert [a.get_title() for a in fig.axes] == ["other", "toy"]
    assert fig.axes[0].get_legend() is None and fig.axes[1].get_legend() is not None
    assert fig.texts[0].get_text() == "Acceptance along the output — src"
    assert "series" not in pb  # the input is not changed


def test_plot_request_boxplot_one_box_per_series():
    g = gains_table(TWO_REQUESTS)
    g = pd.concat([g, g.assign(method="eagle3", gained=g.gained + 1)])
    rm = V.request_means(g)
    fig = VP.plot_request_boxplot(rm, "src", whis=(10, 90))
    ax = fig.axes[0]
    assert len(ax.containers) == 2  # one dataset x two series: a box each
    assert sum(type(p).__name__ == "PathPatch" for p in ax.patches) == 2
    assert ax.get_title() == "Per-request mean acceptance length, whiskers 10–90th pct\nsrc"
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["eagle3 (k=3)", "ngram (k=3)"]


def test_plot_greedy_drift_three_panels_on_the_batch_sizes():
    t = make_sweep(drift_cells())
    drift, lossless = V.greedy_drift(t["runs"], t["requests"]), V.lossless_check(t["runs"], t["requests"])
    fig = VP.plot_greedy_drift(drift, lossless, "src")
    assert len(fig.axes) == 3
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8"]
    assert fig.axes[1].get_ylim() == pytest.approx((-0.02, 1.02))
    assert fig.texts[0].get_text().startswith("Greedy drift — src\n")
    fig = VP.plot_greedy_drift(drift, lossless.iloc[0:0], "src")
    assert not fig.axes[2].lines  # no lossless rows: that panel stays blank
