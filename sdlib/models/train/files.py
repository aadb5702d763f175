"""Small file helpers of the trainer: atomic JSON, reproducible gzipped ``.npy``, hashes, UTC stamps.

Usage:
    from sdlib.models.train.files import load_npy_gz
    tokens = load_npy_gz(Path(".train") / "train_tokens.npy.gz")   # uint16 token ids
"""

from __future__ import annotations

import gzip
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (tmp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_gz(path: Path, data: bytes) -> None:
    """gzip with mtime 0 and no file name, so equal data give equal bytes."""
    with open(path, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(data)


def save_npy_gz(path: Path, arr) -> None:
    """``.npy`` inside gzip (see :func:`write_gz`)."""

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    write_gz(path, buf.getvalue())


def load_npy_gz(path: Path):
    """The array :func:`save_npy_gz` wrote."""

    with gzip.open(path, "rb") as gz:
        return np.load(io.BytesIO(gz.read()), allow_pickle=False)


def utc_now() -> str:
    """``YYYY-MM-DDTHH:MM:SSZ``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
