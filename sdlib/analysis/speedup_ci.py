"""Measured speedups with bootstrap intervals over prompts, paired with the no-SD cell of the same prompts.

Per cell, the request-level throughput is ``sum(output_tokens) / sum(latency_s)`` over its requests; a
method's speedup is that over the no-SD cell's with the same model, dataset, batch size and batch mode. The
interval resamples prompts (``prompt_index``; every copy of a prompt goes together) with the same draws for the
SD and the no-SD cell (paired; :mod:`sdlib.core.bootstrap`, seeded per cell). The runs table's window speedup
(:func:`sdlib.analysis.measures.speedup_table`) is kept beside it.

Usage:
    from sdlib.analysis.speedup_ci import measured_speedups
    t = measured_speedups("data/sweeps/embedded_custom")
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sdlib.analysis.measures import speedup_table
from sdlib.core import bootstrap
from sdlib.store import read_table

KEYS = ["model", "dataset", "batch_size", "batch_mode"]


def _per_prompt(req: pd.DataFrame) -> pd.DataFrame:
    return req.groupby("prompt_index")[["output_tokens", "latency_s"]].sum()


def measured_speedups(sweep_dir, n_boot: int = bootstrap.N_BOOT, level: float = bootstrap.LEVEL) -> pd.DataFrame:
    """Per SD cell: ``speedup`` (request-level, see the module docstring) with ``speedup_lo``/``speedup_hi``,
    the window speedup of the runs table (``window_speedup``), and the number of prompts."""
    runs = read_table(sweep_dir, "runs")
    runs = runs[runs["status"].fillna("ok") == "ok"] if "status" in runs else runs
    req = read_table(sweep_dir, "requests")
    win = speedup_table(runs).set_index(KEYS + ["method_label"])["speedup"]
    rows = []
    base = runs[runs["method"] == "none"]
    for _, r in runs[runs["method"] != "none"].iterrows():
        b = base
        for k in KEYS:
            b = b[b[k] == r[k]]
        if b.empty:
            continue
        sd = _per_prompt(req[req["run_id"] == r["run_id"]])
        ns = _per_prompt(req[req["run_id"] == b.iloc[0]["run_id"]])
        common = sd.index.intersection(ns.index)
        sd, ns = sd.loc[common], ns.loc[common]
        n = len(common)
        if n == 0:
            continue
        w = bootstrap.unit_weights(n, n_boot, bootstrap.rng("speedup_ci", *(r[k] for k in KEYS), r["method_label"]))
        tok, lat = (np.column_stack([sd[c], ns[c]]).astype(float) for c in ("output_tokens", "latency_s"))
        rate = bootstrap.ratio(w, tok, lat)  # columns: SD, no SD (the same prompts drawn)
        point = (sd["output_tokens"].sum() / sd["latency_s"].sum()) / (ns["output_tokens"].sum() / ns["latency_s"].sum())
        lo, hi = bootstrap.interval(rate[:, 0] / rate[:, 1], level)
        rows.append({**{k: r[k] for k in KEYS}, "method": r["method"], "method_label": r["method_label"],
                     "num_spec_tokens": r["num_spec_tokens"], "speedup": float(point), "speedup_lo": float(lo),
                     "speedup_hi": float(hi), "window_speedup": float(win.get(tuple(r[k] for k in KEYS) + (r["method_label"],), np.nan)),
                     "num_prompts": int(n), "run_id": r["run_id"]})
    return pd.DataFrame(rows)
