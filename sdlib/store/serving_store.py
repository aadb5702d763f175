"""A serving sweep's folder: the same atomic writes, resume, failure records and provenance as a sweep's
(:class:`sdlib.store.SweepStore`), with the serving tables (sdlib/store/schema.py, ``serve_*``).

Layout of ``<results_dir>/<name>/`` (default ``data/serving/<name>/``)::

    serve_requests/<run_id>__s<i>.parquet   per request of server i's share of the cell
    serve_chunks/<run_id>__s<i>.parquet     per token-bearing stream message
    serve_counters/<run_id>__s<i>.parquet   /metrics deltas of server i; written last: the share is done
    serve_runs/<run_id>.parquet             the cell's summary; written when every share is done (cell done)
    failures/<run_id>.json                  a cell that failed (removed when it later succeeds)
    provenance.json                         config + one entry per invocation (servers: vLLM version, device,
                                            command line, start-up time; client; git commit)
    logs/                                   one log per server (not committed)

Usage:
    from sdlib.store.serving_store import ServingStore
    store = ServingStore("data/serving/embedded_serving")
    runs = store.read("serve_runs")
"""

from __future__ import annotations

import pandas as pd

from sdlib.store.files import write_parquet_atomic
from sdlib.store.schema import conform
from sdlib.store.sweep_store import SweepStore, empty_table

#: Tables written per server share, in order (counters last: marks the share done).
SHARE_TABLES = ("serve_requests", "serve_chunks", "serve_counters")
RUNS = "serve_runs"


def share_name(run_id: str, server: int) -> str:
    return f"{run_id}__s{server}"


class ServingStore(SweepStore):
    """Reads and writes one serving sweep's folder."""

    def is_done(self, run_id: str) -> bool:
        return (self.dir / RUNS / f"{run_id}.parquet").exists()

    def done_ids(self) -> set[str]:
        d = self.dir / RUNS
        return {p.stem for p in d.glob("*.parquet")} if d.is_dir() else set()

    def share_done(self, run_id: str, server: int) -> bool:
        return (self.dir / "serve_counters" / f"{share_name(run_id, server)}.parquet").exists()

    def write_share(self, run_id: str, server: int, tables: dict[str, pd.DataFrame]) -> None:
        """Write one server's share of a cell (requests, chunks, then counters), each atomically."""
        for t in SHARE_TABLES:
            write_parquet_atomic(conform(t, tables[t]), self.dir / t / f"{share_name(run_id, server)}.parquet")

    def read_shares(self, run_id: str) -> dict[str, pd.DataFrame]:
        """Every share of one cell, concatenated per table."""
        out = {}
        for t in SHARE_TABLES:
            files = sorted((self.dir / t).glob(f"{run_id}__s*.parquet"))
            out[t] = (conform(t, pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)) if files
                      else empty_table(t))
        return out

    def write_cell(self, run_id: str, tables: dict[str, pd.DataFrame]) -> None:
        """Write the cell's summary row (``serve_runs``): marks the cell done; clears an old failure."""
        write_parquet_atomic(conform(RUNS, tables[RUNS]), self.dir / RUNS / f"{run_id}.parquet")
        f = self.dir / "failures" / f"{run_id}.json"
        if f.exists():
            f.unlink()
