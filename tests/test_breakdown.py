"""Phase timers (sdlib.vllm.phase_hooks): fake runners with a fake clock (exact sums), then real engines.

Fake runner V1 step, in clock units (powers of two, so float sums are exact):
execute_model: prep 1 + _model_forward 2 + compute_logits 0.5;
sample_tokens: _sample 0.125 + propose_draft_token_ids 3 (which calls compute_logits 0.5 inside:
counted as draft, not verify) + book-keeping 0.25.
-> step 7.375, draft 3.5, verify 2.5, sample 0.125, other 1.25.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import pytest

from sdlib.analysis import breakdown as A
from sdlib.extract.tables import phases_frame
from sdlib.store.schema import columns
from sdlib.vllm import phase_hooks as H


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def advance(self, dt):
        self.t += dt


class FakeModel:
    def __init__(self, clock):
        self.clock = clock

    def compute_logits(self, h=None):
        self.clock.advance(0.5)
        return h

    def forward(self, **kw):
        self.clock.advance(2.0)
        return "hidden"

    def __call__(self, **kw):  # like nn.Module: __call__ -> self.forward
        return self.forward(**kw)


class FakeRunnerV1:
    """Calls its methods in the order vLLM's V1 GPUModelRunner does."""

    def __init__(self, clock, sd=True):
        self.clock, self.model = clock, FakeModel(clock)
        self.speculative_config = object() if sd else None

    def execute_model(self, scheduler_output=None):
        self.clock.advance(1.0)
        self._model_forward()
        self.model.compute_logits()
        return None

    def _model_forward(self, **kw):
        self.clock.advance(2.0)
        return "hidden"

    def sample_tokens(self, grammar_output=None):
        self._sample()
        if self.speculative_config is not None:
            self.propose_draft_token_ids()
        self.clock.advance(0.25)
        return "output"

    def _sample(self, *a):
        self.clock.advance(0.125)

    def propose_draft_token_ids(self, *a):
        self.clock.advance(3.0)
        self.model.compute_logits()  # e.g. a drafter sharing the target's lm_head: still draft
        return [[1, 2, 3]]


def _step(r, n=1):
    for _ in range(n):
        r.execute_model("so")
        r.sample_tokens(None)


def _totals(rows):
    return {r["phase"]: (r["calls"], r["total_s"]) for r in rows}


def test_v1_wrapping_collect_reset_uninstall():
    clock = Clock()
    r = FakeRunnerV1(clock)
    t = H.PhaseTimers("perf_counter", clock=clock).install(r, kind="v1")
    assert not t.missing and not t.failures
    assert t.hooked["verify"] == ["_model_forward", "model.compute_logits"]
    _step(r, 2)
    got = _totals(t.collect())
    assert got == {"step": (2, 14.75), "draft": (2, 7.0), "verify": (2, 5.0), "sample": (2, 0.25)}
    assert all(row["timer"] == "perf_counter" for row in t.collect())
    # calls outside a step (e.g. vLLM's dummy/profile runs) are not timed
    r._model_forward()
    r.propose_draft_token_ids()
    assert _totals(t.collect())["verify"] == (2, 5.0)
    t.reset()
    assert {k: v for k, v in _totals(t.collect()).items()} == {p: (0, 0.0) for p in H.PHASES}
    _step(r, 1)
    assert _totals(t.collect())["step"] == (1, 7.375)
    # only this instance is wrapped; uninstall restores the class methods
    other = FakeRunnerV1(clock)
    assert "execute_model" not in vars(other)
    t.uninstall()
    assert not {"execute_model", "sample_tokens", "_model_forward", "_sample"} & set(vars(r))
    assert "compute_logits" not in vars(r.model)
    t.reset()
    _step(r, 1)
    assert _totals(t.collect())["step"] == (0, 0.0)


def test_breakdown_table_other_arithmetic():
    clock = Clock()
    r = FakeRunnerV1(clock)
    t = H.PhaseTimers(clock=clock).install(r, kind="v1")
    _step(r, 4)
    ph = phases_frame("run-a", t.collect())
    assert list(ph.columns) == columns("step_phases")
    runs = pd.DataFrame({"run_id": ["run-a"], "model": ["m"], "method": ["draft_model"],
                         "method_label": ["draft_model-k3"], "batch_size": [1], "dataset": ["d"]})
    bt = A.breakdown_table(ph, runs)
    row = bt.iloc[0]
    assert row["num_steps"] == 4 and row["step_s"] == 29.5
    assert row["other_s"] == 29.5 - 14.0 - 10.0 - 0.5 == 5.0
    assert row["share_draft"] == 14.0 / 29.5 and row["share_other"] == 5.0 / 29.5
    assert math.isclose(sum(row[f"share_{p}"] for p in A.SHARE_PHASES), 1.0)
    assert row["step_ms"] == 1000 * 29.5 / 4
    assert row["model"] == "m" and row["batch_size"] == 1
    # pooled over runs: time-weighted, shares still sum to 1
    ph2 = ph.assign(run_id="run-b", total_s=ph["total_s"] * 3)
    bt2 = A.breakdown_table(pd.concat([ph, ph2]), pd.concat([runs, runs.assign(run_id="run-b")]))
    pooled = A.pooled_shares(bt2, by=("model", "method_label", "batch_size"))
    assert len(pooled) == 1 and pooled.loc[0, "runs"] == 2
    assert math.isclose(pooled.loc[0, "share_draft"], 14.0 / 29.5)
    assert math.isclose(pooled.loc[0, "step_s"], 4 * 29.5)


