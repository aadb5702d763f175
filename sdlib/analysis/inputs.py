"""A notebook's inputs, checked: every requested sweep folder or trace glob must exist.

A notebook asked to read a folder that is not there stops with an error naming it, instead of
drawing something else (the default sweeps) and exiting 0.

Usage:
    from sdlib.analysis.inputs import sweep_dirs, matching_files
    dirs = sweep_dirs(["data/sweeps/embedded_default"])          # [Path(...)] or FileNotFoundError
    files = matching_files(["data/traces/embedded_*.jsonl.gz"])  # sorted paths or FileNotFoundError
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Iterable, Sequence

from sdlib.paths import resolve


def as_list(value) -> list:
    """A notebook parameter that may be one item or a list (None: empty)."""
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [value]
    return list(value)


def sweep_dirs(dirs: Iterable[str | os.PathLike[str]] | str | None, tables: Sequence[str] = ("runs",)) -> list[Path]:
    """The requested sweep folders, resolved against the repo root, each once, in order.

    Raises FileNotFoundError naming the first folder that does not exist or holds none of
    ``tables`` (a typo or a sweep that never ran must not fall back to other data).
    """
    out: list[Path] = []
    for d in as_list(dirs):
        p = resolve(d)
        if not p.is_dir():
            raise FileNotFoundError(f"sweep folder {p} does not exist (requested as {str(d)!r})")
        if not any((p / t).is_dir() and any((p / t).glob("*.parquet")) for t in tables):
            raise FileNotFoundError(f"sweep folder {p} has no {' or '.join(tables)} table (requested as {str(d)!r})")
        if p not in out:
            out.append(p)
    return out


def matching_files(patterns: Iterable[str] | str | None) -> list[Path]:
    """Files matching repo-relative globs, sorted, each once; FileNotFoundError naming a pattern that
    matches nothing. An empty list of patterns asks for nothing and returns nothing."""
    out: set[Path] = set()
    for pat in as_list(patterns):
        hits = glob.glob(str(resolve(pat)))
        if not hits:
            raise FileNotFoundError(f"no file matches {str(pat)!r} (resolved: {resolve(pat)})")
        out.update(Path(h) for h in hits)
    return sorted(out)
