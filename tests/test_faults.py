"""Fault injection with real CPU vLLM engines (slow; CI runs it): kill -9 of the worker mid-cell, kill -9 of
the supervisor at three random moments (one before its worker starts, one while the engine starts, one while
the cells run; the seed is in every message), SIGINT and SIGTERM to the supervisor alone while the engine
starts. Each time: no finished cell lost or changed, no process of the sweep alive 10 s later, no failure
written for a cell that did not fail, and a resume completes every cell.

No fixed sleeps: each moment is a state the test waits for (a worker process, the engine up, a cell done),
with a deadline, and the random moments are drawn inside the phases the first run measured. Each kill after
the first redoes the three cells of one engine group, so the killed run and its resume start one engine each."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest
import yaml

from sdlib.paths import MODELS_DIR, REPO_ROOT
from tests.conftest import sigint_as_at_a_terminal
from sdlib.run.supervise import shm_files
from sdlib.store import SweepStore
from tests.procs import cmdline as _cmdline, ours as _ours

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from sdlib.models.tinymodels import build_models

    build_models(MODELS_DIR)
    d = tmp_path_factory.mktemp("faults")
    (d / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Write a haiku about the number {i}."}) + "\n"
                                       for i in range(6)))
    cfg = {"name": "faults", "results_dir": str(d / "out"),
           "models": [{"name": "tiny", "path": str(MODELS_DIR / "target"), "max_model_len": 512}],
           "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
           "workloads": [{"dataset": "custom", "name": "haiku", "path": str(d / "p.jsonl"), "num_requests": 4,
                          "max_output_tokens": 24, "ignore_eos": True}],
           "batch_sizes": [1, 2, 4], "warmup_requests": 1,
           "engine": {"gpu_memory_utilization": 0.1, "enforce_eager": True}}
    p = d / "faults.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p, SweepStore(d / "out" / "faults")


def _start(p: Path, marker: str) -> subprocess.Popen:
    env = {**os.environ, "SDLIB_FAULT_TEST": marker, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-m", "sdlib", "sweep", str(p), "--no-summary"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=sigint_as_at_a_terminal)


def _wait_for(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _snapshot(store: SweepStore) -> dict:
    return {f: f.stat().st_mtime_ns for f in store.dir.glob("*/*.parquet")}


def _no_orphans(marker: str, what: str = "", within_s: float = 10.0) -> None:
    """No process of the sweep alive ``within_s`` after it ended: polled, so it returns as soon as they are
    gone (a process that is gone cannot come back: only a live one of ours could start another)."""
    t_end = time.monotonic() + within_s
    left = _ours(marker)
    while left and time.monotonic() < t_end:
        time.sleep(0.2)
        left = _ours(marker)
    assert not left, f"processes left {within_s:g} s later{' (' + what + ')' if what else ''}: " \
                     f"{[(p, _cmdline(p)[:80]) for p in left]}"


def _workers(marker: str) -> list[int]:
    return [x for x in _ours(marker) if " worker " in _cmdline(x)]


def _engine_up(store: SweepStore, since: float) -> bool:
    """A worker's engine is up: it wrote its environment file after ``since`` (``sdlib.run.worker``: after
    the engine started, before the first cell; one a killed supervisor left behind is older)."""
    for f in (store.dir / ".run").glob("*.env.json"):
        try:
            if f.stat().st_mtime >= since:
                return True
        except OSError:
            continue
    return False


def _phase(marker: str, store: SweepStore, since: float) -> str:
    if _engine_up(store, since):
        return "the cells run"
    return "the engine starts" if _workers(marker) else "before the worker"


def _kept(before: dict) -> None:
    for f, mtime in before.items():
        assert f.exists() and f.stat().st_mtime_ns == mtime, f"finished cell file lost or changed: {f}"


def _stopped_worker(marker: str, store: SweepStore) -> dict:
    """A live worker, stopped (SIGSTOP) with cells still to do, so that a SIGKILL lands mid-work whatever the
    machine's load: a stopped worker writes no cell, so the cells not done now are exactly those the kill
    must fail. Empty (and every worker left running) when there is none right now."""
    for pid in _ours(marker):
        argv = _cmdline(pid).split()
        if "worker" not in argv or not argv[-1].endswith(".spec.json"):
            continue
        try:
            run_ids = set(json.loads(Path(argv[-1]).read_text())["run_ids"])
            os.kill(pid, signal.SIGSTOP)
        except (OSError, ValueError, KeyError):
            continue
        if _wait_stopped(pid):
            todo = run_ids - store.done_ids()
            if todo:
                return {"pid": pid, "run_ids": run_ids, "todo": todo}
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    return {}


def _wait_stopped(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` is in the stopped state (T); False if it is gone or does not stop in time."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if stat[stat.rindex(")") + 2] == "T":
            return True
        time.sleep(0.01)
    return False


def _cells_of(p: Path) -> dict[str, set[str]]:
    """Engine group (method label) -> its cells' run ids."""
    from sdlib.config import load_sweep

    out: dict[str, set[str]] = {}
    for c in load_sweep(p).cells():
        out.setdefault(c.method.label, set()).add(c.run_id)
    return out


