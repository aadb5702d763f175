"""The simulator beside a trace-replay sweep: the same requests and step sequences, timed by cost models.

Three predictions per replayed cell (dataset, policy, batch size):

* ``simulator``: the trace simulator as published (:func:`sdlib.sim.policy.walk.request_times`) with a linear cost
  model (the authors' H100 fit, our H200 fit): drafts verified as proposed (ragged);
* ``simulator, padded``: the same, but every step verifies K tokens where the engine path does
  (vLLM 0.26's V2 runner: EAGLE, EAGLE-3, whatever the plan proposed);
* ``engine refit``: step time from a linear fit per engine (path and K) to the replay's own engine steps,
  ``duration = fixed + kv_s * kv + n_s * n`` (:func:`fit_engine_steps`): it carries the path's fixed cost per
  step, the price of K, and padding; the baseline uses the no-SD engine's fit.

The replay (:mod:`sdlib.sim.replay`) runs exactly the simulator's steps, so prediction and measurement
differ only in time.

Usage:
    preps = sdlib.analysis.replay.replay_traces(store.read_provenance())
    sim = simulated_speedups(preps, info, [AUTHORS_H100_LLAMA8B], batch_sizes=[1, 8, 32, 128])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import pandas as pd

from sdlib.core.registry import method_spec, replay_ref
from sdlib.sim.costmodel import CostModel, robust_lstsq
from sdlib.sim.policy.walk import PolicyInputs, no_sd_times, request_times
from sdlib.sim.prepared import PreparedTraces
from sdlib.sim.replay import replay_steps

#: trace policies the simulator can predict (calibration policies are engine checks, not predictions)
TRACE_POLICIES = ("fixed", "oracle", "combine")
#: The ``cost_model`` of the refit's rows; the powered tables' ``predictor`` begins with it (gpu/refit_history.py)
REFIT_COST_MODEL = "engine refit"


def trace_policy(replay, method: str, K: int):
    """The registry name a config's ``replay`` stands for on ``method``'s engine (``fixed`` for ``fixed`` and for
    an instance label such as ``fixed-eagle3-k5``), None for no replay or a name the registry does not know."""
    if not isinstance(replay, str) or not replay:
        return None
    try:
        return replay_ref(replay, method, int(K)).name
    except ValueError:  # RegistryError
        return None


def trace_cells(info: pd.DataFrame) -> pd.DataFrame:
    """The method labels whose replay the simulator can price (:data:`TRACE_POLICIES`), A/A twins left out
    (``aa_of``: the same plan as the arm they copy)."""
    kinds = [trace_policy(r, m, k) for r, m, k in zip(info["replay"], info["method"], info["K"])]
    twin = info["aa_of"].notna() if "aa_of" in info else pd.Series(False, index=info.index)
    return info[pd.Series(kinds, index=info.index).isin(TRACE_POLICIES) & ~twin]


def _steps(prep: PreparedTraces, method: str, policy: str, K: int, padded: bool):
    """The replayed steps of ``policy`` on ``method``'s engine; ``padded``: every row verifies K where the
    method's engine pads (vLLM 0.26's V2 runner: :attr:`sdlib.core.registry.MethodSpec.padded`)."""
    st = replay_steps(prep, replay_ref(policy, method, K), K, method=method)
    if padded and method_spec(method).padded:
        st = dataclasses.replace(st, n_i=np.full_like(st.n_i, K + 1), eagle_n=np.full(st.n_i.shape, K + 1.0))
    return st


def simulated_speedups(preps: dict[str, PreparedTraces], info: pd.DataFrame, cost_models: Sequence[CostModel],
                       batch_sizes: Sequence[int]) -> pd.DataFrame:
    """Per (dataset, method label, batch size, cost model, variant): the simulator's speedup over the same
    prompts (mean SD throughput / mean no-SD throughput); variants ``ragged`` and ``padded``."""
    rows = []
    for ds, prep in preps.items():
        inp = PolicyInputs.of(prep)
        for m in trace_cells(info).itertuples():
            for padded in (False, True):
                st = _steps(prep, m.method, m.replay, int(m.K), padded)
                L = st.output_len
                for cm in cost_models:
                    for B in batch_sizes:
                        sd = B * L / request_times(inp, st, cm, B)
                        base = B * L / no_sd_times(inp, L, cm, B)
                        rows.append({"dataset": ds, "method_label": m.method_label, "batch_size": int(B),
                                     "cost_model": cm.name, "variant": "padded" if padded else "ragged",
                                     "speedup_sim": float(sd.mean() / base.mean())})
    return pd.DataFrame(rows)


@dataclasses.dataclass(frozen=True)
class StepFit:
    """``duration = fixed_s + kv_s * kv + n_s * n`` for one engine's steps, with its fit diagnostics."""

    engine: str
    fixed_s: float
    kv_s: float
    n_s: float
    n_steps: int
    inlier_share: float
    r2_all: float
    r2_inliers: float

    def time(self, kv, n):
        return self.fixed_s + self.kv_s * np.asarray(kv, float) + self.n_s * np.asarray(n, float)


