"""Where a speculative-decoding step spends its time: drafting, verification, rejection sampling, other.

Timing hooks are installed *in-process* on vLLM's model runner (the engine core must live in
this process: set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before building ``vllm.LLM``). Each hook
wraps one runner method on the instance (never the class), so the draft model, which may share
the target's class, is never timed as the target.

Phases and what they bracket, per runner (checked in the sources of vLLM 0.32.0 and 0.26.0):

* V1 runner -- ``vllm/v1/worker/gpu_model_runner.py`` ``GPUModelRunner``, which the CPU build's
  ``CPUModelRunner`` (``cpu_model_runner.py``) subclasses; on 0.26 GPU it runs n-gram and draft model.

  - ``step``   = ``execute_model`` + ``sample_tokens`` (two intervals per engine step, counted once).
  - ``verify`` = ``_model_forward`` (the target forward; under CUDA graphs the graph replay inside
    the wrapper it calls) + ``model.compute_logits`` on the target's logits rows.
  - ``sample`` = ``_sample``: the rejection sampler with SD, the plain sampler without.
  - ``draft``  = ``propose_draft_token_ids``: the proposer (``drafter.propose``: n-gram look-up,
    draft-model or EAGLE forward passes with their own logits and sampling, input preparation).

* V2 runner -- ``vllm/v1/worker/gpu/model_runner.py`` ``GPUModelRunner`` (on 0.26 GPU: EAGLE and
  EAGLE-3, with async scheduling; same call sites in 0.32. The 0.32 CPU build refuses it here:
  "Model Runner V2 requires Triton", so on the CPU it is checked only against a fake runner).

  - ``step``   = ``execute_model`` + ``sample_tokens``.
  - ``verify`` = the target forward, whichever way ``execute_model`` runs it:
    ``cudagraph_manager.run_fullgraph`` (FULL graph replay), ``cudagraph_manager.run_pw_graph``
    (piecewise graphs) or ``model.forward`` (eager; also reached from inside run_pw_graph, counted
    once) + ``model.compute_logits`` (called in ``sample()``).
  - ``sample`` = ``sampler.__call__`` / ``rejection_sampler.__call__`` (plain objects: their class
    is swapped for a one-off subclass on this instance only).
  - ``draft``  = ``speculator.propose``.

``other = step - draft - verify - sample``: input preparation, state updates, book-keeping,
output copies, grammar, and (on a GPU) stream idle inside the step's windows.

Rules that keep the phases disjoint: ``draft``/``verify``/``sample`` are timed only inside a
``step`` call and only at the outermost level (a phase hook reached while another phase runs is
not timed again), so ``draft + verify + sample <= step``. Calls during CUDA-graph capture are
passed through untimed.

Timers. On a CUDA device each call is bracketed by two CUDA events recorded on the current
stream; ``elapsed_time`` is read only when events have completed (polled with the non-blocking
``query()`` at later calls, or synchronised in ``collect()``), so no synchronisation is added to
the step. A phase's time is then *GPU stream time* between its two events: its kernels, graph
replays, and any stream idle while the CPU prepares them (e.g. a CPU n-gram look-up shows as the
stall it causes on the stream). With async scheduling the events still measure the enqueued
work. On the CPU each call is timed with ``time.perf_counter`` (wall time).

A phase that cannot be hooked is reported as missing (``total_s`` NaN) and never raises; the
draft phase of a run without SD is 0 by construction.

Usage:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # before vllm.LLM(...)
    timers = install_phase_timers(llm)
    timers.reset(); ...drive llm.llm_engine...; rows = timers.collect()
    bt = breakdown_table(read_step_phases("data/sweeps/embedded_default"), store.read("runs"))

    python -m sdlib.breakdown --method eagle   # self-check: tiny dummy-weight engine, prints the phases
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd

log = logging.getLogger("sdlib.breakdown")

PHASES = ("draft", "verify", "sample", "step")
#: Shares in :func:`breakdown_table`, in stacking order (bottom to top).
SHARE_PHASES = ("draft", "verify", "sample", "other")
#: Timer kinds in the ``timer`` column, and how to say them in a figure.
TIMER_LABELS = {"cuda_event": "GPU time (CUDA events)", "perf_counter": "CPU wall time"}
#: Columns of the ``step_phases`` table (one row per run and phase).
STEP_PHASES_COLUMNS = ("run_id", "phase", "calls", "total_s", "timer")


@dataclass(frozen=True)
class Hook:
    """One wrapped method: ``<runner>.<path>.<attr>`` timed as ``phase``.

    ``path`` is a dotted attribute path from the runner ("" = the runner). ``attr == "__call__"``
    times calls of the object itself. ``counts``: whether a call adds to the phase's ``calls``.
    ``optional``: a missing target is expected in some configurations (e.g. no CUDA-graph
    manager under ``enforce_eager``) and is not reported.
    """

    phase: str
    path: str
    attr: str
    counts: bool = True
    optional: bool = False


#: Which methods are hooked on each runner kind (see the module docstring).
RUNNER_HOOKS: dict[str, tuple[Hook, ...]] = {
    "v1": (
        Hook("step", "", "execute_model"),
        Hook("step", "", "sample_tokens", counts=False),
        Hook("verify", "", "_model_forward"),
        Hook("verify", "model", "compute_logits", counts=False),
        Hook("sample", "", "_sample"),
        Hook("draft", "", "propose_draft_token_ids"),
    ),
    "v2": (
        Hook("step", "", "execute_model"),
        Hook("step", "", "sample_tokens", counts=False),
        Hook("verify", "cudagraph_manager", "run_fullgraph", optional=True),
        Hook("verify", "cudagraph_manager", "run_pw_graph", optional=True),
        Hook("verify", "model", "forward"),
        Hook("verify", "model", "compute_logits", counts=False),
        Hook("sample", "sampler", "__call__"),
        Hook("sample", "rejection_sampler", "__call__", optional=True),
        Hook("draft", "speculator", "propose"),
    ),
}

#: Module of the class that marks each runner kind (searched along the runner's MRO).
RUNNER_MODULES = {"vllm.v1.worker.gpu.model_runner": "v2", "vllm.v1.worker.gpu_model_runner": "v1"}

#: Attribute chain from ``vllm.LLM`` to the model runner (same in 0.26 and 0.32, single process):
#: LLM.llm_engine -> LLMEngine.engine_core (InprocClient) -> .engine_core (EngineCore)
#: -> .model_executor (UniProcExecutor) -> .driver_worker (WorkerWrapperBase) -> .worker -> .model_runner
RUNNER_CHAIN = ("llm_engine", "engine_core", "engine_core", "model_executor", "driver_worker", "worker",
                "model_runner")


def find_model_runner(obj: Any) -> Any:
    """The model runner behind ``obj`` (an ``LLM``, ``LLMEngine``, executor, worker, or the runner).

    Returns None when the chain ends elsewhere (e.g. the engine core runs in another process).
    """
    cur = obj
    for name in RUNNER_CHAIN:
        if _looks_like_runner(cur):
            return cur
        nxt = getattr(cur, name, None)
        if nxt is not None:
            cur = nxt
    return cur if _looks_like_runner(cur) else None


def _looks_like_runner(x: Any) -> bool:
    return (x is not None and not any(hasattr(x, n) for n in RUNNER_CHAIN)
            and callable(getattr(x, "execute_model", None)) and callable(getattr(x, "sample_tokens", None)))


def runner_kind(runner: Any) -> Optional[str]:
    """``"v1"`` or ``"v2"`` from the runner's class hierarchy (duck-typed as a fallback)."""
    for cls in type(runner).__mro__:
        kind = RUNNER_MODULES.get(getattr(cls, "__module__", ""))
        if kind:
            return kind
    if hasattr(runner, "propose_draft_token_ids") or hasattr(runner, "_model_forward"):
        return "v1"
    if hasattr(runner, "speculator") or hasattr(runner, "cudagraph_manager"):
        return "v2"
    return None


