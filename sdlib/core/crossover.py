"""Where SD stops paying: from a speedup table (measured or simulated), per group, the speedup at the smallest and
largest batch size and the first batch size whose speedup falls below each threshold. Notebook 01 reads it off
measured sweeps (:mod:`sdlib.analysis.measures`, :mod:`sdlib.analysis.intervals`), notebook 05 off the simulator
(:mod:`sdlib.sim.bounds`): it sits below both.

Usage:
    from sdlib.core.crossover import crossover_table
    crossover_table(speedups, by=("model", "dataset", "method_label"), thresholds=(1.0, 1.2))
"""

from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

#: Column names of :func:`crossover_table` (notebook 01's); ``below`` is formatted with each threshold
#: (``{thr:g}``), and ``paying`` set to None leaves that column out.
CROSSOVER_COLUMNS = {"first": "speedup_at_min_bs", "last": "speedup_at_max_bs",
                     "below": "first_batch_size_below_{thr:g}", "paying": "last_paying_batch_size"}


def crossover_table(sp: pd.DataFrame, by: Sequence[str] = ("model", "dataset", "method_label"),
                    thresholds: Sequence[float] = (1.0,), columns: Optional[dict] = None) -> pd.DataFrame:
    """Per group of ``by``: where SD stops paying, from a speedup table (measured or simulated).

    Columns (names from ``columns``, default :data:`CROSSOVER_COLUMNS`): ``by``; the speedup at
    the smallest and the largest batch size; per threshold, the smallest batch size whose speedup
    is below it (NA if none); ``last_paying_batch_size``: the largest batch size before the first
    one below 1 (all of them if none is). Rows of the no-SD baseline (``method == "none"``) and
    rows without a speedup are left out. Serves notebook 01 (measured sweeps) and, through
    :func:`sdlib.sim.bounds.crossover_by_cost_model`, notebook 05 (simulated).
    """
    names = {**CROSSOVER_COLUMNS, **(columns or {})}
    d = sp[sp["method"] != "none"] if "method" in sp.columns else sp
    d = d.dropna(subset=["speedup"])
    rows = []
    for keys, g in d.groupby(list(by)):
        g = g.sort_values("batch_size")
        row = dict(zip(by, keys))
        row[names["first"]] = float(g["speedup"].iloc[0])
        row[names["last"]] = float(g["speedup"].iloc[-1])
        for thr in thresholds:
            row[names["below"].format(thr=thr)] = _first_below(g, thr)
        if names.get("paying"):
            first = _first_below(g, 1.0)
            paying = g[g["batch_size"] < first]["batch_size"] if first is not pd.NA else g["batch_size"]
            row[names["paying"]] = int(paying.max()) if len(paying) else pd.NA
        rows.append(row)
    return pd.DataFrame(rows)


def _first_below(g: pd.DataFrame, threshold: float):
    """The smallest batch size of ``g`` (sorted by batch size) with speedup < ``threshold``, or NA."""
    below = g[g["speedup"] < threshold]
    return int(below["batch_size"].iloc[0]) if len(below) else pd.NA
