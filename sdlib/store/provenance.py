"""Provenance facts every writer records: the time, the git commit.

Usage:
    from sdlib.store.provenance import git_commit, utc_now
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from sdlib.paths import REPO_ROOT


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def git_commit(repo: Path = REPO_ROOT) -> str:
    """The commit of the code that runs: ``$SDLIB_GIT_COMMIT`` when set (a copy of the tree whose git metadata
    is not the checkout's, e.g. on a lent GPU machine: the caller passes ``git rev-parse HEAD`` plus ``-dirty``
    from the real checkout), else the repo's HEAD commit, with ``-dirty`` if the tree has changes; ``unknown``
    outside git."""
    if os.environ.get("SDLIB_GIT_COMMIT"):
        return os.environ["SDLIB_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("SDLIB_GIT_COMMIT", "unknown")


def git_tracked(folder: Path) -> "set[Path] | None":
    """The files under ``folder`` that git tracks (committed results), as resolved paths: empty outside a git
    work tree, None when git cannot answer here (no git) and ``folder`` lies inside this repository (then
    treat every file there as tracked)."""
    folder = Path(folder).resolve()
    try:
        out = subprocess.run(["git", "-C", str(folder), "ls-files", "-z", "--", "."], capture_output=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is None or out.returncode != 0:
        inside = folder == REPO_ROOT or REPO_ROOT in folder.parents
        has_git = out is not None and b"not a git repository" in (out.stderr or b"")
        return set() if (has_git or not inside) else None
    return {(folder / p.decode()).resolve() for p in out.stdout.split(b"\0") if p}


def _nvidia_smi(field: str) -> str | None:
    """GPU 0's ``field`` as ``nvidia-smi --query-gpu`` gives it; None without nvidia-smi or an answer."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return (out[0].strip() or None) if out else None


def device_name() -> str:
    """A human-readable device name: the GPU's, or the CPU model. Asks torch only where it is already
    imported (an engine process); elsewhere ``nvidia-smi``, so that a process that only sends requests (the
    serving supervisor) never spends seconds importing torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001
            pass
    elif name := _nvidia_smi("name"):
        return name
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass

    return "CPU: " + (platform.processor() or platform.machine())


def device_uuid() -> str | None:
    """The GPU's UUID, which says which physical card ran an engine (every lent GPU machine's host name is ``vm``,
    so a sweep resumed on another machine would not show it otherwise); None without CUDA. Asks torch only where
    it is already imported (an engine process); elsewhere ``nvidia-smi`` (the serving supervisor), whose ``GPU-``
    prefix is dropped so that both name a card alike."""
    torch = sys.modules.get("torch")
    if torch is None:
        return (_nvidia_smi("uuid") or "").removeprefix("GPU-") or None
    try:
        if torch.cuda.is_available():
            u = getattr(torch.cuda.get_device_properties(0), "uuid", None)
            return str(u) if u is not None else None
    except Exception:  # noqa: BLE001
        pass
    return None


def recorded_engine(prov: dict, key: str) -> str:
    """``key`` (``device``, ``vllm_version``) of the latest engine a sweep's provenance records, ``""`` if none
    does; a CPU device reads ``CPU: <model>`` (:func:`device_name`)."""
    engines = [e for inv in prov.get("invocations", []) for e in inv.get("engines", [])]
    return next((str(e[key]) for e in reversed(engines) if e.get(key)), "")