def _r2(y: np.ndarray, yhat: np.ndarray) -> float:
    ss = float(np.sum((y - y.mean()) ** 2))
    return float(1 - np.sum((y - yhat) ** 2) / ss) if ss > 0 else float("nan")


def fit_engine_steps(runs: pd.DataFrame, engine_steps: pd.DataFrame, info: pd.DataFrame) -> dict[str, StepFit]:
    """One linear step-time fit per engine (path and K) over every step of its replayed and no-SD cells
    (prefills included; ``n`` = tokens the target processed, ``kv`` = tokens held). The robust refit drops
    steps beyond 5 scaled MADs; R² is reported over all steps and over the inliers."""
    keep_labels = pd.concat([trace_cells(info), info[info["method"] == "none"]])
    es = engine_steps.merge(runs[["run_id", "method_label"]], on="run_id").merge(
        keep_labels[["method_label", "engine"]], on="method_label")
    es = es[es["num_scheduled_tokens"].notna() & (es["num_running"] > 0)]
    fits = {}
    for eng, g in es.groupby("engine"):
        kv = g["num_context_tokens"].to_numpy(float)
        n = g["num_scheduled_tokens"].to_numpy(float)
        y = g["duration_s"].to_numpy(float)
        X = np.column_stack([np.ones_like(kv), kv, n])
        coef, keep = robust_lstsq(X, y, robust=True)
        fits[eng] = StepFit(eng, float(coef[0]), float(coef[1]), float(coef[2]), len(y), float(keep.mean()),
                            _r2(y, X @ coef), _r2(y[keep], X[keep] @ coef))
    return fits


def fits_table(fits: dict[str, StepFit]) -> pd.DataFrame:
    """The fits as a table (ms and µs units for reading)."""
    return pd.DataFrame([{"engine": f.engine, "fixed_ms": 1e3 * f.fixed_s, "per_kv_token_us": 1e6 * f.kv_s,
                          "per_token_us": 1e6 * f.n_s, "steps": f.n_steps, "inlier_share": f.inlier_share,
                          "r2_all": f.r2_all, "r2_inliers": f.r2_inliers} for f in fits.values()])


def refit_speedups(preps: dict[str, PreparedTraces], info: pd.DataFrame, fits: dict[str, StepFit],
                   batch_sizes: Sequence[int]) -> pd.DataFrame:
    """Per (dataset, method label, batch size): the speedup predicted by the engine fits (padding as the
    engine pads; the baseline from the no-SD engine's fit)."""
    rows = []
    base_fit = fits["none"]
    for ds, prep in preps.items():
        P = prep.prompt_len.astype(float)
        for m in trace_cells(info).itertuples():
            if m.engine not in fits:
                continue
            f = fits[m.engine]
            rec = _steps(prep, m.method, m.replay, int(m.K), padded=True)
            L = rec.output_len.astype(float)
            for B in batch_sizes:
                t_sd = f.time(B * (P[rec.req] + rec.pos), B * rec.n_i)
                sd_t = np.bincount(rec.req, weights=t_sd, minlength=len(prep)) + f.time(0, B * P)
                steps = np.maximum(L - 1, 0).astype(int)
                req = np.repeat(np.arange(len(prep)), steps)
                off = np.concatenate([[0], np.cumsum(steps)])
                c = np.arange(off[-1]) - off[req] + 1
                t_b = base_fit.time(B * (P[req] + c), B)
                base_t = np.bincount(req, weights=t_b, minlength=len(prep)) + base_fit.time(0, B * P)
                rows.append({"dataset": ds, "method_label": m.method_label, "batch_size": int(B),
                             "cost_model": REFIT_COST_MODEL, "variant": "as the engine runs",
                             "speedup_sim": float((B * L / sd_t).mean() / (B * L / base_t).mean())})
    return pd.DataFrame(rows)
