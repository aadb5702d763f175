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
import warnings
from typing import Any, Optional

import pandas as pd
import pyarrow.parquet as pq

from sdlib.paths import resolve
from sdlib.store.files import write_json_atomic, write_parquet_atomic
from sdlib.store.provenance import utc_now
from sdlib.store.schema import TABLES, columns, conform

TABLE_ORDER = ("requests", "steps", "engine_steps", "step_phases", "runs")  # runs last = commit marker
OPTIONAL_TABLES = ("step_phases",)  # written empty when a cell has none


def empty_table(table: str) -> pd.DataFrame:
    """An empty DataFrame with the table's columns and dtypes."""
    return conform(table, pd.DataFrame({c: pd.Series(dtype="object") for c in columns(table)}))


def readable(path: Path) -> bool:
    """True when ``path`` is a whole parquet file (its footer reads)."""
    try:
        pq.read_metadata(path)
        return True
    except Exception:  # noqa: BLE001 - truncated, empty or not parquet
        return False


def current_cells(sweep_dir: str | os.PathLike[str]) -> Optional[set[str]]:
    """The run ids of the sweep's current config (recorded in provenance.json by the last ``sdlib sweep``);
    None for a folder written before they were recorded (then every cell counts)."""
    p = resolve(sweep_dir) / "provenance.json"
    try:
        cells = json.loads(p.read_text()).get("cells") if p.exists() else None
    except (OSError, json.JSONDecodeError):
        return None
    return set(cells) if cells is not None else None


def read_table(sweep_dir: str | os.PathLike[str], table: str, current_only: bool = True) -> pd.DataFrame:
    """All cells' rows of ``table`` in a sweep folder (empty, typed, if none).

    ``current_only``: only the cells of the sweep's current config (:func:`current_cells`), so results of an
    edited config never mix with the old config's. Unreadable files (a cell cut short) are left out with a
    warning naming them, never a traceback.
    """
    if table not in TABLES:
        raise KeyError(f"table: {table!r} is not one of {sorted(TABLES)}")
    root = resolve(sweep_dir)
    d = root / table
    files = sorted(d.glob("*.parquet")) if d.is_dir() else []
    keep = current_cells(root) if current_only else None
    if keep is not None:
        files = [f for f in files if f.stem in keep]
    bad = [f for f in files if not readable(f)]
    if bad:
        warnings.warn(f"{root.name}/{table}: {len(bad)} unreadable file(s) left out: "
                      f"{', '.join(f.name for f in bad[:3])}{' ...' if len(bad) > 3 else ''}", stacklevel=2)
        files = [f for f in files if f not in bad]
    if not files:
        return empty_table(table)
    return conform(table, pd.concat([pd.read_parquet(f) for f in files], ignore_index=True))


class SweepStore:
    """Reads and writes one sweep's folder."""

    def __init__(self, out_dir: str | os.PathLike[str]):
        self.dir = resolve(out_dir)
        #: what the last ``run_sweep`` on this store planned, finished and failed (run ids)
        self.outcome: dict[str, list[str]] = {"planned": [], "done": [], "failed": []}

    # cells -----------------------------------------------------------------
    def cell_files(self, run_id: str) -> list[Path]:
        """Every file of one cell: its table files, failure record and replay check."""
        out = [self.dir / t / f"{run_id}.parquet" for t in TABLE_ORDER]
        out += [self.dir / "failures" / f"{run_id}.json", self.dir / "replay" / f"{run_id}.json"]
        return [f for f in out if f.exists()]

    def is_done(self, run_id: str) -> bool:
        """Finished and whole: every table file present and readable (``runs`` is written last). A table of
        :data:`OPTIONAL_TABLES` may be absent (sweeps written before it existed), but must read if present."""
        def whole(t: str) -> bool:
            f = self.dir / t / f"{run_id}.parquet"
            return readable(f) if f.exists() else t in OPTIONAL_TABLES

        return all(whole(t) for t in TABLE_ORDER)

    def done_ids(self) -> set[str]:
        """Cells whose ``runs`` file exists and whose every table file reads (a corrupt cell is not done)."""
        d = self.dir / "runs"
        return {p.stem for p in d.glob("*.parquet") if self.is_done(p.stem)} if d.is_dir() else set()

    def corrupt_ids(self) -> set[str]:
        """Cells with a ``runs`` file but an unreadable or missing table file (rerun them)."""
        d = self.dir / "runs"
        return {p.stem for p in d.glob("*.parquet") if not self.is_done(p.stem)} if d.is_dir() else set()

    def all_ids(self) -> set[str]:
        """Every cell with any file here (done, corrupt or failed)."""
        ids = set()
        for sub in (*TABLE_ORDER, "failures", "replay"):
            d = self.dir / sub
            if d.is_dir():
                ids |= {p.name.split(".")[0] for p in d.iterdir() if not p.name.startswith(".")}
        return ids

    def remove_cells(self, run_ids: set[str]) -> int:
        """Delete every file of these cells; returns the number of files removed."""
        n = 0
        for rid in run_ids:
            for f in self.cell_files(rid):
                f.unlink()
                n += 1
        return n

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

    def failures(self, current_only: bool = True) -> pd.DataFrame:
        """Failure records (of the current config's cells unless ``current_only`` is False)."""
        d = self.dir / "failures"
        files = sorted(d.glob("*.json")) if d.is_dir() else []
        keep = current_cells(self.dir) if current_only else None
        rows = []
        for p in files:
            if keep is not None and p.stem not in keep:
                continue
            try:
                rows.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                rows.append({"run_id": p.stem, "error": "unreadable failure record"})
        return pd.DataFrame(rows)

    def read(self, table: str, current_only: bool = True) -> pd.DataFrame:
        return read_table(self.dir, table, current_only)

    def set_current(self, sweep_config: dict[str, Any], run_ids: list[str]) -> bool:
        """Record the current config and its cells; returns True when they changed (provenance rewritten)."""
        prov = self.read_provenance()
        if prov.get("cells") == list(run_ids) and prov.get("config") == sweep_config:
            return False
        prov["sweep"] = sweep_config.get("name")
        prov["config"] = sweep_config
        prov["cells"] = list(run_ids)
        write_json_atomic(prov, self.provenance_path)
        return True

    def stale_ids(self) -> set[str]:
        """Cells here that are not in the current config (an older config's results)."""
        cur = current_cells(self.dir)
        return set() if cur is None else self.all_ids() - cur

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


class SweepBusy(RuntimeError):
    """Another process holds the results folder's lock; the message says who."""


class FolderLock:
    """An exclusive lock on a results folder (``.sweep.lock``, flock: released when the holder dies)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / ".sweep.lock"
        self._fh = None

    def __enter__(self) -> "FolderLock":
        import fcntl
        import socket

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise SweepBusy(f"results folder {self.path.parent} is in use by {holder}; wait for it, or use another "
                            "--results-dir") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {utc_now()}\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
