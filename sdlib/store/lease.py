"""A results folder's lease: which sweep holds the folder, safe across hosts that share it over a network file system.

:class:`sdlib.store.FolderLock` takes an ``flock`` on ``.sweep.lock``. On a local file system that is exact and
is released when its holder dies; on NFS it may not be: Linux clients mounted with ``local_lock=flock`` (and
NFSv3 clients without a lock manager) lock only on their own host, and a server restart can drop locks. So the
lock also holds a lease, ``.sweep.lease`` (JSON: host, pid, token, since), that its holder creates with
``O_CREAT | O_EXCL`` (atomic on NFSv3 and later and on every local file system) and rewrites every
:data:`LEASE_HEARTBEAT_S` from a thread. Another sweep, on any host, refuses the folder while the lease is live:

* held on this host: live while its pid is alive and its heartbeat is not stale;
* held on another host: live while the file was rewritten less than :data:`LEASE_STALE_S` ago, measured on the
  file system's own clock (against the mtime of a probe file written beside it just now), so the hosts' clocks
  need not agree.

A stale lease (its holder was killed, or its host died) is taken over: renamed aside (one rename of a file
succeeds, so of two sweeps taking it over at once one finds the other's fresh lease aside instead of the stale
one and refuses), then created anew with ``O_EXCL``. A holder whose lease went missing recreates it at its next
heartbeat; one that finds another token in it has lost the folder (``lost``; the Ray executor starts no group
then, :mod:`sdlib.run.ray_executor`).

Not covered: a holder paused (stopped, or its host cut off) for longer than :data:`LEASE_STALE_S` while its
engines keep writing: its lease is taken over, and until its heartbeat notices, both write. Cells are written
atomically and each by one engine group, so a finished cell is never damaged; the same cell may be measured twice.

Usage:
    lease = Lease(folder).take()     # SweepBusy if another sweep holds it
    lease.heartbeat()                # (a thread calls it every LEASE_HEARTBEAT_S)
    lease.release()
    lease_holder(folder)             # {"host", "pid", "token", "since"} or None
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any, Optional

from sdlib.store.files import write_json_atomic
from sdlib.store.provenance import utc_now

LEASE_NAME = ".sweep.lease"
#: Seconds between two rewrites of a held lease.
LEASE_HEARTBEAT_S = 10.0
#: Seconds after its last rewrite when a lease counts as abandoned: well above the heartbeat and NFS's attribute
#: cache (``acregmax``, 60 s by default; a lease is read by opening it, which revalidates, but a margin is kept).
LEASE_STALE_S = 120.0


class LeaseBusy(RuntimeError):
    """A live lease of another sweep; the message says whose (:class:`sdlib.store.SweepBusy` derives from it)."""


def _read(path: Path) -> Optional[tuple[dict[str, Any], float]]:
    """The lease's content and mtime (opened first: on NFS an open revalidates the file's attributes); None if
    there is none. An unreadable lease reads as ``{}`` (judged by its age alone)."""
    try:
        with open(path) as fh:
            mtime = os.fstat(fh.fileno()).st_mtime
            text = fh.read()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = {}
    return (data if isinstance(data, dict) else {}), mtime


def lease_holder(folder: Path) -> Optional[dict[str, Any]]:
    """Who holds ``folder``'s lease now (host, pid, token, since), or None."""
    got = _read(Path(folder) / LEASE_NAME)
    return None if got is None else got[0]


def fs_now(folder: Path) -> float:
    """The file system's clock: the mtime of a probe file written in ``folder`` now (then removed)."""
    probe = Path(folder) / f"{LEASE_NAME}.probe-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"x")
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def why_live(held: dict[str, Any], age_s: float) -> Optional[str]:
    """Why a lease read ``age_s`` seconds after its last rewrite still holds (None: stale, take it over)."""
    if age_s > LEASE_STALE_S:
        return None
    if held.get("host") == socket.gethostname() and not _pid_alive(held.get("pid")):
        return None  # its holder on this host is gone (killed: nothing removed the lease)
    return f"its lease was renewed {max(age_s, 0.0):.0f} s ago"


class Lease:
    """This process's lease on a results folder."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LEASE_NAME
        self.token = uuid.uuid4().hex
        self.record = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token, "since": utc_now()}
        self.lost: Optional[str] = None  # why this lease is no longer ours (None while it is)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _create(self) -> bool:
        """Create the lease file with our record unless one exists (O_EXCL); True when created."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump(self.record, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def take(self) -> "Lease":
        """Take the lease (a stale one is taken over); :class:`LeaseBusy` while another sweep's is live."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                break
            got = _read(self.path)
            if got is None:
                continue  # removed in between: try again
            held, mtime = got
            live = why_live(held, fs_now(self.folder) - mtime)
            if live:
                raise LeaseBusy(self._busy(held, live))
            aside = self.path.with_name(f"{LEASE_NAME}.stale-{self.token}")
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                continue  # another sweep moved it first
            moved = _read(aside)
            aside.unlink(missing_ok=True)
            if moved is not None and moved[0].get("token") != held.get("token"):
                # another sweep took the stale lease over between our look and our rename: it is theirs (their
                # heartbeat recreates the file we moved)
                raise LeaseBusy(self._busy(moved[0], "it has just taken over a stale lease"))
        else:
            raise LeaseBusy(f"results folder {self.folder}: its lease ({self.path.name}) keeps changing; another "
                            "sweep is taking it")
        back = lease_holder(self.path.parent)
        if not back or back.get("token") != self.token:
            raise LeaseBusy(self._busy(back or {}, "it took the lease at the same moment"))
        return self

    def _busy(self, held: dict[str, Any], why: str) -> str:
        who = f"pid {held.get('pid', '?')} on {held.get('host', '?')}" + (
            f" since {held['since']}" if held.get("since") else "")
        return (f"results folder {self.folder} is in use by {who} ({why}; {self.path.name}); wait for it, or use "
                "another --results-dir")

    def heartbeat(self) -> bool:
        """Rewrite the lease if it is still ours (recreate it if it went missing); False once it is another's."""
        if self.lost:
            return False
        held = lease_holder(self.folder)
        if held is None:
            if self._create():
                return True
            held = lease_holder(self.folder) or {}
        if held.get("token") != self.token:
            self.lost = (f"the lease of {self.folder} was taken by pid {held.get('pid', '?')} on "
                         f"{held.get('host', '?')}")
            return False
        write_json_atomic(self.record, self.path)
        return True

    def start(self, every_s: Optional[float] = None) -> "Lease":
        """Heartbeat from a daemon thread every ``every_s`` (default :data:`LEASE_HEARTBEAT_S`)."""
        every = LEASE_HEARTBEAT_S if every_s is None else every_s

        def beat() -> None:
            while not self._stop.wait(every):
                try:
                    if not self.heartbeat():
                        return
                except OSError:  # a file system hiccup: try again at the next beat
                    continue

        self._thread = threading.Thread(target=beat, daemon=True, name="sweep-lease")
        self._thread.start()
        return self

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        held = lease_holder(self.folder)
        if held is not None and held.get("token") == self.token:
            self.path.unlink(missing_ok=True)
