"""Drive a vLLM ``LLMEngine`` step by step: closed-loop batches or the paper's batches.

Works on anything with ``add_request(id, prompt, params)``, ``step()`` and
``has_unfinished_requests()`` (tests use a fake engine). Records, per request,
the tokens gained in each engine step (DELTA outputs) and timestamps, and per
engine step its wall time and load.

* ``closed_loop``: batch size B = B requests in flight; when one finishes the
  next is admitted. The steady window runs from the first step after all
  initially admitted requests have their first token to the last step that
  started with B requests in flight (warm-up and drain excluded). If that
  window is empty (too few requests), the whole run is the window.
* ``paper``: the paper's definition: each prompt is one batch of B copies, run
  one after another; throughput is the mean over batches of tokens / duration.

Usage:
    from sdlib.run.driver import drive
    rec = drive(llm.llm_engine, prompts, batch_size=8, make_params=lambda p: params)
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence


@dataclass
class RequestRecord:
    request_id: str
    prompt_index: int
    batch_index: int
    prompt_tokens: int
    arrival_s: float
    first_token_s: Optional[float] = None
    finish_s: Optional[float] = None
    finish_reason: Optional[str] = None
    gains: list[int] = field(default_factory=list)  # tokens added per engine step that added any
    gain_steps: list[int] = field(default_factory=list)  # the engine step of each entry of gains
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    detailed: Optional[tuple[list[int], list[int]]] = None  # (drafted, accepted) from vLLM, if any


@dataclass
class StepRecord:
    engine_step: int
    start_s: float
    duration_s: float
    num_running: int
    num_new_tokens: int
    num_context_tokens: int
    in_window: bool = False


@dataclass
class DriveResult:
    requests: list[RequestRecord]
    steps: list[StepRecord]
    wall_s: float
    window_s: float
    window_output_tokens: int
    tok_per_s: float
    batch_mode: str


class _Run:
    """Shared bookkeeping for both modes."""

    def __init__(self, engine, make_params: Callable[[Any], Any], spec_metrics: Callable[[Any], Any],
                 clock: Callable[[], float], progress=None):
        self.engine = engine
        self.make_params = make_params
        self.spec_metrics = spec_metrics
        self.clock = clock
        self.t0 = clock()
        self.records: dict[str, RequestRecord] = {}
        self.live: dict[str, RequestRecord] = {}
        self.steps: list[StepRecord] = []
        self.progress = progress

    def now(self) -> float:
        return self.clock() - self.t0

    def admit(self, rid: str, prompt, prompt_index: int, batch_index: int) -> str:
        """Add one request; returns its id (``rid``, plus ``@<replay_key>`` for trace replay)."""
        key = getattr(prompt, "replay_key", None)
        if key is not None:  # trace replay: the engine's hooks find the request's plan by this key
            rid = f"{rid}@{int(key)}"
        ids = prompt.prompt_token_ids
        rec = RequestRecord(rid, prompt_index, batch_index, len(ids), self.now(),
                            prompt_token_ids=[int(t) for t in ids])
        self.records[rid] = rec
        self.live[rid] = rec
        self.engine.add_request(rid, {"prompt_token_ids": list(map(int, ids))}, self.make_params(prompt))
        return rid

    def step(self) -> list[str]:
        """One engine step; returns the ids of requests that finished in it."""
        ctx = sum(r.prompt_tokens + len(r.token_ids) for r in self.live.values())
        start = self.now()
        outs = self.engine.step()
        end = self.now()
        finished, running, new = [], 0, 0
        for o in outs:
            rec = self.records.get(o.request_id)
            if rec is None:
                continue
            c = o.outputs[0]
            n = len(c.token_ids)
            if n:
                running += 1
                new += n
                rec.gains.append(n)
                rec.gain_steps.append(len(self.steps))
                rec.token_ids.extend(int(t) for t in c.token_ids)
                if rec.first_token_s is None:
                    rec.first_token_s = end
            if o.finished:
                rec.finish_s = end
                rec.finish_reason = getattr(c, "finish_reason", None)
                rec.detailed = self.spec_metrics(c)
                self.live.pop(o.request_id, None)
                finished.append(o.request_id)
                if self.progress is not None:
                    self.progress.update(1)
        self.steps.append(StepRecord(len(self.steps), start, end - start, running, new, ctx))
        return finished


def drive(engine, prompts: Sequence[Any], batch_size: int, make_params: Callable[[Any], Any],
          mode: str = "closed_loop", spec_metrics: Callable[[Any], Any] = lambda c: None,
          clock: Callable[[], float] = time.perf_counter, progress=None, id_prefix: str = "r") -> DriveResult:
    """Run ``prompts`` through ``engine`` at ``batch_size``; see the module docstring.

    ``prompts`` items need ``.index`` and ``.prompt_token_ids``. ``make_params``
    returns the SamplingParams for a prompt (DELTA output kind).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if mode == "closed_loop":
        return _closed_loop(engine, prompts, batch_size, make_params, spec_metrics, clock, progress, id_prefix)
    if mode == "paper":
        return _paper(engine, prompts, batch_size, make_params, spec_metrics, clock, progress, id_prefix)
    raise ValueError(f"mode: {mode!r} is not one of closed_loop, paper")


