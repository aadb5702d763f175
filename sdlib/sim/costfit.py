"""Fit the simulator's cost model to a measured sweep (e.g. the H200 sweep).

One joint least-squares fit over the engine steps of the no-SD cells and of one EAGLE(-3)
method's cells (steady windows, where ``num_scheduled_tokens`` is known)::

    duration = a_kv*kv + a_n*n + c  +  [SD step] * (b_kv*kv + d)

``kv`` = ``num_context_tokens`` (tokens held by the running requests), ``n`` =
``num_scheduled_tokens`` (tokens the target processed: 1 per request without SD, 1 + k
with SD, plus prompts being prefilled). The no-SD steps alone cannot separate ``a_kv``
from ``a_n`` (``kv`` grows with ``n = B``); SD steps feed ``(k+1)B`` tokens at the same
``kv`` and can. ``b_kv*kv + d`` is the drafting cost (``b_n`` = 0: with fixed k the
per-request tokens are constant and fold into ``d``). The per-step overhead is inside
``c`` (``overhead_s`` = 0). n-gram drafting keeps the base model's fraction of T.
A robust refit drops steps beyond 5 scaled MADs (hiccups); ``meta`` keeps R^2 and the RMS residual
over *all* steps beside the inlier share and the fit's R^2 on the inliers
(:func:`sdlib.sim.costmodel.fit_diagnostics`).

The committed fits in ``data/costmodels/`` are written by ``make costmodels``, which runs this module
for each entry of :data:`COMMITTED_FITS`; each JSON's ``meta.producer`` names the command.

Usage:
    python -m sdlib.sim.costfit data/sweeps/h200_llama8b --eagle-method eagle3-k3-L2.5 \
        --out data/costmodels/h200_llama8b.json
    python -m sdlib.sim.costfit --committed      # every fit in COMMITTED_FITS (make costmodels)
    # in Python:
    from sdlib.sim.costfit import fit_sweep_cost_model
    cm = fit_sweep_cost_model("data/sweeps/h200_llama8b", "h200_llama8b", eagle_method="eagle3-k3-L2.5")
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sdlib.paths import repo_relative, resolve
from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B, CostModel, fit_diagnostics, robust_lstsq
from sdlib.store import read_table


def _steps_of(runs: pd.DataFrame, es: pd.DataFrame, label: str) -> pd.DataFrame:
    ids = set(runs.loc[runs["method_label"] == label, "run_id"])
    d = es[es["run_id"].isin(ids)]
    return d[d["num_scheduled_tokens"].notna() & (d["num_running"] > 0) & d["in_window"].fillna(False)]


def fit_joint(no_sd: pd.DataFrame, sd: pd.DataFrame, robust: bool = True) -> tuple[np.ndarray, dict]:
    """Coefficients ``[a_kv, a_n, c, b_kv, d]`` and fit diagnostics (see the module docstring)."""
    both = pd.concat([no_sd.assign(_sd=0.0), sd.assign(_sd=1.0)], ignore_index=True)
    kv = both["num_context_tokens"].to_numpy(float)
    n = both["num_scheduled_tokens"].to_numpy(float)
    s = both["_sd"].to_numpy(float)
    y = both["duration_s"].to_numpy(float)
    X = np.column_stack([kv, n, np.ones_like(kv), s * kv, s])
    coef, keep = robust_lstsq(X, y, robust)
    return coef, fit_diagnostics(X, y, coef, keep)


def fit_sweep_cost_model(sweep_dir, name: str, eagle_method: str,
                         base: CostModel = AUTHORS_H100_LLAMA8B) -> CostModel:
    """A CostModel fitted jointly to one sweep's no-SD and ``eagle_method`` steady-window steps."""
    runs, es = read_table(sweep_dir, "runs"), read_table(sweep_dir, "engine_steps")
    no_sd, sd = _steps_of(runs, es, "none"), _steps_of(runs, es, eagle_method)
    if no_sd.empty or sd.empty:
        raise ValueError(f"{sweep_dir}: need no-SD and {eagle_method!r} engine steps with num_scheduled_tokens")
    coef, meta = fit_joint(no_sd, sd)
    meta["drafting_steps"] = int(len(sd))
    return base.replace(name=name, target_kv_s=float(coef[0]), target_n_s=float(coef[1]),
                        target_fixed_s=float(coef[2]), eagle_kv_s=float(coef[3]), eagle_n_s=0.0,
                        eagle_fixed_s=float(coef[4]), overhead_s=0.0,
                        source=f"joint fit to {sweep_dir}: no-SD + {eagle_method} steady-window engine steps",
                        meta={**meta, "drafting_from": eagle_method, "ngram_frac_from": base.name})


