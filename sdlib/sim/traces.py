"""Teacher-forced acceptance traces: the SpecDecode-Bench format, ours and the authors'.

A trace row is one request: its prompt and greedy output token ids, and for each
method a list ``acc_len`` where ``acc_len[p]`` = tokens gained (accepted + 1) if a
verify step started at output position ``p`` with up to k drafted tokens (k = 20 in
the authors' traces; ours record k in a provenance file); entry 0 is the prefill
step (always 1).

Our own traces (written by ``sdlib traces``, :mod:`sdlib.run.traces`) are files of the
same format with a provenance JSON beside each (:func:`write_traces`, :func:`load_our_traces`).

Usage:
    from sdlib.sim.traces import load_reference_traces, load_our_traces
    df = load_reference_traces()            # all four datasets, ~1,400 requests
    df = load_reference_traces(["gsm8k"])   # one dataset
    ours = load_our_traces("data/traces/embedded_*.jsonl.gz")
    df, k = load_traces("reference")        # or trace files of either format (globs): (traces, their k)
"""

from __future__ import annotations

import glob
import gzip
import json
import platform
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.extract.ngram import TRACE_MAX_K
from sdlib.paths import DATA_DIR, repo_relative, resolve
from sdlib.store import git_commit, utc_now
from sdlib.store.provenance import device_name

REFERENCE_DIR: Path = DATA_DIR / "reference" / "specdecode-bench-llama3.1-8b"
#: dataset name in our tables -> file stem in the authors' repository
REFERENCE_FILES = {
    "cnn_dailymail": "combined_cnn",
    "gsm8k": "combined_gsm8k",
    "instructcoder": "combined_instructcoder",
    "sharegpt": "combined_sharegpt",
}
#: method name in our tables -> key in the authors' JSON
REFERENCE_METHODS = {"ngram": "acc_ngram", "eagle3": "acc_eagle"}
#: every method our own traces carry (sdlib.run.traces) -> JSON key; EAGLE-1 must not collide with acc_eagle
TRACE_KEYS = {**REFERENCE_METHODS, "eagle": "acc_eagle1", "draft_model": "acc_draft_model"}
TRACE_COLUMNS = ["dataset", "request_id", "prompt_token_ids", "output_token_ids", "method", "acc_len"]


