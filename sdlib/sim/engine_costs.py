"""A step-cost model that carries the engine's price of K, fitted to the H200 trace replay (vLLM 0.26).

What the replay (``data/sweeps/h200_replay``) showed, and what this model therefore carries:

* on the EAGLE-3 path (V2 runner, asynchronous scheduling) every row verifies K tokens whatever it drafted,
  and the step time grows with K (EAGLE drafting K tokens + verifying K+1 per row + CUDA-graph sizes);
* on the n-gram path (V1 runner, synchronous, ragged drafts) a row verifies what it drafted, but the step
  carries a large fixed cost: with vLLM 0.26's default CUDA graphs a batch whose rows verify fewer than
  1 + K tokens leaves the FULL graph and is bound by the host (the hook-off control, configs/h200_hookoff*.yaml,
  put the replay hooks' own host time at 0.02-0.31 ms per step; with ``cudagraph_mode: FULL`` most of the
  fixed cost goes, configs/h200_ragged_full.yaml, not fitted here);
* no SD: a plain decode step.

So a step is priced by its engine **path** and its **k** (draft slots per row), per batch size ``B``::

    t = alpha[path](k, B) + a_kv * kv + a_n[path] * n

``kv`` = tokens in the batch's KV cache, ``n`` = tokens the step feeds the target (ragged path only; on the
padded path and without SD ``n`` is fixed by ``k`` and ``B`` and sits inside ``alpha``). ``a_kv`` is one
slope shared by the paths (a fixed-effects fit: within-cell variation only), ``a_n`` the ragged path's
per-token slope; ``alpha[path](k, B)`` = the median of ``t - a_kv*kv - a_n*n`` over each measured cell's
steady-window decode steps. Between measured k and B the table is interpolated linearly (B: beyond the
largest measured B, extrapolated from the last two; k beyond the largest measured k, likewise; both never below
the largest measured value, so a falling last segment is held flat there; ragged
k below the smallest measured k takes the smallest's value: the harness's fixed cost dominates there).
``k = 0`` on any path is a plain decode step (the no-SD row). The prefill is priced by ``prefill_model``
(the replay times decode steps only): a name or path that :func:`sdlib.sim.costmodels.load_cost_model`
resolves when it loads this model (it sits above this module, so the model never loads one itself).

The policies (:mod:`sdlib.sim.policy.walk`) give each step its path and k: EAGLE-3 and policies that mix
drafters run on the padded path with k = the tokens the step drafts (a per-step k, as vLLM's Dynamic SD
varies k between steps; fixed-k methods keep their k); n-gram-only policies run on the ragged path with the
engine's K. Drafting is inside the measured steps, so the drafting flags of a step cost nothing extra here.

Usage:
    from sdlib.sim.engine_costs import fit_engine_cost_model
    ecm = fit_engine_cost_model("data/sweeps/h200_replay", name="h200_replay_engine")
    ecm.save("data/costmodels/h200_replay_engine.json"); ecm.step_time("padded", k=3, B=32, kv=32 * 600)
    # priced with its prefill: sdlib.sim.costmodels.load_cost_model("h200_replay_engine")
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Optional

import numpy as np
import pandas as pd

from sdlib.core.registry import METHODS
from sdlib.sim.costmodel import CostModel, StepCostModel, robust_lstsq

#: Engine paths: ``none`` (no SD), ``padded`` (EAGLE-3 / V2 runner: every row verifies k), ``ragged``
#: (n-gram / V1 runner: a row verifies what it drafted).
PATHS = ("none", "padded", "ragged")
#: Sweep method name -> engine path (:attr:`sdlib.core.registry.MethodSpec.path`; methods without one are not fitted).
PATH_OF_METHOD = {m.name: m.path for m in METHODS.values() if m.path is not None}
#: The committed fit (written by :func:`fit_engine_cost_model`; see ``data/costmodels/README`` lines in data/README.md).
ENGINE_COST_MODEL_FILE = "data/costmodels/h200_replay_engine.json"


@dataclass(frozen=True)
class EngineCostModel(StepCostModel):
    """Per-path, per-k, per-B step times (s) with a shared KV slope; see the module docstring."""

    kind: ClassVar[str] = "engine"

    name: str
    a_kv_s: float  # s per KV token (shared by the paths)
    a_n_s: dict  # path -> s per scheduled token (0 where n is fixed by k and B)
    ks: dict  # path -> measured k (sorted)
    batch_sizes: list  # measured B (sorted)
    alpha_s: dict  # path -> [[alpha(k_i, B_j)]] (len(ks) x len(batch_sizes)), s
    prefill_model: str  # name or path of the linear CostModel that prices the prefill
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False)
    #: the linear model ``prefill_model`` names, set by :func:`sdlib.sim.costmodels.load_cost_model` (not saved)
    prefill: Optional[CostModel] = field(default=None, compare=False, repr=False)

    # ---- pricing ---------------------------------------------------------------------------------------
    def alpha(self, path: str, k, B) -> np.ndarray:
        """``alpha[path](k, B)`` in s, interpolated (vectorised over ``k``; ``B`` a scalar)."""
        k = np.asarray(k, dtype=float)
        Bs = np.asarray(self.batch_sizes, dtype=float)

        def over_b(row) -> float:
            row = np.asarray(row, dtype=float)
            return float(_interp_extrap(float(B), Bs, row))

        none_b = over_b(self.alpha_s["none"][0])
        if path == "none":
            return np.full(k.shape, none_b)
        ks = np.asarray(self.ks[path], dtype=float)
        col = np.array([over_b(r) for r in self.alpha_s[path]])
        if path == "padded":  # k = 0 is a plain decode step: interpolate from it
            ks, col = np.concatenate([[0.0], ks]), np.concatenate([[none_b], col])
        out = _interp_extrap(np.maximum(k, ks[0]), ks, col)
        return np.where(k <= 0, none_b, out)

    def step_time(self, path: str, k, B: int, kv, n=None) -> np.ndarray:
        """One decode step of the batch, s: ``alpha[path](k, B) + a_kv*kv + a_n[path]*n``."""
        kv = np.asarray(kv, dtype=float)
        t = self.alpha(path, k, B) + self.a_kv_s * kv
        a_n = float(self.a_n_s.get(path, 0.0))
        if a_n and n is not None:
            t = t + a_n * np.where(np.asarray(k) > 0, np.asarray(n, dtype=float), 0.0)
        return t

    def no_sd_time(self, B: int, kv) -> np.ndarray:
        """A plain decode step (no SD), s."""
        return self.step_time("none", np.zeros(np.shape(kv)), B, kv)

    def prefill_time(self, num_prompt_tokens):
        """The batch's prefill, s (priced by :attr:`prefill_model`'s prefill forward)."""
        if self.prefill is None:
            raise ValueError(f"engine cost model {self.name!r}: its prefill model {self.prefill_model!r} is not "
                             "resolved (get the model through sdlib.sim.costmodels.load_cost_model)")
        return self.prefill.prefill_time(num_prompt_tokens)

    # ---- the protocol (StepCostModel) ------------------------------------------------------------------
    def step_seconds(self, B: int, kv, n_i, k, eagle, eagle_n, ngram, path: str) -> np.ndarray:
        """``alpha[path](k, B) + a_kv*kv + a_n*B*n_i`` (drafting is inside the measured steps, so the drafting
        flags cost nothing extra; k = 0 is a plain decode step)."""
        return self.step_time(path, k, B, kv, n=B * np.asarray(n_i, dtype=float))

    def no_sd_step_seconds(self, B: int, kv) -> np.ndarray:
        return self.no_sd_time(B, kv)

    def prefill_seconds(self, num_prompt_tokens) -> np.ndarray:
        """:meth:`prefill_time` (the measured steps hold the per-step overhead; the prefill adds none)."""
        return self.prefill_time(num_prompt_tokens)

    # ---- JSON ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self.replace(prefill=None))
        del d["prefill"]
        return {"kind": self.kind, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineCostModel":
        d = dict(d)
        if d.pop("kind", cls.kind) != cls.kind:
            raise KeyError(f"EngineCostModel: kind {d.get('kind')!r} is not {cls.kind!r}")
        return cls(**d)


def _interp_extrap(x, xp: np.ndarray, fp: np.ndarray):
    """np.interp inside ``xp``; linear from the last two points above it, never below the last (a falling last
    segment, as the n-gram path's from k = 5 to 10 at some batch sizes, is held flat: a step with more draft
    slots or rows than any measured one does not get cheaper than the largest measured; flat below the first)."""
    y = np.interp(x, xp, fp)
    if len(xp) >= 2:
        slope = max(0.0, float((fp[-1] - fp[-2]) / (xp[-1] - xp[-2])))
        y = np.where(np.asarray(x) > xp[-1], fp[-1] + slope * (np.asarray(x) - xp[-1]), y)
    return y


# --------------------------------------------------------------------------- fit
def decode_steps(sweep_dir) -> pd.DataFrame:
    """Steady-window, full-batch, pure-decode engine steps of a replay sweep with ``path``, ``k``, ``B``.

    Synthetic-acceptance cells are left out (their drafts are random, not the replay's); prefill steps
    (more scheduled tokens than ``B*(k+1)``) and steps with fewer running requests than ``B`` too.
    """
    # deferred: sdlib.store loads pandas, and only this path needs it
    from sdlib.store import read_table

    runs, es = read_table(sweep_dir, "runs"), read_table(sweep_dir, "engine_steps")
    d = es.merge(runs[["run_id", "method", "method_label", "batch_size", "num_spec_tokens"]], on="run_id")
    d = d[d["in_window"].fillna(False).astype(bool) & (d["num_running"] == d["batch_size"])
          & ~d["method_label"].str.contains("synthetic") & d["method"].isin(list(PATH_OF_METHOD))]
    k = np.where(d["method"].map(lambda m: METHODS[m].is_sd), d["num_spec_tokens"], 0).astype(int)
    d = d.assign(path=d["method"].map(PATH_OF_METHOD), k=k, B=d["batch_size"].astype(int))
    return d[d["num_scheduled_tokens"] <= d["num_running"] * (d["k"] + 1)].reset_index(drop=True)


def _within_cell_slopes(d: pd.DataFrame, cols: list[str]) -> np.ndarray:
    cell = d["path"] + "/" + d["k"].astype(str) + "/" + d["B"].astype(str)
    X = np.column_stack([d[c] - d.groupby(cell)[c].transform("mean") for c in cols]).astype(float)
    y = (d["duration_s"] - d.groupby(cell)["duration_s"].transform("mean")).to_numpy(float)
    coef, _ = robust_lstsq(X, y)
    return coef


def fit_engine_cost_model(sweep_dir, name: str = "h200_replay_engine",
                          prefill_model: str = "data/costmodels/h200_llama8b.json") -> EngineCostModel:
    """Fit :class:`EngineCostModel` to a replay sweep's engine steps (see the module docstring)."""
    d = decode_steps(sweep_dir)
    if d.empty:
        raise ValueError(f"{sweep_dir}: no steady-window decode steps")
    a_kv = float(_within_cell_slopes(d[d["path"] != "ragged"], ["num_context_tokens"])[0])
    rag = d[d["path"] == "ragged"]
    a_n = {"none": 0.0, "padded": 0.0, "ragged": 0.0}
    if len(rag):
        a_n["ragged"] = float(_within_cell_slopes(rag, ["num_context_tokens", "num_scheduled_tokens"])[1])
    Bs = sorted(d["B"].unique().tolist())
    ks, alpha, counts = {}, {}, {}
    for path in PATHS:
        p = d[d["path"] == path]
        if p.empty:
            raise ValueError(f"{sweep_dir}: no steps on the {path} path")
        ks[path] = sorted(p["k"].unique().tolist())
        resid = p["duration_s"] - a_kv * p["num_context_tokens"] - a_n[path] * p["num_scheduled_tokens"]
        med = resid.groupby([p["k"], p["B"]]).median()
        cnt = resid.groupby([p["k"], p["B"]]).size()
        missing = [(k, b) for k in ks[path] for b in Bs if (k, b) not in med.index]
        if missing:
            raise ValueError(f"{sweep_dir}: path {path} lacks (k, B) cells {missing}")
        alpha[path] = [[float(med[(k, b)]) for b in Bs] for k in ks[path]]
        counts[path] = [[int(cnt[(k, b)]) for b in Bs] for k in ks[path]]
    if ks["none"] != [0]:
        raise ValueError("the none path must have k = 0 only")
    return EngineCostModel(
        name=name, a_kv_s=a_kv, a_n_s=a_n, ks=ks, batch_sizes=Bs, alpha_s=alpha, prefill_model=prefill_model,
        source=f"fit_engine_cost_model({sweep_dir}): medians per (path, k, B) + within-cell slopes",
        meta={"steps_per_cell": counts, "n_steps": int(len(d))})


def measured_vs_model(ecm: EngineCostModel, sweep_dir) -> pd.DataFrame:
    """Per measured (path, k, B): median measured step and the model at each step's kv / n (ms)."""
    d = decode_steps(sweep_dir)
    rows = []
    for (path, k, B), g in d.groupby(["path", "k", "B"]):
        pred = ecm.step_time(path, np.full(len(g), k), int(B), g["num_context_tokens"], g["num_scheduled_tokens"])
        rows.append({"path": path, "k": int(k), "batch_size": int(B), "steps": len(g),
                     "measured_ms": 1e3 * float(g["duration_s"].median()), "model_ms": 1e3 * float(np.median(pred))})
    return pd.DataFrame(rows)
