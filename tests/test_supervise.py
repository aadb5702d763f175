"""The engine-process supervisor (sdlib.run.supervise): start-up timeout, process-group clean-up, no hang on a
pipe held by orphaned children. Plain Python processes stand in for the worker and vLLM's engine processes."""

from __future__ import annotations

import os
import sys
import time

from sdlib.run.supervise import EngineProcess, group_alive

# a "worker" that starts a long-lived child (as vLLM starts its engine core), then sleeps or exits
WORKER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("child", child.pid, flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
time.sleep(120)
"""


def _start(tmp_path, mode: str, env_out=None) -> EngineProcess:
    return EngineProcess([sys.executable, "-c", WORKER, mode], tmp_path / "w.log", env=dict(os.environ),
                         env_out=env_out)


def _child_pid(log) -> int:
    for _ in range(100):
        text = log.read_text() if log.exists() else ""
        if "child" in text:
            return int(text.split()[1])
        time.sleep(0.05)
    raise AssertionError("worker never printed its child")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_engine_not_up_in_time_is_ended_with_its_children(tmp_path):
    p = _start(tmp_path, "sleep", env_out=tmp_path / "env.json")
    child = _child_pid(tmp_path / "w.log")
    t0 = time.monotonic()
    out = p.wait(startup_timeout_s=1.0)
    assert out.exit_code is None and "did not start within 1 s" in out.reason
    assert time.monotonic() - t0 < 20
    time.sleep(0.3)
    assert not _alive(child) and not group_alive(p.pgid)


def test_engine_up_means_no_startup_timeout(tmp_path):
    env_out = tmp_path / "env.json"
    env_out.write_text("{}")  # the worker reports its engine up at once
    p = EngineProcess([sys.executable, "-c", "import time; time.sleep(1.5)"], tmp_path / "w.log",
                      env=dict(os.environ), env_out=env_out)
    out = p.wait(startup_timeout_s=0.5)
    assert out.ok and out.reason == ""


def test_dead_worker_with_children_holding_the_pipe_does_not_hang(tmp_path):
    p = _start(tmp_path, "exit")
    child = _child_pid(tmp_path / "w.log")
    t0 = time.monotonic()
    out = p.wait()
    assert out.exit_code == 3 and "exited with code 3" in out.reason
    assert time.monotonic() - t0 < 20  # not the child's 120 s
    time.sleep(0.3)
    assert not _alive(child)
    assert "child" in (tmp_path / "w.log").read_text()
