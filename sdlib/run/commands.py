"""The sweep commands of the command line: ``sweep``, ``plan``, ``validate``, ``status``, ``clean``.

Paths on the command line resolve from where the user stands; paths inside a config from the config file's
folder; ``@trained/<part>`` (the committed trained models, data/models), ``@models/<part>`` (random-weight
tiny models, ``sdlib models``) and ``@shapes/<name>`` (config-only paper shapes for dummy weights) from the
repository.

Usage:
    sdlib sweep my.yaml --dry-run          # the cells and the engines it would start; starts nothing
    sdlib status my.yaml --results-dir out # done / failed / to do / stale cells
    sdlib clean my.yaml --stale            # delete the cells of an older config
    sdlib plan my.yaml --gpu-minutes 30    # estimated minutes per engine and block; the blocks that fit
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from sdlib.config import ConfigError, SweepConfig, load_sweep
from sdlib.paths import RESULTS_RULE

PATHS_HELP = ("Paths: on the command line from the current folder; inside a config from the config's folder; "
              "@trained/<part> = the committed trained models (data/models), @models/<part> = random-weight "
              "tiny models (sdlib models), @shapes/<name> = paper-scale shapes for dummy weights. "
              + RESULTS_RULE.replace("<kind>", "sweeps"))


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or any(x < 1 for x in out):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return out


def _count(text: str) -> int:
    """A count >= 1 (``--num-requests``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return n


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _load(args) -> SweepConfig:
    overrides = {}
    if getattr(args, "results_dir", None):
        overrides["results_dir"] = str(Path(args.results_dir).expanduser().resolve())
    sweep = load_sweep(Path(args.config).expanduser().resolve(), overrides)
    if getattr(args, "num_requests", None) is not None:
        from sdlib.config import parse_sweep

        d = sweep.to_dict()
        d["workloads"] = [{**w, "num_requests": args.num_requests} for w in d["workloads"]]
        try:
            sweep = parse_sweep(d)
        except ConfigError as err:
            raise ConfigError(f"--num-requests {args.num_requests}: {err}") from None
    return sweep


def _only(args, sweep: SweepConfig) -> dict:
    only = {}
    if args.batch_sizes:
        bad = sorted(set(args.batch_sizes) - set(sweep.batch_sizes))
        if bad:
            raise ConfigError(f"--batch-sizes: {bad} are not in the config's batch_sizes {sweep.batch_sizes}")
        only["batch_sizes"] = args.batch_sizes
    if args.datasets:
        have = {w.label for w in sweep.workloads}
        bad = sorted(set(args.datasets) - have)
        if bad:
            raise ConfigError(f"--datasets: {bad} are not workloads of the config ({sorted(have)})")
        only["datasets"] = args.datasets
    return only


def cmd_sweep(args) -> int:
    from sdlib.run.plan import plan
    from sdlib.run.preflight import preflight
    from sdlib.run.sweep import run_sweep
    from sdlib.store import SweepBusy, SweepStore

    sweep = _load(args)
    from sdlib.run.ray_executor import executor_from_args  # --executor / --address (the Ray executor)
    sweep = executor_from_args(sweep, args)
    methods = (args.method or []) + (args.methods or [])
    if methods:
        known = {m.label for m in sweep.methods} | {m.name for m in sweep.methods} | \
            {m.engine_label for m in sweep.methods}
        bad = sorted(set(methods) - known)
        if bad:
            raise ConfigError(f"--methods: {bad} are not methods of the config ({sorted(m.label for m in sweep.methods)})")
    only = _only(args, sweep)
    args.plan_minutes = _minutes(args.plan_minutes, "--plan-minutes")
    if args.plan_minutes is not None or args.blocks:
        only = _planned_blocks(args, sweep, methods, only)
        if only is None:
            return 0
    if args.dry_run:
        preflight(sweep)
        groups = plan(sweep, SweepStore(sweep.out_dir), retry_failed=not args.skip_failed)
        n = 0
        for (model, eng, start), cells in groups.items():
            cells = [c for c in cells if (not methods or eng in methods or c.method.label in methods
                                          or c.method.name in methods)
                     and (not only.get("batch_sizes") or c.batch_size in only["batch_sizes"])
                     and (not only.get("datasets") or c.workload.label in only["datasets"])
                     and ("blocks" not in only or (c.model.name, c.workload.label, c.batch_size) in only["blocks"])]
            if not cells:
                continue
            n += len(cells)
            print(f"engine {model} / {eng}" + (f" (start {start})" if start else "") + f": {len(cells)} cell(s)")
            for c in cells:
                print(f"  {c.run_id}")
        print(f"{sweep.name}: would run {n} cell(s); results in {sweep.out_dir} (dry run: nothing started)")
        return 0
    import signal

    from sdlib.run.sweep import _on_sigterm

    old_term = signal.signal(signal.SIGTERM, _on_sigterm)  # SIGTERM as Ctrl-C: one line, not a traceback
    try:
        store = run_sweep(sweep, retry_failed=not args.skip_failed, only_methods=methods or None,
                          verbose=args.verbose, only=only or None)
    except SweepBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, SIGINT, SIGTERM: the engine group is ended; say what is kept
        store = SweepStore(sweep.out_dir)
        ids = {c.run_id for c in sweep.cells()}
        done = len(store.done_ids() & ids)
        why = " (SIGTERM)" if str(err) == "SIGTERM" else ""
        print(f"{sweep.name}: interrupted{why}; {done} cell(s) kept, {len(ids) - done} to do (run the same "
              f"command to resume); results in {store.dir}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
    out = store.outcome
    if args.summary and out["done"]:
        from sdlib.run.report import print_report

        print_report(store, run_ids=out["planned"], cells={c.run_id for c in sweep.cells()})
    if out["planned"] and not out["done"]:
        print(f"error: every one of the {len(out['planned'])} cell(s) failed; see {store.dir / 'failures'}",
              file=sys.stderr)
        return 1
    return 1 if (args.strict and out["failed"]) else 0


def _minutes(text, flag: str):
    """A budget flag's minutes (None when not given); :class:`ConfigError` (one line) unless a number >= 0."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{flag}: expected a number of minutes, got {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise ConfigError(f"{flag}: expected a number of minutes >= 0, got {text!r}")
    return v


def _planned_blocks(args, sweep: SweepConfig, methods: list, only: dict):
    """``sdlib sweep --plan-minutes N`` / ``--blocks``: the blocks to run as ``only``; None when nothing is left."""
    from sdlib.run import budget
    from sdlib.store import SweepStore

    if methods:
        raise ConfigError("--plan-minutes/--blocks run whole blocks (every arm of a dataset and batch size): "
                          "not with --methods")
    if args.blocks:
        return {**only, "blocks": budget.parse_blocks(args.blocks, sweep)}
    bp = budget.plan_budget(sweep, SweepStore(sweep.out_dir), args.plan_minutes, args.priority, only,
                            retry_failed=not args.skip_failed)
    chosen = bp.selected
    if not chosen:
        if bp.blocks.empty:
            print(f"{sweep.name}: nothing to run (every cell done)", file=sys.stderr)
            return None
        raise ConfigError(f"--plan-minutes {args.plan_minutes:g}: no block fits (the smallest alone needs "
                          f"{bp.blocks['alone_s'].min() / 60:.1f} min; sdlib plan {args.config} shows them)")
    left = bp.blocks[~bp.blocks["selected"]]
    print(f"plan: {len(chosen)} of {len(bp.blocks)} block(s), {bp.total_s / 60:.1f} of {args.plan_minutes:g} min "
          f"estimated" + (f"; left for later: {', '.join(f'{r.dataset}:{r.batch_size}' for r in left.itertuples())}"
                          if len(left) else ""), file=sys.stderr)
    return {**only, "blocks": chosen}


def cmd_plan(args) -> int:
    from sdlib.run import budget

    if args.cost_model:  # a path on the command line resolves from where the user stands
        args.cost_model = str(Path(args.cost_model).expanduser().resolve())
    if args.gpus and not args.paper_matrix:
        raise ConfigError("--gpus: only with --paper-matrix")
    if args.paper_matrix:
        planner = budget.calibrated_planner(args.cost_model, device=args.device, vllm_version=args.vllm_version)
        est = budget.paper_matrix(planner)
        print(budget.format_paper_matrix(est))
        if args.gpus:  # the matrix packed onto that many GPUs, longest engine group first (docs/scale.md)
            print("\n" + budget.format_packing(est, planner, args.gpus))
        return 0
    if args.measured is not None:
        planner = budget.Planner(args.cost_model, budget.Calibration(), args.device, args.vllm_version)
        where = Path(args.measured).expanduser().resolve() if args.measured else None  # None: data/sweeps
        invs = budget.committed_invocations(where, planner, args.device)
        print(budget.format_measured(budget.measured_vs_plan(invs, args.device), args.device))
        return 0
    if not args.config:
        raise ConfigError("plan: give a sweep CONFIG (or --paper-matrix, or --measured)")
    minutes = _minutes(args.gpu_minutes, "--gpu-minutes")
    from sdlib.store import SweepStore

    sweep = _load(args)
    budget.parse_priority(args.priority, sweep)  # a bad --priority fails before anything is priced
    bp = budget.plan_budget(sweep, SweepStore(sweep.out_dir), minutes, args.priority, _only(args, sweep),
                            cost_model=args.cost_model, device=args.device, vllm_version=args.vllm_version,
                            from_scratch=args.from_scratch)
    print(budget.format_plan(bp, sweep, args.config, args.priority))
    if args.cells:
        print()
        print(budget.format_cells(bp))
    return 0


def cmd_validate(args) -> int:
    from sdlib.run.preflight import preflight

    sweep = _load(args)
    preflight(sweep)
    print(f"{args.config}: ok, {len(sweep.cells())} cells")
    return 0


def cmd_status(args) -> int:
    from sdlib.store import SweepStore

    sweep = _load(args)
    store = SweepStore(sweep.out_dir)
    cells = sweep.cells()
    ids = {c.run_id for c in cells}
    done = store.done_ids() & ids
    corrupt = store.corrupt_ids() & ids
    failed = set(store.failures(current_only=False).get("run_id", [])) & ids
    stale = store.all_ids() - ids
    todo = [c for c in cells if c.run_id not in done]
    print(f"{sweep.name}: {len(cells)} cells, {len(done)} done, {len(failed - done)} failed, {len(todo)} to do"
          + (f", {len(corrupt)} damaged (rerun)" if corrupt else "")
          + (f"; {len(stale)} stale cell(s) of an older config here (sdlib clean --stale {args.config})"
             if stale else "") + f"; results in {store.dir}")
    for c in todo:
        if c.run_id in corrupt:
            print(f"DAMAGED {c.run_id}: {store.damage(c.run_id)}")
        else:
            print(("FAILED  " if c.run_id in failed else "todo    ") + c.run_id)
    return 0


def _confirm(prompt: str, yes: bool) -> bool:
    """True with ``--yes``; at a terminal, when the user answers y; never without a terminal."""
    if yes:
        return True
    if not sys.stdin.isatty():
        return False
    try:
        return input(f"{prompt} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def cmd_clean(args) -> int:
    """Delete cells' files: the stale cells (``--stale``) and the cells named (``--cell``). Lists them first and
    asks (or takes ``--yes``); never deletes a git-tracked file (committed results) unless its cell is named."""
    from sdlib.store import FolderLock, SweepBusy, SweepStore
    from sdlib.store.provenance import git_tracked

    named = set(args.cell or [])
    if not args.stale and not named:
        raise ConfigError("clean: say what to remove (--stale, or --cell RUN_ID)")
    sweep = _load(args)
    store = SweepStore(sweep.out_dir)
    if not store.dir.is_dir():
        print(f"{sweep.name}: {store.dir} does not exist; nothing to delete")
        return 0
    try:
        with FolderLock(store.dir):
            have = store.all_ids()
            unknown = sorted(named - have)
            if unknown:
                raise ConfigError(f"clean --cell: {unknown[:3]} are not cells in {store.dir}")
            stale = (have - {c.run_id for c in sweep.cells()}) if args.stale else set()
            tracked = git_tracked(store.dir)
            protected = set()  # stale cells with committed files: kept unless named
            for rid in sorted(stale - named):
                if tracked is None or any(f.resolve() in tracked for f in store.cell_files(rid)):
                    protected.add(rid)
            doomed = sorted((stale - protected) | named)
            files = [f for rid in doomed for f in store.cell_files(rid)]
            if protected:
                print(f"{sweep.name}: keeping {len(protected)} stale cell(s) whose files git tracks (committed "
                      f"results); name one with --cell RUN_ID to delete it")
            if not doomed:
                print(f"{sweep.name}: nothing to delete in {store.dir}")
                return 0
            print(f"{sweep.name}: would delete {len(doomed)} cell(s), {len(files)} file(s) in {store.dir}:")
            for rid in doomed:
                committed = tracked is None or any(f.resolve() in (tracked or set()) for f in store.cell_files(rid))
                print(f"  {rid}" + (" (named; its files are committed)" if committed else ""))
            if not _confirm(f"delete these {len(files)} file(s)?", args.yes):
                print(f"{sweep.name}: nothing deleted (no terminal to ask: run again with --yes to delete)"
                      if not sys.stdin.isatty() else f"{sweep.name}: nothing deleted")
                return 1
            n = store.remove_cells(set(doomed))
    except SweepBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kinds = Counter(r.split("__")[1] if "__" in r else r for r in doomed)
    print(f"{sweep.name}: removed {len(doomed)} cell(s) ({n} files): {dict(kinds)}")
    return 0


def cmd_rekey(args) -> int:
    """Rename finished cells to the current run-id scheme (see sdlib.store.rekey)."""
    from sdlib.store import FolderLock, SweepBusy, SweepStore
    from sdlib.store.rekey import cell_coordinates, rekey

    sweep = _load(args)
    store = SweepStore(sweep.out_dir)
    from sdlib.config import parse_sweep

    prov_cfg = store.read_provenance().get("config")
    if not prov_cfg:
        raise ConfigError(f"rekey: {store.dir} has no recorded config (provenance.json)")
    recorded = parse_sweep(prov_cfg).to_dict()  # the recorded config as today's classes read it (defaults filled)
    current = sweep.to_dict()
    for d in (recorded, current):
        for k in ("results_dir", "description", "executor", "ray_address"):  # how it ran, not what it measured
            d.pop(k, None)
    if recorded != current:
        diff = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
        raise ConfigError(f"rekey: the cells here were measured under another config (differs in {diff}); "
                          "rerun them instead")
    by_coord = {c.coordinates: c.run_id for c in sweep.cells()}
    mapping = {old: by_coord[co] for old, co in cell_coordinates(store).items() if co in by_coord}
    try:
        with FolderLock(store.dir):
            n = rekey(store, mapping)
            store.set_current(sweep.to_dict(), [c.run_id for c in sweep.cells()])
    except SweepBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{sweep.name}: {n} cell(s) renamed to the current run ids, {len(mapping) - n} already current")
    return 0


def add_parsers(sub) -> None:
    """The sweep commands' parsers, on the CLI's subparsers."""
    s = sub.add_parser("sweep", help="run or resume a sweep (skips finished cells)", epilog=PATHS_HELP,
                       description="Run every unfinished cell of a sweep config; reads the config and its models "
                                   "and workloads, writes <results_dir>/<name>/ (tables, provenance.json, logs/).")
    s.add_argument("config", help="sweep YAML")
    s.add_argument("--results-dir", help="write under this folder instead of the config's results_dir")
    s.add_argument("--methods", type=_names, help="only these methods (labels, names or engines, comma-separated)")
    s.add_argument("--method", action="append", help=argparse.SUPPRESS)
    s.add_argument("--batch-sizes", type=_ints, help="only these batch sizes of the config (e.g. 1,8)")
    s.add_argument("--datasets", type=_names, help="only these workloads of the config")
    s.add_argument("--num-requests", type=_count, help="every workload measures this many requests (a new config: "
                                                    "its cells differ from the file's)")
    s.add_argument("--dry-run", action="store_true", help="print the cells and engines it would run; start nothing")
    s.add_argument("--verbose", action="store_true", help="show the engines' own output (always in logs/)")
    s.add_argument("--no-summary", dest="summary", action="store_false", help="no summary table at the end")
    s.add_argument("--skip-failed", action="store_true", help="do not retry cells that failed before")
    s.add_argument("--strict", action="store_true", help="exit 1 if any cell failed")
    s.add_argument("--plan-minutes", metavar="N",
                   help="run only the whole blocks (model, dataset, batch size: every arm) that sdlib plan "
                        "--gpu-minutes N selects; done cells are skipped, so rerunning takes the next blocks")
    s.add_argument("--priority", help="with --plan-minutes: block order (dataset | bs | a list; see sdlib plan)")
    s.add_argument("--blocks", help="run only these blocks: dataset:bs[,...] (or model/dataset:bs)")
    from sdlib.run.ray_executor import add_executor_arguments  # --executor / --address (the Ray executor)
    add_executor_arguments(s)
    s.set_defaults(func=cmd_sweep)
    pl = sub.add_parser(
        "plan", help="estimated GPU minutes per engine and block; the blocks that fit a budget", epilog=PATHS_HELP,
        description="Estimate a sweep's cells (engine steps x the engine cost model, data/costmodels/"
                    "h200_replay_engine.json; trace-replay plans; synthetic acceptance) and engine starts "
                    "(median engine_start_s of the committed sweeps' provenance, data/sweeps/*/provenance.json), "
                    "skip cells already in the results folder, and with --gpu-minutes pick the whole comparison "
                    "blocks (model, dataset, batch size, every arm) that fit. Reads the config, its workloads' "
                    "prompts and traces, the results folder, the cost model and the committed provenance; writes "
                    "nothing. The formula: sdlib/run/budget.py.")
    pl.add_argument("config", nargs="?", help="sweep YAML")
    pl.add_argument("--gpu-minutes", metavar="N", help="budget: the blocks that fit in N minutes")
    pl.add_argument("--priority", help="block order: dataset (default: the config's datasets, then batch sizes), "
                                       "bs (batch sizes first), or a list of datasets, batch sizes, dataset:bs")
    pl.add_argument("--batch-sizes", type=_ints, help="only blocks at these batch sizes of the config")
    pl.add_argument("--datasets", type=_names, help="only blocks of these workloads of the config")
    pl.add_argument("--results-dir", help="the results folder whose done cells are skipped (default: the config's)")
    pl.add_argument("--from-scratch", action="store_true", help="plan every cell, as if none were done")
    pl.add_argument("--cells", action="store_true", help="also print every cell's estimate")
    pl.add_argument("--cost-model", help="engine cost model JSON (default: data/costmodels/h200_replay_engine.json)")
    pl.add_argument("--device", default="NVIDIA H200", help="device whose engine starts calibrate (default: %(default)s)")
    pl.add_argument("--vllm-version", help="only engine starts recorded with this vLLM (default: any)")
    pl.add_argument("--paper-matrix", action="store_true",
                    help="the paper's full matrix (6 datasets, 5 methods, k 1-10, bs 1-512, 3 repeats, 8B and 70B "
                         "shapes) in GPU-hours")
    pl.add_argument("--gpus", type=_ints, metavar="N[,N...]", help="with --paper-matrix: its engine groups packed "
                    "longest first onto N GPUs: makespan against GPU-hours / N (docs/scale.md)")
    pl.add_argument("--measured", nargs="?", const="", metavar="DIR",
                    help="minutes each recorded invocation under DIR (default data/sweeps) used against its plan")
    pl.set_defaults(func=cmd_plan)
    v = sub.add_parser("validate", help="check a config, its models and workloads; start nothing", epilog=PATHS_HELP)
    v.add_argument("config", help="sweep YAML")
    v.set_defaults(func=cmd_validate)
    st = sub.add_parser("status", help="cells done / failed / to do / stale", epilog=PATHS_HELP)
    st.add_argument("config", help="sweep YAML")
    st.add_argument("--results-dir", help="the results folder the sweep was run with (default: the config's)")
    st.set_defaults(func=cmd_status)
    c = sub.add_parser("clean", help="remove results that no longer belong to the config (lists them, asks)",
                       epilog=PATHS_HELP, description="Delete cells' files in the config's results folder: the "
                       "stale cells (--stale: not cells of this config) and any cell named with --cell. It lists "
                       "them and asks; without a terminal it deletes only with --yes. Files git tracks (committed "
                       "results) are never deleted unless their cell is named with --cell.")
    c.add_argument("config", help="sweep YAML")
    c.add_argument("--results-dir", help="the results folder (default: the config's)")
    c.add_argument("--stale", action="store_true", help="remove the cells of an older config (not in this one)")
    c.add_argument("--cell", action="append", metavar="RUN_ID", help="remove this cell (repeatable), even if "
                   "git tracks its files")
    c.add_argument("--yes", "-y", action="store_true", help="delete without asking")
    c.set_defaults(func=cmd_clean)
    r = sub.add_parser("rekey", help="rename finished cells to the current run-id scheme (after an sdlib upgrade)",
                       epilog=PATHS_HELP)
    r.add_argument("config", help="sweep YAML (must equal the config the cells were measured under)")
    r.add_argument("--results-dir", help="the results folder (default: the config's)")
    r.set_defaults(func=cmd_rekey)
