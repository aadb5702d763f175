"""Run a sweep: check everything first, lock the results folder, skip finished cells, one engine process per
(model, engine), record provenance, show one progress line per engine, and leave nothing behind.

Faults it survives: the worker dying (its engine processes are ended and its unfinished cells recorded as
failed; the sweep goes on), an engine that does not come up in time, Ctrl-C / SIGTERM (the engine is shut down,
then killed), a kill -9 of this process (the worker dies with it; at the next start any engine group a killed
sweep left behind is ended and its shared memory removed), and a second sweep on the same folder (refused).
With ``executor: ray`` (``--executor ray``) each engine group runs the same way in a Ray task on a cluster node
(:mod:`sdlib.run.ray_executor`).

Usage:
    sdlib sweep configs/embedded_default.yaml
    from sdlib.run.sweep import run_sweep; run_sweep("configs/embedded_default.yaml")
"""

from __future__ import annotations

import signal
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

from sdlib.config import ConfigError, SweepConfig, in_blocks, load_sweep, parse_sweep
from sdlib.run.groups import _child_env, _on_sigterm, _orphans, begin_invocation, end_invocation, run_group
from sdlib.run.inputs import check_inputs, record_inputs
from sdlib.run.plan import group_cells, plan
from sdlib.run.preflight import preflight
from sdlib.store import FolderLock, SweepStore


def run_sweep(config: str | Path | SweepConfig, retry_failed: bool = True, quiet: bool = False,
              only_methods: Optional[list[str]] = None, env: Optional[dict[str, str]] = None,
              verbose: bool = False, only: Optional[dict[str, Any]] = None) -> SweepStore:
    """Run every unfinished cell of a sweep; returns the store (read tables from it).

    ``only_methods``: run only these engine groups (label or method name); ``only``: run only cells with
    these ``batch_sizes`` / ``datasets``, or in these ``blocks`` ((model, dataset, batch size) keys, e.g. from
    :func:`sdlib.run.budget.select_blocks`); the config's cells stay the current ones. ``verbose``: echo the
    engines' output (vLLM's logs; always kept in ``logs/``). ``quiet``: print nothing.
    ``store.outcome`` says what this invocation planned, finished and failed.
    """
    sweep = config if isinstance(config, SweepConfig) else load_sweep(config)
    preflight(sweep)
    store = SweepStore(sweep.out_dir)
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if sweep.executor != "ray":
        return _locked_sweep(sweep, store, say, retry_failed, only_methods, env, verbose, quiet, only)
    from sdlib.run import ray_executor  # Ray only for this executor (the module imports it inside functions)

    connection = ray_executor.connect(sweep.ray_address, verbose)  # first: no Ray or no cluster is one line, no engine
    try:
        return _locked_sweep(sweep, store, say, retry_failed, only_methods, env, verbose, quiet, only,
                             ray_executor, connection)
    finally:
        ray_executor.disconnect()


def recorded_form(sweep: SweepConfig, store: SweepStore) -> dict[str, Any]:
    """The config to record as current: the one already recorded when it reads as the same config today (fields
    added to sdlib since, at their defaults, do not rewrite a committed provenance.json), else ``sweep``'s."""
    current = sweep.to_dict()
    recorded = store.read_provenance().get("config")
    if not recorded or recorded == current:
        return current
    try:
        return recorded if parse_sweep(recorded).to_dict() == current else current
    except ConfigError:  # recorded by an sdlib whose configs today's no longer reads
        return current


