"""What both executors do per engine group: start it (:func:`run_group`: an :class:`sdlib.run.supervise.
EngineProcess` running ``sdlib worker SPEC``, its cells written by the worker), record a group that failed, show
its progress, end the groups a killed sweep left behind, and open and close an invocation's provenance record.
The local executor (:func:`sdlib.run.sweep.run_sweep`) runs the groups here one after another; the Ray executor
(:mod:`sdlib.run.ray_executor`) runs each as a task on a cluster node.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Optional

from tqdm.auto import tqdm

from sdlib.config import SweepConfig
from sdlib.paths import REPO_ROOT, resolve
from sdlib.run.plan import model_cards
from sdlib.run.preflight import hub_reachable
from sdlib.run.supervise import EngineProcess, end_group, group_alive, remove_unused
from sdlib.store import SweepStore, git_commit, utc_now, write_json_atomic
from sdlib.workloads.datasets import PACKAGE_SOURCES


def _orphans(store: SweepStore, remove_others: bool = True) -> int:
    """End the engine groups a killed sweep left running on this host (their records in ``.engines/``); returns
    how many. The records of other hosts' groups are removed too unless ``remove_others`` is False (the Ray
    executor ends those on their own hosts first, :func:`sdlib.run.ray_executor.end_orphans_on_nodes`)."""
    d = store.dir / ".engines"
    n = 0
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            rec = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            rec = {}
        pgid = rec.get("pgid")
        if not remove_others and rec.get("host") != socket.gethostname():
            continue
        known = [str(x) for x in rec.get("shm") or [] if str(x).startswith("/dev/shm/")]
        if isinstance(pgid, int) and rec.get("host") == socket.gethostname():
            if group_alive(pgid):
                end_group(pgid, grace_s=5.0, known=known)
                n += 1
            else:  # the group is gone: the /dev/shm files it was seen mapping may not be
                remove_unused(known)
        f.unlink(missing_ok=True)
    return n


class _Progress:
    """One line per engine group: a live bar on a terminal, a plain line per finished cell otherwise."""

    def __init__(self, store: SweepStore, label: str, cells: list, enabled: bool):
        self.store, self.label, self.cells, self.enabled = store, label, cells, enabled
        self.done: set[str] = set()
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=len(cells), desc=label, unit="cell", file=sys.stderr, leave=True)

    def poll(self) -> None:
        if not self.enabled:
            return
        for c in self.cells:
            if c.run_id not in self.done and (self.store.dir / "runs" / f"{c.run_id}.parquet").exists():
                self.done.add(c.run_id)
                if self.bar is not None:
                    self.bar.update(1)
                else:
                    print(f"{self.label}: {len(self.done)}/{len(self.cells)} cells "
                          f"({c.workload.label} bs={c.batch_size} done)", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.poll()
        if self.bar is not None:
            self.bar.close()


def _last_worker_line(log_file: Path) -> str:
    """``: <line>`` for the worker's own last one-line message (``worker: ...``) in its log, else ''."""
    try:
        with open(log_file, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - 4096))
            tail = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    lines = [x.strip() for x in tail if x.startswith("worker: ")]
    return f" ({lines[-1][len('worker: '):]})" if lines else ""


def offline_env(sweep: SweepConfig) -> dict[str, str]:
    """Variables that keep the engines from calling home: vLLM's usage statistics and other telemetry off
    always; the Hugging Face libraries offline when every model is a local folder or the Hub is unreachable
    (so nothing waits on a network that is not there). The user's own settings win."""
    out = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}

    paths = [m.path for m in sweep.models] + [m.tokenizer for m in sweep.models if m.tokenizer] + \
        [me.model for me in sweep.methods if me.model and me.name != "custom"]
    hub_data = any(w.source == "hub" or (w.source == "auto" and not w.path and w.dataset not in PACKAGE_SOURCES)
                   for w in sweep.workloads)
    if (all(resolve(p).exists() for p in paths) and not hub_data) or not hub_reachable():
        out.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    return out


def _child_env(env: Optional[dict[str, str]], sweep: Optional[SweepConfig] = None) -> dict[str, str]:
    child_env = {**(offline_env(sweep) if sweep is not None else {}), **os.environ, "PYTHONUNBUFFERED": "1",
                 **(env or {})}
    child_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    child_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    child_env["SDLIB_SUPERVISOR_PID"] = str(os.getpid())
    return child_env


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt("SIGTERM")


def begin_invocation(sweep: SweepConfig, store: SweepStore, groups, say, **extra) -> None:
    """Record this invocation in provenance.json (``extra``: e.g. the executor) and say what it will run.
    ``cells_already_done`` counts the done cells of what the invocation selected (:func:`selected_ids`), not other
    blocks' cells in the same store."""
    total = sum(len(c) for c in groups.values())
    selected = selected_ids(sweep, store)
    entry = {"started_at": utc_now(), "git_commit": git_commit(), "argv": sys.argv, "host": socket.gethostname(),
             "cells_planned": total, "cells_already_done": len(store.done_ids() & selected),
             "models": model_cards(sweep),
             "engines": [], **({"selection": store.selection} if store.selection else {}), **extra}
    store.record_invocation(sweep.to_dict(), entry)
    say(f"sweep {sweep.name}: {total} cell(s) to run in {len(groups)} engine(s); results in {store.dir}")