def test_missing_phase_is_reported_not_raised():
    clock = Clock()
    r = FakeRunnerV1(clock)
    r._sample = None  # an instance attribute that is not callable: the hook cannot be installed
    t = H.PhaseTimers(clock=clock).install(r, kind="v1")
    assert "sample" in t.missing and t.failures
    r._sample = lambda *a: clock.advance(0.125)
    _step(r, 1)
    got = _totals(t.collect())
    assert math.isnan(got["sample"][1]) and got["step"][1] == 7.375
    bt = A.breakdown_table(phases_frame("x", t.collect()))
    assert math.isnan(bt.loc[0, "share_sample"]) and math.isnan(bt.loc[0, "share_other"])
    assert bt.loc[0, "share_verify"] == 2.5 / 7.375
    # an unknown runner: everything missing, nothing raised
    t2 = H.PhaseTimers().install(object())
    assert set(t2.missing) == set(H.PHASES)


class Sampler:  # plain classes with __call__, as the V2 runner's Sampler / RejectionSampler
    def __init__(self, clock):
        self.clock = clock

    def __call__(self, logits, batch):
        self.clock.advance(0.125)
        return "sampled"


class RejectionSampler:
    def __init__(self, sampler):
        self.sampler = sampler

    def __call__(self, logits, batch, draft_logits=None):
        self.sampler.clock.advance(0.125)
        return self.sampler(logits, batch)  # nested: counted once


class Speculator:
    def __init__(self, clock):
        self.clock = clock

    def propose(self, *a, **kw):
        self.clock.advance(4.0)
        return [[7]]


class FakeRunnerV2:
    """The V2 runner's call pattern: forward in execute_model, logits + sampler in sample()."""

    def __init__(self, clock, sd=True):
        self.clock, self.model = clock, FakeModel(clock)
        self.cudagraph_manager = None  # enforce_eager
        self.sampler = Sampler(clock)
        self.rejection_sampler = RejectionSampler(self.sampler) if sd else None
        self.speculator = Speculator(clock) if sd else None
        self.speculative_config = object() if sd else None

    def execute_model(self, so=None):
        self.clock.advance(1.0)
        self.model(input_ids=None)

    def sample_tokens(self, g=None):
        self.model.compute_logits()
        if self.rejection_sampler is not None:
            self.rejection_sampler("logits", "batch")
        else:
            self.sampler("logits", "batch")
        if self.speculator is not None:
            self.speculator.propose()
        self.clock.advance(0.5)


def test_v2_call_hooks_and_no_sd():
    clock = Clock()
    r = FakeRunnerV2(clock)
    t = H.PhaseTimers(clock=clock).install(r, kind="v2")
    assert not t.missing and not t.failures, (t.missing, t.failures)
    assert isinstance(r.sampler, Sampler) and type(r.sampler) is not Sampler
    _step(r, 2)
    got = _totals(t.collect())
    # step = 1 + 2 + 0.5 + 0.25 + 4 + 0.5 = 8.25
    assert got == {"step": (2, 16.5), "verify": (2, 5.0), "sample": (2, 0.5), "draft": (2, 8.0)}
    t.uninstall()
    assert type(r.sampler) is Sampler and type(r.rejection_sampler) is RejectionSampler

    r0 = FakeRunnerV2(clock, sd=False)
    t0 = H.PhaseTimers(clock=clock).install(r0, kind="v2")
    assert not t0.missing and t0.not_applicable == {"draft"} and not t0.failures
    _step(r0, 1)
    got0 = _totals(t0.collect())
    assert got0["draft"] == (0, 0.0) and got0["sample"] == (1, 0.125) and got0["step"] == (1, 4.125)


