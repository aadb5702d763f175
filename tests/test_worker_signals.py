"""The worker's end when its supervisor dies: the kernel's parent-death SIGTERM and the watcher's own SIGTERM
both arrive, and the second one must not cut the clean-up short (a CI run once found two /dev/shm files left
after a supervisor was killed while the cells ran: tests/test_faults.py). These run a stand-in worker (a process
group leader that imports ``sdlib.run.worker``, with a child mapping a /dev/shm file), no vLLM: seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from sdlib.paths import REPO_ROOT
from sdlib.run.supervise import group_alive

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir() or sys.platform != "linux",
                                reason="needs Linux /dev/shm")

# The stand-in: a child maps the shared-memory file (as vLLM's engine core maps its message queues); the main
# thread gets SIGTERM (the first raises KeyboardInterrupt, as in the worker), ends its group in `finally`, and a
# second SIGTERM lands in the middle of that clean-up (sent from inside remove_unused, so it lands there always).
STAND_IN = textwrap.dedent("""
    import mmap, os, signal, subprocess, sys, time
    from pathlib import Path
    import sdlib.run.worker as w

    shm = Path(sys.argv[1])
    shm.write_bytes(bytes(4096))
    child = subprocess.Popen([sys.executable, "-c",
        "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 4096); "
        "print('mapped', flush=True); time.sleep(600)", str(shm)], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    assert child.stdout.readline().strip() == b"mapped"
    real = w.remove_unused
    def remove_unused(files):
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM, now, during the clean-up
        time.sleep(0.3)                      # give Python's handler the chance to run in this (main) thread
        return real(files)
    w.remove_unused = remove_unused
    signal.signal(signal.SIGTERM, w._on_term)
    try:
        print("ready", flush=True)  # inside the try: the test's SIGTERM may come at once
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        w._end_own_group()
    print("not reached: _end_own_group ends the process", flush=True)
""")


def test_a_second_sigterm_during_the_clean_up_leaves_no_shared_memory(tmp_path):
    shm = Path(f"/dev/shm/sdlib_test_{uuid.uuid4().hex[:12]}")
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(shm)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        os.kill(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"the stand-in did not end within 60 s: {out!r} {err!r}") from None
        assert "interrupted" in out and "not reached" not in out, (out, err)
        assert "Traceback" not in err, err  # the second SIGTERM raised nothing inside the clean-up
        assert proc.returncode == -signal.SIGKILL  # the group ended itself, this process last
        t_end = time.monotonic() + 10
        while group_alive(proc.pid) and time.monotonic() < t_end:
            time.sleep(0.1)
        assert not group_alive(proc.pid), "the child mapping the file outlived its group's end"
        assert not shm.exists(), "shared memory left after a second SIGTERM during the clean-up"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        shm.unlink(missing_ok=True)


def test_the_first_sigterm_interrupts_and_later_ones_do_nothing(tmp_path):
    """In a fresh process (the handler's state is global): the first SIGTERM raises KeyboardInterrupt, a second
    returns; the back-stop thread it starts would end the group after 15 s, so the process leaves before that."""
    code = textwrap.dedent("""
        import os, signal
        import sdlib.run.worker as w
        try:
            w._on_term(signal.SIGTERM, None)
            print("no raise")
        except KeyboardInterrupt:
            print("raised")
        print("second", w._on_term(signal.SIGTERM, None))
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                         capture_output=True, text=True, timeout=60, start_new_session=True)
    assert out.stdout.split("\n")[:2] == ["raised", "second None"], (out.stdout, out.stderr)
