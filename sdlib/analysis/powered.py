"""Comparisons a powered sweep can support: paired ratios over prompts and engine starts, the A/A drift of the
same engines, the minimum detectable effect, and which differences are established.

A powered sweep (``engine_starts`` >= 2, ``order: abba``, an A/A twin ``methods.*.aa_of``; e.g.
configs/h200_powered_ngram.yaml) runs every arm on every engine start over the same prompts. The unit of
comparison is a (engine start, prompt): its value in a cell is the prompt's decode rate, ``(output tokens - 1)
/ (finish - first token)`` of its requests (closed loop: a prompt cycled at large batch sizes has several; they
are averaged). Two arms at one (dataset, batch size) are paired on the units both ran, and their ratio is a
ratio of means, ``sum(rate_a) / sum(rate_b)``, with a two-level bootstrap (:func:`sdlib.core.bootstrap.
cluster_weights`: engine starts drawn with replacement, then prompts within each), so the interval carries the
engine-start variance as well as the prompts'.

* ``drift`` of a block (dataset, batch size) is how far the A/A pair's interval reaches from 1:
  ``max(|lo - 1|, |hi - 1|)``; a difference is **established** only when a ratio's interval excludes 1 by more
  than that (``lo > 1 + drift`` or ``hi < 1 - drift``), else it is "not established".
* ``mde``: the minimum detectable effect of the block, ``exp((z_0.975 + z_0.8) * sd(log A/A replicates)) - 1``:
  the smallest relative difference a paired comparison of this size detects with 80% power at the 5% level.

Usage:
    from sdlib.analysis.powered import powered_tables
    t = powered_tables("data/sweeps/h200_powered_ngram")   # {"units", "speedups", "aa", "headline"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from sdlib.analysis.replay import method_info
from sdlib.core import bootstrap
from sdlib.core.registry import method_spec, replay_ref
from sdlib.store import SweepStore

#: z of the two-sided 5% level and of 80% power (the minimum detectable effect).
Z_ALPHA, Z_POWER = 1.959963984540054, 0.8416212335729143
#: Columns every comparison row carries (what it rests on).
SUPPORT = ["n_prompts", "n_starts", "n_units", "output_tokens"]


def request_rates(runs: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Per measured request: its cell's coordinates and ``rate`` = (output tokens - 1) / (finish - first token),
    tokens per second (requests of one token or no decode time are left out)."""
    r = requests.merge(runs[["run_id", "method_label", "dataset", "batch_size", "engine_start"]], on="run_id")
    dur = r["finish_s"] - r["first_token_s"]
    ok = (r["output_tokens"] > 1) & (dur > 0)
    r = r[ok].assign(rate=(r["output_tokens"][ok] - 1) / dur[ok])
    return r[["run_id", "method_label", "dataset", "batch_size", "engine_start", "prompt_index", "output_tokens",
              "rate"]].reset_index(drop=True)


