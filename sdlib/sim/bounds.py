"""The simulator's bounds, summarised: best fixed k vs Oracle Proposal vs Oracle Combine, the two conventions
compared, where fixed k stops paying per cost model, and the headline numbers (notebook 05's tables).

Usage:
    from sdlib.sim.bounds import bounds_stack, compare_conventions
    st = bounds_stack(table)   # table: sdlib.sim.oracle.simulate(...)
    summary = convention_summary(compare_conventions(table))
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.core.crossover import crossover_table
from sdlib.core.registry import PolicyRef
from sdlib.paths import FIGURES_DIR
from sdlib.sim.conventions import Convention, get_convention
from sdlib.sim.costmodel import CostModel
from sdlib.sim.oracle import TABLE_COLUMNS, authors_policies, simulate
from sdlib.sim.prepared import PreparedTraces

#: The two proposers simulated on their own (``combined`` picks between them per step).
SINGLE_PROPOSERS = ("eagle3", "ngram")

#: the convention fields, with a short name for each quirk
QUIRKS = {"index_shift": "look-up index shift", "combine_draft": "Combine drafting price",
          "combine_length": "Combine output length", "ngram_match": "n-gram no-match rule",
          "ngram_idle_draft": "n-gram idle drafting"}


def convention_ablation(base: str | Convention = "authors", target: str | Convention = "corrected") -> dict:
    """``base``, ``target``, and ``base`` with one field at a time set as in ``target`` ("authors + <quirk> fixed")."""
    b, t = get_convention(base), get_convention(target)
    out = {b.name: b}
    for f, label in QUIRKS.items():
        if getattr(b, f) != getattr(t, f):
            name = f"{b.name}, {label} as {t.name}"
            out[name] = Convention(name, **{g: (getattr(t, g) if g == f else getattr(b, g)) for g in QUIRKS})
    out[t.name] = t
    return out


def compare_conventions(table: pd.DataFrame, a: str = "authors", b: str = "corrected") -> pd.DataFrame:
    """Side by side: one row per cell with ``speedup_<a>``, ``speedup_<b>``, ``diff`` (b - a) and ``ratio`` (b / a)."""
    keys = [c for c in TABLE_COLUMNS if c not in ("convention", "speedup")]
    w = table.pivot_table(index=keys, columns="convention", values="speedup").reset_index()
    w = w.rename(columns={a: f"speedup_{a}", b: f"speedup_{b}"})
    w["diff"] = w[f"speedup_{b}"] - w[f"speedup_{a}"]
    w["ratio"] = w[f"speedup_{b}"] / w[f"speedup_{a}"]
    w.columns.name = None
    return w


def write_bounds_csv(table: pd.DataFrame, path=None) -> Path:
    """Write the speedup table with exactly :data:`TABLE_COLUMNS` to ``figures/05_oracle_bounds.csv`` (default)."""

    p = Path(path) if path is not None else FIGURES_DIR / "05_oracle_bounds.csv"
    p.parent.mkdir(parents=True, exist_ok=True)
    out = table[TABLE_COLUMNS].sort_values(TABLE_COLUMNS[:6]).reset_index(drop=True)
    out.to_csv(p, index=False, float_format="%.6g")
    return p


#: The paper's oracle-bound numbers (Llama-3.1-8B, H100, simulated), quoted in PAPER.md; cited, never ours.
PAPER_BOUNDS = pd.DataFrame([
    {"dataset": "instructcoder", "proposer": "ngram", "predict_method": "best FIXED_k", "batch_size": 1,
     "speedup": 2.1, "claim": "best fixed-k n-gram ~2.1x", "short": "fixed n-gram 2.1x"},
    {"dataset": "instructcoder", "proposer": "ngram", "predict_method": "ORACLE", "batch_size": 1,
     "speedup": 2.75, "claim": "Oracle Proposal (n-gram) ~2.75x", "short": "Oracle n-gram 2.75x"},
    {"dataset": "instructcoder", "proposer": "combined", "predict_method": "ORACLE", "batch_size": 1,
     "speedup": 4.9, "claim": "Oracle Combine ~4.9x, falling with batch size", "short": "Combine 4.9x"},
])


def bounds_stack(table: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, batch_size): best fixed k (over eagle3/ngram and k), best Oracle Proposal, Oracle Combine.

    ``table``: one convention and one cost model of :func:`sdlib.sim.oracle.speedup_table` (or measured cells in
    its shape, with its ``kind`` and ``k`` columns; capped oracles count as Oracle Proposal / Combine, the best
    K per cell). The
    increments ``oracle_gain`` (best ORACLE over best fixed) and ``combine_gain``
    (Combine over the larger of the two) are clipped at 0 for stacking; ``stack_top``
    is the stacked height.
    """
    fixed = table[table["kind"] == "fixed"].sort_values("speedup")
    fixed = fixed.groupby(["dataset", "batch_size"]).tail(1)
    fixed = fixed.assign(best_fixed_label=fixed.proposer + " k=" + fixed["k"].astype(int).astype(str))
    orc = table[table["kind"] == "oracle"].sort_values("speedup")
    orc = orc.groupby(["dataset", "batch_size"]).tail(1)
    comb = table[(table["kind"] == "combine") & table["k"].isna()]
    comb = comb.sort_values("speedup").groupby(["dataset", "batch_size"]).tail(1)
    out = (fixed[["dataset", "batch_size", "speedup", "best_fixed_label"]].rename(columns={"speedup": "best_fixed"})
           .merge(orc[["dataset", "batch_size", "speedup", "proposer"]]
                  .rename(columns={"speedup": "best_oracle", "proposer": "best_oracle_proposer"}),
                  on=["dataset", "batch_size"])
           .merge(comb[["dataset", "batch_size", "speedup"]].rename(columns={"speedup": "combine_oracle"}),
                  on=["dataset", "batch_size"], how="left"))
    out["oracle_gain"] = (out.best_oracle - out.best_fixed).clip(lower=0)
    out["combine_gain"] = (out["combine_oracle"] - np.maximum(out.best_fixed, out.best_oracle)).clip(lower=0).fillna(0)
    out["stack_top"] = out.best_fixed + out.oracle_gain + out.combine_gain
    return out.sort_values(["dataset", "batch_size"]).reset_index(drop=True)


