"""GPU-time planner: what each cell and engine start of a sweep costs, which comparison blocks fit a budget.

A cell's estimate (seconds) comes from the engine cost model (:mod:`sdlib.sim.engine_costs`: ``step_time``,
``prefill_time``) and the cell's engine steps, which are known before it runs::

    cell = s_m * sum_r w_r * [ prefill(b * P_r) + sum_j step(path, K, b, kv = b * (P_r + pos_rj),
                                                             n = b * (1 + d_rj)) ]  +  cell_overhead

* requests ``r``: paper mode (``batch_mode: paper``): each prompt of the workload is one batch of ``b = B``
  copies, ``w_r = 1``; closed loop: ``num_requests`` requests (the workload's prompts cycled), ``b = min(B, n)``
  in flight, ``w_r = 1 / b`` (a step serves ``b`` requests);
* ``P_r``: the prompt's tokens (trace workloads, ``source: reference | traces``: the prompts themselves;
  other sources: ``max_prompt_tokens``, else :data:`DEFAULT_PROMPT_TOKENS`); outputs ``O_r`` of
  ``max_output_tokens`` (a trace prompt's recorded length where shorter; an upper bound without
  ``ignore_eos``);
* steps ``j`` with output position ``pos_rj`` and tokens drafted ``d_rj``: for a trace-replay cell the exact
  plan (:func:`sdlib.sim.replay.replay_plans`, the very steps the engine will take); otherwise
  ``ceil((O_r - 1) / tau)`` steps at ``pos = 1 + j * tau`` drafting ``K``, with ``tau`` tokens per step: 1 without
  SD, ``synthetic_acceptance_length`` (or ``1 + sum(synthetic_acceptance_rates)``) where the method's options
  set it, else :data:`DEFAULT_TOKENS_PER_STEP` (1: never fewer steps than no SD, so the estimate is high);
* ``path`` and ``K``: the method's engine path (:attr:`sdlib.core.registry.MethodSpec.path`; SD methods without
  a fitted path, e.g. a draft model, are priced on the ``padded`` path, which leaves out the draft model's own
  forward passes) and its ``num_spec_tokens`` (``K = 0`` without SD);
* ``s_m``: the scale of the model on the device, the median of measured / modelled seconds over committed cells
  of the same shape, tensor-parallel size and device, matched by method, batch mode and batch size in the order
  :meth:`Calibration.scale` gives; 1 where the shape was never measured there (priced as the cost model's shape).
  The batch size counts because the cost model's error on another device is not one factor: on the H100 the
  headline's bs 1 cells' ratio lies below its bs 32 and 128 cells', so a pooled median over-priced bs 1.

The warm-up (``warmup_requests`` requests run before a cell) is priced by the same formula, closed loop, at
``b = min(B, warmup_requests)`` (with a config's ``warmup_tokens``: a full batch of ``max(warmup_requests, B)``
requests of that many tokens): once per (engine start, batch size) with ``warmup_scope: batch_size``, before
every cell otherwise. An engine group (:attr:`sdlib.config.Cell.group`: one engine start) costs::

    group = engine_start(class) + process_overhead + sum of its warm-ups + sum of its cells

``engine_start``: the median ``engine_start_s`` of the committed sweeps' provenance for the device, vLLM version,
model shape, method and start class (``first``: the run's first engine; ``new_kind``: the first engine of its
(model, method) in the run, which compiles its graphs; ``again``: later ones), dropping model, method and vLLM
version in that order where nothing matches, and :data:`DEFAULT_ENGINE_START_S` for a device never seen.
``process_overhead`` (process start, ``import vllm``, shut-down) and ``cell_overhead`` (plans, tables, Triton
compilation in a first batch) are fitted by least squares to the committed invocations' wall time left over
after their measured engine starts, measured cells and modelled warm-ups (:func:`calibrate`).

A budget (:func:`select_blocks`) is spent in whole comparison blocks: (model, dataset, batch size) with every
arm of the config there (every method and replay, the no-SD baseline, A/A twins) on every engine start, so a
budget that runs out leaves complete comparisons. Blocks go in priority order (the config's order of datasets,
then batch sizes; ``priority="bs"``: batch sizes first; or a list of datasets / batch sizes / ``dataset:bs``);
a block is added when the total still fits: its cells plus the engine starts (and warm-ups) it needs that the
blocks already taken do not, each engine start counted once. Cells already in the results folder cost nothing
(a resumed sweep skips them).

A block that alone exceeds the budget could never run whole, so it is taken in **parts** (:func:`block_parts`):
one engine start of every arm, ``(model, dataset, batch size, start)``, and where one start alone still exceeds
the budget, one (engine start, repeat) of every arm, ``(..., start, repeat)``. A part holds every arm of the
block at that start (and repeat), the no-SD baseline and the A/A twin included, so its comparisons are complete
and paired within it; a budget cut short leaves whole parts. The parts of one block then run on different
machines: the powered analysis's clusters are (engine start, repeat) (:mod:`sdlib.analysis.powered`), so a
machine's own variance enters the interval as an engine start's does. A block that fits alone is never split.

Usage:
    sdlib plan configs/h200_online.yaml --from-scratch             # every cell's estimate, per engine and block
    sdlib plan configs/h200_replay.yaml --gpu-minutes 20           # the blocks that fit in 20 GPU-minutes
    sdlib sweep configs/h200_replay.yaml --plan-minutes 20         # run exactly those (done cells skipped)
    from sdlib.run.budget import estimate_sweep
    est = estimate_sweep(load_sweep("configs/h200_online.yaml")); est.groups, est.cells   # DataFrames (s)
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.config import Cell, ConfigError, SweepConfig, WorkloadConfig, in_blocks, parse_sweep
from sdlib.core.registry import DRAFTERS, method_spec, replay_ref
from sdlib.paths import SWEEPS_DIR, resolve
from sdlib.run.plan import done_in_whole_parts

#: Tokens per step of an SD cell whose acceptance is not known before it runs (no replay plan, no synthetic
#: acceptance): 1, as without SD, so the estimate errs high.
DEFAULT_TOKENS_PER_STEP = 1.0
#: Prompt tokens of a workload whose prompts are not read here (not a trace source) and that sets no
#: ``max_prompt_tokens``.
DEFAULT_PROMPT_TOKENS = 256
#: Engine start-up seconds per start class on a device the committed provenance never saw.
DEFAULT_ENGINE_START_S = {"first": 120.0, "new_kind": 90.0, "again": 45.0}
#: Seconds per engine process (start, ``import vllm``, shut-down) and per cell when no invocation is recorded.
DEFAULT_PROCESS_OVERHEAD_S = 20.0
DEFAULT_CELL_OVERHEAD_S = 1.0
#: The device a plan is for unless told otherwise (the committed engine cost model's).
DEFAULT_DEVICE = "NVIDIA H200"
START_CLASSES = ("first", "new_kind", "again")
_ALL = 100_000  # "every prompt" of a trace workload (the largest num_requests a config may ask)
START_COLUMNS = ["device", "vllm_version", "model", "method", "start_class", "engine_start_s", "sweep"]
RATIO_COLUMNS = ["model", "device", "method", "batch_mode", "batch_size", "ratio", "sweep"]


def load_cost_model(name_or_path=None):
    """The engine cost model a plan prices steps with: a name, a path or a model (default: the committed fit).
    The one place this module loads a cost model."""
    # deferred: sdlib.sim.engine_costs loads pandas, and only this path needs it
    from sdlib.sim import engine_costs

    spec = name_or_path or engine_costs.ENGINE_COST_MODEL_FILE
    try:  # the one loader of every cost model kind, where it exists (sdlib.sim.costmodels)
        # deferred: sdlib.sim.costmodels loads pandas, and only this path needs it
        from sdlib.sim.costmodels import load_cost_model as load
    except ImportError:
        load = engine_costs.load_any_cost_model
    return load(spec)


def model_key(model) -> str:
    """What a model's costs depend on: its shape (path) and tensor-parallel size."""
    return f"{model.path}|tp{model.tensor_parallel_size}"


