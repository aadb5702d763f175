#!/usr/bin/env python3
"""Draft the measured fields of a GPU session's record (``data/gpu/<session>.json``) from the sweep it added to.

Each session's record was written by hand: its engine starts, cell counts, times, replay exactness and GPU state
copied from the sweep's ``provenance.json`` and runs tables, and re-checked by a helper. This script reads them
for one invocation of ``sdlib sweep`` (default: the last) and prints the fields as JSON, for the integrator to
paste beside what only they know (``producer``, ``what``, ``budget_left_s``, ``next``):

- ``device``, ``device_uuid``, ``commit``: the invocation's engines and commit;
- ``invocation``: its cells planned / already done / done / failed, started and finished at;
- ``replay``: how many of its cells have a replay file and how many of those are exact;
- ``engine_start_s``: each engine's start, by method, in run order (a method's second start in the invocation
  as ``<method> #2``);
- ``gpu_state``: the ranges of the runs tables' GPU columns over its cells (a column no cell knows, such as the
  power limit and the per-reason clock-event counters in sweeps written before they were recorded, is left out),
  and within each engine start the median (and range by arm) of repeat 1's decode rate over repeat 0's.

The invocation's cells are the runs rows whose ``started_at`` lies between its start and finish (its commit too).

Usage:
    .venv/bin/python gpu/record.py data/sweeps/h100_v034_headline [--invocation -1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
INVOCATION_KEYS = ("cells_planned", "cells_already_done", "cells_done", "cells_failed", "started_at", "finished_at")


def invocation_label(sweep: str, inv: dict) -> str:
    """``sweep (blocks)``, as the records name an invocation (its ``--blocks`` argument, if any)."""
    argv = inv.get("argv", [])
    blocks = argv[argv.index("--blocks") + 1] if "--blocks" in argv[:-1] else "all"
    return f"{sweep} ({blocks})"


def invocation_runs(folder: Path, inv: dict) -> pd.DataFrame:
    """The runs rows of the cells this invocation ran."""
    from sdlib.store import SweepStore

    runs = SweepStore(folder).read("runs", current_only=False)
    if runs.empty or "finished_at" not in inv:
        return runs.iloc[0:0]
    t = pd.to_datetime(runs["started_at"])
    inside = (t >= pd.Timestamp(inv["started_at"])) & (t <= pd.Timestamp(inv["finished_at"]))
    return runs[inside & (runs["git_commit"] == inv.get("git_commit"))]


def _span(s: pd.Series, digits: int = 0) -> list:
    lo, hi = round(float(s.min()), digits), round(float(s.max()), digits)
    return [int(lo), int(hi)] if digits == 0 else [lo, hi]


def gpu_state(runs: pd.DataFrame) -> dict:
    """Ranges of the GPU columns over the cells (each under the column's name without ``gpu_``; only the columns some
    cell knows), and repeat 1 over repeat 0 within each cell's block and engine start (``by_arm``: the range over
    arms, blocks and starts)."""
    from sdlib.store.gpu_state import HELD_KEYS

    out = {"cells": len(runs)}
    for col, key in (("gpu_sm_mhz_start", "sm_mhz_start"), ("gpu_sm_mhz_end", "sm_mhz_end"),
                     ("gpu_mem_mhz_end", "mem_mhz_end"), ("gpu_temp_c_end", "temp_c_end"),
                     ("gpu_power_w_end", "power_w_end"), ("gpu_power_limit_w_end", "power_limit_w_end"),
                     ("gpu_slowdown_ms", "slowdown_ms"), *((f"gpu_{k}", k) for k in HELD_KEYS)):
        if col in runs and runs[col].notna().any():
            out[key] = _span(runs[col])
    if "gpu_clock_events_end" in runs:
        out["clock_events_end"] = sorted(runs["gpu_clock_events_end"].dropna().unique().tolist())
    keys = [k for k in ("model", "dataset", "batch_size", "engine_start", "method_label") if k in runs]
    rates = runs.pivot_table(index=keys, columns="repeat", values="tok_per_s")
    if {0, 1} <= set(rates.columns):
        r = (rates[1] / rates[0]).dropna()
        out["repeat1_over_repeat0"] = {"median": round(float(r.median()), 3), "by_arm": _span(r, 3)}
    return out


def draft(folder: Path, index: int = -1) -> dict:
    prov = json.loads((folder / "provenance.json").read_text())
    inv = prov["invocations"][index]
    engines = inv.get("engines", [])
    runs = invocation_runs(folder, inv)
    replays = [folder / "replay" / f"{rid}.json" for rid in runs["run_id"]] if len(runs) else []
    replays = [p for p in replays if p.is_file()]
    exact = sum(json.loads(p.read_text()).get("exact") is True for p in replays)
    label = invocation_label(folder.name, inv)
    return {
        "device": sorted({e.get("device") for e in engines if e.get("device")}),
        "device_uuid": sorted({e.get("device_uuid") for e in engines if e.get("device_uuid")}),
        "commit": inv.get("git_commit"),
        "invocation": {label: {k: inv.get(k) for k in INVOCATION_KEYS}},
        "replay": {"cells": len(runs), "replay_files": len(replays), "exact": exact},
        "engine_start_s": {label: engine_starts(engines)},
        "gpu_state": gpu_state(runs) if len(runs) else {"cells": 0},
    }


def engine_starts(engines: list[dict]) -> dict[str, float]:
    """Each engine's start in seconds, in run order, keyed by method; a method's later starts in the same
    invocation (an A-B-B-A run of both engine starts) as ``<method> #2``, ``#3``, so that none overwrites another.
    ``#2`` is the method's second engine in the invocation, not necessarily engine start 1 of the sweep."""
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for e in engines:
        if e.get("engine_start_s") is None:
            continue
        method = e.get("method", "?")
        n = seen[method] = seen.get(method, 0) + 1
        out[method if n == 1 else f"{method} #{n}"] = round(e["engine_start_s"], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep folder, e.g. data/sweeps/h100_v034_headline")
    ap.add_argument("--invocation", type=int, default=-1, help="which invocation of its provenance (default -1)")
    a = ap.parse_args(argv)
    if not (a.sweep / "provenance.json").is_file():
        raise SystemExit(f"record: {a.sweep} has no provenance.json")
    n = len(json.loads((a.sweep / "provenance.json").read_text()).get("invocations", []))
    if not -n <= a.invocation < n:
        raise SystemExit(f"record: {a.sweep} has {n} invocation(s); --invocation {a.invocation} is not one")
    print(json.dumps(draft(a.sweep, a.invocation), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
