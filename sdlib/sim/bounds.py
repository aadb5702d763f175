"""The simulator's bounds, summarised: best fixed k vs Oracle Proposal vs Oracle Combine, and the two conventions compared.

Usage:
    from sdlib.sim.bounds import bounds_stack, compare_conventions
    st = bounds_stack(table)   # table: sdlib.sim.oracle.simulate(...)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sdlib.paths import FIGURES_DIR
from sdlib.sim.oracle import TABLE_COLUMNS, Convention, get_convention

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

    ``table``: one convention and one cost model of :func:`speedup_table`. The
    increments ``oracle_gain`` (best ORACLE over best fixed) and ``combine_gain``
    (Combine over the larger of the two) are clipped at 0 for stacking; ``stack_top``
    is the stacked height.
    """
    t = table[table.proposer.isin(["eagle3", "ngram"])]
    fixed = t[t.predict_method.str.startswith("FIXED_")].sort_values("speedup")
    fixed = fixed.groupby(["dataset", "batch_size"]).tail(1)
    fixed = fixed.assign(best_fixed_label=fixed.proposer + " k=" + fixed.predict_method.str[6:])
    orc = t[t.predict_method == "ORACLE"].sort_values("speedup").groupby(["dataset", "batch_size"]).tail(1)
    comb = table[(table.proposer == "combined") & (table.predict_method == "ORACLE")]
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
