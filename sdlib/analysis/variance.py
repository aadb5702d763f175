"""Acceptance-length variance: within a request, across requests, across datasets; greedy drift.

Two inputs end in one long table of verify steps (:data:`GAIN_COLUMNS`), one row per
step, ``gained`` = tokens the step produced (accepted + 1):

* the authors' teacher-forced traces (``sdlib.sim.traces``): a fixed-k chain is replayed
  along each greedy output (:func:`chain_gains`, :func:`trace_gains`);
* our sweep tables ``runs`` / ``requests`` / ``steps`` (:func:`load_sweep`,
  :func:`sweep_gains`).

Everything downstream (:func:`position_bins`, :func:`request_means`,
:func:`percentile_ranges`, :func:`cheat_sheet`) reads only that table. The greedy drift
and lossless checks (:func:`greedy_drift`, :func:`lossless_check`) read our
``runs`` + ``requests`` tables (output token ids).

Usage:
    from sdlib.sim.traces import load_reference_traces
    from sdlib.analysis import variance as V
    g = V.trace_gains(load_reference_traces(["gsm8k"]), k=3)
    V.cheat_sheet(g)                                  # mean acceptance length per method x dataset
    V.percentile_ranges(V.request_means(g))           # 5th-95th pct of per-request means
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.core.bootstrap import wilson
from sdlib.extract.ngram import TRACE_MAX_K
from sdlib.paths import resolve
from sdlib.store import read_table

#: Model that produced the authors' traces (SpecDecode-Bench simulator, commit 2fdccbd).
REFERENCE_MODEL = "Llama-3.1-8B-Instruct"
#: ``source`` value for rows that come from the authors' traces.
REFERENCE_SOURCE = "authors' traces"

#: The common long table: one row per verify step.
GAIN_COLUMNS = [
    "source",      # "authors' traces" or "sweep:<name>"
    "model",       # target model
    "dataset",     # workload
    "method",      # SD method (ngram, eagle3, ...)
    "k",           # tokens proposed per step (chain length)
    "batch_size",  # B; 1 for the teacher-forced traces (no batch enters them)
    "run_id",      # cell id; "reference" for the traces
    "request_id",  # request id inside the run
    "position",    # output tokens the request had when the step started
    "output_len",  # the request's output length, tokens
    "gained",      # tokens the step produced = accepted + 1
    "drafted",     # tokens drafted in the step; <NA> where unknown (traces)
]
#: Keys of one curve / box / cheat-sheet cell.
GROUP_KEYS = ["source", "model", "dataset", "method", "k", "batch_size"]
#: Keys of one request.
REQUEST_KEYS = GROUP_KEYS + ["run_id", "request_id"]


# ---------------------------------------------------------------------------
# Input (a): the authors' teacher-forced traces
# ---------------------------------------------------------------------------

def chain_gains(acc_len: Sequence[int], k: int, output_len: Optional[int] = None,
                authors_shift: bool = False) -> tuple[list[int], list[int]]:
    """Replay a fixed-k chain along one teacher-forced trace; return (positions, gains).

    The prefill produces output token 0, so the first verify step starts at position
    ``p = 1``. A step at ``p`` gains ``g = min(acc_len[i], k + 1, output_len - p)`` tokens
    and the next step starts at ``p + g``, until ``p >= output_len``.

    ``i = p`` by default: ``acc_len[p]`` is the gain of a step that starts with ``p``
    output tokens (checked on the InstructCoder n-gram lists: re-running an n-gram
    matcher at ``p`` reproduces ``acc_len[p]`` exactly). ``authors_shift=True`` reads
    ``i = p - 1`` as the authors' simulator does (its first decode step reads the
    prefill entry, always 1). ``output_len`` defaults to ``len(acc_len)``, the
    sequence the list was measured along (the simulator's choice too).
    """
    if not 1 <= k <= TRACE_MAX_K:
        raise ValueError(f"k={k}: the traces support 1 <= k <= {TRACE_MAX_K}")
    n = len(acc_len) if output_len is None else min(int(output_len), len(acc_len))
    shift = 1 if authors_shift else 0
    positions, gains = [], []
    p = 1
    while p < n:
        g = min(int(acc_len[p - shift]), k + 1, n - p)
        g = max(g, 1)
        positions.append(p)
        gains.append(g)
        p += g
    return positions, gains


def trace_gains(traces: pd.DataFrame, k: int = 3, authors_shift: bool = False,
                model: str = REFERENCE_MODEL, source: str = REFERENCE_SOURCE) -> pd.DataFrame:
    """Long gains table (:data:`GAIN_COLUMNS`) from teacher-forced traces, one fixed ``k``.

    ``traces`` is the long form of :func:`sdlib.sim.traces.load_reference_traces` (columns
    ``dataset, request_id, method, acc_len``). ``output_len`` = ``len(acc_len)``: the
    authors' EAGLE lists were measured along their own greedy run, which drifted from
    the stored output in part of the rows, so the list (not the stored ids) sets the length.
    """
    pos_all, gain_all, idx, lens = [], [], [], []
    for i, acc in enumerate(traces["acc_len"]):
        pos, gain = chain_gains(acc, k, authors_shift=authors_shift)
        pos_all.extend(pos)
        gain_all.extend(gain)
        idx.append(np.full(len(pos), i, dtype=np.int64))
        lens.append(len(acc))
    rows = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
    df = pd.DataFrame({
        "dataset": traces["dataset"].to_numpy()[rows],
        "method": traces["method"].to_numpy()[rows],
        "request_id": traces["request_id"].astype(str).to_numpy()[rows],
        "position": np.asarray(pos_all, dtype=np.int64),
        "output_len": np.asarray(lens, dtype=np.int64)[rows],
        "gained": np.asarray(gain_all, dtype=np.int64),
    })
    df["source"] = source
    df["model"] = model
    df["k"] = k
    df["batch_size"] = 1
    df["run_id"] = "reference"
    df["drafted"] = pd.NA
    return _typed(df)


# ---------------------------------------------------------------------------
# Input (b): our own sweep tables
# ---------------------------------------------------------------------------

def load_sweep_tables(sweep_dir: str | Path) -> dict[str, pd.DataFrame]:
    """``{"runs", "requests", "steps"}`` of one sweep; runs filtered to ``status == "ok"``."""
    out = {t: read_table(Path(sweep_dir), t) for t in ("runs", "requests", "steps")}
    runs = out["runs"]
    if "status" in runs.columns:
        out["runs"] = runs[runs["status"].astype("string") == "ok"].reset_index(drop=True)
    return out


def sweep_gains(runs: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame,
                source: str = "sweep", include_baseline: bool = False) -> pd.DataFrame:
    """Long gains table (:data:`GAIN_COLUMNS`) from our ``steps`` joined with ``runs`` and ``requests``.

    ``gained = accepted + 1``; ``k = runs.num_spec_tokens``; ``output_len =
    requests.output_tokens``. Runs without SD (``method == "none"``) are dropped unless
    ``include_baseline`` (their steps always gain 1).
    """
    if steps.empty or runs.empty:
        return _typed(pd.DataFrame(columns=GAIN_COLUMNS))
    r = runs[["run_id", "model", "dataset", "method", "num_spec_tokens", "batch_size"]].rename(
        columns={"num_spec_tokens": "k"})
    if not include_baseline:
        r = r[r["method"].astype("string") != "none"]
    q = requests[["run_id", "request_id", "output_tokens"]].rename(columns={"output_tokens": "output_len"})
    s = steps[["run_id", "request_id", "position", "drafted", "accepted"]]
    df = s.merge(r, on="run_id", how="inner").merge(q, on=["run_id", "request_id"], how="left")
    df["gained"] = df["accepted"].astype("Int64") + 1
    df["source"] = source
    return _typed(df)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """:data:`GAIN_COLUMNS` in order, with fixed dtypes."""
    out = df.reindex(columns=GAIN_COLUMNS).copy()
    for c in ("source", "model", "dataset", "method", "run_id", "request_id"):
        out[c] = out[c].astype("string")
    for c in ("k", "batch_size", "position", "output_len", "gained", "drafted"):
        out[c] = out[c].astype("Int64")
    return out.reset_index(drop=True)


# ---------------------------------------------------------------------------
# Within a request: acceptance along the output
# ---------------------------------------------------------------------------

def _request_ratio(g: pd.DataFrame, keys: list[str], n_boot: int) -> pd.DataFrame:
    """Per ``keys`` group: a bootstrap interval (over requests, drawn within each run) of the mean of
    ``gained`` over the group's steps (``value_lo``, ``value_hi``;
    :func:`sdlib.analysis.intervals.ratio_by_request`)."""
    # deferred: sdlib.analysis.intervals loads pandas, and only this path needs it
    from sdlib.analysis.intervals import ratio_by_request

    per = g.assign(_g=g["gained"].astype("float64"), _n=1.0).groupby(
        keys + ["run_id", "request_id"], dropna=False, observed=True)[["_g", "_n"]].sum().reset_index()
    ci = ratio_by_request(per, keys, "_g", "_n", strata="run_id", n_boot=n_boot)
    return ci.drop(columns=["value", "n_requests"])


def position_bins(gains: pd.DataFrame, n_bins: int = 10, split_at: Optional[float] = None,
                  n_boot: int = 0) -> pd.DataFrame:
    """Mean tokens gained per step in ``n_bins`` bins of relative position, short vs long outputs.

    Relative position = ``position / output_len`` (in [0, 1)), bin ``b = floor(n_bins *
    rel)``. A request is ``long`` when ``output_len > split_at``; ``split_at=None`` splits
    each (source, model, dataset, method, k, batch_size) group at the median output
    length of its requests. ``mean_gained`` pools the steps in a bin (a mean over steps);
    ``n_boot`` > 0 adds ``mean_gained_lo``/``mean_gained_hi``, a 95% bootstrap interval over requests.
    """
    g = gains.dropna(subset=["position", "output_len"])
    g = g[g["output_len"] > 0].copy()
    # integer arithmetic: floor(n_bins * position / output_len) without float rounding
    b = (g["position"].astype("int64") * n_bins) // g["output_len"].astype("int64")
    g["bin"] = b.clip(0, n_bins - 1).astype("int64")
    if split_at is None:
        per_req = g.drop_duplicates(REQUEST_KEYS)[REQUEST_KEYS + ["output_len"]]
        med = per_req.groupby(GROUP_KEYS, dropna=False)["output_len"].median().rename("split_at")
        g = g.merge(med.reset_index(), on=GROUP_KEYS, how="left")
    else:
        g["split_at"] = float(split_at)
    g["length_class"] = np.where(g["output_len"].astype("float64") > g["split_at"], "long", "short")
    g["_request"] = g["run_id"] + "/" + g["request_id"]
    keys = GROUP_KEYS + ["length_class", "bin"]
    out = g.groupby(keys, dropna=False).agg(
        mean_gained=("gained", "mean"),
        n_steps=("gained", "size"),
        n_requests=("_request", "nunique"),
        split_at=("split_at", "first"),
    ).reset_index()
    if n_boot:
        out = out.merge(_request_ratio(g, keys, n_boot).rename(
            columns={"value_lo": "mean_gained_lo", "value_hi": "mean_gained_hi"}), on=keys, how="left")
    out["bin_lo"] = out["bin"] / n_bins
    out["bin_hi"] = (out["bin"] + 1) / n_bins
    out["bin_mid"] = (out["bin"] + 0.5) / n_bins
    return out


# ---------------------------------------------------------------------------
# Across requests
# ---------------------------------------------------------------------------

def request_means(gains: pd.DataFrame) -> pd.DataFrame:
    """Per-request mean acceptance length = mean of ``gained`` over the request's steps."""
    out = gains.groupby(REQUEST_KEYS, dropna=False).agg(
        mean_acc_len=("gained", "mean"),
        n_steps=("gained", "size"),
        output_len=("output_len", "first"),
    ).reset_index()
    out["mean_acc_len"] = out["mean_acc_len"].astype("float64")
    return out