# --------------------------------------------------------------------------- calibration
@dataclass
class Calibration:
    """What the cost model does not price, from the committed sweeps' provenance (:func:`calibrate`).

    ``starts``: one row per recorded engine start (device, vllm_version, model (:func:`model_key`), method
    (registry name), start_class, engine_start_s, sweep). ``ratios``: one row per measured cell (model, device,
    method, batch_mode, batch_size, ratio = measured wall / modelled window seconds, sweep).
    """

    starts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=START_COLUMNS))
    process_overhead_s: float = DEFAULT_PROCESS_OVERHEAD_S
    cell_overhead_s: float = DEFAULT_CELL_OVERHEAD_S
    ratios: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=RATIO_COLUMNS))
    source: str = "defaults"
    _scale_cache: dict = field(default_factory=dict, repr=False, compare=False)

    def engine_start_s(self, model: str, method: str, start_class: str, device: str = DEFAULT_DEVICE,
                       vllm_version: Optional[str] = None) -> tuple[float, str]:
        """Median recorded start-up (s) and what it matched (``vllm/model/method``, ``*`` where a field was
        dropped, ``default`` for :data:`DEFAULT_ENGINE_START_S`); a ``first`` start pools every method."""
        s = self.starts
        s = s[(s["device"] == device) & (s["start_class"] == start_class)] if len(s) else s
        want = {"vllm_version": vllm_version, "model": model, "method": method}
        drops = [(), ("model",), ("model", "method"), ("model", "method", "vllm_version")]
        if start_class == "first":  # a machine's first engine: cold whatever its method
            drops = [("method",), ("model", "method"), ("model", "method", "vllm_version")]
        for drop in drops:
            sel = s
            for k, v in want.items():
                if k not in drop and v is not None:
                    sel = sel[sel[k] == v]
            if len(sel):
                tag = "/".join("*" if (k in drop or v is None) else str(v) for k, v in want.items())
                return float(sel["engine_start_s"].median()), f"{tag} ({len(sel)} starts)"
        return DEFAULT_ENGINE_START_S[start_class], "default"

    def scale(self, model_key_: str, method: str, batch_mode: str, device: str = DEFAULT_DEVICE,
              batch_size: Optional[int] = None) -> tuple[float, str]:
        """``s_m`` for cells of a model shape (:func:`model_key`), method, batch mode and batch size on ``device``:
        the median measured / modelled seconds of committed cells alike. Among the cells of the method and batch
        mode, those of the batch size where it has :data:`MIN_SCALE_CELLS` of them, else of the nearest batch
        size (log scale) that has, else all of them pooled; where the method has no cell of that batch mode, its
        cells of any mode the same way; then the shape's no-SD cells the same way; 1 (``none``) where the shape
        was never measured there. What matched: ``method/mode/bs (n cells)``, ``*`` for a pooled field."""
        key = (model_key_, method, batch_mode, device, batch_size)
        if key not in self._scale_cache:
            r = self.ratios
            r = r[(r["model"] == model_key_) & (r["device"] == device)] if len(r) else r
            out = (1.0, "none")
            for meth, mode in ((method, batch_mode), (method, None), ("none", batch_mode), ("none", None)):
                if not len(r):
                    break
                sel = r[(r["method"] == meth) & ((r["batch_mode"] == mode) if mode else True)]
                if not len(sel):
                    continue
                bs = _nearest_batch_size(sel, batch_size)
                if bs is not None:
                    sel = sel[sel["batch_size"] == bs]
                near = "" if bs in (None, batch_size) else f", nearest to bs {batch_size}"
                out = (float(sel["ratio"].median()),
                       f"{meth}/{mode or '*'}/{'*' if bs is None else bs} ({len(sel)} cells{near})")
                break
            self._scale_cache[key] = out
        return self._scale_cache[key]


#: Cells a batch size needs among the committed ones before its own median scales a cell (:meth:`Calibration.scale`);
#: with fewer, the nearest batch size that has them is taken, else every batch size pooled.
MIN_SCALE_CELLS = 3


def _nearest_batch_size(sel: pd.DataFrame, batch_size: Optional[int]) -> Optional[int]:
    """The batch size whose cells scale a cell of ``batch_size``: itself where it has :data:`MIN_SCALE_CELLS`
    cells in ``sel``, else the nearest on a log scale that has them (the smaller on a tie); None (pool them all)
    where no batch size is given or recorded, or none has enough cells."""
    if batch_size is None or "batch_size" not in sel:
        return None
    counts = sel["batch_size"].dropna().astype(int).value_counts()
    enough = sorted(int(b) for b in counts[counts >= MIN_SCALE_CELLS].index if b > 0)
    if not enough:
        return None
    want = max(int(batch_size), 1)
    # the ratio of the two sizes, exactly (a difference of float logs can break a tie the wrong way)
    return min(enough, key=lambda b: (Fraction(max(b, want), min(b, want)), b))


# --------------------------------------------------------------------------- requests of a cell
@dataclass
class _Request:
    prompt_tokens: int
    output_tokens: int
    pos: Optional[np.ndarray] = None  # replay: output position at each verify step
    proposed: Optional[np.ndarray] = None  # replay: tokens drafted at each verify step


class _Workloads:
    """Prompts and trace plans per workload, loaded once per planner."""

    def __init__(self):
        self._pools: dict[str, list] = {}
        self._preps: dict[str, Any] = {}
        self._plans: dict[tuple, list] = {}

    @staticmethod
    def _key(wl: WorkloadConfig, n: int, max_model_len: int) -> str:
        return json.dumps([dataclasses.asdict(wl), n, max_model_len], sort_keys=True, default=str)

    def pool(self, wl: WorkloadConfig, n: int, max_model_len: int) -> list:
        """``(prompt tokens, output tokens, source id)`` of the prompts a cell of ``wl`` runs: the first ``n`` (a
        trace source's prompts come in a fixed order, so the first ``n`` are those a sweep loads)."""
        key = self._key(dataclasses.replace(wl, num_requests=1), 0, max_model_len)
        if key not in self._pools:
            if wl.source in ("reference", "traces"):
                # deferred: sdlib.workloads loads pydantic, and only this path needs it
                from sdlib.workloads import load_trace_prompts

                with warnings.catch_warnings():  # asking for every prompt: that there are fewer is no news
                    warnings.simplefilter("ignore")
                    prompts = load_trace_prompts(dataclasses.replace(wl, num_requests=_ALL))
                out = [(len(p.prompt_token_ids), int(p.max_output_tokens or wl.max_output_tokens), str(p.source_id))
                       for p in prompts]
                # the worker drops prompts that do not fit max_model_len with their output budget
                self._pools[key] = [p for p in out if p[0] + p[1] <= max_model_len]
            else:
                P = wl.max_prompt_tokens or DEFAULT_PROMPT_TOKENS
                self._pools[key] = None if P + wl.max_output_tokens <= max_model_len else []
        pool = self._pools[key]
        if pool is None:
            P = wl.max_prompt_tokens or DEFAULT_PROMPT_TOKENS
            return [(P, wl.max_output_tokens, str(i)) for i in range(n)]
        return pool[:n]

    def plans(self, cell: Cell, pool: list) -> list:
        """The replay plans of ``cell``'s prompts (in pool order)."""
        # deferred: sdlib.sim.prepared loads pandas, and only this path needs it
        from sdlib.sim.prepared import prepare_traces, truncate_traces
        from sdlib.sim.replay import replay_plans
        from sdlib.workloads import load_trace_table

        m, wl = cell.method, cell.workload
        pkey = self._key(wl, len(pool), 0)
        if pkey not in self._preps:
            table = load_trace_table(wl)
            ids = [p[2] for p in pool]
            rows = table[table["request_id"].astype(str).isin(set(ids))]
            prep = truncate_traces(prepare_traces(rows, ngram_lookup=True, keep_tokens=True), wl.max_output_tokens)
            self._preps[pkey] = prep
        prep = self._preps[pkey]
        key = (pkey, m.name, m.replay, m.num_spec_tokens, cell.batch_size)
        if key not in self._plans:
            plans = replay_plans(prep, m.name, m.replay, m.num_spec_tokens, batch_size=cell.batch_size, workload=wl)
            by_id = {str(r): p for r, p in zip(prep.request_id, plans)}
            self._plans[key] = [by_id[p[2]] for p in pool]
        return self._plans[key]


def tokens_per_step(method) -> Optional[float]:
    """Mean tokens an SD step gains when the method's options fix it (vLLM's synthetic acceptance), else None."""
    o = method.options
    if o.get("synthetic_acceptance_length") is not None:
        return float(o["synthetic_acceptance_length"])
    if o.get("synthetic_acceptance_rates"):
        return 1.0 + float(sum(o["synthetic_acceptance_rates"]))
    return None


def engine_path(method) -> str:
    """The cost model's path for a method: its registry path, ``padded`` for SD methods without one."""
    spec = method_spec(method.name)
    if not spec.is_sd:
        return "none"
    return spec.path or "padded"


