"""The results folder's lease (sdlib.store.lease), the part of FolderLock that holds across hosts on a shared file
system: a live lease of another host refuses the folder, a stale one (by the file system's clock) and one whose
holder on this host is dead are taken over, the heartbeat keeps it fresh, a lease taken over by another sweep is
noticed (``lost``) and never overwritten, and it is removed on release. Another host is simulated by the host name
written in the lease (flock, which would refuse first on one machine, is what the lease stands in for on NFS)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from sdlib.store import FolderLock, SweepBusy
from sdlib.store import lease as lease_mod
from sdlib.store.lease import LEASE_NAME, Lease, LeaseBusy, fs_now, lease_holder


def _foreign(folder, host="other-host", pid=4242, age_s=0.0, token="theirs"):
    p = folder / LEASE_NAME
    p.write_text(json.dumps({"host": host, "pid": pid, "token": token, "since": "2026-01-01T00:00:00Z"}))
    t = fs_now(folder) - age_s
    os.utime(p, (t, t))
    return p


def test_a_live_lease_of_another_host_refuses_the_folder(tmp_path):
    _foreign(tmp_path, age_s=5.0)
    with pytest.raises(SweepBusy) as err:
        with FolderLock(tmp_path):
            pass
    msg = str(err.value)
    assert "pid 4242 on other-host" in msg and "renewed 5 s ago" in msg and "\n" not in msg
    assert lease_holder(tmp_path)["token"] == "theirs"  # left as it was
    assert not list(tmp_path.glob(f"{LEASE_NAME}.*")), "probe or aside files left behind"


def test_a_stale_lease_is_taken_over_and_removed_on_release(tmp_path):
    _foreign(tmp_path, age_s=lease_mod.LEASE_STALE_S + 5)
    with FolderLock(tmp_path) as lock:
        held = lease_holder(tmp_path)
        assert held["token"] == lock.lease.token and held["host"] == socket.gethostname()
        assert held["pid"] == os.getpid()
    assert lease_holder(tmp_path) is None
    assert not list(tmp_path.glob(f"{LEASE_NAME}*"))


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _foreign(tmp_path, host=socket.gethostname(), pid=dead.pid, age_s=1.0)
    with FolderLock(tmp_path) as lock:
        assert lease_holder(tmp_path)["token"] == lock.lease.token


def test_a_lease_of_a_live_process_on_this_host_refuses(tmp_path):
    _foreign(tmp_path, host=socket.gethostname(), pid=os.getppid(), age_s=1.0)
    with pytest.raises(LeaseBusy, match=f"pid {os.getppid()} on {socket.gethostname()}"):
        Lease(tmp_path).take()


def test_heartbeat_refreshes_and_a_lease_taken_over_is_lost_not_overwritten(tmp_path):
    lease = Lease(tmp_path).take()
    path = tmp_path / LEASE_NAME
    old = fs_now(tmp_path) - 50
    os.utime(path, (old, old))
    assert lease.heartbeat() and path.stat().st_mtime > old + 40
    path.unlink()  # gone (another sweep moved it aside and refused): the holder recreates it
    assert lease.heartbeat() and lease_holder(tmp_path)["token"] == lease.token
    _foreign(tmp_path, token="usurper")
    assert not lease.heartbeat()
    assert lease.lost and "other-host" in lease.lost
    assert lease_holder(tmp_path)["token"] == "usurper"
    lease.release()  # not ours: left alone
    assert lease_holder(tmp_path)["token"] == "usurper"


def test_the_heartbeat_thread_beats(tmp_path):
    lease = Lease(tmp_path).take().start(every_s=0.05)
    path = tmp_path / LEASE_NAME
    old = fs_now(tmp_path) - 50
    os.utime(path, (old, old))
    t0 = time.monotonic()
    while path.stat().st_mtime <= old and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    lease.release()
    assert not path.exists()
    assert time.monotonic() - t0 < 5, "the heartbeat thread never rewrote the lease"


def test_an_unreadable_lease_counts_by_its_age(tmp_path):
    p = tmp_path / LEASE_NAME
    p.write_text("{not json")
    with pytest.raises(LeaseBusy):
        Lease(tmp_path).take()
    t = fs_now(tmp_path) - lease_mod.LEASE_STALE_S - 1
    os.utime(p, (t, t))
    assert Lease(tmp_path).take().token == lease_holder(tmp_path)["token"]


def test_two_takers_of_one_stale_lease_one_wins(tmp_path, monkeypatch):
    """The race the rename closes: B judged the lease stale, then A took it over; B's rename moves A's fresh lease
    aside, so B refuses, and A's heartbeat puts its lease back."""
    _foreign(tmp_path, age_s=lease_mod.LEASE_STALE_S + 5)
    a = Lease(tmp_path)
    b = Lease(tmp_path)
    real_why = lease_mod.why_live

    def b_looks_then_a_takes(held, age_s):
        out = real_why(held, age_s)
        if out is None and held.get("token") == "theirs" and lease_holder(tmp_path)["token"] == "theirs":
            monkeypatch.setattr(lease_mod, "why_live", real_why)
            a.take()  # A takes over between B's look and B's rename
        return out

    monkeypatch.setattr(lease_mod, "why_live", b_looks_then_a_takes)
    with pytest.raises(LeaseBusy, match="just taken over"):
        b.take()
    assert a.heartbeat() and lease_holder(tmp_path)["token"] == a.token
