"""Pluggable, linear step-time cost model for speculative decoding (seconds).

A step of a batch costs ``draft + verify + overhead`` where

* target forward (verify, also prefill with ``kv = 0``):
  ``T(kv, n) = a_kv*kv + a_n*n + c``; ``kv`` = tokens in the batch's KV cache,
  ``n`` = tokens the step feeds the target (all requests together);
* EAGLE drafting: ``b_kv*kv + b_n*n_i + d``; ``n_i`` = one request's tokens in the
  step (proposed + 1), as in the authors' simulator;
* n-gram drafting: a fraction of the step's ``T`` (``0.005875*T`` in the authors');
* a fixed per-step overhead (scheduler, sampling, bookkeeping).

:data:`AUTHORS_H100_LLAMA8B` is the authors' fit; :func:`fit_cost_model` fits
``T(kv, n)`` from our measured ``engine_steps`` table; models round-trip through
JSON (:meth:`StepCostModel.save`; :func:`sdlib.sim.costmodels.load_cost_model` reads any kind back) so
fitted ones can live in ``data/costmodels/*.json``.

:class:`StepCostModel` is what the simulator asks of any cost model (this linear one, and
:class:`sdlib.sim.engine_costs.EngineCostModel`, priced per engine path and k): the seconds of a batch of
decode steps, of a no-SD step, of the prefill; it never asks which class it holds.

Usage:
    from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B as cm, fit_cost_model
    cm.step_time("eagle3", kv=8 * 600, n=8 * 4, n_i=4)     # one step, bs 8, k=3, s
    fitted = fit_cost_model(engine_steps_df, name="ours_h200_llama8b"); fitted.save("data/costmodels/ours.json")
    cm.step_seconds(B=8, kv=8 * 600, n_i=4, k=3, eagle=1.0, eagle_n=4, ngram=0.0, path="padded")   # the protocol
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
import pandas as pd

#: drafting methods :meth:`CostModel.draft_time` knows; ``ngram+eagle3`` = both drafters run.
DRAFT_METHODS = ("none", "ngram", "eagle", "eagle3", "ngram+eagle3")


class StepCostModel(ABC):
    """The cost-model protocol: what the simulator (:mod:`sdlib.sim.policy.walk`, :mod:`sdlib.sim.oracle`)
    asks of a cost model, in seconds, vectorised over steps. Every kind implements it; nothing dispatches on
    the class. ``kind`` names the kind in its JSON (``"kind"`` key; absent = ``linear``)."""

    name: str
    kind: ClassVar[str] = ""

    @abstractmethod
    def step_seconds(self, B: int, kv, n_i, k, eagle, eagle_n, ngram, path: str) -> np.ndarray:
        """Decode steps of a batch of ``B`` copies: ``kv`` tokens in the batch's KV cache, ``n_i`` tokens per
        row fed to the target (proposed + 1), ``k`` the engine's draft slots per row, ``eagle`` / ``ngram``
        1.0 where that drafter ran (charged), ``eagle_n`` the tokens EAGLE-3 processed, ``path`` the engine
        path (``padded`` / ``ragged``)."""

    @abstractmethod
    def no_sd_step_seconds(self, B: int, kv) -> np.ndarray:
        """Plain decode steps (one token per row) of a batch of ``B`` copies at ``kv`` KV tokens."""

    @abstractmethod
    def prefill_seconds(self, num_prompt_tokens) -> np.ndarray:
        """The batch's prefill step (``num_prompt_tokens`` over all rows), with whatever a step costs besides."""

    @property
    def catch_up_s(self) -> float:
        """Seconds per token EAGLE-3 re-reads when it drafts after steps it skipped (0: not priced apart)."""
        return 0.0

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable); :func:`sdlib.sim.costmodels.load_cost_model` reads it back."""

    @classmethod
    @abstractmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepCostModel":
        """Inverse of :meth:`to_dict`."""

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON to ``path`` (folders created, atomically)."""
        # deferred: sdlib.store.files loads pandas, and only this path needs it
        from sdlib.store.files import write_json_atomic

        write_json_atomic(self.to_dict(), Path(path))
        return Path(path)

    def replace(self, **changes) -> "StepCostModel":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class CostModel(StepCostModel):
    """Linear step-time model; all coefficients in seconds (per token where it says so)."""

    kind: ClassVar[str] = "linear"

    name: str
    target_kv_s: float  # a_kv: s per token in the batch's KV cache
    target_n_s: float  # a_n: s per token fed to the target in the step
    target_fixed_s: float  # c: s per target forward
    eagle_kv_s: float  # b_kv: s per KV token, EAGLE drafting
    eagle_n_s: float  # b_n: s per token of one request's step (proposed + 1), EAGLE drafting
    eagle_fixed_s: float  # d: s per step, EAGLE drafting
    ngram_frac: float  # n-gram drafting = ngram_frac * T(kv, n)
    overhead_s: float  # per-step overhead, s
    source: str = ""  # where the numbers come from
    meta: dict = field(default_factory=dict, compare=False)  # fit diagnostics etc.

    # ---- the three pieces -------------------------------------------------
    def verify_time(self, kv, n):
        """Target forward time T(kv, n), s; numpy-vectorised over ``kv`` and ``n``."""
        return self.target_kv_s * np.asarray(kv, dtype=float) + self.target_n_s * np.asarray(n, dtype=float) \
            + self.target_fixed_s

    def prefill_time(self, num_prompt_tokens):
        """Prefill of the whole batch = one target forward with an empty KV cache, s."""
        return self.verify_time(0.0, num_prompt_tokens)

    def draft_time(self, method: str, kv, n_i, verify_s=None, n=None):
        """Drafting time of one step, s.

        ``method``: ``eagle``/``eagle3`` (``b_kv*kv + b_n*n_i + d``), ``ngram``
        (``ngram_frac * verify_s``; ``verify_s`` defaults to ``verify_time(kv, n)``),
        ``ngram+eagle3`` (both drafters run), ``none`` (0).
        """
        if method == "none":
            return np.zeros(np.broadcast(np.asarray(kv), np.asarray(n_i)).shape)
        if method in ("eagle", "eagle3"):
            return self.eagle_kv_s * np.asarray(kv, dtype=float) + self.eagle_n_s * np.asarray(n_i, dtype=float) \
                + self.eagle_fixed_s
        if method == "ngram":
            if verify_s is None:
                if n is None:
                    raise ValueError("draft_time('ngram') needs verify_s or n")
                verify_s = self.verify_time(kv, n)
            return self.ngram_frac * np.asarray(verify_s, dtype=float)
        if method == "ngram+eagle3":
            return self.draft_time("eagle3", kv, n_i) + self.draft_time("ngram", kv, n_i, verify_s, n)
        raise ValueError(f"method {method!r} not in {DRAFT_METHODS}")

    def step_time(self, method: str, kv, n, n_i=None):
        """One decode step of the batch: draft + verify + overhead, s.

        ``n`` = tokens fed to the target (all requests), ``n_i`` = one request's
        tokens (defaults to ``n``, i.e. batch size 1).
        """
        n_i = n if n_i is None else n_i
        v = self.verify_time(kv, n)
        return v + self.draft_time(method, kv, n_i, verify_s=v) + self.overhead_s

    # ---- Leviathan's c -----------------------------------------------------
    def draft_cost_ratio(self, method: str, k: int, kv: float = 0.0, batch_size: int = 1) -> float:
        """Leviathan's ``c``: drafting time per drafted token / target forward time.

        Per request at ``batch_size`` copies, ``kv`` = one request's context (tokens);
        the target time is one decode token per request (Leviathan's model ignores
        that verifying ``k+1`` tokens costs more than one).
        """
        kv_b, b = kv * batch_size, batch_size
        t = float(self.verify_time(kv_b, b))
        d = float(self.draft_time(method, kv_b, k + 1, verify_s=t))
        return d / (k * t)

    # ---- the protocol (StepCostModel) ---------------------------------------
    def step_seconds(self, B: int, kv, n_i, k, eagle, eagle_n, ngram, path: str) -> np.ndarray:
        """``T(kv, B*n_i) + overhead + eagle*EAGLE(kv, eagle_n) + ngram*ngram_frac*T`` (as
        :func:`sdlib.sim.policy.walk.request_times`); ``k`` and ``path`` do not enter a linear model."""
        v = self.verify_time(kv, B * np.asarray(n_i, dtype=float))
        t = v + self.overhead_s
        t = t + np.asarray(eagle, dtype=float) * self.draft_time("eagle3", kv, eagle_n)
        return t + np.asarray(ngram, dtype=float) * self.ngram_frac * v

    def no_sd_step_seconds(self, B: int, kv) -> np.ndarray:
        """``T(kv, B) + overhead``."""
        return self.verify_time(kv, B) + self.overhead_s

    def prefill_seconds(self, num_prompt_tokens) -> np.ndarray:
        """:meth:`prefill_time` + the per-step overhead."""
        return self.prefill_time(num_prompt_tokens) + self.overhead_s

    @property
    def catch_up_s(self) -> float:
        """``b_n``: EAGLE drafting's price per token of the request's step."""
        return float(self.eagle_n_s)

    # ---- JSON --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable; no ``kind`` key: linear is the default kind)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CostModel":
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        d = dict(d)
        if d.pop("kind", cls.kind) != cls.kind:
            raise KeyError(f"CostModel: kind {d.get('kind')!r} is not {cls.kind!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - names
        if bad:
            raise KeyError(f"CostModel: unknown keys {sorted(bad)}")
        return cls(**d)


# The authors' fit, Llama-3.1-8B-Instruct on one H100 ("fitted with instructcoder
# bs=1,8,16,32,64"): SpecDecode-Bench/simulator commit 2fdccbd, predictor.py,
# class Llama8BH100 (also quoted in PAPER.md). Their switching overhead is 0.
AUTHORS_H100_LLAMA8B = CostModel(
    name="authors_h100_llama8b",
    target_kv_s=3.92645679e-08,
    target_n_s=2.10103129e-05,
    target_fixed_s=5.88590713e-03,
    eagle_kv_s=2.37768493e-09,
    eagle_n_s=8.41429603e-07,
    eagle_fixed_s=2.13526175e-03,
    ngram_frac=0.005875,
    overhead_s=1.20683946e-03,
    source="SpecDecode-Bench/simulator@2fdccbd predictor.py Llama8BH100 (Llama-3.1-8B-Instruct, H100)",
)

#: Built-in cost models by name (:func:`sdlib.sim.costmodels.load_cost_model` looks names up here first).
COST_MODELS: dict[str, CostModel] = {AUTHORS_H100_LLAMA8B.name: AUTHORS_H100_LLAMA8B}


def _lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef


def robust_lstsq(X: np.ndarray, y: np.ndarray, robust: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Least squares, then (if ``robust`` and >= 10 points) one refit without points whose
    residual lies beyond 5 scaled MADs. Returns (coefficients, mask of points kept)."""
    coef = _lstsq(X, y)
    keep = np.ones(len(y), dtype=bool)
    if robust and len(y) >= 10:
        r = y - X @ coef
        mad = 1.4826 * np.median(np.abs(r - np.median(r)))
        if mad > 1e-9 * float(np.max(np.abs(y))):  # an exact fit's rounding noise is no outlier
            k = np.abs(r - np.median(r)) <= 5 * mad
            if k.sum() >= 3 and not k.all():
                keep = k
                coef = _lstsq(X[keep], y[keep])
    return coef, keep


def fit_diagnostics(X: np.ndarray, y: np.ndarray, coef: np.ndarray, keep: np.ndarray) -> dict[str, Any]:
    """How well ``X @ coef`` fits ``y``, over *all* points and over the robust fit's inliers (``keep``).

    ``r2_all`` / ``rms_residual_all_s``: every step the fit was offered (the number to quote for the
    model); ``r2_inliers`` / ``rms_residual_inliers_s``: only the steps the robust refit kept, with
    ``inlier_share`` = kept / all, so that a high inlier R^2 is never shown without the share it covers.
    """
    def r2(yy, rr):
        ss = float(np.sum((yy - yy.mean()) ** 2))
        return float(1 - np.sum(rr ** 2) / ss) if ss > 0 else float("nan")

    r = y - X @ coef
    n, k = len(y), int(keep.sum())
    return {"n_steps": int(n), "n_inliers": k, "n_dropped": int(n - k),
            "inlier_share": k / n if n else float("nan"),
            "r2_all": r2(y, r), "r2_inliers": r2(y[keep], r[keep]),
            "rms_residual_all_s": float(np.sqrt(np.mean(r ** 2))),
            "rms_residual_inliers_s": float(np.sqrt(np.mean(r[keep] ** 2)))}


def fit_summary(meta: dict[str, Any]) -> str:
    """``R² 0.81 over all 5,479 steps; robust fit on 87% inliers (R² 0.97 there)`` for titles and prints."""
    if "r2_all" not in meta:
        return "fit diagnostics unknown"
    return (f"R² {meta['r2_all']:.3f} over all {meta['n_steps']:,} steps; robust fit on "
            f"{100 * meta['inlier_share']:.0f}% inliers (R² {meta['r2_inliers']:.3f} there)")


def fit_cost_model(engine_steps: pd.DataFrame, name: str, *, n_column: str = "num_new_tokens",
                   tokens_per_request: Optional[float] = None, overhead_s: float = 0.0,
                   base: CostModel = AUTHORS_H100_LLAMA8B, in_window_only: bool = False,
                   robust: bool = True, source: str = "") -> CostModel:
    """Least-squares fit of ``T(kv, n) = a_kv*kv + a_n*n + c`` to measured engine steps.

    ``engine_steps``: our ``engine_steps`` table (sdlib.store.schema): ``duration_s``,
    ``num_context_tokens`` (-> kv), ``num_new_tokens`` and ``num_running``.
    ``n`` = ``engine_steps[n_column]``, or ``num_running * tokens_per_request`` when
    ``tokens_per_request`` is given (an SD run with fixed k: ``k + 1``). Fit no-SD
    steps (``n`` = output tokens = running requests); their duration holds the
    per-step overhead too, so ``c`` absorbs it unless ``overhead_s`` (known, s) is
    given, which is subtracted first and stored. ``robust`` drops points whose
    residual exceeds 5 scaled MADs (prefill steps, hiccups) and refits once.
    Drafting coefficients are copied from ``base`` (they are not fitted here).
    ``meta``: :func:`fit_diagnostics` (R^2 and RMS residual over all steps and over the inliers).
    """
    df = engine_steps
    if in_window_only and "in_window" in df:
        df = df[df["in_window"].fillna(False).astype(bool)]
    kv = df["num_context_tokens"].to_numpy(dtype=float)
    if tokens_per_request is not None:
        n = df["num_running"].to_numpy(dtype=float) * float(tokens_per_request)
    else:
        n = df[n_column].to_numpy(dtype=float)
    y = df["duration_s"].to_numpy(dtype=float) - overhead_s
    ok = np.isfinite(kv) & np.isfinite(n) & np.isfinite(y)
    kv, n, y = kv[ok], n[ok], y[ok]
    if len(y) < 3:
        raise ValueError(f"fit_cost_model: need >= 3 finite steps, got {len(y)}")
    X = np.column_stack([kv, n, np.ones_like(kv)])
    coef, keep = robust_lstsq(X, y, robust)
    meta = {**fit_diagnostics(X, y, coef, keep), "drafting_from": base.name}
    return base.replace(name=name, target_kv_s=float(coef[0]), target_n_s=float(coef[1]),
                        target_fixed_s=float(coef[2]), overhead_s=float(overhead_s),
                        source=source or f"fit_cost_model on {meta['n_steps']} engine steps", meta=meta)