def units(rates: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, batch size, method label, engine start, prompt): the mean rate of the prompt's requests,
    how many there were and their output tokens."""
    g = rates.groupby(["dataset", "batch_size", "method_label", "engine_start", "prompt_index"])
    return g.agg(rate=("rate", "mean"), n_requests=("rate", "size"), output_tokens=("output_tokens", "sum")
                 ).reset_index()


def arm_info(provenance: dict) -> pd.DataFrame:
    """Per method label: ``method_label, method, K, replay, family`` (``none`` for no SD, the replayed
    policy's registry family, ``fixed`` for a real method with its own k) and ``aa_of`` (the arm an A/A twin
    repeats, else None)."""
    info = method_info(provenance)
    aa = {m["label"]: m.get("aa_of") for m in provenance.get("config", {}).get("methods", [])}
    fam = []
    for m in info.itertuples():
        if not method_spec(m.method).is_sd:
            fam.append("none")
        elif isinstance(m.replay, str) and m.replay:
            fam.append(replay_ref(m.replay, m.method, int(m.K)).spec.family)
        else:
            fam.append("fixed")
    return info.assign(family=fam, aa_of=info["method_label"].map(aa))


def _pair(u: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    keys = ["engine_start", "prompt_index"]
    ua = u.loc[u["method_label"] == a, keys + ["rate", "output_tokens"]]
    ub = u.loc[u["method_label"] == b, keys + ["rate", "output_tokens"]]
    return ua.merge(ub, on=keys, suffixes=("_a", "_b")).sort_values(keys).reset_index(drop=True)


def ratio_replicates(u: pd.DataFrame, a: str, b: str, key: tuple, n_boot: int = bootstrap.N_BOOT):
    """(point ratio of means a / b over their paired units, its two-level bootstrap replicates, the pairs)."""
    p = _pair(u, a, b)
    if len(p) < bootstrap.MIN_UNITS:
        return float("nan"), np.full(n_boot, np.nan), p
    _, sizes = np.unique(p["engine_start"].to_numpy(), return_counts=True)
    W = bootstrap.cluster_weights(sizes, n_boot, bootstrap.rng("analysis.powered", *key, a, b))
    reps = bootstrap.ratio(W, p["rate_a"].to_numpy(float), p["rate_b"].to_numpy(float))
    return float(p["rate_a"].sum() / p["rate_b"].sum()), reps, p


def compare(u: pd.DataFrame, dataset: str, batch_size: int, a: str, b: str, drift: float = 0.0,
            n_boot: int = bootstrap.N_BOOT) -> dict:
    """One paired comparison a / b at (dataset, batch size): ratio, interval, what it rests on, whether it
    is established against ``drift``."""
    cell = u[(u["dataset"] == dataset) & (u["batch_size"] == batch_size)]
    r, reps, p = ratio_replicates(cell, a, b, (dataset, int(batch_size)), n_boot)
    lo, hi = bootstrap.interval(reps)
    return {"dataset": dataset, "batch_size": int(batch_size), "arm": a, "reference": b, "ratio": r,
            "ratio_lo": lo, "ratio_hi": hi, "n_prompts": int(p["prompt_index"].nunique()) if len(p) else 0,
            "n_starts": int(p["engine_start"].nunique()) if len(p) else 0, "n_units": int(len(p)),
            "output_tokens": int(p["output_tokens_a"].sum() + p["output_tokens_b"].sum()) if len(p) else 0,
            "drift": float(drift), "established": bool(established(lo, hi, drift))}


def established(lo: float, hi: float, drift: float) -> bool:
    """The interval excludes 1 by more than the A/A drift of the same engines."""
    return bool(np.isfinite(lo) and np.isfinite(hi) and (lo > 1 + drift or hi < 1 - drift))


def aa_table(u: pd.DataFrame, arms: pd.DataFrame, n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size, A/A twin): the twin over its arm (should be 1), its interval, the block's
    ``drift`` and ``mde``."""
    rows = []
    for twin in arms[arms["aa_of"].notna()].itertuples():
        for (ds, bs), cell in u.groupby(["dataset", "batch_size"]):
            if not {twin.method_label, twin.aa_of} <= set(cell["method_label"]):
                continue
            r, reps, p = ratio_replicates(cell, twin.method_label, twin.aa_of, (ds, int(bs)), n_boot)
            lo, hi = bootstrap.interval(reps)
            logs = np.log(reps[np.isfinite(reps) & (reps > 0)])
            sd = float(np.std(logs, ddof=1)) if logs.size > 1 else float("nan")
            rows.append({"dataset": ds, "batch_size": int(bs), "arm": twin.method_label, "reference": twin.aa_of,
                         "ratio": r, "ratio_lo": lo, "ratio_hi": hi, "contains_1": bool(lo <= 1 <= hi),
                         "drift": float(max(abs(lo - 1), abs(hi - 1))) if np.isfinite(lo) else float("nan"),
                         "mde": float(np.exp((Z_ALPHA + Z_POWER) * sd) - 1) if np.isfinite(sd) else float("nan"),
                         "n_prompts": int(p["prompt_index"].nunique()), "n_starts": int(p["engine_start"].nunique()),
                         "n_units": int(len(p)),
                         "output_tokens": int(p["output_tokens_a"].sum() + p["output_tokens_b"].sum())})
    return pd.DataFrame(rows, columns=["dataset", "batch_size", "arm", "reference", "ratio", "ratio_lo", "ratio_hi",
                                       "contains_1", "drift", "mde", *SUPPORT])


def _drift_of(aa: pd.DataFrame, ds: str, bs: int) -> float:
    d = aa[(aa["dataset"] == ds) & (aa["batch_size"] == bs)]["drift"]
    return float(d.max()) if len(d) and d.notna().any() else float("nan")


def speedup_table(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, baseline: str = "none",
                  n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Every SD arm over the no-SD ``baseline`` at each (dataset, batch size), paired over prompts and starts."""
    rows = []
    fam = dict(zip(arms["method_label"], arms["family"]))
    for (ds, bs), cell in u.groupby(["dataset", "batch_size"]):
        for a in sorted(set(cell["method_label"]) - {baseline}):
            row = compare(u, ds, int(bs), a, baseline, _drift_of(aa, ds, int(bs)), n_boot)
            rows.append({**row, "family": fam.get(a)})
    return pd.DataFrame(rows)


def headline_table(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, speedups: pd.DataFrame,
                   n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size): every non-fixed arm over the best fixed arm of that block (the fixed arm with
    the highest speedup point; A/A twins excluded), paired; ``best_fixed`` names it. The choice of the best
    fixed arm uses the same data, which favours it slightly: a policy called ahead of it is ahead of the
    strongest fixed arm this sweep measured."""
    twins = set(arms.loc[arms["aa_of"].notna(), "method_label"])
    fam = dict(zip(arms["method_label"], arms["family"]))
    rows = []
    for (ds, bs), sp in speedups.groupby(["dataset", "batch_size"]):
        fixed = sp[(sp["family"] == "fixed") & ~sp["arm"].isin(twins)]
        if fixed.empty:
            continue
        best = fixed.loc[fixed["ratio"].idxmax(), "arm"]
        for a in sp.loc[~sp["family"].isin(["fixed", "none"]) & ~sp["arm"].isin(twins), "arm"]:
            row = compare(u, ds, int(bs), a, best, _drift_of(aa, ds, int(bs)), n_boot)
            rows.append({**row, "family": fam.get(a), "best_fixed": best})
    return pd.DataFrame(rows)


def powered_tables(sweep_dir: str | Path, n_boot: int = bootstrap.N_BOOT,
                   baseline: Optional[str] = "none") -> dict[str, pd.DataFrame]:
    """``units``, ``speedups`` (each arm over no SD), ``aa`` (A/A twins, drift, MDE) and ``headline`` (each
    policy over the best fixed arm) of one powered sweep's current cells."""
    store = SweepStore(sweep_dir)
    runs, requests = store.read("runs"), store.read("requests")
    arms = arm_info(store.read_provenance())
    u = units(request_rates(runs, requests))
    aa = aa_table(u, arms, n_boot)
    sp = speedup_table(u, arms, aa, baseline, n_boot)
    return {"units": u, "speedups": sp, "aa": aa, "headline": headline_table(u, arms, aa, sp, n_boot)}
