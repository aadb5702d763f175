"""Measured results of a trace-replay sweep: throughput per batch, speedups paired by prompt with bootstrap
intervals, the calibration against synthetic acceptance, and what an engine step costs on each path.

A replay sweep runs in the paper's batch mode: each prompt is one batch of B copies, and every policy runs
the same prompts, so a speedup pairs each policy's batch with the no-SD batch of the same prompt. The
interval resamples prompts (paired) with replacement (:mod:`sdlib.core.bootstrap`, seeded per cell).

Usage:
    from sdlib.analysis.replay import method_info, batch_throughput, paired_speedups
    info = method_info(store.read_provenance())
    sp = paired_speedups(batch_throughput(store.read("runs"), store.read("requests")), info)
"""

from __future__ import annotations

import json

from typing import Any

import numpy as np
import pandas as pd

from sdlib.config import parse_sweep
from sdlib.core import bootstrap
from sdlib.core.registry import engine_label, method_spec, replay_ref
from sdlib.sim.bounds import bounds_stack
from sdlib.sim.oracle import authors_names
from sdlib.sim.prepared import prepare_traces, truncate_traces
from sdlib.sim.replay_costs import trace_cells
from sdlib.workloads import load_prompts, load_trace_table

#: the no-SD method label every speedup is relative to
BASELINE = "none"


def method_info(provenance: dict[str, Any]) -> pd.DataFrame:
    """One row per method label of the sweep's config: ``method_label, method, K, replay, engine, synthetic_L,
    aa_of`` (``engine`` = the engine path and K that ran it, e.g. ``eagle3-k3``; ``aa_of``: the arm an A/A twin
    copies). The provenance's config is the sweep's validated config written out whole, so every SD method
    carries its ``num_spec_tokens``."""
    rows = []
    for m in provenance.get("config", {}).get("methods", []):
        k = int(m["num_spec_tokens"]) if method_spec(m["name"]).is_sd else 0
        opts = m.get("options") or {}
        rows.append({"method_label": m["label"], "method": m["name"], "K": k, "replay": m.get("replay"),
                     "engine": engine_label(m["name"], k), "synthetic_L": opts.get("synthetic_acceptance_length"),
                     "aa_of": m.get("aa_of")})
    return pd.DataFrame(rows, columns=["method_label", "method", "K", "replay", "engine", "synthetic_L", "aa_of"])


def replay_traces(provenance: dict[str, Any]) -> dict:
    """Per dataset of a replay sweep: the prompts its cells ran, as prepared traces cut like the plans were."""
    sweep = parse_sweep(provenance["config"])
    out = {}
    for wl in sweep.workloads:
        prompts = load_prompts(wl)
        ids = [str(p.source_id) for p in prompts]
        table = load_trace_table(wl)
        rows = table[table["request_id"].astype(str).isin(ids)]
        prep = truncate_traces(prepare_traces(rows, keep_tokens=True), wl.max_output_tokens)
        order = [list(prep.request_id).index(i) for i in ids]
        out[wl.label] = prep.take(order)
    return out


#: a step this long (s) and this many times the cell's median step is a harness hiccup, not the engine
HICCUP_MIN_S, HICCUP_FACTOR = 0.5, 50.0


def harness_hiccups(requests: pd.DataFrame, engine_steps: pd.DataFrame) -> pd.DataFrame:
    """Batches that contain an engine step of at least :data:`HICCUP_MIN_S` and :data:`HICCUP_FACTOR` times
    the cell's median step (e.g. a one-off JIT compilation inside a measured batch): ``run_id, batch_index,
    step_s, median_step_s``. They are listed, and left out of :func:`batch_throughput` when passed to it."""
    rows = []
    for rid, e in engine_steps.groupby("run_id"):
        med = float(e["duration_s"].median())
        bad = e[(e["duration_s"] >= HICCUP_MIN_S) & (e["duration_s"] >= HICCUP_FACTOR * med)]
        if bad.empty:
            continue
        req = requests[requests["run_id"] == rid]
        for st in bad.itertuples():
            hit = req[(req["arrival_s"] <= st.start_s) & (req["finish_s"] >= st.start_s)]
            for b in sorted(set(hit["batch_index"])):
                rows.append({"run_id": rid, "batch_index": int(b), "step_s": float(st.duration_s),
                             "median_step_s": med})
    return pd.DataFrame(rows, columns=["run_id", "batch_index", "step_s", "median_step_s"])


