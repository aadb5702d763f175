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
  "Model Runner V2 requires Triton", so on the CPU it is checked only against a fake runner). vLLM 0.34
  has only this runner (``gpu_model_runner.py`` removed), for every method: the same call sites, read in
  its source (``execute_model`` lines 2127-2164, ``sample`` 1703-1760, ``sample_tokens`` 2368;
  ``model_state.compute_sample_logits`` calls ``model.compute_logits``); gpu/smoke_034.py checks that
  every phase is hooked there.

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

    sdlib selfcheck --method eagle   # self-check: tiny dummy-weight engine, prints the phases
"""

from __future__ import annotations

import collections
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sdlib.store.schema import STEP_PHASES as PHASES
from sdlib.store.schema import TIMERS

log = logging.getLogger("sdlib.vllm.phase_hooks")


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
        # deferred: torch takes seconds to import, and only this path needs it
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
        if timer not in TIMERS:
            raise ValueError(f"timer: {timer!r} is not one of {sorted(TIMERS)}")
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
            # deferred: torch takes seconds to import, and only this path needs it
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self._clock()

    def _stop(self, phase: str, start: Any, counts: bool) -> None:
        if counts:
            self._calls[phase] += 1
        if self.timer == "cuda_event":
            # deferred: torch takes seconds to import, and only this path needs it
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
            # deferred: torch takes seconds to import, and only this path needs it
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


# --------------------------------------------------------------------------- timers inside the workers
def _w_timers_install(worker: Any, timer: Optional[str]) -> dict[str, Any]:
    runner = worker.model_runner
    t = PhaseTimers(timer or default_timer(runner)).install(runner)
    runner._sdlib_timers = t
    return t.describe()


def _w_timers_reset(worker: Any) -> None:
    worker.model_runner._sdlib_timers.reset()


def _w_timers_collect(worker: Any) -> list[dict[str, Any]]:
    return worker.model_runner._sdlib_timers.collect()


class RemoteTimers:
    """The phase timers installed inside the engine's workers (``llm.collective_rpc``), for engines whose
    model runner lives in other processes (tensor parallel > 1, or the multi-process engine core). Same
    ``reset`` / ``collect`` / ``describe`` as :class:`PhaseTimers`; the numbers are rank 0's (every rank
    runs the same steps). The functions are pickled by reference: the worker processes must import sdlib
    (PYTHONPATH) and the engine needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``."""

    def __init__(self, llm: Any, timer: Optional[str] = None):
        self.llm = llm
        self._describe = llm.collective_rpc(_w_timers_install, args=(timer,))[0]

    def reset(self) -> None:
        self.llm.collective_rpc(_w_timers_reset)

    def collect(self) -> list[dict[str, Any]]:
        return self.llm.collective_rpc(_w_timers_collect)[0]

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "installed": "in the workers (collective_rpc), rank 0's timers"}
