"""Every table notebook 06 draws, from one trace-replay sweep folder (and the simulator over the same cells).

Usage:
    from sdlib.analysis.replay_report import replay_report
    rep = replay_report("data/sweeps/h200_replay", cost_models=[AUTHORS_H100_LLAMA8B])
    rep["speedups"], rep["calibration"], rep["comparison"], rep["stack_measured"], ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.analysis.replay import (batch_throughput, calibration_table, error_summary, graph_mode, harness_hiccups,
                                   hook_times, measured_stack, method_info, paired_ratio, paired_speedups,
                                   replay_traces, sim_vs_measured, simulator_labels, step_costs)
from sdlib.analysis.versions import vllm_version
from sdlib.sim.bounds import bounds_stack
from sdlib.sim.costmodel import CostModel
from sdlib.sim.replay_costs import fit_engine_steps, fits_table, refit_speedups, simulated_speedups
from sdlib.store import SweepStore


def replay_report(sweep_dir: str | Path, cost_models: Sequence[CostModel] = ()) -> dict[str, pd.DataFrame]:
    """Tables of one replay sweep: ``hiccups`` (batches left out), ``speedups`` (measured, paired, 95% CI),
    ``calibration``, ``step_costs``, ``engine_fits``, ``predictions`` (simulator with each cost model, ragged
    and padded, and the engine refit), ``comparison`` (measured beside each prediction), ``errors``,
    ``stack_measured`` and ``stack_simulated`` (the first cost model, as the engine pads), and ``paired_gains``
    (Oracle Combine's and Oracle Proposal's gain over the best fixed method, measured against each prediction:
    :func:`paired_gains`)."""
    store, info, runs, es, hiccups, batches = _batches(sweep_dir)
    sp = paired_speedups(batches, info)
    bss = sorted(runs["batch_size"].unique())
    preps = replay_traces(store.read_provenance())
    fits = fit_engine_steps(runs, es, info)
    preds = [refit_speedups(preps, info, fits, bss)]
    if cost_models:
        preds.insert(0, simulated_speedups(preps, info, cost_models, bss))
    predictions = pd.concat(preds, ignore_index=True)
    comparison = sim_vs_measured(simulator_labels(sp), predictions)
    out = {"hiccups": hiccups, "speedups": sp, "calibration": calibration_table(batches, info),
           "step_costs": step_costs(runs, es, info), "engine_fits": fits_table(fits),
           "predictions": predictions, "comparison": comparison, "errors": error_summary(comparison),
           "stack_measured": measured_stack(sp)}
    if cost_models:
        first = predictions[(predictions["cost_model"] == cost_models[0].name) & (predictions["variant"] == "padded")]
        sim = simulator_labels(sp)[["dataset", "method_label", "batch_size", "proposer", "predict_method", "kind",
                                    "k"]].merge(
            first.rename(columns={"speedup_sim": "speedup"}), on=["dataset", "method_label", "batch_size"])
        out["stack_simulated"] = bounds_stack(sim)
        out["paired_gains"] = paired_gains(batches, info, sp, predictions)
    return out


#: the oracle arms whose gain over the best fixed method :func:`paired_gains` compares, by the policy kind
GAIN_KINDS = {"combine": "Oracle Combine", "oracle": "Oracle Proposal"}


def _best(cells: pd.DataFrame, col: str) -> pd.Series:
    """The row of ``cells`` with the largest ``col`` (Combine: the uncapped-k instances only)."""
    return cells.loc[cells[col].idxmax()]


def paired_gains(batches: pd.DataFrame, info: pd.DataFrame, sp: pd.DataFrame,
                 predictions: pd.DataFrame) -> pd.DataFrame:
    """Simulated against measured as paired ratios: per (dataset, batch size, predictor) the gain of Oracle
    Combine and of Oracle Proposal over the best fixed method, each world choosing its own best cells.

    ``measured`` (with ``measured_lo``/``measured_hi``: paired bootstrap over the prompts both arms ran, the
    batches of :func:`_batches`) is best oracle arm / best fixed arm by measured speedup; ``simulated`` the same
    ratio from the predictor's speedups. The fixed cells' own over-prediction is kept apart:
    ``fixed_overprediction`` = predicted / measured speedup of the measured best fixed cell - 1 (a predictor can
    be wrong about both arms and right about their ratio, or the reverse)."""
    cells = simulator_labels(sp)
    cells = cells[(cells["kind"] != "combine") | cells["k"].isna()]
    rows = []
    for (ds, bs), g in cells.groupby(["dataset", "batch_size"]):
        fixed = g[g["kind"] == "fixed"]
        if fixed.empty:
            continue
        bf = _best(fixed, "speedup")
        rel = paired_speedups(batches[(batches["dataset"] == ds) & (batches["batch_size"] == bs)], info,
                              baseline=bf["method_label"]).set_index("method_label")
        pr = predictions[(predictions["dataset"] == ds) & (predictions["batch_size"] == bs)]
        for kind, arm in GAIN_KINDS.items():
            arms = g[g["kind"] == kind]
            if arms.empty:
                continue
            best = _best(arms, "speedup")
            m = rel.loc[best["method_label"]]
            for (cm, var), p in pr.groupby(["cost_model", "variant"], sort=False):
                p = p.set_index("method_label")["speedup_sim"]
                sim_fixed = p.reindex(fixed["method_label"]).max()
                sim_arm = p.reindex(arms["method_label"]).max()
                rows.append({"dataset": ds, "batch_size": int(bs), "arm": arm, "predictor": f"{cm}, {var}",
                             "best_fixed_label": bf["method_label"], "arm_label": best["method_label"],
                             "n_prompts": int(m["n_prompts"]), "measured": float(m["speedup"]),
                             "measured_lo": float(m["speedup_lo"]), "measured_hi": float(m["speedup_hi"]),
                             "simulated": float(sim_arm / sim_fixed),
                             "fixed_overprediction": float(p.get(bf["method_label"], np.nan) / bf["speedup"] - 1)})
    out = pd.DataFrame(rows)
    if len(out):
        out["sim_over_measured"] = out["simulated"] / out["measured"]
    return out


def measured_relative(sweep_dir: str | Path, reference: str) -> pd.DataFrame:
    """Per (dataset, method label, batch size) of a replay sweep: throughput relative to the ``reference``
    method label on the same prompts (``vs_reference``, a ratio of means) with a 95% interval (paired bootstrap
    over prompts, :func:`~sdlib.analysis.replay.paired_speedups`); batches with harness hiccups left out."""
    _, info, _, _, _, batches = _batches(sweep_dir)
    rel = paired_speedups(batches, info, baseline=reference)
    rel = rel.rename(columns={"speedup": "vs_reference", "speedup_lo": "vs_reference_lo",
                              "speedup_hi": "vs_reference_hi"})
    return rel.assign(reference=reference)


def hook_control(sweep_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """The n-gram path's hook-off control (configs/h200_hookoff*.yaml): per sweep, engine method and batch size
    (datasets pooled, as :func:`~sdlib.analysis.replay.step_costs` pools them), the median engine step with its
    interquartile range, the CUDA-graph mode, whether the replay hooks were installed, and their host time
    per wrapped call (``hook_ms``: ``vllm_ms`` inside vLLM's own call plus ``own_ms``, the hooks' own work), and
    the vLLM version the sweep's engines reported (``vllm``: 0.26's V1 runner and 0.34's V2 runner differ here)."""
    out = []
    for d in sweep_dirs:
        store = SweepStore(d)
        prov = store.read_provenance()
        info = method_info(prov)
        runs = store.read("runs")
        c = step_costs(runs, store.read("engine_steps"), info)
        t = hook_times(store).merge(runs[["run_id", "method_label", "batch_size"]], on="run_id")
        t = t.groupby(["method_label", "batch_size"], as_index=False)[["hook_calls", "hook_s", "vllm_s"]].sum()
        t["hook_ms"], t["vllm_ms"] = 1000 * t["hook_s"] / t["hook_calls"], 1000 * t["vllm_s"] / t["hook_calls"]
        t["own_ms"] = t["hook_ms"] - t["vllm_ms"]
        c = c.merge(t.drop(columns=["hook_s", "vllm_s"]), on=["method_label", "batch_size"], how="left")
        out.append(c.assign(sweep=store.dir.name, vllm=vllm_version(d), graph_mode=graph_mode(prov),
                            hooks=c["replay"].notna()))
    cols = ["sweep", "vllm", "graph_mode", "engine", "method_label", "replay", "hooks", "K", "batch_size", "step_ms",
            "step_ms_q25", "step_ms_q75", "tokens_per_step", "steps", "hook_calls", "hook_ms", "vllm_ms", "own_ms"]
    return pd.concat(out, ignore_index=True)[cols]