def percentile_ranges(req_means: pd.DataFrame, lo: float = 5, hi: float = 95,
                      value: str = "mean_acc_len") -> pd.DataFrame:
    """Per group: requests, mean, median and the ``lo``-``hi`` percentiles of ``value``.

    Percentiles use numpy's default (linear) interpolation, the same as seaborn's
    ``boxplot(whis=(lo, hi))`` whiskers.
    """
    def agg(x: pd.Series) -> pd.Series:
        v = x.to_numpy(dtype="float64")
        return pd.Series({
            "n_requests": len(v), "mean": v.mean(), "median": np.median(v),
            f"p{lo:g}": np.percentile(v, lo), f"p{hi:g}": np.percentile(v, hi),
        })
    out = req_means.groupby(GROUP_KEYS, dropna=False)[value].apply(agg).unstack().reset_index()
    out["n_requests"] = out["n_requests"].astype("int64")
    return out


# ---------------------------------------------------------------------------
# Across datasets: the cheat sheet
# ---------------------------------------------------------------------------

def cheat_sheet(gains: pd.DataFrame, n_boot: int = 0) -> pd.DataFrame:
    """Mean acceptance length per (source, model, dataset, method, k, batch_size).

    ``mean_acc_len`` = mean of ``gained`` over all verify steps = 1 + accepted / steps:
    the paper's ``1 + accepted / drafts`` when every step drafts (the traces' fixed-k
    chain). Where ``drafted`` is known (our sweeps), ``mean_acc_len_drafts`` = 1 +
    accepted / (steps with ``drafted > 0``), which is vLLM's counter definition (an
    n-gram step with no match is not a draft); <NA> otherwise. ``n_boot`` > 0 adds
    ``mean_acc_len_lo``/``mean_acc_len_hi``: a 95% bootstrap interval over requests (within each run).
    """
    g = gains.copy()
    g["accepted"] = g["gained"] - 1
    g["is_draft"] = (g["drafted"] > 0).astype("boolean")
    g["acc_if_draft"] = g["accepted"].where(g["is_draft"].fillna(False), 0)

    def one(x: pd.DataFrame) -> pd.Series:
        known = x["drafted"].notna().all()
        n_drafts = int(x["is_draft"].fillna(False).sum())
        return pd.Series({
            "mean_acc_len": float(x["gained"].astype("float64").mean()),
            "mean_acc_len_drafts": (1 + float(x["acc_if_draft"].sum()) / n_drafts) if known and n_drafts else np.nan,
            "n_steps": len(x),
            "n_requests": x[["run_id", "request_id"]].drop_duplicates().shape[0],
        })
    out = g.groupby(GROUP_KEYS, dropna=False)[["gained", "drafted", "is_draft", "acc_if_draft",
                                               "run_id", "request_id"]].apply(one).reset_index()
    out["n_steps"] = out["n_steps"].astype("int64")
    out["n_requests"] = out["n_requests"].astype("int64")
    if n_boot:
        out = out.merge(_request_ratio(g, GROUP_KEYS, n_boot).rename(
            columns={"value_lo": "mean_acc_len_lo", "value_hi": "mean_acc_len_hi"}), on=GROUP_KEYS, how="left")
    return out