def run_seconds(ecm, path: str, K: int, b: int, requests: Sequence[_Request], weight: float,
                tau: float = 1.0, counts: Optional[Sequence[int]] = None) -> tuple[float, float]:
    """Seconds and engine steps (the prefill's included) of ``requests`` run ``b`` at a time (the module
    docstring's formula without ``s_m``); ``weight``: ``w_r``; ``counts``: how often each request runs (1)."""
    if not requests:
        return 0.0, 0.0
    cnt = np.ones(len(requests)) if counts is None else np.asarray(counts, dtype=float)
    P, pos, d, c = [], [], [], []
    for r, n in zip(requests, cnt):
        if r.pos is not None:
            p = np.asarray(r.pos, dtype=float)
            dr = np.asarray(r.proposed, dtype=float) if path == "ragged" else np.full(p.size, float(K))
        else:
            m = max(0, math.ceil((r.output_tokens - 1) / tau))
            p, dr = 1.0 + tau * np.arange(m), np.full(m, float(K))
        P.append(np.full(p.size, float(r.prompt_tokens)))
        pos.append(p)
        d.append(dr)
        c.append(np.full(p.size, n))
    P, pos, d, c = np.concatenate(P), np.concatenate(pos), np.concatenate(d), np.concatenate(c)
    prompts = np.array([r.prompt_tokens for r in requests], dtype=float)
    t = float(np.sum(cnt * ecm.prefill_time(b * prompts)))
    if pos.size:
        t += float(np.sum(c * ecm.step_time(path, np.full(pos.size, K), int(b), b * (P + pos), b * (1.0 + d))))
    return weight * t, weight * float(c.sum() + cnt.sum())


