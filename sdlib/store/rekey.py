"""Re-identify a sweep's finished cells under the current run-id scheme, keeping every row.

A cell's run id hashes everything that defines its result. When sdlib adds to that (e.g. the engine's
settings and seed), cells measured before keep their old ids and would look stale. ``sdlib rekey`` renames
them to the ids the current config gives the same cells (matched by model, method label, dataset, batch size,
repeat and batch mode), rewriting the ``run_id`` column in every table, the failure records and replay checks
-- only when the config the cells were measured under (provenance.json) equals the current one.

Usage:
    n = rekey(store, {old_run_id: new_run_id, ...})
"""

from __future__ import annotations

import json
import os

import pandas as pd

from sdlib.store.files import write_json_atomic, write_parquet_atomic
from sdlib.store.schema import conform
from sdlib.store.sweep_store import CELL_JSON_DIRS, TABLE_ORDER, SweepStore


def cell_coordinates(store: SweepStore) -> dict[str, tuple]:
    """run id -> (model, method label, dataset, batch size, repeat, batch mode) of every finished cell here."""
    runs = store.read("runs", current_only=False)
    return {r.run_id: (r.model, r.method_label, r.dataset, int(r.batch_size), int(r.repeat), r.batch_mode)
            for r in runs.itertuples()}


def rekey(store: SweepStore, mapping: dict[str, str]) -> int:
    """Rename cells ``old -> new`` (files and ``run_id`` values); returns the number of cells renamed."""
    n = 0
    for old, new in mapping.items():
        if old == new:
            continue
        for table in TABLE_ORDER:
            src = store.dir / table / f"{old}.parquet"
            if not src.exists():
                continue
            df = pd.read_parquet(src)
            df["run_id"] = new
            write_parquet_atomic(conform(table, df), store.dir / table / f"{new}.parquet")
        for sub in CELL_JSON_DIRS:
            src = store.dir / sub / f"{old}.json"
            if src.exists():
                obj = json.loads(src.read_text())
                if isinstance(obj, dict) and obj.get("run_id") == old:
                    obj["run_id"] = new
                write_json_atomic(obj, store.dir / sub / f"{new}.json")
        for table in TABLE_ORDER:  # the old files go once every new one is written
            f = store.dir / table / f"{old}.parquet"
            if f.exists():
                os.unlink(f)
        for sub in CELL_JSON_DIRS:
            f = store.dir / sub / f"{old}.json"
            if f.exists():
                os.unlink(f)
        n += 1
    return n