def counter_acceptance(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run, the paper's definition from vLLM's counters: 1 + accepted tokens / drafts."""
    cols = ["run_id", "model", "dataset", "method", "num_spec_tokens", "batch_size",
            "counter_num_drafts", "counter_num_accepted_tokens"]
    r = runs[[c for c in cols if c in runs.columns]].copy()
    drafts = r["counter_num_drafts"].astype("Float64")
    r["mean_acc_len_counters"] = 1 + r["counter_num_accepted_tokens"].astype("Float64") / drafts.where(drafts > 0)
    return r


# ---------------------------------------------------------------------------
# Greedy drift and the lossless check (our tables only)
# ---------------------------------------------------------------------------

def _requests_with_runs(runs: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Requests joined with their run's keys; ``ids`` = parsed output token ids (tuple)."""
    keys = ["run_id", "model", "dataset", "method", "num_spec_tokens", "batch_size"]
    keys += [c for c in ("batch_mode", "method_label", "repeat") if c in runs.columns]
    df = requests.merge(runs[keys], on="run_id", how="inner")
    df["ids"] = [tuple(json.loads(s)) if isinstance(s, str) else tuple(s) for s in df["output_token_ids"]]
    df["method"] = df["method"].astype("string")
    if "method_label" not in df.columns:
        df["method_label"] = df["method"]
    sort = [c for c in ("repeat", "run_id") if c in df.columns]
    return df.sort_values(sort + ["request_id"], kind="stable").reset_index(drop=True)


def _match_keys(df: pd.DataFrame) -> list[str]:
    return ["model", "dataset"] + (["batch_mode"] if "batch_mode" in df.columns else [])


def greedy_drift(runs: pd.DataFrame, requests: pd.DataFrame,
                 ref_batch_size: Optional[int] = None, n_boot: int = 2000) -> pd.DataFrame:
    """No-SD runs: mean output length per batch size, and how many outputs differ from the reference batch size.

    A request at batch size B is compared, token for token, with the first request of
    the same (model, dataset[, batch_mode], prompt_index) at ``ref_batch_size`` (default:
    the smallest batch size present, normally 1). Request ids differ between runs, so
    matching is on ``prompt_index``. ``frac_differ`` = differing / compared, with its Wilson interval
    (``frac_differ_lo/hi``); ``mean_output_tokens_lo/hi``: a bootstrap interval over requests.
    """
    # deferred: sdlib.analysis.intervals loads pandas, and only this path needs it
    from sdlib.analysis.intervals import ratio_by_request

    df = _requests_with_runs(runs, requests)
    df = df[df["method"] == "none"]
    cols = _match_keys(df) + ["batch_size", "n_requests", "mean_output_tokens", "n_compared", "frac_differ"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    mk = _match_keys(df)
    parts = []
    for key, grp in df.groupby(mk, dropna=False):
        ref_bs = grp["batch_size"].min() if ref_batch_size is None else ref_batch_size
        ref = grp[grp["batch_size"] == ref_bs].drop_duplicates("prompt_index")[["prompt_index", "ids"]]
        ref = ref.rename(columns={"ids": "ref_ids"})
        m = grp.merge(ref, on="prompt_index", how="left")
        has = m["ref_ids"].notna()
        m["differs"] = [a != b if h else np.nan for a, b, h in zip(m["ids"], m["ref_ids"], has)]
        m["has_ref"] = has
        agg = _share_of_requests(m, ["batch_size"], "differs", "has_ref", "differ",
                                 mean_output_tokens=("output_tokens", "mean"))
        ci = ratio_by_request(m.assign(_one=1.0, _out=m["output_tokens"].astype("float64")), ["batch_size"],
                              "_out", "_one", strata="run_id", n_boot=n_boot)
        agg = agg.merge(ci.rename(columns={"value_lo": "mean_output_tokens_lo", "value_hi": "mean_output_tokens_hi"})
                        [["batch_size", "mean_output_tokens_lo", "mean_output_tokens_hi"]], on="batch_size", how="left")
        agg["ref_batch_size"] = ref_bs
        for c, v in zip(mk, key if isinstance(key, tuple) else (key,)):
            agg[c] = v
        parts.append(agg)
    out = pd.concat(parts, ignore_index=True)
    out["mean_output_tokens"] = out["mean_output_tokens"].astype("float64")
    return out[cols[:-2] + ["mean_output_tokens_lo", "mean_output_tokens_hi", "n_compared", "n_differ", "frac_differ",
                            "frac_differ_lo", "frac_differ_hi", "ref_batch_size"]]


def lossless_check(runs: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """SD runs: fraction of requests whose output equals the no-SD output at the same batch size.

    Each SD request is matched with the first no-SD request of the same (model, dataset
    [, batch_mode], batch_size, prompt_index). Greedy SD is lossless in exact arithmetic;
    differences come from batch-shape-dependent kernels, as in greedy drift. ``frac_identical_lo/hi``:
    its Wilson interval.
    """
    df = _requests_with_runs(runs, requests)
    mk = _match_keys(df) + ["batch_size"]
    cols = mk + ["method", "method_label", "n_requests", "n_compared", "n_identical", "frac_identical"]
    base = df[df["method"] == "none"].drop_duplicates(mk + ["prompt_index"])[mk + ["prompt_index", "ids"]]
    sd = df[df["method"] != "none"]
    if sd.empty:
        return pd.DataFrame(columns=cols)
    m = sd.merge(base.rename(columns={"ids": "base_ids"}), on=mk + ["prompt_index"], how="left")
    m["has_base"] = m["base_ids"].notna()
    m["identical"] = [float(a == b) if h else np.nan for a, b, h in zip(m["ids"], m["base_ids"], m["has_base"])]
    out = _share_of_requests(m, mk + ["method", "method_label"], "identical", "has_base", "identical", dropna=False)
    return out[cols + ["frac_identical_lo", "frac_identical_hi"]]


def _share_of_requests(m: pd.DataFrame, by: list[str], flag: str, has: str, name: str, dropna: bool = True,
                       **extra) -> pd.DataFrame:
    """Per ``by`` group of requests ``m``: ``n_requests``, ``n_compared`` (requests where ``has``),
    ``n_<name>`` (where ``flag``, 1.0 / 0.0 / NaN), ``frac_<name>`` and its Wilson interval (``_lo``, ``_hi``);
    ``extra``: more named aggregations."""

    out = m.groupby(by, dropna=dropna).agg(
        n_requests=("request_id", "size"), **extra, n_compared=(has, "sum"),
        **{f"n_{name}": (flag, lambda s: float(np.nansum(s.astype("float64"))))}).reset_index()
    out[f"frac_{name}"] = out[f"n_{name}"] / out["n_compared"].where(out["n_compared"] > 0)
    out[f"frac_{name}_lo"], out[f"frac_{name}_hi"] = wilson(out[f"n_{name}"], out["n_compared"])
    return out


def existing_dirs(dirs: Iterable[str | Path], tables: Sequence[str] = ("steps", "runs")) -> list[Path]:
    """The sweep folders holding any of ``tables`` (resolved against the repo root); prints a note for each other."""
    out = []
    for d in dirs:
        p = resolve(d)
        if any((p / t).is_dir() for t in tables):
            out.append(p)
        else:
            print(f"note: no sweep tables in {p} (skipped)")
    return out