#: The fits committed under data/costmodels/: output file -> (sweep folder, EAGLE method label).
COMMITTED_FITS = {"data/costmodels/h200_llama8b.json": ("data/sweeps/h200_llama8b", "eagle3-k3-L2.5")}
#: The committed engine cost models (:mod:`sdlib.sim.engine_costs`): output file -> replay sweep folder.
COMMITTED_ENGINE_FITS = {"data/costmodels/h200_replay_engine.json": "data/sweeps/h200_replay"}


def write_fit(sweep_dir, eagle_method: str, out, producer: str) -> Path:
    """Fit ``sweep_dir`` and write the model to ``out`` (named after the file), ``meta.producer`` set."""

    out = resolve(out)
    cm = fit_sweep_cost_model(repo_relative(resolve(sweep_dir)), Path(out).stem, eagle_method=eagle_method)
    cm = cm.replace(meta={**_rounded(cm.meta), "producer": producer},
                    **{k: _rounded(v) for k, v in cm.to_dict().items() if isinstance(v, float)})
    return cm.save(out)


def write_engine_fit(sweep_dir, out, producer: str) -> Path:
    """Fit the engine cost model (per path, k and batch size) to the replay sweep ``sweep_dir`` and write it
    to ``out`` (named after the file), ``meta.producer`` set."""

    # deferred: sdlib.sim.engine_costs loads pandas, and only this path needs it
    from sdlib.sim.engine_costs import fit_engine_cost_model

    out = resolve(out)
    ecm = fit_engine_cost_model(repo_relative(resolve(sweep_dir)), Path(out).stem)
    return replace(ecm, meta={**ecm.meta, "producer": producer}).save(out)


def _rounded(x):
    """Floats (also inside a dict) to 10 significant digits: a refit on another machine writes the same file."""
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return float(f"{x:.10g}") if isinstance(x, float) else x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdlib.sim.costfit",
                                 description="Fit the simulator's cost model to a measured sweep and write it as JSON.")
    ap.add_argument("sweep", nargs="?", help="sweep folder (repo-relative or absolute)")
    ap.add_argument("--eagle-method", help="method label whose steps give the drafting cost, e.g. eagle3-k3-L2.5")
    ap.add_argument("--out", help="JSON file to write (its stem names the model)")
    ap.add_argument("--committed", action="store_true", help="rewrite every fit in COMMITTED_FITS (make costmodels)")
    a = ap.parse_args(argv)
    if a.committed:
        for out, (sweep, method) in COMMITTED_FITS.items():
            p = write_fit(sweep, method, out, "make costmodels (python -m sdlib.sim.costfit --committed)")
            print(f"wrote {p}")
        for out, sweep in COMMITTED_ENGINE_FITS.items():
            print(f"wrote {write_engine_fit(sweep, out, 'make costmodels (python -m sdlib.sim.costfit --committed)')}")
        return 0
    if not (a.sweep and a.eagle_method and a.out):
        ap.error("give SWEEP, --eagle-method and --out, or --committed")
    print("wrote", write_fit(a.sweep, a.eagle_method, a.out,
                             f"python -m sdlib.sim.costfit {a.sweep} --eagle-method {a.eagle_method} --out {a.out}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
