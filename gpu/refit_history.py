#!/usr/bin/env python3
"""How the engine refit's predictions moved as a sweep's blocks were added: one table from the git history.

Notebook 06's ``_powered_sim_vs_measured_`` CSV has, per block and oracle, the engine refit's simulated ratio over
the best fixed arm (``predictor`` "engine refit, ..."), a linear step-time fit to the sweep's own engine steps. The
fit takes in every step of the sweep, so each GPU session that adds cells moves every block's prediction; FINDINGS
used to carry that history as clauses in five bullets. This script reads every committed version of the CSV
(``git log`` of the file, oldest first, then the working tree's copy if it differs: commit ``worktree``)
and writes one tidy table: commit, date, block, oracle, the refit's value,
the measured interval at that commit, and where the value lay against it (``below`` / ``inside`` / ``above``).
``--markdown`` also prints the Combine and Oracle Proposal values as a block x commit table.

Usage:
    .venv/bin/python gpu/refit_history.py h100_v034_headline [--markdown]
writes data/gpu/refit_history_h100_v034_headline.csv
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sdlib.sim.replay_costs import REFIT_COST_MODEL as REFIT  # noqa: E402  (the predictor's label begins so)
BLOCK = ["dataset", "batch_size", "oracle"]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def figure_csv(sweep: str) -> str:
    return f"figures/06_trace_replay__powered_sim_vs_measured__sweep={sweep}.csv"


def history(sweep: str) -> pd.DataFrame:
    """One row per (commit, block, oracle) of the refit's prediction, oldest commit first."""
    path = figure_csv(sweep)
    log = [l.split() for l in _git("log", "--reverse", "--diff-filter=AM", "--format=%H %ad", "--date=short", "--",
                                   path).split("\n")
           if l.strip()]
    versions = [(commit, date, _git("show", f"{commit}:{path}")) for commit, date in log]
    here = ROOT / path
    if here.is_file() and (not versions or here.read_text() != versions[-1][2]):  # not committed yet
        versions.append(("worktree", "uncommitted", here.read_text()))
    rows = []
    for order, (commit, date, text) in enumerate(versions):
        df = pd.read_csv(io.StringIO(text))
        refit = df[df["predictor"].str.startswith(REFIT)]
        for r in refit.itertuples(index=False):
            where = "below" if r.simulated < r.ratio_lo else "above" if r.simulated > r.ratio_hi else "inside"
            rows.append({"order": order, "commit": commit[:8], "date": date, "dataset": r.dataset,
                         "batch_size": int(r.batch_size), "oracle": r.oracle, "refit": round(float(r.simulated), 6),
                         "measured": round(float(r.ratio), 6), "measured_lo": round(float(r.ratio_lo), 6),
                         "measured_hi": round(float(r.ratio_hi), 6), "refit_vs_interval": where})
    if not rows:
        raise SystemExit(f"refit_history: no committed version of {path} has an engine refit row")
    return pd.DataFrame(rows)


def markdown(h: pd.DataFrame) -> str:
    """Block x commit, each cell the refit's value with ``<`` / ``>`` where it lay below / above the interval."""
    mark = {"below": "<", "above": ">", "inside": ""}
    h = h.assign(cell=[f"{v:.3f}{mark[w]}" for v, w in zip(h["refit"], h["refit_vs_interval"])],
                 col=[f"{o} {c}" for o, c in zip(h["order"], h["commit"])])
    t = h.pivot_table(index=BLOCK, columns="col", values="cell", aggfunc="first").fillna("")
    t = t[sorted(t.columns, key=lambda c: int(c.split()[0]))]
    t.columns = [c.split()[1] for c in t.columns]
    head = "| dataset | bs | oracle | " + " | ".join(f"`{c}`" for c in t.columns) + " |"
    lines = [head, "| " + " | ".join(["---"] * (3 + len(t.columns))) + " |"]
    for (d, b, o), row in t.iterrows():
        lines.append(f"| {d} | {b} | {o} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", help="e.g. h100_v034_headline")
    ap.add_argument("--out", type=Path, help="default: data/gpu/refit_history_SWEEP.csv")
    ap.add_argument("--markdown", action="store_true", help="also print the block x commit table")
    a = ap.parse_args(argv)
    h = history(a.sweep)
    out = a.out or ROOT / "data" / "gpu" / f"refit_history_{a.sweep}.csv"
    h.to_csv(out, index=False)
    print(f"refit_history: {h['commit'].nunique()} commits x {h.groupby(BLOCK).ngroups} block-oracles -> {out}")
    if a.markdown:
        print(markdown(h))
    return 0


if __name__ == "__main__":
    sys.exit(main())
