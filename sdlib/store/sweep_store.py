"""A sweep's folder: one parquet file per (table, cell), written atomically; failures; provenance.

Layout of ``<results_dir>/<sweep>/``::

    runs/<run_id>.parquet          written last: its presence marks the cell finished
    requests/<run_id>.parquet
    steps/<run_id>.parquet
    engine_steps/<run_id>.parquet
    step_phases/<run_id>.parquet   time in drafting / verification / sampling (only with engine.phase_timers)
    replay/<run_id>.json           trace replay: each request's steps and vLLM's counters checked against the plan
    failures/<run_id>.json         a cell that failed (removed when it later succeeds)
    provenance.json                sweep config + one entry per invocation (vLLM version, device, commit, ...)
    logs/                          engine process logs (not committed)

Usage:
    from sdlib.store import SweepStore, read_table
    store = SweepStore("data/sweeps/embedded_default")
    runs = store.read("runs")
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from sdlib.paths import resolve
from sdlib.store.files import write_json_atomic, write_parquet_atomic
from sdlib.store.provenance import utc_now
from sdlib.store.schema import TABLES, columns, conform

TABLE_ORDER = ("requests", "steps", "engine_steps", "step_phases", "runs")  # runs last = commit marker
OPTIONAL_TABLES = ("step_phases",)  # written empty when a cell has none


def empty_table(table: str) -> pd.DataFrame:
    """An empty DataFrame with the table's columns and dtypes."""
    return conform(table, pd.DataFrame({c: pd.Series(dtype="object") for c in columns(table)}))


def read_table(sweep_dir: str | os.PathLike[str], table: str) -> pd.DataFrame:
    """All cells' rows of ``table`` in a sweep folder (empty, typed, if none)."""
    if table not in TABLES:
        raise KeyError(f"table: {table!r} is not one of {sorted(TABLES)}")
    d = resolve(sweep_dir) / table
    files = sorted(d.glob("*.parquet")) if d.is_dir() else []
    if not files:
        return empty_table(table)
    return conform(table, pd.concat([pd.read_parquet(f) for f in files], ignore_index=True))


class SweepStore:
    """Reads and writes one sweep's folder."""

    def __init__(self, out_dir: str | os.PathLike[str]):
        self.dir = resolve(out_dir)

    # cells -----------------------------------------------------------------
    def is_done(self, run_id: str) -> bool:
        return (self.dir / "runs" / f"{run_id}.parquet").exists()

    def done_ids(self) -> set[str]:
        d = self.dir / "runs"
        return {p.stem for p in d.glob("*.parquet")} if d.is_dir() else set()

    def write_cell(self, run_id: str, tables: dict[str, pd.DataFrame]) -> None:
        """Write a finished cell's tables, ``runs`` last, each atomically; clear an old failure."""
        tables = {**{t: empty_table(t) for t in OPTIONAL_TABLES}, **tables}
        missing = set(TABLE_ORDER) - set(tables)
        if missing:
            raise KeyError(f"write_cell: missing tables {sorted(missing)}")
        for t in TABLE_ORDER:
            write_parquet_atomic(conform(t, tables[t]), self.dir / t / f"{run_id}.parquet")
        f = self.dir / "failures" / f"{run_id}.json"
        if f.exists():
            f.unlink()

    def write_json(self, relpath: str, obj: Any) -> Path:
        """Write a JSON file inside the sweep's folder (atomically), e.g. ``replay/<run_id>.json``."""
        path = self.dir / relpath
        write_json_atomic(obj, path)
        return path

    def write_failure(self, run_id: str, info: dict[str, Any]) -> None:
        write_json_atomic({"run_id": run_id, "failed_at": utc_now(), **info},
                          self.dir / "failures" / f"{run_id}.json")

    def failures(self) -> pd.DataFrame:
        d = self.dir / "failures"
        rows = [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []
        return pd.DataFrame(rows)

    def read(self, table: str) -> pd.DataFrame:
        return read_table(self.dir, table)

    # provenance --------------------------------------------------------------
    @property
    def provenance_path(self) -> Path:
        return self.dir / "provenance.json"

    def read_provenance(self) -> dict[str, Any]:
        p = self.provenance_path
        return json.loads(p.read_text()) if p.exists() else {}

    def record_invocation(self, sweep_config: dict[str, Any], entry: dict[str, Any]) -> None:
        """Append one invocation's facts to provenance.json (the config is kept as the latest)."""
        prov = self.read_provenance()
        prov["sweep"] = sweep_config.get("name")
        prov["config"] = sweep_config
        prov.setdefault("invocations", []).append(entry)
        write_json_atomic(prov, self.provenance_path)

    def update_invocation(self, index: int, updates: dict[str, Any]) -> None:
        prov = self.read_provenance()
        inv = prov.setdefault("invocations", [])
        if -len(inv) <= index < len(inv):
            inv[index].update(updates)
            write_json_atomic(prov, self.provenance_path)

    def log_path(self, name: str) -> Path:
        p = self.dir / "logs" / f"{name}.log"
        p.parent.mkdir(parents=True, exist_ok=True)
        return p
