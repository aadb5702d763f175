"""Time per phase of a speculative-decoding step, from the ``step_phases`` table (paper Fig. 4 form).

The timers that fill ``step_phases`` are hooked into vLLM's model runner by
:mod:`sdlib.vllm.phase_hooks` (which says what each phase brackets); this module only reads
and aggregates the recorded table.

Usage:
    from sdlib.analysis.breakdown import breakdown_table, pooled_shares, read_step_phases
    bt = breakdown_table(read_step_phases("data/sweeps/embedded_default"), store.read("runs"))
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import pandas as pd

from sdlib.core import bootstrap
from sdlib.store import read_table
from sdlib.store.schema import STEP_PHASES as PHASES

#: Shares in :func:`breakdown_table`, in stacking order (bottom to top).
SHARE_PHASES = ("draft", "verify", "sample", "other")
#: Timer kinds in the ``timer`` column, and how to say them in a figure.
TIMER_LABELS = {"cuda_event": "GPU time (CUDA events)", "perf_counter": "CPU wall time"}


def read_step_phases(sweep_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """``<sweep_dir>/step_phases`` (a folder of per-cell parquet files); empty, typed, if missing."""
    return read_table(sweep_dir, "step_phases")


RUN_META = ["sweep", "model", "method", "method_label", "num_spec_tokens", "dataset", "batch_size", "batch_mode",
            "repeat"]


def breakdown_table(phases_df: pd.DataFrame, runs_df: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Per run: seconds and share of step time of draft, verify, sample and other.

    Definition (per run = one sweep cell, warm-up excluded): ``step_s`` = total time inside the
    runner's ``execute_model`` + ``sample_tokens`` calls; ``draft_s``, ``verify_s``, ``sample_s`` =
    total time inside the phase hooks (disjoint, nested in the step windows);
    ``other_s = step_s - draft_s - verify_s - sample_s``; ``share_<p> = <p>_s / step_s`` (the four
    shares sum to 1). A phase that was not hooked (NaN) makes ``other`` and its own share NaN.
    ``num_steps`` = ``execute_model`` calls; ``step_ms`` = mean step time, ms. The time the engine
    spends outside the runner (scheduler, output processing) is not in ``step_s``.
    ``runs_df`` (optional) adds the run's model, method, dataset, batch size, ... columns.
    """
    cols = ["run_id", "timer", "num_steps", "step_s"] + [f"{p}_s" for p in SHARE_PHASES] + \
        [f"share_{p}" for p in SHARE_PHASES] + ["step_ms"]
    if phases_df is None or phases_df.empty:
        meta = [c for c in RUN_META if runs_df is not None and c in runs_df.columns]
        return pd.DataFrame(columns=cols[:1] + meta + cols[1:])
    p = phases_df.copy()
    p["total_s"] = p["total_s"].astype("float64")
    tot = p.groupby(["run_id", "phase"])["total_s"].sum(min_count=1).unstack("phase")
    tot = tot.reindex(columns=list(PHASES))  # sum(min_count=1): a NaN (unhooked) phase stays NaN
    out = pd.DataFrame(index=tot.index)
    step_rows = p[p["phase"] == "step"].drop_duplicates("run_id").set_index("run_id")
    out["timer"] = p.drop_duplicates("run_id").set_index("run_id")["timer"].reindex(out.index)
    out["num_steps"] = step_rows["calls"].reindex(out.index).astype("Int64")
    out["step_s"] = tot["step"]
    for ph in ("draft", "verify", "sample"):
        out[f"{ph}_s"] = tot[ph]
    out["other_s"] = out["step_s"] - out["draft_s"] - out["verify_s"] - out["sample_s"]
    denom = out["step_s"].where(out["step_s"] > 0)
    for ph in SHARE_PHASES:
        out[f"share_{ph}"] = out[f"{ph}_s"] / denom
    out["step_ms"] = 1000.0 * out["step_s"] / out["num_steps"].astype("float64").where(out["num_steps"] > 0)
    out = out.reset_index()
    if runs_df is not None and not runs_df.empty:
        meta = [c for c in RUN_META if c in runs_df.columns]
        out = runs_df[["run_id"] + meta].merge(out, on="run_id", how="right")
    else:
        meta = []
    out["run_id"] = out["run_id"].astype("string")
    return out[["run_id"] + meta + cols[1:]].reset_index(drop=True)


