"""Run a sweep: validate, skip finished cells, one engine process per (model, method), record provenance.

Usage:
    python -m sdlib sweep configs/embedded_default.yaml
    from sdlib.sweep import run_sweep; run_sweep("configs/embedded_default.yaml")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

from sdlib.config import ConfigError, SweepConfig, load_sweep, parse_sweep
from sdlib.paths import REPO_ROOT, resolve
from sdlib.storage import SweepStore, git_commit, utc_now


def check_paths(sweep: SweepConfig) -> None:
    """Fail early, in one line, when a local model path is missing (writes @shapes/ folders)."""
    from sdlib.shapes import write_shape

    for p in [m.path for m in sweep.models] + [me.model for me in sweep.methods if me.model]:
        if p.startswith("@shapes/"):
            write_shape(p[len("@shapes/"):])
    for i, m in enumerate(sweep.models):
        if m.path.startswith(("@", ".", "/")) and not resolve(m.path).exists():
            hint = " (build the embedded models: python -m sdlib models)" if m.path.startswith("@models/") else ""
            raise ConfigError(f"models.{i}.path: {resolve(m.path)} does not exist{hint}")
    for i, me in enumerate(sweep.methods):
        if me.model and me.model.startswith(("@", ".", "/")) and not resolve(me.model).exists():
            raise ConfigError(f"methods.{i}.model: {resolve(me.model)} does not exist")
        for j, wl in enumerate(sweep.workloads):
            if wl.path and not resolve(wl.path).exists() and wl.source == "local":
                raise ConfigError(f"workloads.{j}.path: {resolve(wl.path)} does not exist")


def model_cards(sweep: SweepConfig) -> dict[str, Any]:
    """What each local model folder says about itself (sdlib_model.json), e.g. random weights."""
    out = {}
    paths = [(m.name, m.path) for m in sweep.models] + [(me.label, me.model) for me in sweep.methods if me.model]
    for name, p in paths:
        d = resolve(p)
        card, manifest = d / "sdlib_model.json", d.parent / "manifest.json"
        if card.exists():
            out[name] = json.loads(card.read_text())
        elif manifest.exists() and (d / "config.json").exists():  # built by sdlib.tinymodels: random init
            m = json.loads(manifest.read_text())
            out[name] = {"name": d.name, "kind": "sdlib.tinymodels", "seed": m.get("seed"),
                         "random_weights": not m.get("trained", False), "path": p}
        else:
            out[name] = {"path": p}
    return out


def plan(sweep: SweepConfig, store: SweepStore, retry_failed: bool = True) -> "OrderedDict[tuple, list]":
    """Cells still to run, grouped by engine (model, method), in config order."""
    done = store.done_ids()
    failed = set(store.failures().get("run_id", [])) if not retry_failed else set()
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for c in sweep.cells():
        if c.run_id in done or c.run_id in failed:
            continue
        groups.setdefault(c.group, []).append(c)
    return groups


def _stream(proc: subprocess.Popen, log_file: Path, quiet: bool) -> None:
    with open(log_file, "ab") as log:
        while True:
            chunk = proc.stdout.read1(4096) if hasattr(proc.stdout, "read1") else proc.stdout.read(4096)
            if not chunk:
                break
            log.write(chunk)
            log.flush()
            if not quiet:
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()


def run_sweep(config: str | Path | SweepConfig, retry_failed: bool = True, quiet: bool = False,
              only_methods: Optional[list[str]] = None, env: Optional[dict[str, str]] = None) -> SweepStore:
    """Run every unfinished cell of a sweep; returns the store (read tables from it)."""
    sweep = config if isinstance(config, SweepConfig) else load_sweep(config)
    check_paths(sweep)
    store = SweepStore(sweep.out_dir)
    groups = plan(sweep, store, retry_failed=retry_failed)
    if only_methods:
        groups = OrderedDict((g, c) for g, c in groups.items() if g[1] in only_methods or c[0].method.name in only_methods)
    total = sum(len(c) for c in groups.values())
    if total == 0:  # nothing to run: leave provenance as it is (a rerun of a finished sweep changes no file)
        print(f"sweep {sweep.name}: nothing to run; {len(store.done_ids())} cell(s) done, "
              f"{len(store.failures())} failed; results in {store.dir}", file=sys.stderr)
        return store
    entry = {
        "started_at": utc_now(),
        "git_commit": git_commit(),
        "argv": sys.argv,
        "host": os.uname().nodename,
        "cells_planned": total,
        "cells_already_done": len(store.done_ids()),
        "models": model_cards(sweep),
        "engines": [],
    }
    store.record_invocation(sweep.to_dict(), entry)
    print(f"sweep {sweep.name}: {total} cell(s) to run in {len(groups)} engine(s); results in {store.dir}",
          file=sys.stderr)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    child_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    child_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    engines = []
    for (model_name, method_label), cells in groups.items():
        with tempfile.TemporaryDirectory(prefix="sdlib-") as tmp:
            spec_path, env_out = Path(tmp) / "spec.json", Path(tmp) / "env.json"
            spec_path.write_text(json.dumps({"sweep": sweep.to_dict(), "run_ids": [c.run_id for c in cells],
                                             "env_out": str(env_out)}, default=str))
            log_file = store.log_path(f"{model_name}__{method_label}")
            print(f"[{model_name} / {method_label}] starting engine for {len(cells)} cell(s); log: {log_file}",
                  file=sys.stderr)
            proc = subprocess.Popen([sys.executable, "-m", "sdlib.worker", str(spec_path)], cwd=str(REPO_ROOT),
                                    env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                _stream(proc, log_file, quiet)
                rc = proc.wait()
            except KeyboardInterrupt:
                proc.terminate()
                proc.wait()
                raise
            info = json.loads(env_out.read_text()) if env_out.exists() else {"model": model_name,
                                                                             "method": method_label}
            info["exit_code"] = rc
            engines.append(info)
            if rc != 0:
                for c in cells:
                    if not store.is_done(c.run_id) and not (store.dir / "failures" / f"{c.run_id}.json").exists():
                        store.write_failure(c.run_id, {
                            "model": model_name, "method_label": method_label, "dataset": c.workload.dataset,
                            "batch_size": c.batch_size, "repeat": c.repeat,
                            "error": f"engine process exited with code {rc}; see {log_file}"})
                print(f"[{model_name} / {method_label}] engine process exited with code {rc}; "
                      f"failures recorded, going on", file=sys.stderr)
            store.update_invocation(-1, {"engines": engines})
    store.update_invocation(-1, {"finished_at": utc_now(), "cells_done": len(store.done_ids()),
                                 "cells_failed": len(store.failures())})
    nf = len(store.failures())
    print(f"sweep {sweep.name}: {len(store.done_ids())} cell(s) done, {nf} failed", file=sys.stderr)
    return store


__all__ = ["run_sweep", "plan", "check_paths", "parse_sweep"]
