"""Run a sweep: validate, skip finished cells, one engine process per (model, method), record provenance.

Usage:
    python -m sdlib sweep configs/embedded_default.yaml
    from sdlib.run.sweep import run_sweep; run_sweep("configs/embedded_default.yaml")
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Optional

from sdlib.config import SweepConfig, load_sweep
from sdlib.paths import REPO_ROOT
from sdlib.run.plan import check_paths, model_cards, plan
from sdlib.run.supervise import EngineProcess
from sdlib.store import SweepStore, git_commit, utc_now


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
            proc = EngineProcess([sys.executable, "-m", "sdlib", "worker", str(spec_path)], log_file,
                                 env=child_env, cwd=str(REPO_ROOT), env_out=env_out, echo=not quiet)
            try:
                outcome = proc.wait(startup_timeout_s=sweep.engine.startup_timeout_s)
            except BaseException:  # Ctrl-C, SIGTERM: end the engine and everything it started, then stop
                proc.terminate()
                raise
            info = json.loads(env_out.read_text()) if env_out.exists() else {"model": model_name,
                                                                             "method": method_label}
            info["exit_code"] = outcome.exit_code
            if outcome.reason:
                info["error"] = outcome.reason
            engines.append(info)
            if not outcome.ok:
                for c in cells:
                    if not store.is_done(c.run_id) and not (store.dir / "failures" / f"{c.run_id}.json").exists():
                        store.write_failure(c.run_id, {
                            "model": model_name, "method_label": method_label, "dataset": c.workload.dataset,
                            "batch_size": c.batch_size, "repeat": c.repeat,
                            "error": f"{outcome.reason}; see {log_file}"})
                print(f"[{model_name} / {method_label}] {outcome.reason}; failures recorded, going on",
                      file=sys.stderr)
            store.update_invocation(-1, {"engines": engines})
    store.update_invocation(-1, {"finished_at": utc_now(), "cells_done": len(store.done_ids()),
                                 "cells_failed": len(store.failures())})
    nf = len(store.failures())
    print(f"sweep {sweep.name}: {len(store.done_ids())} cell(s) done, {nf} failed", file=sys.stderr)
    return store


__all__ = ["run_sweep"]