def graph_mode_comparison(sweep_dirs: Sequence[str | Path], labels: Sequence[str]) -> pd.DataFrame:
    """The same replayed cells under different CUDA-graph modes (one sweep per mode, same requests): per
    (dataset, method label, batch size) and sweep, the speedup over that sweep's own no-SD cells with its 95%
    interval, the throughput relative to the first sweep on the same prompts (``vs_first``, paired bootstrap
    over prompts) and, per sweep, the Oracle Proposal / fixed rows relative to the sweep's best fixed label in
    that cell (``vs_best_fixed``, paired)."""
    out, first = [], None
    for d in sweep_dirs:
        store, info, _, _, _, batches = _batches(d)
        batches = batches[batches["method_label"].isin(list(labels) + ["none"])]
        sp = paired_speedups(batches, info)
        sp = sp[sp["method_label"] != "none"].assign(sweep=store.dir.name,
                                                      graph_mode=graph_mode(store.read_provenance()))
        fixed = sp[sp["replay"] == "fixed"]
        best = fixed.loc[fixed.groupby(["dataset", "batch_size"])["speedup"].idxmax(),
                         ["dataset", "batch_size", "method_label"]].rename(columns={"method_label": "best_fixed"})
        sp = sp.merge(best, on=["dataset", "batch_size"], how="left")
        tok = {key: g.set_index("prompt_index")["tok_per_s"]
               for key, g in batches.groupby(["dataset", "batch_size", "method_label"])}
        vf = [_paired_ratio(tok.get((r.dataset, r.batch_size, r.method_label)),
                            tok.get((r.dataset, r.batch_size, r.best_fixed)),
                            r.sweep, r.dataset, r.batch_size, r.method_label, r.best_fixed) for r in sp.itertuples()]
        rel = [(1.0, 1.0, 1.0) if first is None else
               _paired_ratio(tok.get((r.dataset, r.batch_size, r.method_label)),
                             first.get((r.dataset, r.batch_size, r.method_label)),
                             r.sweep, r.dataset, r.batch_size, r.method_label, "first") for r in sp.itertuples()]
        ratios = {f"vs_best_fixed{s}": [v[i] for v in vf] for i, s in enumerate(("", "_lo", "_hi"))}
        ratios.update({f"vs_first{s}": [v[i] for v in rel] for i, s in enumerate(("", "_lo", "_hi"))})
        out.append(sp.assign(**ratios))
        if first is None:
            first = tok
    cols = ["sweep", "graph_mode", "dataset", "method_label", "replay", "K", "batch_size", "n_prompts", "speedup",
            "speedup_lo", "speedup_hi", "best_fixed", "vs_best_fixed", "vs_best_fixed_lo", "vs_best_fixed_hi",
            "vs_first", "vs_first_lo", "vs_first_hi"]
    return pd.concat(out, ignore_index=True)[cols]


def _paired_ratio(x: Optional[pd.Series], y: Optional[pd.Series], *key) -> tuple[float, float, float]:
    """Mean of ``x`` over mean of ``y`` (tok/s indexed by prompt) on the prompts both ran, with its paired 95%
    bootstrap interval (seeded by ``key``: what is compared); NaN where one is missing."""
    if x is None or y is None:
        return float("nan"), float("nan"), float("nan")
    c = x.index.intersection(y.index)
    lo, hi = paired_ratio(x[c].to_numpy(float), y[c].to_numpy(float), *key)
    return (float(x[c].mean() / y[c].mean()) if len(c) else float("nan")), lo, hi


def _batches(sweep_dir: str | Path) -> tuple:
    """(store, method info, runs, engine steps, hiccups, per-batch throughput without the hiccups) of a sweep."""
    store = SweepStore(sweep_dir)
    info = method_info(store.read_provenance())
    runs, req, es = store.read("runs"), store.read("requests"), store.read("engine_steps")
    hiccups = harness_hiccups(req, es).merge(runs[["run_id", "method_label", "dataset", "batch_size"]], on="run_id")
    return store, info, runs, es, hiccups, batch_throughput(runs, req, exclude=hiccups)
