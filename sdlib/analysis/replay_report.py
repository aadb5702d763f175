"""Every table notebook 06 draws, from one trace-replay sweep folder (and the simulator over the same cells).

Usage:
    from sdlib.analysis.replay_report import replay_report
    rep = replay_report("data/sweeps/h200_replay", cost_models=[AUTHORS_H100_LLAMA8B])
    rep["speedups"], rep["calibration"], rep["comparison"], rep["stack_measured"], ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from sdlib.analysis.replay import (batch_throughput, calibration_table, error_summary, harness_hiccups,
                                   measured_stack, method_info, paired_speedups, sim_vs_measured, simulator_labels,
                                   step_costs)
from sdlib.sim.bounds import bounds_stack
from sdlib.sim.costmodel import CostModel
from sdlib.sim.replay_costs import (fit_engine_steps, fits_table, refit_speedups, replay_traces,
                                    simulated_speedups)
from sdlib.store import SweepStore


def replay_report(sweep_dir: str | Path, cost_models: Sequence[CostModel] = ()) -> dict[str, pd.DataFrame]:
    """Tables of one replay sweep: ``hiccups`` (batches left out), ``speedups`` (measured, paired, 95% CI),
    ``calibration``, ``step_costs``, ``engine_fits``, ``predictions`` (simulator with each cost model, ragged
    and padded, and the engine refit), ``comparison`` (measured beside each prediction), ``errors``,
    ``stack_measured`` and ``stack_simulated`` (the first cost model, as the engine pads)."""
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
        sim = simulator_labels(sp)[["dataset", "method_label", "batch_size", "proposer", "predict_method"]].merge(
            first.rename(columns={"speedup_sim": "speedup"}), on=["dataset", "method_label", "batch_size"])
        out["stack_simulated"] = bounds_stack(sim)
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


def _batches(sweep_dir: str | Path) -> tuple:
    """(store, method info, runs, engine steps, hiccups, per-batch throughput without the hiccups) of a sweep."""
    store = SweepStore(sweep_dir)
    info = method_info(store.read_provenance())
    runs, req, es = store.read("runs"), store.read("requests"), store.read("engine_steps")
    hiccups = harness_hiccups(req, es).merge(runs[["run_id", "method_label", "dataset", "batch_size"]], on="run_id")
    return store, info, runs, es, hiccups, batch_throughput(runs, req, exclude=hiccups)