def _resolve(root: Any, path: str) -> Any:
    obj = root
    for part in [p for p in path.split(".") if p]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _never() -> bool:
    return False


def _capture_check() -> Callable[[], bool]:
    """``torch.cuda.is_current_stream_capturing`` (no timing inside a CUDA-graph capture)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.is_current_stream_capturing
    except Exception:  # noqa: BLE001
        pass
    return _never


class PhaseTimers:
    """Accumulates time per phase from wrapped runner methods; see the module docstring.

    ``timer``: ``"perf_counter"`` (CPU wall time) or ``"cuda_event"`` (GPU stream time).
    ``clock``: the perf_counter clock (tests pass a fake one).
    """

    def __init__(self, timer: str = "perf_counter", clock: Callable[[], float] = time.perf_counter):
        if timer not in TIMER_LABELS:
            raise ValueError(f"timer: {timer!r} is not one of {sorted(TIMER_LABELS)}")
        self.timer = timer
        self._clock = clock
        self._capturing = _capture_check() if timer == "cuda_event" else _never
        self.runner_class: str = ""
        self.runner_kind: Optional[str] = None
        self.hooked: dict[str, list[str]] = {p: [] for p in PHASES}
        self.missing: dict[str, str] = {}  # phase -> why it could not be hooked
        self.not_applicable: set[str] = set()  # phases that are 0 by construction (draft without SD)
        self.failures: list[str] = []  # hooks that failed (phase still hooked through another)
        self._undo: list[Callable[[], None]] = []
        self._in_step = False
        self._inner: Optional[str] = None
        self.reset()

    # accounting --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything timed so far (pending CUDA events are dropped, not waited for)."""
        self._total = {p: 0.0 for p in PHASES}
        self._calls = {p: 0 for p in PHASES}
        self._pending: dict[str, collections.deque] = {p: collections.deque() for p in PHASES}

    def _start(self) -> Any:
        if self.timer == "cuda_event":
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self._clock()

    def _stop(self, phase: str, start: Any, counts: bool) -> None:
        if counts:
            self._calls[phase] += 1
        if self.timer == "cuda_event":
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            q = self._pending[phase]
            q.append((start, end))
            self._drain(phase, limit=4)
        else:
            self._total[phase] += self._clock() - start

    def _drain(self, phase: str, limit: Optional[int] = None) -> None:
        """Fold completed event pairs into the totals; ``limit=None`` waits for all of them."""
        q = self._pending[phase]
        n = 0
        while q and (limit is None or n < limit):
            start, end = q[0]
            if limit is None:
                end.synchronize()
            elif not end.query():
                break
            q.popleft()
            self._total[phase] += start.elapsed_time(end) / 1000.0
            n += 1

    def collect(self) -> list[dict[str, Any]]:
        """Totals since the last :meth:`reset`: one dict per phase (draft, verify, sample, step).

        ``calls``: timed calls of the phase's counting method (step: ``execute_model`` calls);
        ``total_s``: seconds (NaN for a phase that could not be hooked); ``timer``: the timer kind.
        """
        rows = []
        for p in PHASES:
            if self.timer == "cuda_event":
                self._drain(p)
            total = float("nan") if p in self.missing else float(self._total[p])
            rows.append({"phase": p, "calls": int(self._calls[p]), "total_s": total, "timer": self.timer})
        return rows

    def describe(self) -> dict[str, Any]:
        """What was hooked, for provenance: runner class and kind, timer, methods per phase, gaps."""
        return {"runner_class": self.runner_class, "runner_kind": self.runner_kind, "timer": self.timer,
                "hooked": {p: list(v) for p, v in self.hooked.items()}, "missing": dict(self.missing),
                "not_applicable": sorted(self.not_applicable), "failures": list(self.failures)}

    # wrapping ----------------------------------------------------------------------------------
    def _timed(self, phase: str, fn: Callable, counts: bool) -> Callable:
        timers = self

        def run_timed(args, kwargs):
            start = timers._start()
            out = fn(*args, **kwargs)
            timers._stop(phase, start, counts)
            return out

        def timed(*args, **kwargs):
            if phase == "step":
                if timers._in_step:
                    return fn(*args, **kwargs)
                timers._in_step = True
                try:
                    return fn(*args, **kwargs) if timers._capturing() else run_timed(args, kwargs)
                finally:
                    timers._in_step = False
            if not timers._in_step or timers._inner is not None or timers._capturing():
                return fn(*args, **kwargs)
            timers._inner = phase
            try:
                return run_timed(args, kwargs)
            finally:
                timers._inner = None

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        timed.__name__ = getattr(fn, "__name__", "timed")
        return timed

    def _wrap_method(self, obj: Any, attr: str, phase: str, counts: bool) -> None:
        orig = getattr(obj, attr)  # bound method (raises AttributeError when absent)
        if not callable(orig):
            raise TypeError(f"{attr} is not callable")
        had_own = attr in getattr(obj, "__dict__", {})
        own = obj.__dict__[attr] if had_own else None
        object.__setattr__(obj, attr, self._timed(phase, orig, counts))

        def undo():
            if had_own:
                object.__setattr__(obj, attr, own)
            else:
                try:
                    object.__delattr__(obj, attr)
                except AttributeError:
                    pass

        self._undo.append(undo)

    def _wrap_call(self, obj: Any, phase: str, counts: bool) -> None:
        """Time ``obj(...)``: swap the instance's class for a subclass whose ``__call__`` is timed."""
        cls = type(obj)
        if not any("__call__" in vars(c) for c in cls.__mro__[:-1]):
            raise TypeError(f"{cls.__name__} is not callable")
        base_call = cls.__call__
        sub = type(f"Timed{cls.__name__}", (cls,), {"__call__": self._timed(phase, base_call, counts),
                                                     "__slots__": (), "__module__": cls.__module__})
        obj.__class__ = sub

        def undo():
            if type(obj) is sub:
                obj.__class__ = cls

        self._undo.append(undo)

    def install(self, runner: Any, kind: Optional[str] = None) -> "PhaseTimers":
        """Wrap the runner's methods listed in :data:`RUNNER_HOOKS` for ``kind`` (default: detected)."""
        self.runner_class = f"{type(runner).__module__}.{type(runner).__qualname__}"
        self.runner_kind = kind or runner_kind(runner)
        hooks = RUNNER_HOOKS.get(self.runner_kind or "", ())
        if not hooks:
            for p in PHASES:
                self.missing[p] = f"unknown model runner {self.runner_class}"
            return self
        no_sd = getattr(runner, "speculative_config", "unknown") is None
        for h in hooks:
            name = ".".join(x for x in (h.path, h.attr) if x)
            try:
                obj = _resolve(runner, h.path)
                if obj is None:
                    raise AttributeError(f"runner has no {h.path!r}")
                if h.attr == "__call__":
                    self._wrap_call(obj, h.phase, h.counts)
                else:
                    self._wrap_method(obj, h.attr, h.phase, h.counts)
                self.hooked[h.phase].append(name)
            except Exception as err:  # noqa: BLE001 - fail soft
                if not h.optional:
                    self.failures.append(f"{h.phase}: {name}: {type(err).__name__}: {err}")
        for p in PHASES:
            if self.hooked[p]:
                continue
            if p == "draft" and no_sd:
                self.not_applicable.add(p)
                self.failures = [f for f in self.failures if not f.startswith("draft:")]
            else:
                why = "; ".join(f for f in self.failures if f.startswith(p + ":")) or "no hook for this runner"
                self.missing[p] = why
        if self.missing:
            log.warning("phase timers: could not hook %s on %s", self.missing, self.runner_class)
        return self

    def uninstall(self) -> None:
        """Restore every wrapped method (last wrapped first)."""
        while self._undo:
            self._undo.pop()()


