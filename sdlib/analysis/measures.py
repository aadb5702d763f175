"""Measures from a sweep's tables: throughput, speedup vs the no-SD baseline, acceptance.

Definitions (the paper's, arXiv 2601.11580):
* mean acceptance length = 1 + accepted / drafts (drafts = verify steps that drafted);
* acceptance rate = accepted / drafted tokens;
* per-position acceptance i = P(draft token i accepted | step drafted);
* speedup = mean tok/s with SD / mean tok/s without SD, same model, dataset,
  batch size and batch mode, means over repeats, within one sweep.

Usage:
    from sdlib.analysis.measures import speedup_table, acceptance_table
    sp = speedup_table(store.read("runs"))
    acc = acceptance_table(store.read("steps"), store.read("runs"))
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

KEYS = ["model", "dataset", "batch_size", "batch_mode"]


def throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and spread of tok/s per (model, method, dataset, batch size), repeats aggregated."""
    g = runs.groupby(KEYS + ["method", "method_label", "num_spec_tokens"], dropna=False)["tok_per_s"]
    out = g.agg(tok_per_s="mean", tok_per_s_std="std", repeats="count").reset_index()
    return out.sort_values(KEYS + ["method_label"]).reset_index(drop=True)


def speedup_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Speedup of each SD method over the no-SD baseline in the same sweep (NaN without a baseline)."""
    t = throughput_table(runs)
    base = t[t["method"] == "none"][KEYS + ["tok_per_s"]].rename(columns={"tok_per_s": "baseline_tok_per_s"})
    out = t.merge(base, on=KEYS, how="left")
    out["speedup"] = out["tok_per_s"] / out["baseline_tok_per_s"]
    return out


def acceptance_table(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run: drafts, drafted and accepted tokens, mean acceptance length, rate (from the steps table)."""
    s = steps.copy()
    s["drafted"] = s["drafted"].astype("Float64")
    s["accepted"] = s["accepted"].astype("Float64")
    s["is_draft"] = s["drafted"].fillna(0) > 0
    if s.empty:  # no SD anywhere (a sweep of no-SD cells only): no step drafted
        agg = pd.DataFrame({"run_id": pd.Series(dtype="string"), "steps": pd.Series(dtype="int64"),
                            "drafts": pd.Series(dtype="int64"), "drafted_tokens": pd.Series(dtype="float64"),
                            "accepted_tokens": pd.Series(dtype="float64")})
    else:
        agg = s.groupby("run_id").apply(
            lambda d: pd.Series({
                "steps": len(d),
                "drafts": int(d["is_draft"].sum()),
                "drafted_tokens": float(d.loc[d["is_draft"], "drafted"].sum()),
                "accepted_tokens": float(d.loc[d["is_draft"], "accepted"].sum()),
            }), include_groups=False).reset_index()
    agg["mean_acceptance_length"] = 1 + agg["accepted_tokens"] / agg["drafts"].replace(0, np.nan)
    agg["acceptance_rate"] = agg["accepted_tokens"] / agg["drafted_tokens"].replace(0, np.nan)
    meta = runs[["run_id"] + KEYS + ["method", "method_label", "num_spec_tokens", "repeat",
                                      "counter_num_drafts", "counter_num_draft_tokens",
                                      "counter_num_accepted_tokens"]]
    out = meta.merge(agg, on="run_id", how="inner")
    out["counter_mean_acceptance_length"] = 1 + out["counter_num_accepted_tokens"] / out[
        "counter_num_drafts"].replace(0, np.nan)
    return out


def acceptance_by_method(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Mean acceptance length per (model, method, dataset), pooled over batch sizes and repeats."""
    a = acceptance_table(steps, runs)
    g = a.groupby(["model", "method_label", "dataset"])[["drafts", "accepted_tokens", "drafted_tokens"]].sum()
    g["mean_acceptance_length"] = 1 + g["accepted_tokens"] / g["drafts"].replace(0, np.nan)
    g["acceptance_rate"] = g["accepted_tokens"] / g["drafted_tokens"].replace(0, np.nan)
    return g.reset_index()


def per_position_acceptance(runs: pd.DataFrame) -> pd.DataFrame:
    """vLLM's per-position acceptance (counter vector / drafts), one row per (run, position)."""
    rows = []
    for r in runs.itertuples():
        if not r.counter_num_drafts:
            continue
        for i, v in enumerate(json.loads(r.counter_accepted_per_pos or "[]")):
            rows.append({"run_id": r.run_id, "method_label": r.method_label, "dataset": r.dataset,
                         "batch_size": r.batch_size, "draft_position": i + 1,
                         "acceptance": v / r.counter_num_drafts})
    return pd.DataFrame(rows)


def latency_table(requests: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run: mean / p50 / p90 request latency and time to first token, seconds."""
    r = requests.merge(runs[["run_id"] + KEYS + ["method_label"]], on="run_id")
    g = r.groupby(["run_id"] + KEYS + ["method_label"])
    return g.agg(latency_mean_s=("latency_s", "mean"), latency_p50_s=("latency_s", "median"),
                 latency_p90_s=("latency_s", lambda x: x.quantile(0.9)), ttft_mean_s=("ttft_s", "mean"),
                 ttft_p50_s=("ttft_s", "median")).reset_index()
