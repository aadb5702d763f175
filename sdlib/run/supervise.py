"""Supervise one engine process: start it in its own process group, copy its output to a log, enforce the
start-up timeout, and end it with every process it started (vLLM's engine core and workers).

The worker (``sdlib worker SPEC``) writes ``env_out`` once its engine is up; an engine that has not come
up within ``startup_timeout_s`` is ended and reported as such. The output is read by a thread, so a
dead worker whose children still hold the pipe never blocks the sweep.

Usage:
    proc = EngineProcess(cmd, log_file, env=env, env_out=path)
    outcome = proc.wait(startup_timeout_s=1800)   # Outcome(exit_code, reason)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

#: Seconds between SIGTERM and SIGKILL when a process group is ended.
TERM_GRACE_S = 10.0


@dataclass
class Outcome:
    """How an engine process ended: its exit code (None if killed by us) and why, in words."""

    exit_code: Optional[int]
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class EngineProcess:
    """One worker process (and its process group)."""

    def __init__(self, cmd: list[str], log_file: Path, env: dict[str, str], cwd: Optional[str] = None,
                 env_out: Optional[Path] = None, echo: bool = False, poll_s: float = 0.2):
        self.log_file = Path(log_file)
        self.env_out = Path(env_out) if env_out else None
        self.echo = echo
        self.poll_s = poll_s
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pgid = self.proc.pid  # start_new_session: the worker leads its own group
        self._pump = threading.Thread(target=self._copy_output, daemon=True)
        self._pump.start()

    def _copy_output(self) -> None:
        with open(self.log_file, "ab") as log:
            while True:
                chunk = self.proc.stdout.read1(65536)
                if not chunk:
                    return
                log.write(chunk)
                log.flush()
                if self.echo:
                    sys.stderr.buffer.write(chunk)
                    sys.stderr.flush()

    @property
    def engine_up(self) -> bool:
        return self.env_out is not None and self.env_out.exists()

    def wait(self, startup_timeout_s: Optional[float] = None, on_poll: Optional[Callable[[], None]] = None,
             poll_every_s: float = 1.0) -> Outcome:
        """Wait for the worker to exit; end it (and its group) if its engine is not up in time.
        ``on_poll`` is called about every ``poll_every_s`` (progress display)."""
        last = 0.0
        try:
            while True:
                if on_poll is not None and time.monotonic() - last >= poll_every_s:
                    last = time.monotonic()
                    on_poll()
                rc = self.proc.poll()
                if rc is not None:
                    return Outcome(rc, "" if rc == 0 else f"engine process exited with code {rc}")
                if (startup_timeout_s is not None and not self.engine_up
                        and time.monotonic() - self.started > startup_timeout_s):
                    self.terminate()
                    return Outcome(None, f"engine did not start within {startup_timeout_s:g} s "
                                         "(engine.startup_timeout_s); ended")
                time.sleep(self.poll_s)
        finally:
            self.reap_group()
            self._pump.join(timeout=5.0)

    def terminate(self, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM to the whole group (vLLM shuts down on it), SIGKILL to whatever is left after ``grace_s``."""
        end_group(self.pgid, grace_s, leader=self.proc)

    def reap_group(self, grace_s: float = 3.0) -> None:
        """After the worker is gone: end any process of its group still alive (orphaned engine processes)."""
        if group_alive(self.pgid):
            end_group(self.pgid, grace_s)


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def shm_files(pids: list[int]) -> set[str]:
    """Shared-memory files (/dev/shm) the processes map (vLLM's message queues)."""
    out = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                    out.add(parts[5].split(" (deleted)")[0])
        except OSError:
            continue
    return out


def end_group(pgid: int, grace_s: float = TERM_GRACE_S, leader: Optional[subprocess.Popen] = None) -> None:
    """End a process group: SIGTERM, then SIGKILL after ``grace_s``; then unlink the shared-memory files its
    processes mapped (a killed vLLM engine leaves them behind)."""
    shm = shm_files(group_pids(pgid))
    _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(pgid):
        if leader is not None:
            leader.poll()
        time.sleep(0.1)
    _signal(pgid, signal.SIGKILL)
    if leader is not None:
        leader.wait()
    for _ in range(50):  # the kernel needs a moment to reap
        if not group_alive(pgid):
            break
        time.sleep(0.05)
    for f in shm:
        try:
            os.unlink(f)
        except OSError:
            pass


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """True while any (non-zombie) process of group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_pids(pgid))
