"""A sweep's folder: one parquet file per (table, cell), written atomically; failures; provenance.

Layout of ``<results_dir>/<sweep>/``::

    runs/<run_id>.parquet          written last: its presence marks the cell finished (the commit marker: its
                                   footer holds the sha256 of each other table file of the cell)
    requests/<run_id>.parquet
    steps/<run_id>.parquet
    engine_steps/<run_id>.parquet
    step_phases/<run_id>.parquet   time in drafting / verification / sampling (only with engine.phase_timers)
    replay/<run_id>.json           trace replay: each request's steps and vLLM's counters checked against the plan
    failures/<run_id>.json         a cell that failed (removed when it later succeeds)
    provenance.json                sweep config + one entry per invocation (vLLM version, device, commit, ...)
    .sweep.lock, .sweep.lease      who runs a sweep here (FolderLock: flock, and a lease for shared file systems)
    logs/                          engine process logs (not committed)

Usage:
    from sdlib.store import SweepStore, read_table
    store = SweepStore("data/sweeps/embedded_default")
    runs = store.read("runs")
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import socket
import warnings
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import pyarrow.parquet as pq

from sdlib.paths import resolve
from sdlib.store.files import sha256_file, write_json_atomic, write_parquet_atomic
from sdlib.store.lease import Lease, LeaseBusy
from sdlib.store.provenance import utc_now
from sdlib.store.schema import TABLES, columns, conform

TABLE_ORDER = ("requests", "steps", "engine_steps", "step_phases", "runs")  # runs last = commit marker
OPTIONAL_TABLES = ("step_phases",)  # written empty when a cell has none
#: per-cell JSON records beside the tables (``<dir>/<run_id>.json``): a failure, the replay check, the confidence
#: stop's hook counts; they go, move and count with their cell
CELL_JSON_DIRS = ("failures", "replay", "confidence_stop")
#: The key, in the commit marker's (``runs`` file's) footer, of ``{table: sha256 of its file}`` for the cell's
#: other tables. Cells written before it existed have none: their files are checked by decoding them whole.
CHECKSUM_KEY = "sdlib.sha256"


def empty_table(table: str) -> pd.DataFrame:
    """An empty DataFrame with the table's columns and dtypes."""
    return conform(table, pd.DataFrame({c: pd.Series(dtype="object") for c in columns(table)}))


def readable(path: Path) -> bool:
    """True when ``path`` is a parquet file whose footer reads (a cut write fails this; damage in the middle of
    the file does not: see :func:`decodes`)."""
    try:
        pq.read_metadata(path)
        return True
    except Exception:  # noqa: BLE001 - truncated, empty or not parquet
        return False


def decodes(path: Path) -> bool:
    """True when every page of ``path`` decodes (page checksums verified where the file has them): catches
    damage anywhere in the file. Cached while the file's size and mtime stay."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _decodes(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=65536)
def _decodes(path: str, mtime_ns: int, size: int) -> bool:  # noqa: ARG001 - the cache key
    try:
        pq.read_table(path, page_checksum_verification=True)
        return True
    except Exception:  # noqa: BLE001 - any decoding failure is damage
        return False


def marker_checksums(runs_file: Path) -> Optional[dict[str, str]]:
    """``{table: sha256}`` recorded in a cell's commit marker; None for a cell written before they were."""
    meta = pq.read_metadata(runs_file).metadata or {}
    raw = meta.get(CHECKSUM_KEY.encode())
    return None if raw is None else json.loads(raw.decode())


def _has_checksums(marker: Path) -> bool:
    try:
        return marker.exists() and marker_checksums(marker) is not None
    except Exception:  # noqa: BLE001 - an unreadable marker: judged by cell_damage's callers
        return False