def _closed_loop(engine, prompts, B, make_params, spec_metrics, clock, progress, prefix) -> DriveResult:
    run = _Run(engine, make_params, spec_metrics, clock, progress)
    pending = deque(enumerate(prompts))
    initial: set[str] = set()
    full_at_start: list[bool] = []
    while pending or run.live:
        while pending and len(run.live) < B:
            order, p = pending.popleft()
            rid = run.admit(f"{prefix}{order}", p, p.index, order)
            if order < B:
                initial.add(rid)
        full_at_start.append(len(run.live) == B)
        run.step()
        if not run.live and not pending:
            break
    wall = run.now()
    # steady window: after every initial request has its first token ...
    firsts = [run.records[r].first_token_s for r in initial]
    prefilled_at = max(f for f in firsts if f is not None) if all(f is not None for f in firsts) else None
    s0 = next((s.engine_step for s in run.steps if prefilled_at is not None and s.start_s >= prefilled_at), None)
    # ... to the last step that started with B requests in flight
    full = [i for i, f in enumerate(full_at_start) if f]
    s1 = full[-1] if full else None
    if s0 is None or s1 is None or s1 < s0:
        s0, s1 = 0, len(run.steps) - 1
    for s in run.steps[s0:s1 + 1]:
        s.in_window = True
    window_s = run.steps[s1].start_s + run.steps[s1].duration_s - run.steps[s0].start_s if run.steps else 0.0
    window_tokens = sum(s.num_new_tokens for s in run.steps[s0:s1 + 1])
    return DriveResult(list(run.records.values()), run.steps, wall, window_s, window_tokens,
                       window_tokens / window_s if window_s > 0 else float("nan"), "closed_loop")


def _paper(engine, prompts, B, make_params, spec_metrics, clock, progress, prefix) -> DriveResult:
    run = _Run(engine, make_params, spec_metrics, clock, progress)
    rates, total_dur, total_tokens = [], 0.0, 0
    for b, p in enumerate(prompts):
        t_start = run.now()
        ids = [run.admit(f"{prefix}{b}c{c}", p, p.index, b) for c in range(B)]
        while run.live:
            run.step()
        dur = run.now() - t_start
        tokens = sum(len(run.records[r].token_ids) for r in ids)
        total_dur += dur
        total_tokens += tokens
        if dur > 0:
            rates.append(tokens / dur)
    for s in run.steps:
        s.in_window = True
    tok = sum(rates) / len(rates) if rates else float("nan")
    return DriveResult(list(run.records.values()), run.steps, run.now(), total_dur, total_tokens, tok, "paper")
