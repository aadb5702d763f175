"""Processes of one test's sweeps, found through /proc (the fault tests: local, user-facing and Ray): every live
process whose environment carries the test's marker, a process's command line, and a poll with a deadline."""

from __future__ import annotations

import os
import time
from pathlib import Path


def ours(marker: str) -> list[int]:
    """Live (not zombie) processes other than this one that carry ``marker`` in their environment."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "environ").read_bytes():
                stat = (d / "stat").read_text()
                if stat[stat.rindex(")") + 2] != "Z":
                    out.append(int(d.name))
        except OSError:
            continue
    return out


def cmdline(pid: int) -> str:
    """``pid``'s command line, '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_for(cond, timeout: float, what: str, every: float = 0.05):
    """``cond()``'s first truthy value, polled every ``every`` s; AssertionError after ``timeout`` s."""
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