def default_timer(runner: Any) -> str:
    """``cuda_event`` when the runner's device is a CUDA device, else ``perf_counter``."""
    dev = getattr(runner, "device", None)
    if getattr(dev, "type", str(dev)) == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                return "cuda_event"
        except Exception:  # noqa: BLE001
            pass
    return "perf_counter"


def install_phase_timers(llm: Any, timer: Optional[str] = None, kind: Optional[str] = None) -> PhaseTimers:
    """Hook the phase timers into ``llm`` (a ``vllm.LLM``, its engine, or a model runner).

    Never raises for a vLLM it does not know: phases it cannot reach are reported as missing
    (every phase, if the engine core runs in another process -- set
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before building the ``LLM``).
    """
    runner = find_model_runner(llm)
    if runner is None:
        t = PhaseTimers(timer or "perf_counter")
        mp = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        why = ("model runner not reachable in this process"
               + (" (VLLM_ENABLE_V1_MULTIPROCESSING is not 0)" if mp != "0" else ""))
        t.missing = {p: why for p in PHASES}
        t.runner_class = type(llm).__name__
        log.warning("phase timers: %s", why)
        return t
    return PhaseTimers(timer or default_timer(runner)).install(runner, kind)


# tables ------------------------------------------------------------------------------------------
def phases_frame(run_id: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One cell's :meth:`PhaseTimers.collect` rows as a ``step_phases`` frame (typed)."""
    df = pd.DataFrame(rows, columns=list(STEP_PHASES_COLUMNS[1:]))
    df.insert(0, "run_id", run_id)
    return _typed(df)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    types = {"run_id": "string", "phase": "string", "calls": "Int64", "total_s": "float64", "timer": "string"}
    return df.astype(types)[list(STEP_PHASES_COLUMNS)].reset_index(drop=True)


def empty_step_phases() -> pd.DataFrame:
    return _typed(pd.DataFrame({c: pd.Series(dtype="object") for c in STEP_PHASES_COLUMNS}))


def read_step_phases(sweep_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """``<sweep_dir>/step_phases`` (a folder of per-cell parquet files); empty, typed, if missing."""
    from sdlib.paths import resolve

    d = resolve(sweep_dir) / "step_phases"
    if not d.exists() or (d.is_dir() and not any(d.glob("*.parquet"))):
        return empty_step_phases()
    return _typed(pd.read_parquet(d))


RUN_META = ["sweep", "model", "method", "method_label", "num_spec_tokens", "dataset", "batch_size", "batch_mode",
            "repeat"]


def breakdown_table(phases_df: pd.DataFrame, runs_df: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Per run: seconds and share of step time of draft, verify, sample and other.

    Definition (per run = one sweep cell, warm-up excluded): ``step_s`` = total time inside the
    runner's ``execute_model`` + ``sample_tokens`` calls; ``draft_s``, ``verify_s``, ``sample_s`` =
    total time inside the phase hooks (disjoint, nested in the step windows);
    ``other_s = step_s - draft_s - verify_s - sample_s``; ``share_<p> = <p>_s / step_s`` (the four
    shares sum to 1). A phase that was not hooked (NaN) makes ``other`` and its own share NaN.
    ``num_steps`` = ``execute_model`` calls; ``step_ms`` = mean step time, ms. The time the engine
    spends outside the runner (scheduler, output processing) is not in ``step_s``.
    ``runs_df`` (optional) adds the run's model, method, dataset, batch size, ... columns.
    """
    cols = ["run_id", "timer", "num_steps", "step_s"] + [f"{p}_s" for p in SHARE_PHASES] + \
        [f"share_{p}" for p in SHARE_PHASES] + ["step_ms"]
    if phases_df is None or phases_df.empty:
        meta = [c for c in RUN_META if runs_df is not None and c in runs_df.columns]
        return pd.DataFrame(columns=cols[:1] + meta + cols[1:])
    p = phases_df.copy()
    p["total_s"] = p["total_s"].astype("float64")
    tot = p.groupby(["run_id", "phase"])["total_s"].sum(min_count=1).unstack("phase")
    tot = tot.reindex(columns=list(PHASES))  # sum(min_count=1): a NaN (unhooked) phase stays NaN
    out = pd.DataFrame(index=tot.index)
    step_rows = p[p["phase"] == "step"].drop_duplicates("run_id").set_index("run_id")
    out["timer"] = p.drop_duplicates("run_id").set_index("run_id")["timer"].reindex(out.index)
    out["num_steps"] = step_rows["calls"].reindex(out.index).astype("Int64")
    out["step_s"] = tot["step"]
    for ph in ("draft", "verify", "sample"):
        out[f"{ph}_s"] = tot[ph]
    out["other_s"] = out["step_s"] - out["draft_s"] - out["verify_s"] - out["sample_s"]
    denom = out["step_s"].where(out["step_s"] > 0)
    for ph in SHARE_PHASES:
        out[f"share_{ph}"] = out[f"{ph}_s"] / denom
    out["step_ms"] = 1000.0 * out["step_s"] / out["num_steps"].astype("float64").where(out["num_steps"] > 0)
    out = out.reset_index()
    if runs_df is not None and not runs_df.empty:
        meta = [c for c in RUN_META if c in runs_df.columns]
        out = runs_df[["run_id"] + meta].merge(out, on="run_id", how="right")
    else:
        meta = []
    out["run_id"] = out["run_id"].astype("string")
    return out[["run_id"] + meta + cols[1:]].reset_index(drop=True)


def pooled_shares(bt: pd.DataFrame, by: tuple[str, ...] = ("model", "method_label", "batch_size")) -> pd.DataFrame:
    """Shares pooled over the runs of each group: sum of a phase's seconds / sum of step seconds.

    Pooling weights each run by its step time (not a mean of per-run ratios), so the shares of a
    group still sum to 1. Adds ``runs`` (runs pooled), ``num_steps`` and ``step_ms`` (mean step).
    """
    by = [c for c in by if c in bt.columns]
    secs = ["step_s"] + [f"{p}_s" for p in SHARE_PHASES]
    if bt.empty:
        return pd.DataFrame(columns=by + ["timer", "runs", "num_steps"] + secs +
                            [f"share_{p}" for p in SHARE_PHASES] + ["step_ms"])
    d = bt.copy()
    d["num_steps"] = d["num_steps"].astype("float64")
    g = d.groupby(by, dropna=False)
    out = g[secs].sum(min_count=1)
    nan_any = g[secs].apply(lambda x: x.isna().any())  # a missing phase in any run -> NaN
    out = out.mask(nan_any)
    out["runs"] = g.size()
    out["num_steps"] = g["num_steps"].sum()
    out["timer"] = g["timer"].agg(lambda s: ",".join(sorted(set(map(str, s.dropna())))))
    for ph in SHARE_PHASES:
        out[f"share_{ph}"] = out[f"{ph}_s"] / out["step_s"].where(out["step_s"] > 0)
    out["step_ms"] = 1000.0 * out["step_s"] / out["num_steps"].where(out["num_steps"] > 0)
    out = out.reset_index()
    return out[by + ["timer", "runs", "num_steps"] + secs + [f"share_{p}" for p in SHARE_PHASES] + ["step_ms"]]


def timer_label(timers: pd.Series | list[str] | str) -> str:
    """How the timer kind(s) read in a title: ``GPU time (CUDA events)`` / ``CPU wall time``."""
    kinds = [timers] if isinstance(timers, str) else sorted({str(t) for t in timers if pd.notna(t)})
    return " + ".join(TIMER_LABELS.get(k, k) for k in kinds) or "timer unknown"


# figure ------------------------------------------------------------------------------------------
#: Colours of the stacked phases (bottom to top: draft, verify, sample, other).
PHASE_COLORS = {"draft": "#dd8452", "verify": "#4c72b0", "sample": "#c44e52", "other": "#b8b8b8"}
METHOD_ORDER = ("none", "ngram", "draft_model", "eagle", "eagle3", "mtp")


def _method_sort_key(label: str, method: str) -> tuple:
    m = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)
    return (m, label)


def plot_phase_shares(pooled: pd.DataFrame, title: str, row: str = "model", col: str = "method_label",
                      annotate_min: float = 0.06):
    """Stacked bars of phase shares (paper Fig. 4 form): a panel per ``col`` value (method), a row
    per ``row`` value (model; a list of columns joins them), one bar per batch size; shares >=
    ``annotate_min`` are written on the bar and the mean step time (ms) under each bar."""
    from sdlib.figures import new_figure

    d = pooled.copy()
    if isinstance(row, (list, tuple)):  # several columns -> one row label "a / b"
        cols_ = [c for c in row if c in d.columns]
        d["_row"] = d[cols_].astype(str).agg(" / ".join, axis=1) if cols_ else None
        row = "_row"
    meth = d.drop_duplicates(col).set_index(col)["method"] if "method" in d.columns else pd.Series(dtype=str)
    cols = sorted(d[col].dropna().unique(), key=lambda c: _method_sort_key(str(c), str(meth.get(c, ""))))
    rows = sorted(d[row].dropna().unique()) if row in d.columns else [None]
    n_bs = max(d["batch_size"].nunique(), 1)
    fig, axes = new_figure(len(rows), max(len(cols), 1), width=max(2.6, 0.55 * n_bs + 0.9), height=3.6, sharey=True)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            ax = axes[i][j]
            s = d[(d[col] == c) & ((d[row] == r) if r is not None else True)].sort_values("batch_size")
            x = np.arange(len(s))
            bottom = np.zeros(len(s))
            for ph in SHARE_PHASES:
                v = s[f"share_{ph}"].to_numpy(dtype=float)
                v = np.nan_to_num(v, nan=0.0)
                ax.bar(x, v, bottom=bottom, color=PHASE_COLORS[ph], width=0.7, edgecolor="white", linewidth=0.5,
                       label=ph if (i, j) == (0, 0) else None)
                for xi, (b, h) in enumerate(zip(bottom, v)):
                    if h >= annotate_min:
                        ax.text(xi, b + h / 2, f"{100 * h:.0f}%", ha="center", va="center", fontsize=8,
                                color="white" if ph in ("verify", "sample") else "black")
                bottom += v
            labels = [f"{int(b)}\n{ms:.0f} ms" if np.isfinite(ms) else f"{int(b)}"
                      for b, ms in zip(s["batch_size"], s["step_ms"].astype(float))]
            ax.set_xticks(x, labels, fontsize=8)
            ax.set_ylim(0, 1.0)
            ax.set_title(str(c) if r is None or len(rows) == 1 else f"{r}\n{c}", fontsize=10)
            ax.grid(axis="x", visible=False)
        axes[i][0].set_ylabel("share of step time")
        axes[i][0].yaxis.set_major_formatter(lambda v, _: f"{100 * v:.0f}%")
    fig.supxlabel("batch size (mean step time)", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.0, 0.9), frameon=False,
               title="phase")
    fig.suptitle(title, fontsize=10)
    return fig


# self-check ---------------------------------------------------------------------------------------
_TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "vocab_size": 4096, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu",
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1}
#: Dummy-weight drafters for the self-check (head_dim 64 runs on the CPU build and FA3).
_DRAFTERS = {
    "draft_model": dict(_TINY, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1),
    "eagle": dict(_TINY, num_hidden_layers=1, architectures=["EagleLlamaForCausalLM"]),
    "eagle3": dict(_TINY, num_hidden_layers=1, architectures=["LlamaForCausalLMEagle3"],
                   eagle_aux_hidden_state_layer_ids=[1, 2, 3], target_hidden_size=256),
}


def self_check(method: str = "draft_model", k: int = 3, num_prompts: int = 4, max_tokens: int = 24,
               enforce_eager: Optional[bool] = None) -> dict[str, Any]:
    """Build a tiny dummy-weight engine *in this process*, time a few requests, return what was seen.

    ``method``: none, ngram, draft_model, eagle or eagle3. On a GPU CUDA graphs stay on (unless
    ``enforce_eager``), so the graph-replay paths are the ones timed. Returns ``{"rows": collect(),
    "describe": describe(), "tokens": output tokens, "device": ...}``.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams

    gpu = torch.cuda.is_available()
    tmp = tempfile.mkdtemp(prefix="sdlib-breakdown-")
    paths = {}
    for name, cfg in (("target", _TINY), *(_DRAFTERS.items())):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        paths[name] = d
    spec = None
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    elif method in _DRAFTERS:
        spec = {"method": method, "model": paths[method], "num_speculative_tokens": k}
    elif method != "none":
        raise ValueError(f"method: {method!r} is not one of none, ngram, {', '.join(_DRAFTERS)}")
    kw: dict[str, Any] = dict(model=paths["target"], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                              max_model_len=1024, max_num_seqs=max(num_prompts, 1), seed=0,
                              gpu_memory_utilization=0.3 if gpu else 0.2,
                              enforce_eager=(not gpu) if enforce_eager is None else enforce_eager)
    if spec:
        kw["speculative_config"] = spec
    llm = LLM(**kw)
    timers = install_phase_timers(llm)
    prompts = [{"prompt_token_ids": [5 + (i * 7 + j) % 50 for j in range(32 + 8 * i)]} for i in range(num_prompts)]
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], sp, use_tqdm=False)  # warm-up, not timed
    timers.reset()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    return {"rows": timers.collect(), "describe": timers.describe(),
            "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "device": torch.cuda.get_device_name(0) if gpu else "cpu"}


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m sdlib.breakdown [--method M] [--eager]``: print a ``RESULT {json}`` line."""
    import argparse

    ap = argparse.ArgumentParser(description="Self-check of the phase timers on a tiny dummy-weight engine.")
    ap.add_argument("--method", default="draft_model", help="none, ngram, draft_model, eagle, eagle3")
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
    a = ap.parse_args(argv)
    res = self_check(a.method, enforce_eager=True if a.eager else None)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