def test_find_model_runner_chain_and_detection():
    clock = Clock()
    runner = FakeRunnerV1(clock)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(
        model_executor=SimpleNamespace(execute_model=print, sample_tokens=print,
                                       driver_worker=SimpleNamespace(worker=SimpleNamespace(
                                           execute_model=print, sample_tokens=print, model_runner=runner)))))))
    assert H.find_model_runner(llm) is runner
    assert H.find_model_runner(runner) is runner
    assert H.runner_kind(runner) == "v1" and H.runner_kind(FakeRunnerV2(clock)) == "v2"
    # engine core in another process: the chain stops at the client; all missing, no exception
    mp = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(resources=None)))
    t = H.install_phase_timers(mp)
    assert set(t.missing) == set(H.PHASES)
    assert all(math.isnan(r["total_s"]) for r in t.collect())
    t2 = H.install_phase_timers(llm)
    assert t2.runner_kind == "v1" and t2.timer == "perf_counter" and not t2.missing


def test_read_step_phases(tmp_path):
    empty = A.read_step_phases(tmp_path / "nothing")
    assert empty.empty and list(empty.columns) == columns("step_phases")
    assert A.breakdown_table(empty).empty
    d = tmp_path / "sw" / "step_phases"
    d.mkdir(parents=True)
    rows = [{"phase": p, "calls": 3, "total_s": s, "timer": "cuda_event"}
            for p, s in zip(H.PHASES, (0.25, 1.0, 0.125, 2.0))]
    phases_frame("r1", rows).to_parquet(d / "r1.parquet", index=False)
    got = A.read_step_phases(tmp_path / "sw")
    assert len(got) == 4 and str(got["calls"].dtype) == "Int64"
    bt = A.breakdown_table(got)
    assert bt.loc[0, "other_s"] == 0.625 and bt.loc[0, "timer"] == "cuda_event"
    assert A.timer_label(bt["timer"]) == "GPU time (CUDA events)"


# real engines --------------------------------------------------------------------------------------
def _self_check(method: str, timeout: int = 600, remote: bool = False) -> dict:
    """``sdlib selfcheck --method <method>`` in its own process (a tiny dummy-weight engine)."""
    from sdlib.paths import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_LOGGING_LEVEL": "ERROR"}
    p = subprocess.run([sys.executable, "-m", "sdlib", "selfcheck", "--method", method]
                       + (["--remote"] if remote else []), env=env,
                       capture_output=True, text=True, timeout=timeout, cwd=str(REPO_ROOT))
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, f"self-check failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(line[len("RESULT "):])


def _check(res: dict, timer: str, kind: str, empty_steps: int = 0) -> dict:
    """``empty_steps``: execute_model calls allowed without a target forward (the multi-process engine
    core's idle polls)."""
    d = res["describe"]
    assert d["runner_kind"] == kind, d
    assert not d["missing"] and not d["failures"], d
    assert all(d["hooked"][p] for p in H.PHASES), d
    tot = {r["phase"]: r["total_s"] for r in res["rows"]}
    calls = {r["phase"]: r["calls"] for r in res["rows"]}
    assert all(r["timer"] == timer for r in res["rows"])
    assert calls["step"] > 0 and all(tot[p] > 0 for p in H.PHASES), res["rows"]
    assert calls["draft"] > 0 and calls["step"] - empty_steps <= calls["verify"] <= calls["step"]
    assert tot["draft"] + tot["verify"] + tot["sample"] <= tot["step"] * (1 + 1e-6), tot
    return tot


@pytest.mark.engine
def test_engine_cpu_draft_model_all_phases_hooked():
    _check(_self_check("draft_model"), "perf_counter", "v1")


@pytest.mark.engine
def test_engine_cpu_timers_inside_the_worker_processes():
    """The tensor-parallel path: timers installed in the engine's worker processes through collective_rpc."""
    _check(_self_check("draft_model", remote=True), "perf_counter", "v1", empty_steps=2)


@pytest.mark.gpu
@pytest.mark.parametrize("method,kind", [("ngram", "v1"), ("draft_model", "v1"), ("eagle", "v2"), ("eagle3", "v2")])
def test_engine_gpu_cuda_events(method, kind):
    """On the GPU box with vLLM 0.26: n-gram and draft model run the V1 runner, EAGLE/EAGLE-3 the V2
    runner (async scheduling); CUDA graphs on, so the graph-replay paths are the ones timed."""
    _check(_self_check(method, timeout=900), "cuda_event", kind)


def test_share_intervals_over_pooled_runs():
    # two runs of one bar: verify shares 0.5 and 0.7 with equal step time -> replicates 0.5, 0.6 or 0.7;
    # a bar of one run has no interval
    bt = pd.DataFrame({"model": "m", "method_label": ["e", "e", "n"], "batch_size": 1, "step_s": 1.0,
                       "draft_s": 0.1, "verify_s": [0.5, 0.7, 0.8], "sample_s": 0.0, "other_s": [0.4, 0.2, 0.1]})
    ci = A.share_intervals(bt, n_boot=500).set_index("method_label")
    assert [ci.loc["e", "share_verify_lo"], ci.loc["e", "share_verify_hi"]] == pytest.approx([0.5, 0.7])
    assert math.isnan(ci.loc["n", "share_verify_lo"])