def test_faults(setup):
    p, store = setup
    groups = _cells_of(p)
    assert [len(c) for c in groups.values()] == [3, 3]
    # 1. kill -9 of the worker in the middle of a cell: its cells fail, the sweep goes on and ends by itself
    marker = uuid.uuid4().hex
    t0, since = time.monotonic(), time.time() - 1
    proc = _start(p, marker)
    seen: dict[str, float] = {}

    def first_cell() -> bool:  # and the phases of a start: when the worker appeared, when its engine was up
        if "worker" not in seen and _workers(marker):
            seen["worker"] = time.monotonic() - t0
        if "up" not in seen and _engine_up(store, since):
            seen["up"] = time.monotonic() - t0
        return len(store.done_ids()) >= 1

    _wait_for(first_cell, 300, "a first cell")
    t_worker = seen.get("worker", 3.0)
    t_start = max(seen.get("up", t_worker + 5.0) - t_worker, 1.0)  # the engine's start, worker to engine up
    found: dict = {}
    _wait_for(lambda: found.update(_stopped_worker(marker, store)) or found, 300, "a worker with cells to do")
    before = _snapshot(store)
    shm = shm_files(_ours(marker))
    os.kill(found["pid"], signal.SIGKILL)
    assert proc.wait(timeout=300) in (0, 1)
    _no_orphans(marker)
    assert not [f for f in shm if Path(f).exists()], "shared memory left after the worker was killed"
    _kept(before)
    failed = set(store.failures()["run_id"]) if len(store.failures()) else set()
    assert failed and failed == found["todo"] == found["run_ids"] - store.done_ids(), \
        f"failures recorded {sorted(failed)}; cells not done when the worker was killed {sorted(found['todo'])}"
    # 2. resume: every cell done
    proc = _start(p, marker)
    assert proc.wait(timeout=600) == 0
    assert len(store.done_ids()) == 6 and store.failures().empty
    _no_orphans(marker)
    # 3-7. kill -9 of the supervisor alone at three random moments (before its worker, while the engine
    # starts, while the cells run), then SIGINT and SIGTERM of it alone while the engine starts; each
    # followed by a resume. Each redoes one engine group's three cells (the groups in turn).
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    trials = [(signal.SIGKILL, "before the worker"), (signal.SIGKILL, "the engine starts"),
              (signal.SIGKILL, "the cells run"), (signal.SIGINT, "the engine starts"),
              (signal.SIGTERM, "the engine starts")]
    labels = list(groups)
    for i, (sig, moment) in enumerate(trials):
        redo = groups[labels[i % len(labels)]]
        store.remove_cells(redo)  # three cells to redo, one engine
        marker = uuid.uuid4().hex
        t0, since = time.monotonic(), time.time() - 1
        proc = _start(p, marker)
        if moment == "before the worker":  # a random moment of the supervisor's own start
            delay = rng.uniform(0.1, 0.7) * t_worker
            _wait_for(lambda: time.monotonic() - t0 >= delay or bool(_workers(marker)), 120, "the moment")
        elif moment == "the engine starts":  # a random moment between the worker's start and its engine up
            _wait_for(lambda: bool(_workers(marker)), 120, "a worker")
            t1, delay = time.monotonic(), rng.uniform(0.1, 0.7) * t_start
            _wait_for(lambda: time.monotonic() - t1 >= delay or _engine_up(store, since), 300, "the moment")
        else:  # a random moment of the first cells
            _wait_for(lambda: _engine_up(store, since), 300, "an engine up")
            t1, delay = time.monotonic(), rng.uniform(0.0, 0.5)
            _wait_for(lambda: time.monotonic() - t1 >= delay, 10, "the moment")
        at = _phase(marker, store, since)
        what = (f"{sig!r} at {time.monotonic() - t0:.1f} s, meant while {moment}, landed while {at} "
                f"(seed {seed})")
        before = _snapshot(store)
        shm = shm_files(_ours(marker))
        t_kill = time.time()
        os.kill(proc.pid, sig)
        proc.wait(timeout=120)
        _no_orphans(marker, what)
        _kept(before)
        late = [f for f in (store.dir / "failures").glob("*.json") if f.stat().st_mtime > t_kill + 1]
        assert not late, f"failures written after the kill ({what}): {late}"
        assert not [f for f in shm if Path(f).exists()], f"shared memory left after {what}"
        proc = _start(p, marker)
        assert proc.wait(timeout=600) == 0, what
        assert len(store.done_ids()) == 6, what
        if at != moment:  # the machine's pace moved the moment into the next phase: still a fault, said
            warnings.warn(f"fault test: {what}", stacklevel=1)