def fixed_k_rows(table: pd.DataFrame, cost_model: str, convention: str, batch_size: int = 1) -> pd.DataFrame:
    """The fixed-k rows of one cost model, convention and batch size (column ``k``: the draft length; the
    simulator's markers beside Leviathan's closed form)."""
    return table[(table.batch_size == batch_size) & (table.convention == convention) & (table.cost_model == cost_model)
                 & (table["kind"] == "fixed")].copy()


def convention_summary(cmp_: pd.DataFrame) -> pd.DataFrame:
    """Per (cost model, proposer, predict method) of :func:`compare_conventions`: the mean ratio and the
    smallest, largest and largest absolute difference between the two conventions."""
    return (cmp_.groupby(["cost_model", "proposer", "predict_method"])
            .agg(mean_ratio=("ratio", "mean"), min_diff=("diff", "min"), max_diff=("diff", "max"),
                 max_abs_diff=("diff", lambda d: d.abs().max()))
            .reset_index())


def convention_ablation_table(prep: PreparedTraces, cost_model: CostModel, proposers: Sequence[str],
                              base: str = "authors", target: str = "corrected", batch_sizes: Sequence[int] = (1, 128),
                              fixed_ks: Sequence[int] = (5,), sample: Optional[str | int] = None) -> pd.DataFrame:
    """Speedup under each convention of :func:`convention_ablation` (``base``, one quirk at a time as in
    ``target``, ``target``), one column per convention in that order, a row per (dataset, proposer,
    predict method, batch size): fixed k for each of ``fixed_ks`` and the oracle, per proposer."""
    ablation = convention_ablation(base, target)
    abl = simulate(prep, cost_models=[cost_model], batch_sizes=list(batch_sizes),
                   policies=authors_policies(proposers, fixed_ks), conventions=list(ablation.values()), sample=sample)
    return abl.pivot_table(index=["dataset", "proposer", "predict_method", "batch_size"], columns="convention",
                           values="speedup", sort=False)[list(ablation)].reset_index()


#: Column names of :func:`crossover_by_cost_model` (named after the simulated range, bs 1..512).
CROSSOVER_COLUMNS = {"first": "speedup_bs1", "last": "speedup_bs512", "below": "first_bs_below_{thr:g}",
                     "paying": None}
CROSSOVER_BATCH_SIZES = (1, 8, 16, 32, 64, 128, 256, 512)


def crossover_by_cost_model(prep: PreparedTraces, cost_models: Sequence[CostModel], convention: str,
                            sample: Optional[str | int] = None, batch_sizes: Sequence[int] = CROSSOVER_BATCH_SIZES,
                            proposers: Sequence[str] = SINGLE_PROPOSERS, k: int = 3,
                            thresholds: Sequence[float] = (1.2, 1.0)) -> pd.DataFrame:
    """Per (cost model, proposer, dataset): the first simulated batch size at which fixed ``k``'s speedup falls
    below each threshold (NA: not within ``batch_sizes``), by :func:`sdlib.core.crossover.crossover_table`
    on the simulated table."""
    xs = simulate(prep, cost_models=list(cost_models), batch_sizes=list(batch_sizes),
                  policies=[PolicyRef("fixed", p, int(k)) for p in proposers], conventions=[convention], sample=sample)
    return crossover_table(xs, by=("cost_model", "proposer", "dataset"), thresholds=thresholds,
                           columns=CROSSOVER_COLUMNS)


def headline_table(table: pd.DataFrame, dataset: str, cost_model: str) -> pd.DataFrame:
    """Per (convention, batch size) of one dataset and cost model: the best fixed k (proposer, predict
    method, ``best_fixed`` speedup) and Oracle Combine's speedup (``combine_oracle``)."""
    d = table[(table.dataset == dataset) & (table.cost_model == cost_model)]
    best_fixed = (d[d["kind"] == "fixed"]
                  .sort_values("speedup").groupby(["convention", "batch_size"]).tail(1)
                  .set_index(["convention", "batch_size"])[["proposer", "predict_method", "speedup"]]
                  .rename(columns={"speedup": "best_fixed"}))
    comb = d[(d["kind"] == "combine") & d["k"].isna()].set_index(["convention", "batch_size"])["speedup"]
    return best_fixed.join(comb.rename("combine_oracle")).sort_index()
