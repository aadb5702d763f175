"""Teacher-forced acceptance traces: the SpecDecode-Bench format, ours and the authors'.

A trace row is one request: its prompt and greedy output token ids, and for each
method a list ``acc_len`` where ``acc_len[p]`` = tokens gained (accepted + 1) if a
verify step started at output position ``p`` with up to k drafted tokens (k = 20 in
the authors' traces; ours record k in a provenance file); entry 0 is the prefill
step (always 1).

Usage:
    from sdlib.traces import load_reference_traces
    df = load_reference_traces()            # all four datasets, ~1,400 requests
    df = load_reference_traces(["gsm8k"])   # one dataset
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from sdlib.paths import DATA_DIR

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
#: every method our own traces carry (sdlib.ourtraces) -> JSON key; EAGLE-1 must not collide with acc_eagle
TRACE_KEYS = {**REFERENCE_METHODS, "eagle": "acc_eagle1", "draft_model": "acc_draft_model"}
REFERENCE_MAX_K = 20
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
    frames = []
    for d in names:
        stem = REFERENCE_FILES[d]
        path = directory / f"{stem}.jsonl.gz"
        if not path.exists():
            path = directory / f"{stem}.jsonl"
        frames.append(read_trace_file(path, d))
    return pd.concat(frames, ignore_index=True)


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
