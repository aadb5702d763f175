"""A sweep's results in one table: per cell, tok/s and speedup over no SD with their 95% intervals, and the
mean acceptance length (1 + accepted / drafts). Printed at the end of ``sdlib sweep`` and by ``sdlib report``.

Usage:
    sdlib report configs/embedded_default.yaml            # a text table
    sdlib report data/sweeps/embedded_default --csv       # or --json
"""

from __future__ import annotations

import sys
from typing import Optional

import pandas as pd

COLUMNS = ["model", "dataset", "method_label", "batch_size", "tok_per_s", "tok_per_s_lo", "tok_per_s_hi",
           "speedup", "speedup_lo", "speedup_hi", "mean_acceptance_length", "acceptance_source", "concurrency_mean",
           "n_units", "ci_units"]
_CELL = ["model", "dataset", "method_label", "batch_size"]


def report_table(store, run_ids: Optional[list[str]] = None, n_boot: int = 1000,
                 cells: Optional[set[str]] = None) -> pd.DataFrame:
    """The table for a sweep folder: the cells of ``cells`` (a config's run ids: exactly that config's
    results), else of the folder's current config; rows only for ``run_ids`` when given (their baselines are
    still used for the speedups)."""
    # deferred: sdlib.analysis.intervals loads pandas, and only this path needs it
    from sdlib.analysis.intervals import sweep_intervals
    from sdlib.analysis.measures import acceptance_table

    runs = store.read("runs", cells=cells)
    if run_ids is not None:
        keep = set(run_ids)
        bases = runs[runs["method"] == "none"]  # speedups need their baselines even if they ran earlier
        runs = pd.concat([runs[runs["run_id"].isin(keep)], bases]).drop_duplicates("run_id")
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    _, sp = sweep_intervals(store.dir, n_boot=n_boot, runs=runs)
    acc = acceptance_table(store.read("steps", cells=set(runs["run_id"])), runs)
    if not acc.empty:
        acc = acc.groupby(_CELL, as_index=False)["mean_acceptance_length"].mean()
        sp = sp.merge(acc, on=_CELL, how="left")
    else:
        sp["mean_acceptance_length"] = float("nan")
    src = runs.groupby(_CELL, as_index=False).agg(acceptance_source=("acceptance_source", "first"),
                                                  concurrency_mean=("concurrency_mean", "mean"))
    sp = sp.merge(src, on=_CELL, how="left")
    if run_ids is not None:
        done = runs[runs["run_id"].isin(set(run_ids))][_CELL]
        sp = sp.merge(done.drop_duplicates(), on=_CELL)
    out = sp.reindex(columns=COLUMNS)
    return out.sort_values(["model", "dataset", "batch_size", "method_label"]).reset_index(drop=True)


def _fmt(v, lo, hi, digits: int) -> str:
    if pd.isna(v):
        return "-"
    ci = f" [{lo:.{digits}f}, {hi:.{digits}f}]" if pd.notna(lo) and pd.notna(hi) else ""
    return f"{v:.{digits}f}{ci}"


def format_report(t: pd.DataFrame) -> str:
    """A text table for a terminal."""
    if t.empty:
        return "no finished cells"
    rows = [{"model": r.model, "dataset": r.dataset, "method": r.method_label, "bs": int(r.batch_size),
             "tok/s [95% CI]": _fmt(r.tok_per_s, r.tok_per_s_lo, r.tok_per_s_hi, 1),
             "speedup [95% CI]": _fmt(r.speedup, r.speedup_lo, r.speedup_hi, 2),
             "accept. length": "-" if pd.isna(r.mean_acceptance_length) else f"{r.mean_acceptance_length:.2f}",
             "in flight": "-" if pd.isna(r.concurrency_mean) else f"{r.concurrency_mean:.1f}"}
            for r in t.itertuples()]
    return pd.DataFrame(rows).to_string(index=False)


def print_report(store, run_ids: Optional[list[str]] = None, cells: Optional[set[str]] = None) -> None:
    """The summary at the end of a sweep (the cells it ran, ``cells``: its config's), on stderr."""
    print(format_report(report_table(store, run_ids, cells=cells)), file=sys.stderr)
