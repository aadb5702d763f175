"""gpu/refit_history.py: the engine refit's history, one table from the committed versions of notebook 06's
sim-vs-measured CSV, and the copy of it in FINDINGS.

FINDINGS used to carry the history as "(X and Y before ...)" clauses in five bullets, copied by hand each session.
"""

from __future__ import annotations


import pandas as pd

from sdlib.paths import REPO_ROOT
from tests.gpu_scripts import load

SWEEP = "h100_v034_headline"


def _module():
    return load("refit_history")


def _history() -> pd.DataFrame:
    return pd.read_csv(REPO_ROOT / "data" / "gpu" / f"refit_history_{SWEEP}.csv")


def test_the_committed_history_ends_with_the_current_table():
    """The history's last version is the figure CSV as committed now: regenerate it when notebook 06's table moves."""
    mod = _module()
    h = _history()
    last = h[h["order"] == h["order"].max()].set_index(mod.BLOCK)
    fig = pd.read_csv(REPO_ROOT / mod.figure_csv(SWEEP))
    refit = fig[fig["predictor"].str.startswith(mod.REFIT)].set_index(mod.BLOCK)
    assert sorted(last.index) == sorted(refit.index)
    assert (last["refit"] - refit.loc[last.index, "simulated"]).abs().max() < 1e-6
    assert (last["measured_lo"] - refit.loc[last.index, "ratio_lo"]).abs().max() < 1e-6
    # where each value lay against its interval is what the interval says
    below, above = h["refit"] < h["measured_lo"], h["refit"] > h["measured_hi"]
    where = pd.Series("inside", index=h.index).mask(below, "below").mask(above, "above")
    assert (h["refit_vs_interval"] == where).all()
    assert h.groupby("order")["commit"].nunique().eq(1).all() and h["order"].nunique() >= 10


def test_findings_shows_the_history_table_as_the_script_draws_it():
    mod = _module()
    table = mod.markdown(_history())
    findings = (REPO_ROOT / "docs" / "FINDINGS.md").read_text()
    assert table in findings
    assert "#### The engine refit as blocks were added" in findings


def test_markdown_marks_values_below_and_above_the_measured_interval():
    mod = _module()
    h = pd.DataFrame({"order": [0, 1, 1], "commit": ["aaaa", "bbbb", "bbbb"], "dataset": ["d", "d", "e"],
                      "batch_size": [1, 1, 32], "oracle": ["Oracle Combine"] * 3, "refit": [0.9, 1.2, 1.0],
                      "refit_vs_interval": ["below", "above", "inside"]})
    lines = mod.markdown(h).splitlines()
    assert lines[0] == "| dataset | bs | oracle | `aaaa` | `bbbb` |"
    assert lines[2:] == ["| d | 1 | Oracle Combine | 0.900< | 1.200> |", "| e | 32 | Oracle Combine |  | 1.000 |"]
