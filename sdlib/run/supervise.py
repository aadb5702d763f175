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
import re
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
#: What a worker's exit code means (``sdlib.run.worker``), for the failure records and the progress line.
EXIT_REASONS = {
    3: "its engine died during a cell",
    4: "it computed other run ids than the sweep (a changed checkout or model folder?)",
    5: "it found its sweep gone",
    6: "it could not write its results (a full disk or a read-only folder)",
    130: "it was interrupted",
}
#: Where Python's multiprocessing semaphores (``sem.mp-*``) and shared memory (``psm_*``: vLLM's message queues)
#: live. A process killed with SIGKILL, with the resource tracker that would unlink them, leaves them behind:
#: the supervisor and the worker track which files their group maps and unlink those left once it is gone.
SHM_DIR = Path("/dev/shm")
#: Seconds between two looks at which /dev/shm files an engine group maps: often while its engine starts (when
#: vLLM makes them), rarely after (reading a process's memory map takes a lock the process also needs).
SHM_TRACK_S = 0.5
SHM_TRACK_UP_S = 10.0


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
        #: every /dev/shm file a process of the group was seen mapping (unlinked if left when the group is gone)
        self.shm_seen: set[str] = set()
        self._shm_looked = 0.0
        self.on_shm: Optional[Callable[[set[str]], None]] = None  # told when shm_seen grows (persisted by the sweep)
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pgid = self.proc.pid  # start_new_session: the worker leads its own group
        self._pump = threading.Thread(target=self._copy_output, daemon=True)
        self._pump.start()

    def _copy_output(self) -> None:
        clean = LogCleaner()
        with open(self.log_file, "ab") as log:
            while True:
                chunk = self.proc.stdout.read1(65536)
                if not chunk:
                    log.write(clean.flush())
                    return
                log.write(clean.feed(chunk))
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
                if time.monotonic() - self._shm_looked >= (SHM_TRACK_UP_S if self.engine_up else SHM_TRACK_S):
                    self.track_shm()
                rc = self.proc.poll()
                if rc is not None:
                    return Outcome(rc, "" if rc == 0 else exit_reason(rc))
                if (startup_timeout_s is not None and not self.engine_up
                        and time.monotonic() - self.started > startup_timeout_s):
                    self.terminate()
                    return Outcome(None, f"engine did not start within {startup_timeout_s:g} s "
                                         "(engine.startup_timeout_s); ended")
                time.sleep(self.poll_s)
        finally:
            self.reap_group()
            self._pump.join(timeout=5.0)

    def track_shm(self) -> None:
        """Note the /dev/shm files the group maps now (the worker, vLLM's engine core and workers, ...)."""
        self._shm_looked = time.monotonic()
        new = shm_files(group_pids(self.pgid)) - self.shm_seen
        if new:
            self.shm_seen |= new
            if self.on_shm is not None:
                self.on_shm(self.shm_seen)

    def terminate(self, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM to the whole group (vLLM shuts down on it), SIGKILL to whatever is left after ``grace_s``."""
        self.track_shm()
        end_group(self.pgid, grace_s, leader=self.proc, known=self.shm_seen)

    def reap_group(self, grace_s: float = 3.0) -> None:
        """After the worker is gone: end any process of its group still alive (orphaned engine processes), and
        unlink the /dev/shm files its processes mapped and left (a worker killed with SIGKILL unlinks none)."""
        if group_alive(self.pgid):
            self.track_shm()
            end_group(self.pgid, grace_s, known=self.shm_seen)
        else:
            remove_unused(self.shm_seen)


_ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


class LogCleaner:
    """Engine output as a log file should hold it: terminal escape sequences removed, and a progress bar that
    redraws itself with ``\r`` kept only in its last state (one line, not thousands of redraws)."""

    def __init__(self) -> None:
        self.partial = b""

    @staticmethod
    def _last(segment: bytes) -> bytes:
        parts = [p for p in segment.split(b"\r") if p.strip()]
        return parts[-1] if parts else b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines ``chunk`` finishes, cleaned."""
        lines = _ANSI.sub(b"", self.partial + chunk).split(b"\n")
        tail = lines.pop()
        self.partial = self._last(tail) + (b"\r" if b"\r" in tail else b"")
        return b"".join(self._last(x) + b"\n" for x in lines if self._last(x) or not x.strip(b"\r"))

    def flush(self) -> bytes:
        """What is left of an unfinished line."""
        last, self.partial = self._last(self.partial), b""
        return last + b"\n" if last else b""


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


def exit_reason(rc: int) -> str:
    """A worker's exit code in words."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"engine process was killed ({name})"
    why = EXIT_REASONS.get(rc)
    return f"engine process exited with code {rc}" + (f": {why}" if why else "")


def mapped_shm(uid: Optional[int] = None) -> set[str]:
    """Every /dev/shm file some live process (of ``uid``, default ours) maps: those are in use."""
    uid = os.getuid() if uid is None else uid
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid:
                    pids.append(int(d.name))
            except OSError:
                continue
    return shm_files(pids)


def remove_unused(files) -> int:
    """Unlink those of ``files`` (/dev/shm paths an engine group mapped) that no live process maps any more:
    left by processes that are gone; a file another live process holds is never touched. Returns how many."""
    files = [f for f in files if Path(f).exists()]
    if not files:
        return 0
    used, n = mapped_shm(), 0
    for f in files:
        if str(f) in used:
            continue
        try:
            os.unlink(f)
            n += 1
        except OSError:
            pass
    return n


def end_group(pgid: int, grace_s: float = TERM_GRACE_S, leader: Optional[subprocess.Popen] = None,
              known: "set[str] | list[str]" = ()) -> None:
    """End a process group: SIGTERM, then SIGKILL after ``grace_s``; then unlink the shared-memory files its
    processes mapped (now, and ``known``: seen earlier) that no live process maps (a killed vLLM engine leaves
    them behind)."""
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
    remove_unused(set(shm) | set(known))


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