def selected_ids(sweep: SweepConfig, store: SweepStore) -> set[str]:
    """The run ids an invocation selected (``store.selected_ids``, set by :func:`sdlib.run.sweep.run_sweep`), or
    every cell of the config when it selected all."""
    return store.selected_ids if store.selected_ids is not None else {c.run_id for c in sweep.cells()}


def end_invocation(sweep: SweepConfig, store: SweepStore, say) -> None:
    """Record the invocation's end: ``cells_done`` and ``cells_failed`` among the cells it selected (as
    ``cells_already_done``), so ``cells_done - cells_already_done`` is what it added; say so."""
    ids = selected_ids(sweep, store)
    done = store.done_ids() & ids
    failures = store.failures()
    failed = set(failures["run_id"]) & ids if len(failures) else set()
    store.update_invocation(-1, {"finished_at": utc_now(), "cells_done": len(done), "cells_failed": len(failed)})
    what = "selected cell(s)" if store.selected_ids is not None else "cell(s)"
    say(f"sweep {sweep.name}: {len(done)} of {len(ids)} {what} done, {len(failed)} failed")


def group_tag(key: tuple) -> str:
    """An engine group's name in file names (its spec, log and environment files)."""
    model_name, method_label, start = key
    return f"{model_name}__{method_label}" + (f"__start{start}" if start else "")


def group_label(key: tuple) -> str:
    """An engine group as the progress lines name it: ``[model / method]`` (with its start)."""
    model_name, method_label, start = key
    return f"[{model_name} / {method_label}" + (f" (start {start})" if start else "") + "]"


def record_group_failure(store: SweepStore, key: tuple, cells, reason: str, log_file: Path) -> int:
    """Record every cell of a failed engine group that is neither done nor already recorded as failed (by the
    engine process itself); returns how many were recorded."""
    model_name, method_label, start = key
    if start:
        method_label = f"{method_label} (start {start})"
    recorded = 0
    for c in cells:
        if not store.is_done(c.run_id) and not (store.dir / "failures" / f"{c.run_id}.json").exists():
            store.write_failure(c.run_id, {
                "model": model_name, "method_label": method_label, "dataset": c.workload.dataset,
                "batch_size": c.batch_size, "repeat": c.repeat, "error": f"{reason}; see {log_file}"})
            recorded += 1
    return recorded


def failure_line(store: SweepStore, key: tuple, cells, reason: str, recorded: int) -> str:
    """What a failed group's progress line says after its failures are recorded."""
    left = sum(not store.is_done(c.run_id) for c in cells)
    return f"{group_label(key)} {reason}; " + (
        f"{recorded} failure(s) recorded, going on" if recorded else
        f"its {len(cells)} cell(s) were already finished, nothing to record" if not left else
        f"{left} cell(s) not done (their failures were recorded by the engine process), going on")


def run_group(sweep: SweepConfig, store: SweepStore, key: tuple, cells, child_env: dict, verbose: bool,
              quiet: bool, say, progress: bool = True, announce: bool = True) -> dict:
    """Run one engine group's cells in one supervised engine process (``sdlib worker SPEC``) and record the
    failures of the cells it left unfinished; returns the engine's facts for provenance (``exit_code``,
    ``error``). The same on every executor: the local one calls it in this process, the Ray executor in a Ray
    task on the node that runs the group (:mod:`sdlib.run.ray_executor`)."""
    model_name, method_label, start = key
    tag = group_tag(key)
    if start:
        method_label = f"{method_label} (start {start})"
    run_dir = store.dir / ".run"
    spec_path, env_out = run_dir / f"{tag}.spec.json", run_dir / f"{tag}.env.json"
    env_out.unlink(missing_ok=True)
    write_json_atomic({"sweep": sweep.to_dict(), "run_ids": [c.run_id for c in cells],
                       "env_out": str(env_out)}, spec_path)
    log_file = store.log_path(tag)
    if announce:
        say(f"{group_label(key)} starting an engine for {len(cells)} cell(s); log: {log_file}")
    bar = _Progress(store, group_label(key), cells, enabled=progress and not quiet and not verbose)
    proc = EngineProcess([sys.executable, "-m", "sdlib", "worker", str(spec_path)], log_file, env=child_env,
                         cwd=str(REPO_ROOT), env_out=env_out, echo=verbose)
    marker = store.dir / ".engines" / f"{proc.pgid}.json"
    rec = {"pgid": proc.pgid, "host": socket.gethostname(), "started_at": utc_now(), "group": tag, "shm": []}
    write_json_atomic(rec, marker)
    # the /dev/shm files the group maps, kept in the marker: a later sweep unlinks what a killed one left
    proc.on_shm = lambda seen, rec=rec, marker=marker: write_json_atomic({**rec, "shm": sorted(seen)}, marker)
    try:
        outcome = proc.wait(startup_timeout_s=sweep.engine.startup_timeout_s, on_poll=bar.poll)
    except BaseException:  # Ctrl-C, SIGTERM: end the engine and everything it started, then stop
        proc.terminate()
        marker.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    marker.unlink(missing_ok=True)
    info = json.loads(env_out.read_text()) if env_out.exists() else {"model": model_name, "method": method_label}
    info["exit_code"] = outcome.exit_code
    if outcome.reason:
        info["error"] = outcome.reason
    if not outcome.ok:
        reason = outcome.reason + _last_worker_line(log_file)
        recorded = record_group_failure(store, key, cells, reason, log_file)
        say(failure_line(store, key, cells, reason, recorded))
    spec_path.unlink(missing_ok=True)
    env_out.unlink(missing_ok=True)
    return info