def _open(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def read_trace_file(path: str | Path, dataset: str, methods: Optional[dict[str, str]] = None) -> pd.DataFrame:
    """Read one SpecDecode-Bench JSONL (plain or .gz) into long form.

    Returns one row per (request, method) with columns :data:`TRACE_COLUMNS`;
    ``acc_len`` is a list of ints.
    """
    methods = methods or REFERENCE_METHODS
    rows = []
    with _open(Path(path)) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            for method, key in methods.items():
                if key not in r:
                    continue
                rows.append({
                    "dataset": dataset,
                    "request_id": str(r["id"]),
                    "prompt_token_ids": list(r["prompt_token_ids"]),
                    "output_token_ids": list(r["generated_token_ids"]),
                    "method": method,
                    "acc_len": [int(x) for x in r[key]["acc_len"]],
                })
    return pd.DataFrame(rows, columns=TRACE_COLUMNS)


def load_reference_traces(datasets: Optional[Iterable[str]] = None,
                          directory: Path = REFERENCE_DIR) -> pd.DataFrame:
    """The authors' Llama-3.1-8B/H100 traces (commit 2fdccbd), long form, one row per (request, method)."""
    names = list(datasets) if datasets is not None else list(REFERENCE_FILES)
    bad = [d for d in names if d not in REFERENCE_FILES]
    if bad:
        raise ValueError(f"datasets: {bad} not among the reference traces {sorted(REFERENCE_FILES)}")
    frames = [read_trace_file(reference_path(d, directory), d) for d in names]
    return pd.concat(frames, ignore_index=True)


def reference_path(dataset: str, directory: Path = REFERENCE_DIR) -> Path:
    """The authors' trace file of ``dataset`` (one of :data:`REFERENCE_FILES`): ``.jsonl.gz``, else ``.jsonl``."""
    stem = REFERENCE_FILES[dataset]
    path = directory / f"{stem}.jsonl.gz"
    return path if path.exists() else directory / f"{stem}.jsonl"


def write_trace_file(df: pd.DataFrame, path: str | Path) -> Path:
    """Write long-form traces back in the authors' JSONL format (``acc_<method>`` keys; eagle3 -> acc_eagle)."""
    inv = dict(TRACE_KEYS)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        for rid, g in df.groupby("request_id", sort=False):
            first = g.iloc[0]
            obj = {"id": rid, "prompt_token_ids": list(map(int, first.prompt_token_ids)),
                   "generated_token_ids": list(map(int, first.output_token_ids))}
            for _, r in g.iterrows():
                obj[inv.get(r.method, f"acc_{r.method}")] = {"acc_len": list(map(int, r.acc_len))}
            f.write(json.dumps(obj) + "\n")
    return path


def mean_acc_len(traces: pd.DataFrame) -> pd.Series:
    """Mean ``acc_len`` per method over decode positions (entry 0, the prefill, left out)."""
    def one(lists) -> float:
        vals = np.concatenate([np.asarray(a[1:], float) for a in lists] + [np.zeros(0)])
        return float(vals.mean()) if vals.size else float("nan")

    return traces.groupby("method", sort=False)["acc_len"].apply(one)


def provenance_path(path: Path) -> Path:
    """``<name>.provenance.json`` beside a trace file ``<name>.jsonl[.gz]``."""
    name = path.name
    for suf in (".jsonl.gz", ".jsonl", ".gz"):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    return path.with_name(name + ".provenance.json")


def write_traces(traces: pd.DataFrame, path: str | Path, info: Optional[dict] = None) -> Path:
    """Write long-form traces in the authors' JSONL (keys :data:`TRACE_KEYS`) and a provenance JSON beside it.

    :func:`sdlib.sim.traces.write_trace_file` names unknown methods ``acc_<method>``,
    so EAGLE-1 rows are renamed ``eagle1`` first (``acc_eagle`` is EAGLE-3's key).
    """
    path = resolve(path)
    rename = {m: key[len("acc_"):] for m, key in TRACE_KEYS.items() if m not in ("ngram", "eagle3")}
    out = traces.assign(method=traces["method"].map(lambda m: rename.get(m, m)))
    write_trace_file(out, path)
    prov = {"written_at": utc_now(), "git_commit": git_commit(), "python": platform.python_version(),
            "keys": {m: TRACE_KEYS[m] for m in traces["method"].unique() if m in TRACE_KEYS},
            "cap": "acc_len[p] <= min(k + 1, len(output) - p); acc_len[0] = 1",
            "mismatch_positions": {f"{r.method}/{r.request_id}": list(r.mismatch_positions)
                                   for r in traces.itertuples() if "mismatch_positions" in traces.columns
                                   and len(r.mismatch_positions)},
            **(info or {})}
    prov.setdefault("device", device_name())
    provenance_path(path).write_text(json.dumps(prov, indent=2, default=str) + "\n")
    return path


def read_traces(path: str | Path, dataset: str) -> pd.DataFrame:
    """Read a file written by :func:`write_traces` back into long form (methods named as in our tables)."""
    return read_trace_file(resolve(path), dataset, methods=TRACE_KEYS)


def load_our_traces(patterns: str | Sequence[str]) -> pd.DataFrame:
    """Every trace file matching ``patterns`` (repo-relative globs of :func:`write_traces` output), long form.

    The dataset and ``k`` of each file come from the provenance JSON beside it. Columns:
    :data:`sdlib.sim.traces.TRACE_COLUMNS` + ``k`` + ``file`` (repo-relative). Empty (same columns) when
    nothing matches.
    """
    pats = [patterns] if isinstance(patterns, str) else list(patterns)
    files = sorted({Path(f) for pat in pats for f in glob.glob(str(resolve(pat)))})
    frames = []
    for f in files:
        prov_path = provenance_path(f)
        if not prov_path.exists():
            raise FileNotFoundError(f"{f}: no provenance file {prov_path.name} beside it (written by write_traces)")
        prov = json.loads(prov_path.read_text())
        frames.append(read_traces(f, prov["dataset"]).assign(k=int(prov["k"]), file=repo_relative(f)))
    if not frames:
        return pd.DataFrame(columns=[*TRACE_COLUMNS, "k", "file"])
    return pd.concat(frames, ignore_index=True)


class TraceError(ValueError):
    """Trace files that are not there or lack a method (``sdlib simulate`` prints it as a ``--traces`` error)."""


def load_traces(spec: str) -> tuple[pd.DataFrame, int]:
    """(long-form traces, k): ``reference`` (the authors' four datasets), or trace files (comma-separated
    globs, taken from where the caller stands): ours with the provenance beside each (dataset and k from it),
    any other in the authors' format (dataset from the file name). ``k`` = the smallest over the files. Raises
    :class:`TraceError` when nothing matches or the files lack n-gram or EAGLE-3 acceptance lists."""

    if spec == "reference":
        return load_reference_traces(), TRACE_MAX_K
    files = sorted({f for pat in spec.split(",") for f in glob.glob(pat)})
    if not files:
        raise TraceError(f"no file matches {spec!r}")
    stems = {v: k for k, v in REFERENCE_FILES.items()}
    frames, ks = [], []
    for f in files:
        p = Path(f)
        prov = provenance_path(p)
        if prov.exists():
            info = json.loads(prov.read_text())
            frames.append(read_traces(p.resolve(), info["dataset"]))
            ks.append(int(info.get("k", TRACE_MAX_K)))
        else:
            stem = p.name.split(".")[0]
            frames.append(read_trace_file(p, stems.get(stem, stem)))
            ks.append(TRACE_MAX_K)
    df = pd.concat(frames, ignore_index=True)
    missing = {"ngram", "eagle3"} - set(df["method"])
    if missing:
        raise TraceError(f"{spec!r} has no {sorted(missing)} acceptance lists (acc_ngram, acc_eagle)")
    return df, min(ks)