def pooled_shares(bt: pd.DataFrame, by: tuple[str, ...] = ("model", "method_label", "batch_size")) -> pd.DataFrame:
    """Shares pooled over the runs of each group: sum of a phase's seconds / sum of step seconds.

    Pooling weights each run by its step time (not a mean of per-run ratios), so the shares of a
    group still sum to 1. Adds ``runs`` (runs pooled), ``num_steps`` and ``step_ms`` (mean step).
    """
    by = [c for c in by if c in bt.columns]
    secs = ["step_s"] + [f"{p}_s" for p in SHARE_PHASES]
    if bt.empty:
        return pd.DataFrame(columns=by + ["timer", "runs", "num_steps"] + secs +
                            [f"share_{p}" for p in SHARE_PHASES] + ["step_ms"])
    d = bt.copy()
    d["num_steps"] = d["num_steps"].astype("float64")
    g = d.groupby(by, dropna=False)
    out = g[secs].sum(min_count=1)
    nan_any = g[secs].apply(lambda x: x.isna().any())  # a missing phase in any run -> NaN
    out = out.mask(nan_any)
    out["runs"] = g.size()
    out["num_steps"] = g["num_steps"].sum()
    out["timer"] = g["timer"].agg(lambda s: ",".join(sorted(set(map(str, s.dropna())))))
    for ph in SHARE_PHASES:
        out[f"share_{ph}"] = out[f"{ph}_s"] / out["step_s"].where(out["step_s"] > 0)
    out["step_ms"] = 1000.0 * out["step_s"] / out["num_steps"].where(out["num_steps"] > 0)
    out = out.reset_index()
    return out[by + ["timer", "runs", "num_steps"] + secs + [f"share_{p}" for p in SHARE_PHASES] + ["step_ms"]]


def share_intervals(bt: pd.DataFrame, by: tuple[str, ...] = ("model", "method_label", "batch_size"),
                    n_boot: int = bootstrap.N_BOOT, level: float = bootstrap.LEVEL) -> pd.DataFrame:
    """Per group of ``by``: ``share_<p>_lo`` / ``share_<p>_hi``, a bootstrap interval of each pooled share
    (:func:`pooled_shares`) over the group's runs (datasets, repeats), drawn with replacement (the same draws
    for every phase; :mod:`sdlib.core.bootstrap`). NaN where a group is one run: ``step_phases`` keeps one
    total per run and phase, so a single run cannot be resampled."""
    by = [c for c in by if c in bt.columns]
    rows = []
    for key, g in bt.groupby(by, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        step = g["step_s"].to_numpy(float)
        W = bootstrap.unit_weights(len(g), n_boot, bootstrap.rng("breakdown", *key)) \
            if len(g) >= bootstrap.MIN_UNITS else None
        for ph in SHARE_PHASES:
            lo = hi = np.nan
            v = g[f"{ph}_s"].to_numpy(float)
            if W is not None and np.isfinite(v).all():
                lo, hi = bootstrap.interval(bootstrap.ratio(W, v, step), level)
            row[f"share_{ph}_lo"], row[f"share_{ph}_hi"] = float(lo), float(hi)
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_breakdown(sweep_dir: str | os.PathLike[str], include_no_sd: bool = True) -> Optional[pd.DataFrame]:
    """:func:`breakdown_table` of a sweep folder's ``step_phases`` and ``runs``; without the no-SD runs
    unless ``include_no_sd``; None when the sweep has no ``step_phases`` (run without phase timers)."""
    phases = read_step_phases(sweep_dir)
    if phases.empty:
        return None
    bt = breakdown_table(phases, read_table(sweep_dir, "runs"))
    return bt if include_no_sd else bt[bt["method"] != "none"]


def timer_label(timers: pd.Series | list[str] | str) -> str:
    """How the timer kind(s) read in a title: ``GPU time (CUDA events)`` / ``CPU wall time``."""
    kinds = [timers] if isinstance(timers, str) else sorted({str(t) for t in timers if pd.notna(t)})
    return " + ".join(TIMER_LABELS.get(k, k) for k in kinds) or "timer unknown"


