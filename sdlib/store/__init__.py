"""Store: the one schema, atomic writes, a sweep's folder of tables, provenance.

Usage:
    from sdlib.store import SweepStore, read_table
    runs = SweepStore("data/sweeps/embedded_default").read("runs")
"""

from sdlib.store.files import write_json_atomic, write_parquet_atomic
from sdlib.store.provenance import git_commit, utc_now
from sdlib.store.sweep_store import FolderLock, SweepBusy, SweepStore, current_cells, empty_table, read_table

__all__ = ["SweepStore", "FolderLock", "SweepBusy", "current_cells", "read_table", "empty_table", "write_json_atomic", "write_parquet_atomic", "git_commit",
           "utc_now"]