def price_cell(ecm, path: str, K: int, tau: float, pool: Sequence[_Request], B: int, paper: bool, n: int,
               warmup_requests: int, warmup_tokens: Optional[int] = None) -> dict:
    """A cell's warm-up and measured-window seconds (scale 1), engine steps and tokens per step per row:
    ``pool``: the workload's prompts (paper mode: each one batch of ``B`` copies; closed loop: cycled to ``n``
    requests, ``min(B, n)`` in flight). ``warmup_tokens``: the warm-up is a full batch of ``max(warmup_requests,
    B)`` requests of that many tokens (a config's ``warmup_tokens``) instead of the first requests."""
    if paper:
        b, counts, w = B, [1] * len(pool), 1.0
        warm = list(pool[:warmup_requests])
    else:
        n = max(n, 1)
        counts = [n // len(pool) + (1 if i < n % len(pool) else 0) for i in range(len(pool))]
        b, w = min(B, n), 1.0 / min(B, n)
        warm = [pool[i % len(pool)] for i in range(min(warmup_requests, n))]
    window, steps = run_seconds(ecm, path, K, b, pool, w, tau, counts)
    if warm and warmup_tokens is not None:
        warm = [_Request(pool[i % len(pool)].prompt_tokens, int(warmup_tokens))
                for i in range(max(warmup_requests, B))]
    warm_s = 0.0
    if warm:
        bw = min(B, len(warm))
        warm_s, _ = run_seconds(ecm, path, K, bw, warm, 1.0 / bw, tau)
    rows = b if paper else 1
    gained = sum(r.output_tokens * k for r, k in zip(pool, counts)) * rows
    return {"path": path, "k": K, "requests": int(sum(counts)) * rows, "engine_steps": round(steps),
            "tokens_per_step": (gained / (steps * b)) if steps else float("nan"),
            "warmup_s": warm_s, "window_s": window}


# --------------------------------------------------------------------------- the estimate
@dataclass
class SweepEstimate:
    """Per-cell and per-engine-group estimates (seconds) of a sweep's cells still to run.

    ``cells``: one row per cell of the config (``done`` ones cost nothing), in run order. ``groups``: one row per
    engine group with cells to run (:attr:`sdlib.config.Cell.group`), in run order: ``engine_start_s``,
    ``process_s``, ``warmup_s``, ``cells_s``, ``total_s``. ``notes``: what the config could do cheaper.
    """

    sweep: str
    cells: pd.DataFrame
    groups: pd.DataFrame
    calibration: Calibration
    device: str = DEFAULT_DEVICE
    vllm_version: Optional[str] = None
    cost_model: str = ""
    notes: list = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return float(self.groups["total_s"].sum()) if len(self.groups) else 0.0


class Planner:
    """Prices cells with one cost model and calibration; loads each workload's prompts and plans once."""

    def __init__(self, cost_model=None, calibration: Optional[Calibration] = None, device: str = DEFAULT_DEVICE,
                 vllm_version: Optional[str] = None):
        self.ecm = load_cost_model(cost_model)
        self.cal = calibration if calibration is not None else Calibration()
        self.device, self.vllm_version = device, vllm_version
        self.wl = _Workloads()
        self._memo: dict[str, dict] = {}

    def cell_row(self, c: Cell, scale: Optional[float] = None) -> dict:
        """One cell's estimate: engine steps, tokens per step, warm-up and measured-window seconds."""
        m, wl, B = c.method, c.workload, c.batch_size
        paper = c.batch_mode == "paper"
        n = c.num_requests
        key = json.dumps([m.engine_key(), m.replay, dataclasses.asdict(wl), c.model.max_model_len, B, paper, n,
                          c.warmup_requests, getattr(c, "warmup_tokens", None)], sort_keys=True, default=str)
        if key not in self._memo:
            self._memo[key] = self._price(c, paper, n)
        r = dict(self._memo[key])
        s = self.cal.scale(model_key(c.model), m.name, c.batch_mode, self.device, c.batch_size)[0] \
            if scale is None else scale
        r["warmup_s"] *= s
        r["window_s"] *= s
        return r

    def _price(self, c: Cell, paper: bool, n: int) -> dict:
        m, wl = c.method, c.workload
        pool = self.wl.pool(wl, n, c.model.max_model_len)
        if not pool:
            raise ConfigError(f"workloads.{wl.label}: no prompt fits max_model_len {c.model.max_model_len}")
        plans = self.wl.plans(c, pool) if m.replay else [None] * len(pool)
        reqs = [_Request(P, O, None if pl is None else pl.pos, None if pl is None else pl.proposed)
                for (P, O, _), pl in zip(pool, plans)]
        tau = 1.0 if not m.spec.is_sd else (tokens_per_step(m) or DEFAULT_TOKENS_PER_STEP)
        return price_cell(self.ecm, engine_path(m), m.k, tau, reqs, c.batch_size, paper, n, c.warmup_requests,
                          getattr(c, "warmup_tokens", None))

    def estimate(self, sweep: SweepConfig, store=None, from_scratch: bool = False,
                 retry_failed: bool = True, whole_parts: bool = False) -> SweepEstimate:
        """Every cell of ``sweep`` priced, done ones (in ``store``; also failed ones unless ``retry_failed``)
        marked ``done``; groups of the cells to run. ``whole_parts``: a done cell counts as done only when its
        whole part is (:func:`sdlib.run.plan.done_in_whole_parts`), as a GPU session resumes."""
        done = set() if (store is None or from_scratch) else store.done_ids()
        if store is not None and not from_scratch and not retry_failed:
            done |= set(store.failures().get("run_id", []))
        half_done: set[str] = set()
        if whole_parts:
            whole = done_in_whole_parts(sweep.cells(), done)
            half_done, done = done - whole, whole
        rows = []
        for c in sweep.cells():
            r = self.cell_row(c)
            warm_key = (c.group, c.batch_size) if c.warmup_scope == "batch_size" else (c.group, c.run_id)
            rows.append({"run_id": c.run_id, "model": c.model.name, "engine": c.group[1], "start": c.start,
                         "group": c.group, "method": c.method.name, "method_label": c.method.label,
                         "model_key": model_key(c.model), "dataset": c.workload.label,
                         "batch_size": c.batch_size, "repeat": c.repeat, "block": (c.model.name, c.workload.label,
                                                                                   c.batch_size),
                         "part_key": c.part_key,
                         "warm_key": warm_key, **r, "warmup_each_s": r["warmup_s"],
                         "overhead_s": self.cal.cell_overhead_s, "done": c.run_id in done,
                         "half_done": c.run_id in half_done})
        cells = pd.DataFrame(rows)
        cells = _assign_warmups(cells)
        est = SweepEstimate(sweep.name, cells, pd.DataFrame(), self.cal, self.device, self.vllm_version,
                            getattr(self.ecm, "name", ""), notes=config_notes(sweep))
        est.groups = self.group_table(cells[~cells["done"]])
        return est

    def group_table(self, cells: pd.DataFrame) -> pd.DataFrame:
        """Per engine group of ``cells`` (in their order): engine start (by its class in that order), process
        overhead, warm-ups (each counted once), cells, total (s)."""
        rows, kinds, starts = [], set(), {}
        for g, cs in cells.groupby("group", sort=False):
            kind = (cs["model_key"].iloc[0], cs["method"].iloc[0])
            cls = "first" if not rows else ("new_kind" if kind not in kinds else "again")
            kinds.add(kind)
            if (kind, cls) not in starts:  # one look-up per (shape, method, class): thousands of groups repeat them
                starts[kind, cls] = self.cal.engine_start_s(*kind, cls, self.device, self.vllm_version)
            start_s, matched = starts[kind, cls]
            warm = float(cs.drop_duplicates("warm_key")["warmup_s"].sum())
            cells_s = float((cs["window_s"] + cs["overhead_s"]).sum())
            rows.append({"group": g, "model": g[0], "engine": g[1], "start": g[2], "cells": len(cs),
                         "start_class": cls, "engine_start_s": start_s, "engine_start_from": matched,
                         "process_s": self.cal.process_overhead_s, "warmup_s": warm, "cells_s": cells_s,
                         "total_s": start_s + self.cal.process_overhead_s + warm + cells_s})
        return pd.DataFrame(rows, columns=["group", "model", "engine", "start", "cells", "start_class",
                                           "engine_start_s", "engine_start_from", "process_s", "warmup_s",
                                           "cells_s", "total_s"])


def _assign_warmups(cells: pd.DataFrame) -> pd.DataFrame:
    """A cell's warm-up (``warmup_each_s``, where the table has it: what the cell would pay as the first of its
    key) stays only on the first cell of its warm-up key among ``cells`` (once per engine and batch size with
    ``warmup_scope: batch_size``): any selection of cells pays each of its keys once; ``est_s`` = warm-up +
    window + overhead."""
    first = ~cells.duplicated("warm_key")
    each = cells["warmup_each_s"] if "warmup_each_s" in cells else cells["warmup_s"]
    cells = cells.assign(warmup_s=each.where(first, 0.0))
    return cells.assign(est_s=cells["warmup_s"] + cells["window_s"] + cells["overhead_s"])


def estimate_sweep(sweep: SweepConfig, store=None, cost_model=None, calibration: Optional[Calibration] = None,
                   device: str = DEFAULT_DEVICE, vllm_version: Optional[str] = None,
                   from_scratch: bool = False) -> SweepEstimate:
    """Per-cell and per-engine-group estimates (s) of ``sweep``; cells done in ``store`` cost nothing unless
    ``from_scratch``. ``calibration``: default :func:`calibrate` over the committed sweeps."""
    return calibrated_planner(cost_model, calibration, device, vllm_version).estimate(sweep, store, from_scratch)


def calibrated_planner(cost_model=None, calibration: Optional[Calibration] = None, device: str = DEFAULT_DEVICE,
                       vllm_version: Optional[str] = None, sweeps_dir=None) -> "Planner":
    """A :class:`Planner` with ``calibration``, by default :func:`calibrate`'s (priced with the same planner, so
    the committed configs' cells are priced once)."""
    planner = Planner(cost_model, calibration or Calibration(), device, vllm_version)
    if calibration is None:
        planner.cal = calibration_from(committed_invocations(sweeps_dir, planner, device))
    return planner


# --------------------------------------------------------------------------- what committed runs used
@dataclass
class Invocation:
    """One recorded ``sdlib sweep`` invocation of a committed sweep (its provenance entry) and its cells.

    ``engines``: per engine started, in order: label, model (:func:`model_key`), method, start_class,
    engine_start_s (None if it never came up), exit_code. ``cells``: the cells it finished, priced at scale 1
    (``window_s``, ``warmup_s`` once per warm-up key) beside their measured ``wall_s``.
    """

    sweep: str
    index: int
    device: Optional[str]
    vllm_version: Optional[str]
    wall_s: Optional[float]
    planned: int
    engines: list
    cells: pd.DataFrame

    @property
    def complete(self) -> bool:
        """Finished, every planned cell done and every engine up (its wall time is a plan's whole cost)."""
        return (self.wall_s is not None and len(self.cells) == self.planned and len(self.engines) > 0
                and all(e["engine_start_s"] is not None and e["exit_code"] == 0 for e in self.engines))


def _method_of(sweep: SweepConfig, label: str) -> Optional[str]:
    """The registry method behind an engine label of a recorded config."""
    label = label.split(" (start")[0]
    for m in sweep.methods:
        if label in (sweep.engine_name(m), m.label):
            return m.name
    return None


def committed_invocations(sweeps_dir=None, planner: Optional[Planner] = None,
                          device: Optional[str] = None) -> list[Invocation]:
    """Every recorded invocation of the sweeps under ``sweeps_dir`` (default data/sweeps) whose provenance holds
    its config, with the cells each finished (matched by start time) priced by ``planner`` at scale 1;
    ``device``: only sweeps that ran an engine there."""
    # deferred: sdlib.store loads pandas, and only this path needs it
    from sdlib.store import read_table

    root = resolve(sweeps_dir) if sweeps_dir else SWEEPS_DIR
    planner = planner or Planner()
    out = []
    for prov_file in sorted(root.glob("*/provenance.json")):
        prov = json.loads(prov_file.read_text())
        if not prov.get("config") or not prov.get("invocations"):
            continue
        if device and not any(e.get("device") == device for inv in prov["invocations"] for e in inv.get("engines", [])):
            continue
        try:
            sweep = parse_sweep(prov["config"])
        except ConfigError:
            continue  # recorded under a config today's classes no longer read
        runs = read_table(prov_file.parent, "runs")
        if runs.empty:
            continue
        by_id = {c.run_id: c for c in sweep.cells()}
        runs = runs[runs["run_id"].isin(by_id)].assign(t=pd.to_datetime(runs["started_at"], utc=True))
        runs = runs.sort_values("t", kind="stable")
        models = {m.name: model_key(m) for m in sweep.models}
        for i, inv in enumerate(prov["invocations"]):
            t0 = pd.Timestamp(inv["started_at"])
            t1 = pd.Timestamp(inv["finished_at"]) if inv.get("finished_at") else None
            sel = runs[(runs["t"] >= t0) & ((runs["t"] <= t1) if t1 is not None else True)]
            if t1 is None:  # unfinished: its cells are those before the next invocation
                nxt = prov["invocations"][i + 1]["started_at"] if i + 1 < len(prov["invocations"]) else None
                sel = sel[sel["t"] < pd.Timestamp(nxt)] if nxt else sel
            engines, kinds = [], set()
            for e in inv.get("engines", []):
                mk, meth = models.get(e.get("model")), _method_of(sweep, str(e.get("method", "")))
                cls = "first" if not engines else ("new_kind" if (mk, meth) not in kinds else "again")
                kinds.add((mk, meth))
                engines.append({"label": e.get("method"), "model": mk, "method": meth, "start_class": cls,
                                "engine_start_s": e.get("engine_start_s"), "exit_code": e.get("exit_code"),
                                "device": e.get("device"), "vllm_version": e.get("vllm_version")})
            rows = []
            for rid, wall in zip(sel["run_id"], sel["wall_s"]):
                c = by_id[rid]
                r = planner.cell_row(c, scale=1.0)
                rows.append({"run_id": rid, "group": c.group, "model_key": model_key(c.model), "method": c.method.name,
                             "batch_mode": c.batch_mode, "batch_size": c.batch_size, "warm_key": (c.group, c.batch_size)
                             if c.warmup_scope == "batch_size" else (c.group, rid),
                             "window_s": r["window_s"], "warmup_s": r["warmup_s"], "wall_s": float(wall),
                             "overhead_s": 0.0})
            cells = _assign_warmups(pd.DataFrame(rows)) if rows else pd.DataFrame(
                columns=["run_id", "group", "model_key", "method", "batch_mode", "batch_size", "warm_key", "window_s",
                         "warmup_s", "wall_s", "overhead_s", "est_s"])
            devs = [e["device"] for e in engines if e["device"]]
            vers = [e["vllm_version"] for e in engines if e["vllm_version"]]
            wall = (t1 - t0).total_seconds() if t1 is not None else None
            out.append(Invocation(sweep.name, i, max(set(devs), key=devs.count) if devs else None,
                                  max(set(vers), key=vers.count) if vers else None, wall,
                                  int(inv.get("cells_planned") or 0), engines, cells))
    return out


def calibration_from(invs: list[Invocation], exclude: Sequence[str] = ()) -> Calibration:
    """:class:`Calibration` from recorded invocations, leaving out the sweeps named in ``exclude``."""
    invs = [v for v in invs if v.sweep not in set(exclude)]
    starts = pd.DataFrame([{"device": e["device"], "vllm_version": e["vllm_version"], "model": e["model"],
                            "method": e["method"], "start_class": e["start_class"],
                            "engine_start_s": float(e["engine_start_s"]), "sweep": v.sweep}
                           for v in invs for e in v.engines if e["engine_start_s"] is not None and e["device"]],
                          columns=Calibration().starts.columns)
    ratios = pd.DataFrame([{"model": mk, "device": v.device, "method": meth, "batch_mode": mode,
                            "batch_size": int(bs), "ratio": wall / w, "sweep": v.sweep}
                           for v in invs if len(v.cells)
                           for mk, meth, mode, bs, w, wall in zip(v.cells["model_key"], v.cells["method"],
                                                                  v.cells["batch_mode"], v.cells["batch_size"],
                                                                  v.cells["window_s"], v.cells["wall_s"]) if w > 0],
                          columns=RATIO_COLUMNS)
    cal = Calibration(starts=starts, ratios=ratios)
    # the wall time left after measured starts, measured cells and modelled warm-ups: per engine and per cell
    X, y = [], []
    for v in invs:
        if not v.complete or v.cells.empty:
            continue
        rest = v.wall_s - sum(e["engine_start_s"] for e in v.engines) - v.cells["wall_s"].sum() \
            - float((v.cells["warmup_s"] * _scales(cal, v.cells, v.device)).sum())
        X.append([len(v.engines), len(v.cells)])
        y.append(rest)
    if len(y) >= 2:
        X, y = np.asarray(X, float), np.asarray(y, float)
        coef = np.linalg.lstsq(X, y, rcond=None)[0]
        if coef.min() < 0:  # one of them alone, the other 0
            j = int(np.argmax(coef))
            coef = np.zeros(2)
            coef[j] = max(0.0, float(X[:, j] @ y / (X[:, j] @ X[:, j])))
        cal.process_overhead_s, cal.cell_overhead_s = float(coef[0]), float(coef[1])
    sweeps = sorted({v.sweep for v in invs})
    cal.source = (f"{len(starts)} engine starts and {len(y)} complete invocations of {len(sweeps)} committed "
                  f"sweeps" + (f" (without {', '.join(exclude)})" if exclude else ""))
    return cal


def _scales(cal: Calibration, cells: pd.DataFrame, device: str) -> np.ndarray:
    return np.array([cal.scale(mk, meth, mode, device, int(bs))[0]
                     for mk, meth, mode, bs in zip(cells["model_key"], cells["method"], cells["batch_mode"],
                                                   cells["batch_size"])])


def calibrate(sweeps_dir=None, cost_model=None, device: Optional[str] = DEFAULT_DEVICE) -> Calibration:
    """:class:`Calibration` from the provenance of the committed sweeps (default data/sweeps) that ran on
    ``device`` (None: every device)."""
    return calibration_from(committed_invocations(sweeps_dir, Planner(cost_model, Calibration()), device))


def invocation_plan(v: Invocation, cal: Calibration, device: Optional[str] = None) -> dict:
    """What the planner says an invocation's engines and cells cost (s), beside what it used."""
    dev = device or v.device or DEFAULT_DEVICE
    starts = sum(cal.engine_start_s(e["model"], e["method"], e["start_class"], dev, v.vllm_version)[0]
                 for e in v.engines)
    s = _scales(cal, v.cells, dev) if len(v.cells) else np.zeros(0)
    warm = float((v.cells["warmup_s"] * s).sum()) if len(v.cells) else 0.0
    cells = float((v.cells["window_s"] * s).sum()) if len(v.cells) else 0.0
    over = cal.process_overhead_s * len(v.engines) + cal.cell_overhead_s * len(v.cells)
    return {"engine_starts_s": starts, "warmup_s": warm, "cells_s": cells, "overhead_s": over,
            "total_s": starts + warm + cells + over}


def measured_vs_plan(invs: list[Invocation], device: str = DEFAULT_DEVICE) -> pd.DataFrame:
    """Per recorded invocation on ``device``: minutes used (wall, engine starts, cells) against the plan's, with
    the calibration of every committed sweep (``plan_min``: what ``sdlib plan`` says today) and with that of
    the other sweeps only (``plan_loo_min``: leave-one-sweep-out, the plan as it would have been before)."""
    rows = []
    everything = calibration_from(invs)
    for v in invs:
        if v.device != device or v.wall_s is None:
            continue
        p = invocation_plan(v, everything, device)
        loo = invocation_plan(v, calibration_from(invs, exclude=[v.sweep]), device)
        used_starts = sum(e["engine_start_s"] or 0.0 for e in v.engines)
        rows.append({"sweep": v.sweep, "invocation": v.index, "engines": len(v.engines), "cells": len(v.cells),
                     "complete": v.complete, "used_min": v.wall_s / 60, "plan_min": p["total_s"] / 60,
                     "plan_loo_min": loo["total_s"] / 60,
                     "starts_used_min": used_starts / 60, "starts_plan_min": p["engine_starts_s"] / 60,
                     "cells_used_min": float(v.cells["wall_s"].sum()) / 60 if len(v.cells) else 0.0,
                     "cells_plan_min": p["cells_s"] / 60})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- lint
def _full_graphs(sweep: SweepConfig) -> bool:
    cc = sweep.engine.extra.get("compilation_config") or {}
    mode = cc.get("cudagraph_mode") if isinstance(cc, dict) else None
    return str(mode).upper() == "FULL"


def config_notes(sweep: SweepConfig) -> list[str]:
    """Info lines on what the config could run with fewer engine starts (it is never changed here): n-gram
    replays on several K under ``cudagraph_mode: FULL``, where a step costs what it drafts (FACTS.md), could all
    run on one engine of the largest K (every proposal is capped at K)."""
    if not _full_graphs(sweep):
        return []
    notes = []
    for model in sweep.models:
        ks = sorted({m.num_spec_tokens for m in sweep.methods if m.name == "ngram" and m.replay
                     and (not m.targets or model.name in m.targets)})
        if len(ks) > 1:
            own_k = sorted({m.replay for m in sweep.methods if m.name == "ngram" and m.replay
                            and replay_ref(m.replay, m.name, m.num_spec_tokens).spec.replay_k})
            notes.append(f"info: {model.name}: n-gram replays on {len(ks)} engines (K = {', '.join(map(str, ks))}) under "
                         f"cudagraph_mode FULL, where a step costs what it drafts: one ngram-k{ks[-1]} engine could "
                         f"serve them all ({len(ks) - 1} engine start(s) fewer per engine start of the sweep)"
                         + (f"; the replays that take k from the engine's K ({', '.join(own_k)}) would need their "
                            "k as a policy of their own" if own_k else ""))
    return notes


# --------------------------------------------------------------------------- budget
def parse_priority(text: Optional[str], sweep: SweepConfig) -> list:
    """``--priority``: ``dataset`` (default: the config's datasets, then batch sizes), ``bs`` (batch sizes first),
    or a comma list of datasets, batch sizes and ``dataset:bs`` (blocks matching an earlier item first, the rest
    after in the default order). :class:`ConfigError` (one line) for a name or size not in the config."""
    if text is None or text.strip() in ("", "dataset", "datasets"):
        return ["dataset"]
    if text.strip() in ("bs", "batch_size", "batch_sizes"):
        return ["bs"]
    items = []
    for raw in [x.strip() for x in text.split(",") if x.strip()]:
        ds, _, bs = raw.partition(":") if ":" in raw else ((None, "", raw) if raw.isdigit() else (raw, "", ""))
        items.append((_check_dataset(ds, sweep, "--priority") if ds else None,
                      _check_bs(bs, sweep, "--priority") if bs else None))
    return items


def _check_dataset(name: str, sweep: SweepConfig, flag: str) -> str:
    have = [w.label for w in sweep.workloads]
    if name not in have:
        raise ConfigError(f"{flag}: {name!r} is not a workload of the config ({', '.join(have)})")
    return name


def _check_bs(text: str, sweep: SweepConfig, flag: str) -> int:
    try:
        b = int(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a batch size") from None
    if b not in sweep.batch_sizes:
        raise ConfigError(f"{flag}: batch size {b} is not in the config's batch_sizes {sweep.batch_sizes}")
    return b


def parse_blocks(text: str, sweep: SweepConfig) -> set:
    """``--blocks``: comma list of ``dataset:bs`` (every model) or ``model/dataset:bs`` -> block keys
    ``(model, dataset, batch size)``; a part of a block (:func:`block_parts`) as ``dataset:bs@start`` or
    ``dataset:bs@start.repeat`` -> ``(..., start[, repeat])``."""
    out = set()
    models = [m.name for m in sweep.models]
    for raw in [x.strip() for x in text.split(",") if x.strip()]:
        model, _, rest = raw.rpartition("/")
        rest, at, part = rest.partition("@")
        ds, sep, bs = rest.partition(":")
        if not sep:
            raise ConfigError(f"--blocks: {raw!r} is not dataset:batch_size (e.g. gsm8k:32, or gsm8k:32@1 for its "
                              "engine start 1)")
        if model and model not in models:
            raise ConfigError(f"--blocks: {model!r} is not a model of the config ({', '.join(models)})")
        ds, b = _check_dataset(ds, sweep, "--blocks"), _check_bs(bs, sweep, "--blocks")
        tail: tuple = ()
        if at:
            nums = part.split(".")
            if len(nums) > 2 or not all(n.isdigit() for n in nums):
                raise ConfigError(f"--blocks: {raw!r}: after @ comes an engine start, or start.repeat (e.g. gsm8k:32@1.0)")
            start, rep = int(nums[0]), (int(nums[1]) if len(nums) > 1 else None)
            if start >= sweep.engine_starts:
                raise ConfigError(f"--blocks: {raw!r}: engine start {start}, the config has {sweep.engine_starts} (0-based)")
            if rep is not None and rep >= sweep.repeats:
                raise ConfigError(f"--blocks: {raw!r}: repeat {rep}, the config has {sweep.repeats} (0-based)")
            tail = (start,) if rep is None else (start, rep)
        out |= {(m, ds, b, *tail) for m in ([model] if model else models)}
    return out


def block_order(sweep: SweepConfig, blocks: list, priority: list) -> list:
    """``blocks`` (keys) sorted by ``priority`` (:func:`parse_priority`)."""
    wl = {w.label: i for i, w in enumerate(sweep.workloads)}
    bsi = {b: i for i, b in enumerate(sweep.batch_sizes)}
    mi = {m.name: i for i, m in enumerate(sweep.models)}

    def key(b):
        model, ds, bs = b
        default = (wl[ds], bsi[bs], mi[model])
        if priority == ["dataset"]:
            return default
        if priority == ["bs"]:
            return (bsi[bs], wl[ds], mi[model])
        rank = next((i for i, (d, s) in enumerate(priority) if (d is None or d == ds) and (s is None or s == bs)),
                    len(priority))
        return (rank, *default)

    return sorted(blocks, key=key)


@dataclass
class BudgetPlan:
    """What fits in a budget: ``blocks`` (one row per block with cells to run, in priority order: cells,
    ``alone_s`` = the block by itself with its engine starts, ``added_s`` = what it added when taken,
    ``selected``), the ``groups`` and ``cells`` of the selected blocks, their ``total_s``, and ``budget_s``."""

    estimate: SweepEstimate
    blocks: pd.DataFrame
    groups: pd.DataFrame
    cells: pd.DataFrame
    total_s: float
    budget_s: Optional[float]

    @property
    def selected(self) -> set:
        return set(self.blocks.loc[self.blocks["selected"], "block"]) if len(self.blocks) else set()


def select_blocks(est: SweepEstimate, planner: Planner, sweep: SweepConfig, minutes: Optional[float] = None,
                  priority: Optional[list] = None, only: Optional[dict] = None) -> BudgetPlan:
    """Whole blocks in priority order (a block that alone exceeds the budget in parts: :func:`block_parts`), each
    taken if the total (cells + the engine starts and warm-ups not yet paid) still fits in ``minutes`` (None: every
    block); ``only``: ``datasets`` / ``batch_sizes`` that may be taken."""
    if minutes is not None and (not math.isfinite(minutes) or minutes < 0):
        raise ConfigError(f"--gpu-minutes: expected a number >= 0, got {minutes}")
    todo = est.cells[~est.cells["done"]]
    if only:
        ds, bs = only.get("datasets"), only.get("batch_sizes")
        todo = todo[(todo["dataset"].isin(ds) if ds else True) & (todo["batch_size"].isin(bs) if bs else True)]
    order = block_order(sweep, list(dict.fromkeys(todo["block"])), priority or ["dataset"])
    budget = None if minutes is None else 60.0 * minutes
    taken: list = []
    total, rows = 0.0, []

    def members(keys) -> pd.Series:
        keys = set(keys)
        return todo["part_key"].map(lambda k: in_blocks(k, keys)).astype(bool)

    def cost(keys) -> float:
        sel = todo[members(keys)] if keys else todo.iloc[:0]
        return float(planner.group_table(_assign_warmups(sel))["total_s"].sum()) if len(sel) else 0.0

    units = []
    for b in order:
        units += block_parts(todo[todo["block"] == b], b, cost, budget)
    for b in units:
        alone = cost([b])
        with_it = cost(taken + [b])
        ok = budget is None or with_it <= budget + 1e-9
        if ok:
            taken.append(b)
            added, total = with_it - total, with_it
        else:
            added = with_it - total
        rows.append({"block": b, "model": b[0], "dataset": b[1], "batch_size": b[2], "part": part_label(b),
                     "cells": int(members([b]).sum()), "alone_s": alone, "added_s": added, "selected": ok})
    sel = _assign_warmups(todo[members(taken)]) if taken else todo.iloc[:0]
    return BudgetPlan(est, pd.DataFrame(rows, columns=["block", "model", "dataset", "batch_size", "part", "cells",
                                                        "alone_s", "added_s", "selected"]),
                      planner.group_table(sel), sel, total, budget)


def part_label(key: tuple) -> str:
    """``""`` for a whole block, ``start S`` or ``start S repeat R`` for a part of one."""
    return " ".join(f"{w} {v}" for w, v in zip(("start", "repeat"), key[3:]))


def block_parts(cells: pd.DataFrame, block: tuple, cost, budget: Optional[float]) -> list:
    """The units ``block`` is taken in (module docstring): itself when it fits ``budget`` alone (or there is no
    budget), else one part per engine start, each split further by repeat where it alone still does not fit; the
    parts largest first. ``cells``: the block's cells to run; ``cost(keys)``: seconds of running those keys alone."""
    if budget is None or cost([block]) <= budget + 1e-9:
        return [block]
    starts = sorted(int(s) for s in cells["start"].unique())
    out = []
    for s in starts:
        k = (*block, s)
        reps = sorted(int(r) for r in cells.loc[cells["start"] == s, "repeat"].unique())
        if len(reps) > 1 and (len(starts) == 1 or cost([k]) > budget + 1e-9):  # a start is the block, or too large
            out += [(*k, r) for r in reps]
        elif len(starts) > 1:
            out.append(k)
        else:  # one start, one repeat: nothing smaller to take
            out.append(block)
    # largest first: a part left over from a retried cell (one cell of a start otherwise done) must not take the
    # session's room before a start that has not run yet, and never fit beside it
    return sorted(out, key=lambda k: -cost([k]))


def plan_budget(sweep: SweepConfig, store=None, minutes: Optional[float] = None, priority: Optional[str] = None,
                only: Optional[dict] = None, cost_model=None, calibration: Optional[Calibration] = None,
                device: str = DEFAULT_DEVICE, vllm_version: Optional[str] = None,
                from_scratch: bool = False, retry_failed: bool = True, whole_parts: bool = False) -> BudgetPlan:
    """:func:`estimate_sweep` then :func:`select_blocks` (``priority``: the ``--priority`` text; ``whole_parts``:
    see :meth:`Planner.estimate`)."""
    pri = parse_priority(priority, sweep)
    if minutes is not None and (not math.isfinite(minutes) or minutes < 0):
        raise ConfigError(f"--gpu-minutes: expected a number >= 0, got {minutes}")
    planner = calibrated_planner(cost_model, calibration, device, vllm_version)
    est = planner.estimate(sweep, store, from_scratch, retry_failed, whole_parts)
    return select_blocks(est, planner, sweep, minutes, pri, only)


# --------------------------------------------------------------------------- printing
def _gpus(sweep_models: dict, model: str) -> int:
    return int(sweep_models.get(model, 1))


def format_plan(bp: BudgetPlan, sweep: SweepConfig, config_arg: str = "CONFIG", priority: Optional[str] = None) -> str:
    """The plan as ``sdlib plan`` prints it: engine groups, blocks, total, what is left out."""
    est = bp.estimate
    tp = {m.name: m.tensor_parallel_size for m in sweep.models}
    n_done = int(est.cells["done"].sum())
    lines = [f"{est.sweep}: {len(est.cells)} cells, {n_done} done (skipped), {len(est.cells) - n_done} to run; "
             f"cost model {est.cost_model}; {est.device}, vLLM {est.vllm_version or 'any'}",
             f"calibration: {est.calibration.source}; per engine process {est.calibration.process_overhead_s:.1f} s, "
             f"per cell {est.calibration.cell_overhead_s:.2f} s"]
    lines += est.notes
    n_half = int(bp.cells["half_done"].sum()) if "half_done" in bp.cells else 0
    if n_half:  # --whole-parts: done cells of the planned blocks whose part is not whole run again
        lines.append(f"--whole-parts: {n_half} done cell(s) in parts left half done are planned again")
    g = bp.groups
    if bp.budget_s is not None:
        lines.append(f"budget {bp.budget_s / 60:g} min: {int(bp.blocks['selected'].sum())} of {len(bp.blocks)} "
                     f"block(s) fit, {bp.total_s / 60:.1f} min")
    if g.empty:
        lines.append("nothing to run" + ("" if bp.budget_s is None or bp.blocks.empty
                                          else f": no block fits (the smallest alone needs "
                                               f"{bp.blocks['alone_s'].min() / 60:.1f} min)"))
        return "\n".join(lines)
    lines.append("")
    w = max(12, *(len(f"{r.model} / {r.engine}") + (8 if r.start else 0) for r in g.itertuples()))
    lines.append(f"{'engine group (minutes)':<{w}}  cells  start (class)     process  warm-up  cells  total")
    for r in g.itertuples():
        name = f"{r.model} / {r.engine}" + (f" start {r.start}" if r.start else "")
        lines.append(f"{name:<{w}}  {r.cells:5d}  {r.engine_start_s / 60:5.2f} ({r.start_class:<8})  "
                     f"{r.process_s / 60:6.2f}  {r.warmup_s / 60:7.2f}  {r.cells_s / 60:5.2f}  {r.total_s / 60:5.2f}")
    lines.append("")
    b = bp.blocks

    def name(r) -> str:
        return f"{r.model} / {r.dataset} / bs{r.batch_size}" + (f" / {r.part}" if r.part else "")

    wb = max(36, *(len(name(r)) for r in b.itertuples()))
    lines.append(f"  {'block: model / dataset / batch size':<{wb}}  cells  alone  added  (minutes; + taken, - left out)")
    for r in b.itertuples():
        lines.append(f"{'+' if r.selected else '-'} {name(r):<{wb}}  "
                     f"{r.cells:5d}  {r.alone_s / 60:5.2f}  {r.added_s / 60:5.2f}")
    if (b["part"] != "").any():
        lines.append("  (a block that alone exceeds the budget is taken in parts: every arm at one engine start, or one "
                     "start and repeat)")
    gpu_min = float(sum(r.total_s * _gpus(tp, r.model) for r in g.itertuples())) / 60
    lines.append("")
    lines.append(f"total: {bp.total_s / 60:.1f} min on the machine ({gpu_min:.1f} GPU-min, {gpu_min / 60:.2f} GPU-h): "
                 f"{len(g)} engine start(s) {g['engine_start_s'].sum() / 60:.1f}, processes "
                 f"{g['process_s'].sum() / 60:.1f}, warm-ups {g['warmup_s'].sum() / 60:.1f}, "
                 f"cells {g['cells_s'].sum() / 60:.1f}")
    out = b[~b["selected"]]
    if len(out):
        lines.append(f"left out: {len(out)} block(s), {out['alone_s'].sum() / 60:.1f} min alone: "
                     + ", ".join(f"{r.dataset}:{r.batch_size}" + (f" ({r.part})" if r.part else "")
                                 for r in out.itertuples()))
    if bp.budget_s is not None:
        pri = f" --priority {priority}" if priority else ""
        lines.append(f"run them: sdlib sweep {config_arg} --plan-minutes {bp.budget_s / 60:g}{pri} (done cells are "
                     "skipped, so the same command on the next machine takes the next blocks)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the paper's full matrix
@dataclass(frozen=True)
class PaperMatrix:
    """The paper's whole matrix (6 datasets, 5 methods, k 1-10, batch sizes 1-512, 3 repeats, the 8B and 70B
    shapes) as a powered sweep would run it: closed loop, ``max(prompts_per_cell, requests_per_slot * B)``
    requests per cell of up to ``output_tokens`` tokens, ``warmup_requests`` once per engine and batch size, one
    engine per (shape, method, k) plus the no-SD baseline. ``shapes``: (name, shape path, GPUs = tensor-parallel
    size)."""

    datasets: tuple = ("cnn_dailymail", "sharegpt", "instructcoder", "gsm8k", "aime", "gpqa")
    methods: tuple = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
    ks: tuple = tuple(range(1, 11))
    batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    repeats: int = 3
    shapes: tuple = (("llama-3.1-8b", "@shapes/llama-3.1-8b", 1), ("llama-3-70b", "@shapes/llama-3-70b", 2))
    prompts_per_cell: int = 32
    requests_per_slot: int = 3
    output_tokens: int = 256
    warmup_requests: int = 4


def _reference_profiles(mx: PaperMatrix) -> dict:
    """Per dataset: the prompts a cell runs (the authors' traces' prompts where there are traces; the mean of
    their prompt lengths, ``output_tokens`` out, elsewhere)."""

    # deferred: sdlib.sim.traces loads pandas, and only this path needs it
    from sdlib.sim.traces import REFERENCE_FILES
    from sdlib.workloads import load_trace_prompts

    out = {}
    for d in mx.datasets:
        if d in REFERENCE_FILES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ps = load_trace_prompts(WorkloadConfig(dataset=d, source="reference", num_requests=mx.prompts_per_cell,
                                                       max_output_tokens=mx.output_tokens))
            out[d] = [_Request(len(p.prompt_token_ids), int(p.max_output_tokens)) for p in ps]
    mean_p = int(round(np.mean([r.prompt_tokens for rs in out.values() for r in rs]))) if out else DEFAULT_PROMPT_TOKENS
    for d in mx.datasets:
        out.setdefault(d, [_Request(mean_p, mx.output_tokens)] * mx.prompts_per_cell)
    return out


def reference_tokens_per_step(ks: Sequence[int]) -> dict:
    """``{(drafter, k): 1 + share * sum of the per-position acceptance rates}`` of the authors' traces (all four
    datasets; :func:`sdlib.sim.closed_form.per_position_rates`, what ``sdlib rates`` prints): the tokens a step
    gains. ``share``: the steps where the drafter proposes (the n-gram look-up's matches; 1 for EAGLE-3)."""
    # deferred: sdlib.sim.closed_form loads pandas, and only this path needs it
    from sdlib.sim.closed_form import per_position_rates
    from sdlib.sim.prepared import prepare_traces
    from sdlib.sim.traces import load_reference_traces

    prep = prepare_traces(load_reference_traces(), ngram_lookup=True)
    share = {d: 1.0 for d in DRAFTERS}
    if prep.ngram_avail is not None:
        share["ngram"] = float(np.mean(np.concatenate([np.asarray(a[1:]) > 0 for a in prep.ngram_avail])))
    return {(d, k): 1.0 + share[d] * float(sum(per_position_rates(prep, d, k))) for d in DRAFTERS for k in ks}


def paper_matrix(planner: Optional[Planner] = None, mx: PaperMatrix = PaperMatrix()) -> SweepEstimate:
    """The paper's matrix (:class:`PaperMatrix`) priced like a sweep: ``cells`` and ``groups`` (one engine group
    per shape and engine, ``gpus`` per group) as :func:`estimate_sweep` gives them. Tokens per step of each
    method at each k: :func:`reference_tokens_per_step` (EAGLE-3's lists for the model drafters and MTP)."""
    planner = planner or calibrated_planner()
    profiles = _reference_profiles(mx)
    tau = reference_tokens_per_step(mx.ks)
    rows = []
    for name, path, gpus in mx.shapes:
        mk = f"{path}|tp{gpus}"
        engines = [("none", "none", 0)] + [(m, f"{m}-k{k}", k) for m in mx.methods for k in mx.ks]
        for meth, engine, k in engines:
            spec = method_spec(meth)
            t = 1.0 if not spec.is_sd else tau[(spec.trace or "eagle3", k)]
            p = spec.path or ("padded" if spec.is_sd else "none")
            group = (name, engine, 0)
            for d in mx.datasets:
                for B in mx.batch_sizes:
                    s = planner.cal.scale(mk, meth, "closed_loop", planner.device, B)[0]
                    n = max(mx.prompts_per_cell, mx.requests_per_slot * B)
                    r = price_cell(planner.ecm, p, k, t, profiles[d], B, False, n, mx.warmup_requests)
                    for rep in range(mx.repeats):
                        rows.append({"run_id": f"{name}__{engine}__{d}__bs{B}__r{rep}", "model": name,
                                     "engine": engine, "start": 0, "group": group, "method": meth,
                                     "method_label": engine, "model_key": mk, "dataset": d, "batch_size": B,
                                     "repeat": rep, "block": (name, d, B), "warm_key": (group, B), "gpus": gpus,
                                     **{**r, "warmup_s": r["warmup_s"] * s, "window_s": r["window_s"] * s},
                                     "warmup_each_s": r["warmup_s"] * s,  # before it is kept once per warm_key
                                     "overhead_s": planner.cal.cell_overhead_s, "done": False})
    cells = _assign_warmups(pd.DataFrame(rows))
    groups = pd.concat([planner.group_table(cells[cells["model"] == name]).assign(gpus=gpus)
                        for name, _, gpus in mx.shapes], ignore_index=True)
    return SweepEstimate("paper matrix", cells, groups, planner.cal, planner.device, planner.vllm_version,
                         getattr(planner.ecm, "name", ""), notes=[])


def format_paper_matrix(est: SweepEstimate, mx: PaperMatrix = PaperMatrix()) -> str:
    """The matrix's cost per shape and in all, in hours (``sdlib plan --paper-matrix``)."""
    g, c = est.groups, est.cells
    bs = f"{mx.batch_sizes[0]}-{mx.batch_sizes[-1]}"
    lines = [f"the paper's matrix: {len(mx.datasets)} datasets x ({len(mx.methods)} methods x k {mx.ks[0]}-{mx.ks[-1]}"
             f" + no SD) x {len(mx.batch_sizes)} batch sizes ({bs}) x {mx.repeats} repeats per shape; closed loop, "
             f"max({mx.prompts_per_cell}, {mx.requests_per_slot} B) requests of up to {mx.output_tokens} tokens per "
             f"cell, {mx.warmup_requests} warm-up requests per engine and batch size",
             f"priced with cost model {est.cost_model} on {est.device}; calibration: {est.calibration.source}", "",
             f"{'shape':<14} {'GPUs':>4} {'engines':>7} {'cells':>6} {'starts h':>8} {'procs h':>7} "
             f"{'warm h':>6} {'cells h':>7} {'machine h':>9} {'GPU-h':>7}"]
    tot = 0.0
    for name, _, gpus in mx.shapes:
        gg = g[g["model"] == name]
        h = gg["total_s"].sum() / 3600
        tot += h * gpus
        lines.append(f"{name:<14} {gpus:>4} {len(gg):>7} {int((c['model'] == name).sum()):>6} "
                     f"{gg['engine_start_s'].sum() / 3600:>8.1f} {gg['process_s'].sum() / 3600:>7.1f} "
                     f"{gg['warmup_s'].sum() / 3600:>6.1f} {gg['cells_s'].sum() / 3600:>7.1f} {h:>9.1f} "
                     f"{h * gpus:>7.1f}")
    lines.append(f"total: {tot:.1f} GPU-hours ({len(g)} engine starts, {len(c)} cells)")
    per = c.assign(gpu_s=c["est_s"] * c["gpus"]).groupby("method", sort=False)["gpu_s"].sum() / 3600
    lines.append("cells' GPU-hours by method: " + ", ".join(f"{m} {h:.1f}" for m, h in per.items()))
    return "\n".join(lines)


# --------------------------------------------------------------------------- packing onto many GPUs
#: How the paper matrix's engine groups may be cut for many GPUs (:func:`split_groups`): ``engine``, one engine
#: start per (shape, method, k) as priced; ``dataset``, one per (shape, method, k, dataset); ``block``, one per
#: (shape, method, k, dataset, batch size): each piece with its own engine start and warm-ups.
SPLITS = ("engine", "dataset", "block")


def pack_longest_first(durations_s: Sequence[float], gpus: Sequence[int], n_gpus: int) -> tuple[float, list]:
    """List scheduling, longest job first (LPT): each job (an engine group) takes the ``gpus[i]`` GPUs that come
    free first, starts when the last of them does and holds them all for ``durations_s[i]``. Returns the makespan
    (s) and each job's start (s). What a Ray cluster does with the groups submitted longest first
    (:mod:`sdlib.run.ray_executor`); GPUs are one pool (a tensor-parallel group is not kept inside one node
    here)."""
    if n_gpus < 1:
        raise ValueError("n_gpus: at least one GPU")
    free = [0.0] * n_gpus  # when each GPU comes free
    starts = [0.0] * len(durations_s)
    for i in sorted(range(len(durations_s)), key=lambda j: -durations_s[j]):
        g = int(gpus[i])
        if not 1 <= g <= n_gpus:
            raise ValueError(f"a job needs {g} GPU(s), the pool has {n_gpus}")
        free.sort()
        t = free[g - 1]
        free[:g] = [t + durations_s[i]] * g
        starts[i] = t
    return max(free), starts


def split_groups(est: SweepEstimate, planner: Planner, split: str) -> pd.DataFrame:
    """The paper matrix's engine groups (:func:`paper_matrix`) cut as ``split`` says (:data:`SPLITS`): one row
    per group with ``total_s`` and ``gpus``; each piece pays its own engine start, process and warm-ups."""
    if split not in SPLITS:
        raise ValueError(f"split: {split!r} is not one of {SPLITS}")
    if split == "engine":
        return est.groups
    c = est.cells
    group = [(*g[:2], d) if split == "dataset" else (*g[:2], d, b)
             for g, d, b in zip(c["group"], c["dataset"], c["batch_size"])]
    cells = c.assign(group=group, warm_key=[(g, b) for g, b in zip(group, c["batch_size"])],
                     warmup_s=c["warmup_each_s"])
    cells = _assign_warmups(cells)
    return pd.concat([planner.group_table(cells[cells["model"] == m]).assign(gpus=int(cs["gpus"].iloc[0]))
                      for m, cs in cells.groupby("model", sort=False)], ignore_index=True)


def format_packing(est: SweepEstimate, planner: Planner, gpu_counts: Sequence[int]) -> str:
    """The paper matrix on ``gpu_counts`` GPUs (``sdlib plan --paper-matrix --gpus 8,64,512``): per split of its
    engine groups (:func:`split_groups`) and GPU count, the longest-first makespan (:func:`pack_longest_first`)
    against the ideal (GPU-hours / GPUs)."""
    lines = ["packing onto GPUs: engine groups longest first, each holding its shape's GPUs (tensor-parallel size) "
             "from its engine start to its last cell; +GPU-h = the split's extra engine starts, processes and "
             "warm-ups; ideal = GPU-hours / GPUs; busy = ideal / makespan",
             f"{'split':<8} {'groups':>6} {'GPU-h':>7} {'+GPU-h':>7} {'longest h':>9} {'GPUs':>5} {'makespan h':>10} "
             f"{'ideal h':>7} {'busy':>5}"]
    base = None
    for split in SPLITS:
        g = split_groups(est, planner, split)
        dur, gpus = g["total_s"].tolist(), g["gpus"].astype(int).tolist()
        gpu_h = float((g["total_s"] * g["gpus"]).sum()) / 3600
        base = gpu_h if base is None else base
        for n in gpu_counts:
            span = pack_longest_first(dur, gpus, n)[0] / 3600
            ideal = gpu_h / n
            lines.append(f"{split:<8} {len(g):>6} {gpu_h:>7.1f} {gpu_h - base:>7.1f} {max(dur) / 3600:>9.2f} {n:>5} "
                         f"{span:>10.2f} {ideal:>7.2f} {100 * ideal / span:>4.0f}%")
    return "\n".join(lines)


def format_cells(bp: BudgetPlan) -> str:
    """Every cell of the plan's estimate: run id, engine steps, tokens per step, warm-up / window / total s."""
    c = bp.estimate.cells
    sel = set(bp.cells["run_id"]) if len(bp.cells) else set()
    w = max([len(r) for r in c["run_id"]] + [6])
    lines = [f"  {'run id':<{w}}  path     k  steps  tok/step  warm-up s  window s  total s"]
    for r in c.itertuples():
        mark = "done" if r.done else ("+" if r.run_id in sel else "-")
        lines.append(f"{mark:<2}{r.run_id:<{w}}  {r.path:<7} {r.k:2d} {r.engine_steps:6d}  {r.tokens_per_step:8.2f}  "
                     f"{r.warmup_s:9.2f}  {r.window_s:8.2f}  {r.est_s:7.2f}")
    return "\n".join(lines)


def format_measured(df: pd.DataFrame, device: str = DEFAULT_DEVICE) -> str:
    """:func:`measured_vs_plan` as ``sdlib plan --measured`` prints it (minutes)."""
    if df.empty:
        return f"no recorded invocation on {device}"
    lines = [f"minutes each recorded sdlib sweep invocation on {device} used against its plan (plan: calibrated on "
             "every committed sweep; loo: on the other sweeps only)",
             f"{'sweep':<24} {'inv':>3} {'engines':>7} {'cells':>5}  {'used':>5} {'plan':>5} {'loo':>5}  "
             f"{'starts used/plan':>16}  {'cells used/plan':>15}"]
    for r in df.itertuples():
        lines.append(f"{r.sweep:<24} {r.invocation:>3} {r.engines:>7} {r.cells:>5}  {r.used_min:5.1f} {r.plan_min:5.1f} "
                     f"{r.plan_loo_min:5.1f}  {r.starts_used_min:7.1f} / {r.starts_plan_min:<6.1f}  "
                     f"{r.cells_used_min:6.1f} / {r.cells_plan_min:<6.1f}" + ("" if r.complete else "  (cut short)"))
        lines[-1] = lines[-1].rstrip()
    ok = df[df["complete"]]
    if len(ok):
        err = (ok["plan_loo_min"] / ok["used_min"] - 1).abs()
        lines.append(f"complete invocations: {len(ok)}, used {ok['used_min'].sum():.1f} min, planned "
                     f"{ok['plan_min'].sum():.1f} (loo {ok['plan_loo_min'].sum():.1f}); loo error per invocation: "
                     f"median {100 * err.median():.0f}%, largest {100 * err.max():.0f}%")
    return "\n".join(lines)