def cell_damage(root: Path, run_id: str) -> Optional[str]:
    """Why cell ``run_id`` under ``root`` is not whole (None if it is): its commit marker is missing or does
    not decode, a table file is missing, or a file's sha256 differs from the one in the marker. Cells written
    before checksums existed are checked by decoding every file."""
    marker = root / "runs" / f"{run_id}.parquet"
    if not marker.exists():
        return "not finished (no runs file)"
    try:
        sums = marker_checksums(marker)
    except Exception:  # noqa: BLE001 - a cut or damaged footer
        return "runs file unreadable"
    if sums is not None:
        if not decodes(marker):
            return "runs file damaged"
        for t in TABLE_ORDER[:-1]:
            f = root / t / f"{run_id}.parquet"
            if t not in sums:
                continue
            if not f.exists():
                return f"{t} file missing"
            if sha256_file(f) != sums[t]:
                return f"{t} file damaged (its sha256 differs from the commit marker's)"
        return None
    for t in TABLE_ORDER:
        f = root / t / f"{run_id}.parquet"
        if not f.exists():
            if t in OPTIONAL_TABLES:
                continue
            return f"{t} file missing"
        if not decodes(f):
            return f"{t} file {'damaged' if readable(f) else 'unreadable'}"
    return None


def current_cells(sweep_dir: str | os.PathLike[str]) -> Optional[set[str]]:
    """The run ids of the sweep's current config (recorded in provenance.json by the last ``sdlib sweep``);
    None for a folder written before they were recorded (then every cell counts)."""
    p = resolve(sweep_dir) / "provenance.json"
    try:
        cells = json.loads(p.read_text()).get("cells") if p.exists() else None
    except (OSError, json.JSONDecodeError):
        return None
    return set(cells) if cells is not None else None


def read_table(sweep_dir: str | os.PathLike[str], table: str, current_only: bool = True,
               cells: Optional[set[str]] = None) -> pd.DataFrame:
    """All finished cells' rows of ``table`` in a sweep folder (empty, typed, if none).

    ``cells``: exactly these run ids (a config's cells: ``sdlib report CONFIG``). Otherwise, with
    ``current_only``, the cells of the sweep's current config (:func:`current_cells`), so results of an edited
    config never mix with the old config's. A cell whose commit marker records checksums is read only if every
    file of it matches them; any damaged or unreadable file is left out with a warning naming it, never a
    traceback.
    """
    if table not in TABLES:
        raise KeyError(f"table: {table!r} is not one of {sorted(TABLES)}")
    root = resolve(sweep_dir)
    d = root / table
    files = sorted(d.glob("*.parquet")) if d.is_dir() else []
    keep = set(cells) if cells is not None else (current_cells(root) if current_only else None)
    if keep is not None:
        files = [f for f in files if f.stem in keep]
    bad, frames = [], []
    for f in files:
        if _has_checksums(root / "runs" / f"{f.stem}.parquet"):
            ok = cell_damage(root, f.stem) is None  # every file of the cell matches its commit marker
        else:  # a cell written before checksums (or a folder laid out by hand): the file itself must read
            ok = readable(f)
        if ok:
            try:
                frames.append(pd.read_parquet(f))
                continue
            except Exception:  # noqa: BLE001 - damage in the middle of a file written before checksums
                pass
        bad.append(f)
    if bad:
        warnings.warn(f"{root.name}/{table}: {len(bad)} damaged or unreadable cell(s) left out: "
                      f"{', '.join(f.name for f in bad[:3])}{' ...' if len(bad) > 3 else ''} (sdlib status; a "
                      "rerun of the sweep redoes them)", stacklevel=2)
    if not frames:
        return empty_table(table)
    return conform(table, pd.concat(frames, ignore_index=True))


