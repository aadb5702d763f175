"""Atomic writes: a file is either absent or whole (temporary file in the same folder, then rename).

Files are readable by others (mode 0644), as any file a user writes by hand.

Usage:
    from sdlib.store.files import write_json_atomic, write_parquet_atomic
    write_json_atomic({"a": 1}, Path("out/provenance.json"))
"""

from __future__ import annotations

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


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` to ``path`` via a temporary file and rename (no half-written files)."""
    _atomic_write_bytes(path, lambda tmp: df.to_parquet(tmp, index=False, compression="zstd"))


def write_json_atomic(obj: Any, path: Path) -> None:
    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")

    _atomic_write_bytes(path, w)
