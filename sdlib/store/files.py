"""Atomic writes: a file is either absent or whole (temporary file in the same folder, then rename).

Files are readable by others (mode 0644), as any file a user writes by hand.

Usage:
    from sdlib.store.files import write_json_atomic, write_parquet_atomic
    write_json_atomic({"a": 1}, Path("out/provenance.json"))
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write_bytes(path: Path, writer) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a result file is for everyone to read
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_parquet_atomic(df: pd.DataFrame, path: Path, metadata: "dict[str, str] | None" = None,
                         page_checksums: bool = False) -> None:
    """Write ``df`` to ``path`` via a temporary file and rename (no half-written files). ``metadata``: extra
    key-value pairs in the file's footer (a cell's commit marker carries its tables' checksums there);
    ``page_checksums``: a CRC on every data page, so a reader finds damage anywhere in the file."""
    if metadata is None and not page_checksums:
        _atomic_write_bytes(path, lambda tmp: df.to_parquet(tmp, index=False, compression="zstd"))
        return
    # deferred: pyarrow is slow to import, and only this path needs it
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               **{k.encode(): v.encode() for k, v in metadata.items()}})
    _atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp, compression="zstd",
                                                         write_page_checksum=page_checksums))


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes (hex), cached while its size and mtime stay."""
    st = os.stat(path)
    return _sha256(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=65536)
def _sha256(path: str, mtime_ns: int, size: int) -> str:  # noqa: ARG001 - the cache key
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomic(obj: Any, path: Path) -> None:
    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")

    _atomic_write_bytes(path, w)