def _locked_sweep(sweep: SweepConfig, store: SweepStore, say, retry_failed, only_methods, env, verbose, quiet, only,
                  ray_executor=None, connection=None) -> SweepStore:
    with FolderLock(store.dir) as lock:
        if ray_executor is not None:  # each node ends what a killed sweep left on it, before the records go
            n_remote = ray_executor.end_orphans_on_nodes(store, ray_executor.alive_nodes())
            if n_remote:
                say(f"sweep {sweep.name}: ended {n_remote} engine group(s) a killed sweep left running on the nodes")
        n_orphans = _orphans(store)
        if n_orphans:
            say(f"sweep {sweep.name}: ended {n_orphans} engine group(s) a killed sweep left running")
        inputs = check_inputs(sweep, store)  # a trace or prompt file changed under done cells: one line, no file written
        store.set_current(recorded_form(sweep, store), [c.run_id for c in sweep.cells()])
        groups = select_groups(plan(sweep, store, retry_failed=retry_failed), only_methods, only)
        planned = [c.run_id for cs in groups.values() for c in cs]
        store.outcome = {"planned": planned, "done": [], "failed": []}
        store.selection = selection_record(only_methods, only)
        store.selected_ids = None if store.selection is None else {
            c.run_id for cs in select_groups(group_cells(sweep.cells()), only_methods, only).values() for c in cs}
        if not planned:  # nothing to run: leave provenance as it is (a rerun of a finished sweep changes no file)
            say(f"sweep {sweep.name}: nothing to run; {len(store.done_ids() & set(c.run_id for c in sweep.cells()))}"
                f" cell(s) done, {len(store.failures())} failed; results in {store.dir}")
            return store
        record_inputs(store, inputs)
        if ray_executor is not None:
            ray_executor.run_groups(sweep, store, groups, env, verbose, quiet, say, lock.lease, connection)
        else:
            _run_groups(sweep, store, groups, env, verbose, quiet, say)
        done = store.done_ids()
        store.outcome["done"] = [r for r in planned if r in done]
        store.outcome["failed"] = [r for r in planned if r not in done]
    return store


def select_groups(groups: "OrderedDict[tuple, list]", only_methods=None,
                  only: Optional[dict] = None) -> "OrderedDict[tuple, list]":
    """The engine groups' cells that an invocation was asked to run (``sdlib sweep`` and its ``--dry-run`` both):
    ``--methods`` (a group's engine label, or a cell's method name or label: one policy of a replay engine's group
    is selected alone); ``only``'s ``batch_sizes``, ``datasets`` and ``blocks``. Groups left with no cell are
    dropped."""
    only = only or {}
    bs, ds, blocks = only.get("batch_sizes"), only.get("datasets"), only.get("blocks")

    def wanted(g, c) -> bool:
        return ((not only_methods or g[1] in only_methods or c.method.name in only_methods
                 or c.method.label in only_methods)
                and (not bs or c.batch_size in bs) and (not ds or c.workload.label in ds)
                and (blocks is None or in_blocks(c.part_key, blocks)))

    out = OrderedDict((g, [c for c in cs if wanted(g, c)]) for g, cs in groups.items())
    return OrderedDict((g, cs) for g, cs in out.items() if cs)


def selection_record(only_methods=None, only: Optional[dict] = None) -> Optional[dict[str, list]]:
    """What an invocation was asked to run of its config (``--methods``; ``--datasets``, ``--batch-sizes``,
    ``--blocks`` and ``--plan-minutes``' blocks, as ``only``), JSON-ready and sorted; None when it ran all of it.
    The invocation's provenance entry carries it as ``selection``."""
    out = {}
    if only_methods:
        out["methods"] = sorted(only_methods)
    for key in ("datasets", "batch_sizes", "blocks"):
        v = (only or {}).get(key)
        if v:
            out[key] = sorted((list(x) if isinstance(x, tuple) else x for x in v), key=str)
    return out or None


def _run_groups(sweep: SweepConfig, store: SweepStore, groups, env, verbose: bool, quiet: bool, say) -> None:
    begin_invocation(sweep, store, groups, say)
    child_env = _child_env(env, sweep)
    engines = []
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if sys.platform != "win32" else None
    try:
        for key, cells in groups.items():
            engines.append(run_group(sweep, store, key, cells, child_env, verbose, quiet, say))
            store.update_invocation(-1, {"engines": engines})
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    end_invocation(sweep, store, say)


__all__ = ["run_sweep"]
