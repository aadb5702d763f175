"""Measured speedups with bootstrap intervals over prompts, paired with the no-SD cell of the same prompts.

Per cell, the request-level throughput is ``sum(output_tokens) / sum(latency_s)`` over its requests; a
method's speedup is that over the no-SD cell's with the same model, dataset, batch size and batch mode. The
interval resamples prompts (``prompt_index``; every copy of a prompt goes together) with the same draws for the
SD and the no-SD cell (paired). The runs table's window speedup (:func:`sdlib.analysis.measures.speedup_table`)
is kept beside it.

Usage:
    from sdlib.analysis.speedup_ci import measured_speedups
    t = measured_speedups("data/sweeps/embedded_custom")
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sdlib.analysis.measures import speedup_table
from sdlib.store import read_table

KEYS = ["model", "dataset", "batch_size", "batch_mode"]
N_BOOT = 2000
SEED = 0
CI = 0.95


def _per_prompt(req: pd.DataFrame) -> pd.DataFrame:
    return req.groupby("prompt_index")[["output_tokens", "latency_s"]].sum()


def measured_speedups(sweep_dir, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Per SD cell: ``speedup`` (request-level, see the module docstring) with ``speedup_lo``/``speedup_hi``,
    the window speedup of the runs table (``window_speedup``), and the number of prompts."""
    runs = read_table(sweep_dir, "runs")
    runs = runs[runs["status"].fillna("ok") == "ok"] if "status" in runs else runs
    req = read_table(sweep_dir, "requests")
    win = speedup_table(runs).set_index(KEYS + ["method_label"])["speedup"]
    rng = np.random.default_rng(seed)
    q = [(1 - CI) / 2, 1 - (1 - CI) / 2]
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
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(float)
        rate = lambda t: (w @ t["output_tokens"].to_numpy(float)) / (w @ t["latency_s"].to_numpy(float))  # noqa: E731
        boot = rate(sd) / rate(ns)
        point = (sd["output_tokens"].sum() / sd["latency_s"].sum()) / (ns["output_tokens"].sum() / ns["latency_s"].sum())
        lo, hi = np.quantile(boot, q)
        rows.append({**{k: r[k] for k in KEYS}, "method": r["method"], "method_label": r["method_label"],
                     "num_spec_tokens": r["num_spec_tokens"], "speedup": float(point), "speedup_lo": float(lo),
                     "speedup_hi": float(hi), "window_speedup": float(win.get(tuple(r[k] for k in KEYS) + (r["method_label"],), np.nan)),
                     "num_prompts": int(n), "run_id": r["run_id"]})
    return pd.DataFrame(rows)