class SweepStore:
    """Reads and writes one sweep's folder."""

    def __init__(self, out_dir: str | os.PathLike[str]):
        self.dir = resolve(out_dir)
        #: what the last ``run_sweep`` on this store planned, finished and failed (run ids)
        self.outcome: dict[str, list[str]] = {"planned": [], "done": [], "failed": []}
        #: what this invocation was asked to run of the config (:func:`sdlib.run.sweep.selection_record`), or None
        #: for all of it; recorded with the invocation, so a sweep that holds a subset says why
        self.selection: Optional[dict[str, list]] = None
        #: the run ids of the config's cells this invocation selected, done or not (None: every cell of the config)
        self.selected_ids: Optional[set[str]] = None

    # cells -----------------------------------------------------------------
    def cell_files(self, run_id: str) -> list[Path]:
        """Every file of one cell: its table files and its records of :data:`CELL_JSON_DIRS`."""
        out = [self.dir / t / f"{run_id}.parquet" for t in TABLE_ORDER]
        out += [self.dir / sub / f"{run_id}.json" for sub in CELL_JSON_DIRS]
        return [f for f in out if f.exists()]

    def damage(self, run_id: str) -> Optional[str]:
        """Why a cell with a ``runs`` file is not whole, or None (:func:`cell_damage`)."""
        return cell_damage(self.dir, run_id)

    def is_done(self, run_id: str) -> bool:
        """Finished and whole: the commit marker (``runs``, written last) present and every table file matching
        the checksum it records (cells written before checksums: every file decodes). A table of
        :data:`OPTIONAL_TABLES` may be absent in those older cells."""
        return cell_damage(self.dir, run_id) is None

    def done_ids(self) -> set[str]:
        """Cells whose commit marker exists and whose files are whole (a damaged cell is not done)."""
        d = self.dir / "runs"
        return {p.stem for p in d.glob("*.parquet") if self.is_done(p.stem)} if d.is_dir() else set()

    def corrupt_ids(self) -> set[str]:
        """Cells with a ``runs`` file but a damaged, unreadable or missing table file (rerun them)."""
        d = self.dir / "runs"
        return {p.stem for p in d.glob("*.parquet") if not self.is_done(p.stem)} if d.is_dir() else set()

    def all_ids(self) -> set[str]:
        """Every cell with any file here (done, corrupt or failed)."""
        ids = set()
        for sub in (*TABLE_ORDER, *CELL_JSON_DIRS):
            d = self.dir / sub
            if d.is_dir():  # a run id may hold dots (llama-3.1-8b): strip the suffix, not at the first dot
                ids |= {p.name[: -len(p.suffix)] for p in d.iterdir()
                        if not p.name.startswith(".") and p.suffix in (".parquet", ".json")}
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
        sums = {}
        for t in TABLE_ORDER[:-1]:
            f = self.dir / t / f"{run_id}.parquet"
            write_parquet_atomic(conform(t, tables[t]), f)
            sums[t] = sha256_file(f)
        write_parquet_atomic(conform("runs", tables["runs"]), self.dir / "runs" / f"{run_id}.parquet",
                             metadata={CHECKSUM_KEY: json.dumps(sums, sort_keys=True)}, page_checksums=True)
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

    def read(self, table: str, current_only: bool = True, cells: Optional[set[str]] = None) -> pd.DataFrame:
        return read_table(self.dir, table, current_only, cells)

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

    def set_provenance_key(self, key: str, value: Any) -> None:
        """Set one top-level key of provenance.json (e.g. ``inputs``, :mod:`sdlib.run.inputs`)."""
        prov = self.read_provenance()
        prov[key] = value
        write_json_atomic(prov, self.provenance_path)

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


class SweepBusy(LeaseBusy):
    """Another process holds the results folder's lock; the message says who."""


class FolderLock:
    """An exclusive lock on a results folder: an flock on ``.sweep.lock`` (released when the holder dies), and a
    lease, ``.sweep.lease``, refreshed by a thread while the lock is held, for hosts sharing the folder over a
    network file system where flock may not reach across hosts (:mod:`sdlib.store.lease`). ``lease.lost`` says
    when another sweep has taken the folder over."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / ".sweep.lock"
        self._fh = None
        self.lease: Optional[Lease] = None

    def __enter__(self) -> "FolderLock":

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
        try:
            self.lease = Lease(self.path.parent).take().start()
        except LeaseBusy as err:
            fh.close()
            raise SweepBusy(str(err)) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {utc_now()}\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self.lease is not None:
            self.lease.release()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
