"""Faults a user meets (issue 22): a kill during engine start-up leaves no process and no file in /dev/shm
(real CPU engines, killed as soon as their first semaphore exists); Ctrl-C says what is kept in one line; a
table damaged in the middle, not only cut short, is not a finished cell. Polls with deadlines, never fixed
sleeps. (The broader fault test is tests/test_faults.py.)"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdlib.paths import MODELS_DIR, REPO_ROOT
from sdlib.run.supervise import SHM_DIR, mapped_shm, remove_unused, shm_files
from sdlib.store import SweepStore, empty_table
from tests.conftest import sigint_as_at_a_terminal
from tests.procs import cmdline as _cmdline, ours as _ours, wait_for as _until


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    from sdlib.models.tinymodels import build_models

    build_models(MODELS_DIR)
    d = tmp_path_factory.mktemp("faults_user")
    (d / "p.jsonl").write_text('{"prompt": "Write a haiku."}\n{"prompt": "Count to five."}\n')
    cfg = {"name": "startup", "models": [{"name": "tiny", "path": str(MODELS_DIR / "target"), "max_model_len": 512}],
           "methods": [{"name": "none"}],
           "workloads": [{"dataset": "custom", "name": "haiku", "path": "p.jsonl", "num_requests": 2,
                          "max_output_tokens": 8, "ignore_eos": True}],
           "batch_sizes": [1], "warmup_requests": 1,
           "engine": {"gpu_memory_utilization": 0.1, "enforce_eager": True}}
    p = d / "startup.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _start(p: Path, marker: str, err: Path) -> subprocess.Popen:
    env = {**os.environ, "SDLIB_FAULT_TEST": marker, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-m", "sdlib", "sweep", str(p), "--no-summary"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(err, "w"), start_new_session=True,
                            preexec_fn=sigint_as_at_a_terminal)


def _left_in_shm(seen: set[str]) -> list[str]:
    """What a dead sweep left: the /dev/shm files its processes were seen mapping that still exist."""
    return sorted(f for f in seen if Path(f).exists())


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize("victim,moment", [("worker", ("sem.mp-",)), ("supervisor", ("sem.mp-", "psm_")),
                                           ("sigint", ("sem.mp-",))], ids=["worker", "supervisor", "sigint"])
def test_a_kill_during_engine_startup_leaves_nothing(config, tmp_path, victim, moment):
    """kill -9 of the worker, kill -9 of the supervisor (its worker then ends its own group), Ctrl-C of the
    supervisor, each during the engine's start-up: no process of the sweep 30 s later, no file it made left in
    /dev/shm (before the fix a supervisor killed there left ``sem.mp-*`` and ``psm_*`` files), one line."""
    marker, err = uuid.uuid4().hex, tmp_path / "stderr.txt"
    proc = _start(config, marker, err)
    seen: set[str] = set()  # every /dev/shm file the sweep's processes map, looked at every 0.1 s until the kill

    def reached() -> bool:
        now = shm_files(_ours(marker))
        seen.update(now)
        return all(any(Path(f).name.startswith(k) for f in now) for k in moment)
    try:
        _until(reached, 240, f"the engine's start-up ({moment} in /dev/shm)", every=0.1)
        worker = next(pid for pid in _ours(marker) if " worker " in _cmdline(pid))
        seen |= shm_files(_ours(marker))
        if victim == "worker":
            os.kill(worker, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL if victim == "supervisor" else signal.SIGINT)
        _until(lambda: proc.poll() is not None, 60, "the supervisor to exit")
        _until(lambda: not _ours(marker), 30, "every process of the sweep to end")
        try:
            _until(lambda: not _left_in_shm(seen), 10, "/dev/shm to be clean")
        except AssertionError:
            raise AssertionError(f"left in /dev/shm: {_left_in_shm(seen)}") from None
    finally:
        for pid in _ours(marker):  # a failed run of this test must not leave an engine behind
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass
    text = err.read_text()
    assert "Traceback" not in text, text
    if victim == "sigint":
        assert proc.returncode == 130
        assert text.strip().splitlines()[-1].startswith("startup: interrupted; 0 cell(s) kept, 1 to do"), text
    if victim == "worker":
        failure = json.loads(next((config.parent / "results" / "startup" / "failures").glob("*.json")).read_text())
        assert "killed (SIGKILL)" in failure["error"], failure


def test_only_files_no_live_process_holds_are_unlinked():
    tag = uuid.uuid4().hex[:8]
    left, held = SHM_DIR / f"sem.mp-sdlibtest{tag}a", SHM_DIR / f"psm_sdlibtest{tag}b"
    try:
        left.write_bytes(b"\0" * 32)
        held.write_bytes(b"\0" * 32)
        with open(held, "r+b") as fh, mmap.mmap(fh.fileno(), 32) as m:  # a live process (this one) maps it
            assert str(held) in mapped_shm() and str(left) not in mapped_shm()
            assert remove_unused({str(left), str(held), str(SHM_DIR / "sem.mp-gone")}) == 1
            assert not left.exists() and held.exists()
            m[0] = 1
    finally:
        for f in (left, held):
            f.unlink(missing_ok=True)


def _cell(store: SweepStore, run_id: str) -> None:
    steps = pd.DataFrame({"run_id": run_id, "request_id": [f"r{i % 7}" for i in range(3000)], "step": range(3000),
                          "engine_step": range(3000), "position": range(3000), "drafted": 3,
                          "accepted": [i % 4 for i in range(3000)]})
    runs = empty_table("runs").reindex([0])
    runs["run_id"] = run_id
    store.write_cell(run_id, {"runs": runs, "requests": empty_table("requests"), "steps": steps,
                              "engine_steps": empty_table("engine_steps")})


def _damage_middle(f: Path) -> None:
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(64)  # same size, footer intact: a damaged disk block, not a cut write
    f.write_bytes(bytes(data))


def test_a_table_damaged_in_the_middle_is_not_done(tmp_path, capsys):
    from sdlib.store.sweep_store import readable

    store = SweepStore(tmp_path / "s")
    _cell(store, "a")
    _cell(store, "b")
    assert store.done_ids() == {"a", "b"}
    f = store.dir / "steps" / "b.parquet"
    _damage_middle(f)
    assert readable(f)  # the footer still reads: only the checksum (or a full decode) finds it
    assert store.done_ids() == {"a"} and store.corrupt_ids() == {"b"}
    assert "steps file damaged" in store.damage("b")
    with pytest.warns(UserWarning, match="damaged or unreadable"):
        assert set(store.read("steps")["run_id"]) == {"a"}
    with pytest.warns(UserWarning, match="damaged or unreadable"):
        assert list(store.read("runs")["run_id"]) == ["a"]  # the cell's intact runs row is not read either
    # a cell written before checksums existed: found by decoding it whole
    old = tmp_path / "old"
    for t, df in (("runs", pd.read_parquet(store.dir / "runs" / "a.parquet")),
                  ("steps", pd.read_parquet(store.dir / "steps" / "a.parquet")), ("requests", empty_table("requests")),
                  ("engine_steps", empty_table("engine_steps"))):
        (old / t).mkdir(parents=True, exist_ok=True)
        df.to_parquet(old / t / "a.parquet", index=False)
    old_store = SweepStore(old)
    assert old_store.done_ids() == {"a"}
    _damage_middle(old / "steps" / "a.parquet")
    assert old_store.done_ids() == set() and "damaged" in old_store.damage("a")
    with pytest.warns(UserWarning, match="damaged or unreadable"):
        assert old_store.read("steps").empty  # never a traceback