PAIR_CELL_KEYS = ("repeat", "engine_start")  # a prompt's batches pair within the same repeat and engine start


def batch_throughput(runs: pd.DataFrame, requests: pd.DataFrame,
                     exclude: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (run, batch): output tokens / (last finish - first arrival), tok/s, with the run's dataset, method
    and batch size (paper batch mode: a batch is B copies of one prompt). ``exclude``: batches to leave out
    (``run_id, batch_index``, e.g. :func:`harness_hiccups`)."""
    if exclude is not None and len(exclude):
        drop = set(zip(exclude["run_id"], exclude["batch_index"].astype(int)))
        requests = requests[[(r, int(b)) not in drop for r, b in zip(requests["run_id"], requests["batch_index"])]]
    r = requests.groupby(["run_id", "batch_index"]).agg(
        prompt_index=("prompt_index", "first"), output_tokens=("output_tokens", "sum"),
        t0=("arrival_s", "min"), t1=("finish_s", "max")).reset_index()
    r["tok_per_s"] = r["output_tokens"] / (r["t1"] - r["t0"])
    keep = ["run_id", "dataset", "method", "method_label", "num_spec_tokens", "batch_size"]
    meta = runs[keep + [c for c in PAIR_CELL_KEYS if c in runs.columns]]
    return meta.merge(r.drop(columns=["t0", "t1"]), on="run_id")


def paired_ratio(x: np.ndarray, y: np.ndarray, *key) -> tuple[float, float]:
    """95% interval of ``mean(x) / mean(y)`` resampling the pairs (rows) with replacement, seeded by ``key``
    (:func:`sdlib.core.bootstrap.paired_ratio_interval`); NaN with fewer than 2 pairs."""
    return bootstrap.paired_ratio_interval(x, y, bootstrap.rng("replay", *key))


def paired_speedups(batches: pd.DataFrame, info: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Per (dataset, method label, batch size): speedup = mean tok/s / mean no-SD tok/s over the prompts both
    ran (the paper's definition, a ratio of means), with ``speedup_lo``/``speedup_hi`` (paired bootstrap over
    prompts), ``tok_per_s`` and its interval, ``n_prompts`` (distinct) and ``n_pairs`` (batches paired).
    ``baseline``: the method label in the denominator (another method's label: throughput relative to it, paired
    the same way)."""
    if baseline not in set(batches["method_label"]):
        raise ValueError(f"baseline {baseline!r} is not a method label of these runs")
    keys = ["dataset", "batch_size", "prompt_index", *[c for c in PAIR_CELL_KEYS if c in batches.columns]]
    # a prompt recurs within a cell (closed loop, fewer traces than slots): its k-th batch pairs with the other
    # arm's k-th, so every pair is one to one (a sweep with a block half run has unequal counts per prompt)
    batches = batches.assign(_occurrence=batches.groupby(["method_label", *keys]).cumcount())
    keys.append("_occurrence")
    base = batches[batches["method_label"] == baseline].set_index(keys)
    rows = []
    for (ds, lab, bs), g in batches.groupby(["dataset", "method_label", "batch_size"]):
        g = g.set_index(keys)
        common = g.index.intersection(base.index)
        num = g.loc[common, "tok_per_s"].to_numpy(float)
        den = base.loc[common, "tok_per_s"].to_numpy(float)
        lo, hi = paired_ratio(num, den, ds, lab, bs, baseline)
        t = g["tok_per_s"].to_numpy(float)
        tlo, thi = paired_ratio(t, np.ones_like(t), ds, lab, bs)
        rows.append({"dataset": ds, "method_label": lab, "batch_size": int(bs),
                     "n_prompts": common.get_level_values("prompt_index").nunique(), "n_pairs": len(common),
                     "tok_per_s": float(t.mean()), "tok_per_s_lo": tlo, "tok_per_s_hi": thi,
                     "speedup": float(num.mean() / den.mean()) if len(common) else float("nan"),
                     "speedup_lo": lo, "speedup_hi": hi})
    out = pd.DataFrame(rows)
    return out.merge(info, on="method_label", how="left")


def calibration_table(batches: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """Replay accepting every draft vs vLLM's synthetic acceptance L = K + 1, and accepting none vs L = 1, on
    the same engine path and K: tok/s of each, paired by prompt, and the relative difference."""
    mi = info.set_index("method_label")
    pairs = []
    for lab, row in mi.iterrows():
        if row["replay"] in ("accept_all", "accept_none"):
            want = row["K"] + 1 if row["replay"] == "accept_all" else 1
            syn = mi[(mi["engine"] == row["engine"]) & (mi["synthetic_L"].astype(float) == float(want))]
            if len(syn):
                pairs.append((lab, syn.index[0], row["replay"], want))
    rows = []
    for rep, syn, kind, L in pairs:
        a, b = batches[batches["method_label"] == rep], batches[batches["method_label"] == syn]
        for (ds, bs), ga in a.groupby(["dataset", "batch_size"]):
            gb = b[(b["dataset"] == ds) & (b["batch_size"] == bs)]
            m = ga.merge(gb, on="prompt_index", suffixes=("", "_syn"))
            x, y = m["tok_per_s"].to_numpy(float), m["tok_per_s_syn"].to_numpy(float)
            lo, hi = paired_ratio(x, y, ds, bs, rep, syn)
            rows.append({"dataset": ds, "batch_size": int(bs), "replay": rep, "synthetic": syn, "kind": kind,
                         "synthetic_L": L, "replay_tok_per_s": float(x.mean()), "synthetic_tok_per_s": float(y.mean()),
                         "ratio": float(x.mean() / y.mean()), "ratio_lo": lo, "ratio_hi": hi,
                         "within_3pct": bool(abs(x.mean() / y.mean() - 1) <= 0.03)})
    return pd.DataFrame(rows)


def step_costs(runs: pd.DataFrame, engine_steps: pd.DataFrame, info: pd.DataFrame,
               verified: bool = False) -> pd.DataFrame:
    """Per (engine, policy, batch size): median and interquartile engine-step time (ms) over decode steps
    (steps where every running request gained tokens but none was prefilled), and tokens gained per step.
    ``verified``: also ``verified_per_row``, the median over decode steps of the draft slots a row verified
    (scheduled tokens per running row, less the one every row decodes; the median, since the token bound above
    keeps a few steps that also prefill a new prompt): K on a fixed-K engine, the K Dynamic SD's schedule picks
    for the batch size on its engine (NaN where the engine did not report scheduled tokens)."""
    es = engine_steps.merge(runs[["run_id", "method_label", "batch_size", "dataset"]], on="run_id")
    es = es.merge(info[["method_label", "engine", "replay", "K"]], on="method_label", how="left")
    es = es.sort_values(["run_id", "engine_step"])
    sched = es["num_scheduled_tokens"].astype(float)  # unknown where no plan says what was drafted (no replay)
    full = es["num_running"] == es["batch_size"]
    # where the tokens are unknown, the token bound cannot drop the step that prefills the batch's last prompts:
    # drop each batch's first step at full size instead
    first_full = full & ~(full.groupby(es["run_id"]).shift(1, fill_value=False).astype(bool))
    decode = full & ((sched.isna() & ~first_full) | (sched <= es["batch_size"] * (1 + es["K"])))
    es = es[decode].assign(verified_per_row=(sched / es["num_running"] - 1)[decode])
    g = es.groupby(["engine", "method_label", "replay", "K", "batch_size"], dropna=False)
    extra = {"verified_per_row": ("verified_per_row", "median")} if verified else {}
    out = g.agg(step_ms=("duration_s", lambda s: 1000 * float(np.median(s))),
                step_ms_q25=("duration_s", lambda s: 1000 * float(np.percentile(s, 25))),
                step_ms_q75=("duration_s", lambda s: 1000 * float(np.percentile(s, 75))),
                tokens_per_step=("num_new_tokens", "mean"), steps=("duration_s", "size"), **extra).reset_index()
    out["tokens_per_step"] = out["tokens_per_step"] / out["batch_size"]
    return out


#: vLLM's CUDA-graph mode where a sweep's engine settings name none (vLLM 0.26 default)
DEFAULT_GRAPH_MODE = "FULL_AND_PIECEWISE"


def graph_mode(provenance: dict[str, Any]) -> str:
    """The sweep's CUDA-graph mode: ``engine.extra.compilation_config.cudagraph_mode``, else vLLM's default."""
    engine = provenance.get("config", {}).get("engine") or {}
    if engine.get("enforce_eager"):
        return "NONE"
    cc = (engine.get("extra") or {}).get("compilation_config") or {}
    if isinstance(cc, str):  # vLLM also takes it as JSON text
        try:
            cc = json.loads(cc)
        except ValueError:
            return cc
    return str(cc.get("cudagraph_mode", DEFAULT_GRAPH_MODE)) if isinstance(cc, dict) else DEFAULT_GRAPH_MODE


def hook_times(store) -> pd.DataFrame:
    """Per replayed cell: host time per wrapped call (``hook_ms``), the part inside vLLM's own call
    (``vllm_ms``) and the hooks' own part (``own_ms``), from ``replay/<run_id>.json`` (cells recorded before the
    hooks timed themselves have none; those recorded before 2026-12-02's worker change include the warm-up)."""
    rows = []
    for f in sorted((store.dir / "replay").glob("*.json")):
        h = json.loads(f.read_text()).get("hooks", {})
        if h.get("hook_calls"):
            n = float(h["hook_calls"])
            rows.append({"run_id": f.stem, "hook_calls": int(n), "hook_s": float(h["hook_s"]),
                         "vllm_s": float(h["vllm_s"]), "hook_ms": 1000 * h["hook_s"] / n,
                         "vllm_ms": 1000 * h["vllm_s"] / n, "own_ms": 1000 * (h["hook_s"] - h["vllm_s"]) / n})
    return pd.DataFrame(rows, columns=["run_id", "hook_calls", "hook_s", "vllm_s", "hook_ms", "vllm_ms", "own_ms"])


def simulator_labels(sp: pd.DataFrame) -> pd.DataFrame:
    """Adds the simulator's names of each replayed trace policy (``proposer``, ``predict_method``:
    ``FIXED_K``, ``ORACLE_K``; Combine = proposer ``combined``) and its ``kind`` and ``k`` (None for the
    oracles), so measured cells read like the simulator's table."""
    out = trace_cells(sp).copy()
    refs = [replay_ref(r, m, int(k)) for m, r, k in zip(out["method"], out["replay"], out["K"])]
    names = [authors_names(ref, cap=int(k)) for ref, k in zip(refs, out["K"])]
    out["proposer"] = [a for a, _ in names]
    out["predict_method"] = [b for _, b in names]
    out["kind"] = [ref.name for ref in refs]
    out["k"] = [np.nan if ref.k is None else float(ref.k) for ref in refs]
    return out


def measured_stack(sp: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, batch size): the best measured fixed policy, the best Oracle Proposal, the best Oracle
    Combine (:func:`sdlib.sim.bounds.bounds_stack` on the measured cells), with each best cell's interval."""
    cells = simulator_labels(sp)
    st = bounds_stack(cells)
    ci = cells.set_index(["dataset", "batch_size", "speedup"])[["speedup_lo", "speedup_hi"]]
    ci = ci[~ci.index.duplicated()]
    for col in ("best_fixed", "best_oracle", "combine_oracle"):
        idx = list(zip(st["dataset"], st["batch_size"], st[col]))
        st[f"{col}_lo"] = [ci["speedup_lo"].get(i, np.nan) for i in idx]
        st[f"{col}_hi"] = [ci["speedup_hi"].get(i, np.nan) for i in idx]
    return st


def sim_vs_measured(sp: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Measured cells beside every prediction of the same cell (``predictor`` = cost model and variant):
    ``speedup`` (measured, with its interval), ``speedup_sim`` and ``error`` = predicted / measured - 1."""
    pred = predictions.assign(predictor=predictions["cost_model"] + ", " + predictions["variant"])
    out = sp.merge(pred[["dataset", "method_label", "batch_size", "predictor", "speedup_sim"]],
                   on=["dataset", "method_label", "batch_size"])
    out["error"] = out["speedup_sim"] / out["speedup"] - 1
    out["inside_ci"] = (out["speedup_sim"] >= out["speedup_lo"]) & (out["speedup_sim"] <= out["speedup_hi"])
    return out


def error_summary(cmp_: pd.DataFrame) -> pd.DataFrame:
    """Per (predictor, batch size): median and mean absolute error, share of cells whose prediction falls
    inside the measured interval."""
    g = cmp_.assign(abs_error=cmp_["error"].abs()).groupby(["predictor", "batch_size"])
    return g.agg(cells=("error", "size"), median_abs_error=("abs_error", "median"), mean_error=("error", "mean"),
                 inside_ci=("inside_ci", "mean")).reset_index()
