"""One server process (vLLM's OpenAI server, or the stub): free port, own process group, output to a log,
``/health`` with a timeout, and a stop that always ends the whole group and frees the port.

The process is started through :class:`sdlib.run.supervise.EngineProcess` (own session and process group,
output pump; SIGTERM to the group, SIGKILL after a grace period). Each live server is registered in
``.cache/serve/servers/<pgid>.json`` with a random token also put in its environment
(``SDLIB_SERVE_TOKEN``); :func:`reap_orphans` (run at every serving sweep's start) ends the groups of
registered servers whose supervisor is gone (e.g. killed with ``kill -9``), after checking the token in
the processes' environment, so it never touches a process it did not start.

Usage:
    with Server(lambda port: server_command(model, method, cfg, port), log_file, label="eagle3-k3") as srv:
        srv.wait_healthy(timeout_s=600)
        ... srv.url ...
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Optional

from sdlib.paths import CACHE_DIR, REPO_ROOT
from sdlib.run.supervise import EngineProcess, group_alive, group_pids

#: Where live servers are registered (one JSON per process group).
REGISTRY_DIR: Path = CACHE_DIR / "serve" / "servers"
#: Environment variable carrying a server's registry token.
TOKEN_ENV = "SDLIB_SERVE_TOKEN"
#: Seconds between SIGTERM and SIGKILL when a server is stopped (vLLM shuts its engine core down on SIGTERM).
STOP_GRACE_S = 15.0


class ServerError(RuntimeError):
    """The server did not come up (exited, or /health did not answer in time); the message names the log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` can be bound on ``host`` (nothing listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _http_status(url: str, timeout_s: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - local URL
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def log_tail(path: Path, n: int = 15) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


class Server:
    """A server process bound to a free port on ``host``; ``cmd_for_port(port)`` gives its command line."""

    def __init__(self, cmd_for_port: Callable[[int], list[str]], log_file: Path, label: str = "server",
                 env: Optional[dict[str, str]] = None, host: str = "127.0.0.1", echo: bool = False,
                 registry_dir: Optional[Path] = None):
        self.cmd_for_port = cmd_for_port
        self.log_file = Path(log_file)
        self.label = label
        self.env = env
        self.host = host
        self.echo = echo
        self.registry_dir = Path(registry_dir) if registry_dir else REGISTRY_DIR
        self.port: Optional[int] = None
        self.proc: Optional[EngineProcess] = None
        self.cmd: list[str] = []
        self.token = uuid.uuid4().hex
        self.started_at = 0.0
        self.startup_s: Optional[float] = None

    # lifecycle -----------------------------------------------------------------
    def start(self) -> "Server":
        self.port = free_port(self.host)
        self.cmd = self.cmd_for_port(self.port)
        env = {**(self.env if self.env is not None else os.environ), TOKEN_ENV: self.token}
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as f:
            f.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} start {self.label} on port {self.port}\n"
                    f"=== {' '.join(self.cmd)}\n".encode())
        self.started_at = time.monotonic()
        self.proc = EngineProcess(self.cmd, self.log_file, env=env, cwd=str(REPO_ROOT), echo=self.echo)
        self._register()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pgid(self) -> Optional[int]:
        return self.proc.pgid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until ``GET /health`` answers 200; returns the start-up time (s). Raises :class:`ServerError`
        (after stopping the server) if the process exits or ``timeout_s`` passes first."""
        assert self.proc is not None, "start() first"
        deadline = self.started_at + timeout_s
        while True:
            if not self.running():
                rc = self.proc.proc.poll()
                self.stop()
                raise ServerError(f"{self.label}: server exited with code {rc} before /health answered; "
                                  f"log {self.log_file}:\n{log_tail(self.log_file)}")
            if _http_status(self.url + "/health") == 200:
                self.startup_s = time.monotonic() - self.started_at
                return self.startup_s
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"{self.label}: /health did not answer within {timeout_s:g} s "
                                  f"(server.startup_timeout_s); ended; log {self.log_file}")
            time.sleep(poll_s)

    def stop(self, grace_s: float = STOP_GRACE_S, port_timeout_s: float = 30.0) -> None:
        """End the server's whole process group (SIGTERM, SIGKILL after ``grace_s``) and wait until its port is
        free. Safe to call twice."""
        if self.proc is None:
            return
        if self.proc.proc.poll() is None:
            self.proc.terminate(grace_s)
        self.proc.reap_group()
        self.proc._pump.join(timeout=5.0)
        if self.port is not None:
            deadline = time.monotonic() + port_timeout_s
            while not port_is_free(self.port, self.host) and time.monotonic() < deadline:
                time.sleep(0.2)
        self._unregister()

    def __enter__(self) -> "Server":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # registry (orphan check) -----------------------------------------------------
    def _reg_path(self) -> Path:
        return self.registry_dir / f"{self.pgid}.json"

    def _register(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._reg_path().write_text(json.dumps({
            "pgid": self.pgid, "port": self.port, "token": self.token, "owner_pid": os.getpid(),
            "label": self.label, "cmd": self.cmd, "log": str(self.log_file), "started_unix": time.time()}))

    def _unregister(self) -> None:
        try:
            self._reg_path().unlink()
        except FileNotFoundError:
            pass


def _has_token(pid: int, token: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{TOKEN_ENV}={token}".encode() in env.split(b"\0")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reap_orphans(registry_dir: Optional[Path] = None, grace_s: float = 5.0, log=print) -> list[dict]:
    """End registered servers whose supervisor is gone; returns the entries it ended.

    A server counts as orphaned when its ``owner_pid`` no longer runs; its group is ended only if a
    process of the group carries the registered token in its environment (so a reused pgid is left
    alone). Registry entries of groups that no longer exist are removed.
    """
    reg = Path(registry_dir) if registry_dir else REGISTRY_DIR
    ended = []
    if not reg.is_dir():
        return ended
    for f in sorted(reg.glob("*.json")):
        try:
            e = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if _pid_alive(int(e.get("owner_pid", -1))):
            continue  # its supervisor still runs (this process, or another sweep): not an orphan
        pgid = int(e["pgid"])
        members = [p for p in group_pids(pgid) if _has_token(p, e["token"])] if group_alive(pgid) else []
        if members:
            log(f"serve: ending orphaned server {e.get('label')} (process group {pgid}, port {e.get('port')}, "
                f"supervisor {e.get('owner_pid')} is gone)")
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and group_alive(pgid):
                    time.sleep(0.1)
                if not group_alive(pgid):
                    break
            ended.append(e)
        f.unlink(missing_ok=True)
    return ended
