"""The sweep commands of the command line: ``sweep``, ``plan``, ``validate``, ``status``, ``clean``, ``rekey``.

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
import signal
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from sdlib.commands.base import Command, ConfigCommand, UsageError
from sdlib.paths import RESULTS_RULE

if TYPE_CHECKING:
    from sdlib.config import SweepConfig

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


def _load(config: str, results_dir: Optional[str] = None, num_requests: Optional[int] = None) -> SweepConfig:
    """The sweep of a command line's CONFIG (with ``--results-dir`` and ``--num-requests`` applied)."""
    # pydantic and the policy registry (pandas): imported when a command runs, so that `import sdlib.cli` stays light
    from sdlib.config import ConfigError, load_sweep, parse_sweep

    overrides = {}
    if results_dir:
        overrides["results_dir"] = str(Path(results_dir).expanduser().resolve())
    sweep = load_sweep(Path(config).expanduser().resolve(), overrides)
    if num_requests is not None:
        d = sweep.to_dict()
        d["workloads"] = [{**w, "num_requests": num_requests} for w in d["workloads"]]
        try:
            sweep = parse_sweep(d)
        except ConfigError as err:
            raise UsageError(f"--num-requests {num_requests}: {err}") from None
    return sweep


def _only(batch_sizes: Optional[list[int]], datasets: Optional[list[str]], sweep: SweepConfig) -> dict:
    only = {}
    if batch_sizes:
        bad = sorted(set(batch_sizes) - set(sweep.batch_sizes))
        if bad:
            raise UsageError(f"--batch-sizes: {bad} are not in the config's batch_sizes {sweep.batch_sizes}")
        only["batch_sizes"] = batch_sizes
    if datasets:
        have = {w.label for w in sweep.workloads}
        bad = sorted(set(datasets) - have)
        if bad:
            raise UsageError(f"--datasets: {bad} are not workloads of the config ({sorted(have)})")
        only["datasets"] = datasets
    return only


def _minutes(text, flag: str):
    """A budget flag's minutes (None when not given); :class:`UsageError` (one line) unless a number >= 0."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a number of minutes, got {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise UsageError(f"{flag}: expected a number of minutes >= 0, got {text!r}")
    return v


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


@dataclass
class SweepFileCommand(ConfigCommand):
    """A command on one sweep config and its results folder (paths explained under ``--help``)."""

    epilog = PATHS_HELP

    def sweep_and_store(self):
        """The config as given (``--results-dir`` applied) and the store of its results folder."""
        # deferred: sdlib.store loads pandas, and only the command's run needs it
        from sdlib.store import SweepStore

        sweep = _load(self.config, self.results_dir)
        return sweep, SweepStore(sweep.out_dir)


@dataclass
class SweepCommand(SweepFileCommand):
    """``sdlib sweep CONFIG``: run (or resume) every unfinished cell of a sweep config."""

    parser_name = "sweep"
    parser_help = "run or resume a sweep (skips finished cells)"
    description = ("Run every unfinished cell of a sweep config; reads the config and its models and workloads, "
                   "writes <results_dir>/<name>/ (tables, provenance.json, logs/).")
    results_help = "write under this folder instead of the config's results_dir"

    methods: Optional[list[str]] = None
    method: Optional[list[str]] = None
    batch_sizes: Optional[list[int]] = None
    datasets: Optional[list[str]] = None
    num_requests: Optional[int] = None
    dry_run: bool = False
    verbose: bool = False
    summary: bool = True
    skip_failed: bool = False
    strict: bool = False
    plan_minutes: Optional[str] = None
    priority: Optional[str] = None
    blocks: Optional[str] = None
    plan_device: Optional[str] = None
    executor: Optional[str] = None
    address: Optional[str] = None

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_cli_args(parser)
        parser.add_argument("--methods", type=_names,
                            help="only these methods (labels, names or engines, comma-separated)")
        parser.add_argument("--method", action="append", help=argparse.SUPPRESS)
        parser.add_argument("--batch-sizes", type=_ints, help="only these batch sizes of the config (e.g. 1,8)")
        parser.add_argument("--datasets", type=_names, help="only these workloads of the config")
        parser.add_argument("--num-requests", type=_count, help="every workload measures this many requests (a new "
                            "config: its cells differ from the file's)")
        parser.add_argument("--dry-run", action="store_true",
                            help="print the cells and engines it would run; start nothing")
        parser.add_argument("--verbose", action="store_true", help="show the engines' own output (always in logs/)")
        parser.add_argument("--no-summary", dest="summary", action="store_false", help="no summary table at the end")
        parser.add_argument("--skip-failed", action="store_true", help="do not retry cells that failed before")
        parser.add_argument("--strict", action="store_true", help="exit 1 if any cell failed")
        parser.add_argument("--plan-minutes", metavar="N",
                            help="run only the blocks (model, dataset, batch size: every arm; one too large for N in "
                            "parts, every arm at one engine start) that sdlib plan --gpu-minutes N selects; done cells "
                            "are skipped, so rerunning takes the next ones")
        parser.add_argument("--priority",
                            help="with --plan-minutes: block order (dataset | bs | a list; see sdlib plan)")
        parser.add_argument("--plan-device", metavar="NAME",
                            help="with --plan-minutes: the device whose engine starts calibrate the plan (as sdlib plan "
                            "--device; default: the GPU nvidia-smi names here, else NVIDIA H200)")
        parser.add_argument("--blocks", help="run only these blocks: dataset:bs[,...] (or model/dataset:bs); a part "
                            "of one: dataset:bs@start or dataset:bs@start.repeat")
        # deferred: sdlib.run.ray_executor loads pandas (its store), and only building this parser needs it
        from sdlib.run.ray_executor import add_executor_arguments

        add_executor_arguments(parser)  # --executor / --address (the Ray executor)

    def run(self) -> int:
        # the planner, the supervisor and the store (pandas): imported only when the command runs
        from sdlib.run.plan import plan
        from sdlib.run.preflight import preflight
        from sdlib.run.ray_executor import executor_from_args
        from sdlib.run.sweep import run_sweep
        from sdlib.store import SweepBusy, SweepStore

        sweep = executor_from_args(_load(self.config, self.results_dir, self.num_requests), self)
        methods = (self.method or []) + (self.methods or [])
        if methods:
            known = {m.label for m in sweep.methods} | {m.name for m in sweep.methods} | \
                {m.engine_label for m in sweep.methods}
            bad = sorted(set(methods) - known)
            if bad:
                raise UsageError(f"--methods: {bad} are not methods of the config "
                                 f"({sorted(m.label for m in sweep.methods)})")
        only = _only(self.batch_sizes, self.datasets, sweep)
        plan_minutes = _minutes(self.plan_minutes, "--plan-minutes")
        if plan_minutes is not None or self.blocks:
            only = self._planned_blocks(sweep, methods, only, plan_minutes)
            if only is None:
                return 0
        if self.dry_run:
            from sdlib.run.sweep import select_groups  # the selection a real run makes

            preflight(sweep)
            groups = select_groups(plan(sweep, SweepStore(sweep.out_dir), retry_failed=not self.skip_failed),
                                   methods, only)
            n = 0
            for (model, eng, start), cells in groups.items():
                n += len(cells)
                print(f"engine {model} / {eng}" + (f" (start {start})" if start else "") + f": {len(cells)} cell(s)")
                for c in cells:
                    print(f"  {c.run_id}")
            print(f"{sweep.name}: would run {n} cell(s); results in {sweep.out_dir} (dry run: nothing started)")
            return 0

        # deferred: sdlib.run.sweep loads pydantic, and only this path needs it
        from sdlib.run.groups import _on_sigterm

        old_term = signal.signal(signal.SIGTERM, _on_sigterm)  # SIGTERM as Ctrl-C: one line, not a traceback
        try:
            store = run_sweep(sweep, retry_failed=not self.skip_failed, only_methods=methods or None,
                              verbose=self.verbose, only=only or None)
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
        if self.summary and out["done"]:
            # deferred: sdlib.run.report loads pandas, and only this path needs it
            from sdlib.run.report import print_report

            print_report(store, run_ids=out["planned"], cells={c.run_id for c in sweep.cells()})
        if out["planned"] and not out["done"]:
            print(f"error: every one of the {len(out['planned'])} cell(s) failed; see {store.dir / 'failures'}",
                  file=sys.stderr)
            return 1
        return 1 if (self.strict and out["failed"]) else 0

    def _planned_blocks(self, sweep: SweepConfig, methods: list, only: dict, plan_minutes: Optional[float]):
        """``--plan-minutes N`` / ``--blocks``: the blocks to run as ``only``; None when nothing is left."""
        # deferred: sdlib.run.budget loads pandas, and only this path needs it
        from sdlib.run import budget
        from sdlib.store import SweepStore

        if methods:
            raise UsageError("--plan-minutes/--blocks run whole blocks (every arm of a dataset and batch size): "
                             "not with --methods")
        if self.blocks:
            return {**only, "blocks": budget.parse_blocks(self.blocks, sweep)}
        device = self.plan_device or plan_device_here()
        bp = budget.plan_budget(sweep, SweepStore(sweep.out_dir), plan_minutes, self.priority, only,
                                device=device, retry_failed=not self.skip_failed)
        chosen = bp.selected
        if not chosen:
            if bp.blocks.empty:
                print(f"{sweep.name}: nothing to run (every cell done)", file=sys.stderr)
                return None
            raise UsageError(f"--plan-minutes {plan_minutes:g}: no block fits (the smallest alone needs "
                             f"{bp.blocks['alone_s'].min() / 60:.1f} min; sdlib plan {self.config} shows them)")
        left = bp.blocks[~bp.blocks["selected"]]
        print(f"plan ({device}): {len(chosen)} of {len(bp.blocks)} block(s), {bp.total_s / 60:.1f} of "
              f"{plan_minutes:g} min estimated" + (f"; left for later: {', '.join(f'{r.dataset}:{r.batch_size}' + (f' ({r.part})' if r.part else '') for r in left.itertuples())}"
                              if len(left) else ""), file=sys.stderr)
        return {**only, "blocks": chosen}


def plan_device_here() -> str:
    """The device ``sdlib sweep --plan-minutes`` calibrates its plan for: the GPU this machine has (``nvidia-smi``;
    an H100's engine starts are not an H200's), else :data:`sdlib.run.budget.DEFAULT_DEVICE`."""
    # deferred: sdlib.run.budget loads pandas, and only the --plan-minutes path needs it (as _planned_blocks)
    from sdlib.run.budget import DEFAULT_DEVICE
    # deferred with it: the provenance helpers are needed only where a plan is made
    from sdlib.store.provenance import device_name

    name = device_name()
    return DEFAULT_DEVICE if name.startswith("CPU:") else name


@dataclass
class PlanCommand(Command):
    """``sdlib plan CONFIG``: estimated GPU minutes per engine and block; the blocks that fit a budget."""

    parser_name = "plan"
    parser_help = "estimated GPU minutes per engine and block; the blocks that fit a budget"
    description = ("Estimate a sweep's cells (engine steps x the engine cost model, data/costmodels/"
                   "h200_replay_engine.json; trace-replay plans; synthetic acceptance) and engine starts "
                   "(median engine_start_s of the committed sweeps' provenance, data/sweeps/*/provenance.json), "
                   "skip cells already in the results folder, and with --gpu-minutes pick the whole comparison "
                   "blocks (model, dataset, batch size, every arm) that fit. Reads the config, its workloads' "
                   "prompts and traces, the results folder, the cost model and the committed provenance; writes "
                   "nothing. The formula: sdlib/run/budget.py.")
    epilog = PATHS_HELP

    config: Optional[str] = None
    gpu_minutes: Optional[str] = None
    priority: Optional[str] = None
    batch_sizes: Optional[list[int]] = None
    datasets: Optional[list[str]] = None
    results_dir: Optional[str] = None
    from_scratch: bool = False
    whole_parts: bool = False
    cells: bool = False
    cost_model: Optional[str] = None
    device: str = "NVIDIA H200"
    vllm_version: Optional[str] = None
    paper_matrix: bool = False
    gpus: Optional[list[int]] = None
    measured: Optional[str] = None

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", nargs="?", help="sweep YAML")
        parser.add_argument("--gpu-minutes", metavar="N", help="budget: the blocks that fit in N minutes")
        parser.add_argument("--priority",
                            help="block order: dataset (default: the config's datasets, then batch sizes), "
                                 "bs (batch sizes first), or a list of datasets, batch sizes, dataset:bs")
        parser.add_argument("--batch-sizes", type=_ints, help="only blocks at these batch sizes of the config")
        parser.add_argument("--datasets", type=_names, help="only blocks of these workloads of the config")
        parser.add_argument("--results-dir",
                            help="the results folder whose done cells are skipped (default: the config's)")
        parser.add_argument("--from-scratch", action="store_true", help="plan every cell, as if none were done")
        parser.add_argument("--whole-parts", action="store_true",
                            help="count a done cell as done only when its whole part (model, dataset, batch size, "
                                 "engine start, repeat) is, as a GPU session resumes (gpu/resume_cells.py)")
        parser.add_argument("--cells", action="store_true", help="also print every cell's estimate")
        parser.add_argument("--cost-model",
                            help="engine cost model JSON (default: data/costmodels/h200_replay_engine.json)")
        parser.add_argument("--device", default="NVIDIA H200",
                            help="device whose engine starts calibrate (default: %(default)s)")
        parser.add_argument("--vllm-version", help="only engine starts recorded with this vLLM (default: any)")
        parser.add_argument("--paper-matrix", action="store_true",
                            help="the paper's full matrix (6 datasets, 5 methods, k 1-10, bs 1-512, 3 repeats, 8B and "
                            "70B shapes) in GPU-hours")
        parser.add_argument("--gpus", type=_ints, metavar="N[,N...]", help="with --paper-matrix: its engine groups "
                            "packed longest first onto N GPUs: makespan against GPU-hours / N (docs/scale.md)")
        parser.add_argument("--measured", nargs="?", const="", metavar="DIR",
                            help="minutes each recorded invocation under DIR (default data/sweeps) used against its "
                                 "plan")

    def run(self) -> int:
        # the planner (pandas, the cost models): imported only when the command runs
        from sdlib.run import budget

        cost_model = self.cost_model
        if cost_model:  # a path on the command line resolves from where the user stands
            cost_model = str(Path(cost_model).expanduser().resolve())
        if self.gpus and not self.paper_matrix:
            raise UsageError("--gpus: only with --paper-matrix")
        if self.paper_matrix:
            planner = budget.calibrated_planner(cost_model, device=self.device, vllm_version=self.vllm_version)
            est = budget.paper_matrix(planner)
            print(budget.format_paper_matrix(est))
            if self.gpus:  # the matrix packed onto that many GPUs, longest engine group first (docs/scale.md)
                print("\n" + budget.format_packing(est, planner, self.gpus))
            return 0
        if self.measured is not None:
            planner = budget.Planner(cost_model, budget.Calibration(), self.device, self.vllm_version)
            where = Path(self.measured).expanduser().resolve() if self.measured else None  # None: data/sweeps
            invs = budget.committed_invocations(where, planner, self.device)
            print(budget.format_measured(budget.measured_vs_plan(invs, self.device), self.device))
            return 0
        if not self.config:
            raise UsageError("plan: give a sweep CONFIG (or --paper-matrix, or --measured)")
        minutes = _minutes(self.gpu_minutes, "--gpu-minutes")
        # deferred: sdlib.store loads pandas, and only this path needs it
        from sdlib.store import SweepStore

        sweep = _load(self.config, self.results_dir)
        budget.parse_priority(self.priority, sweep)  # a bad --priority fails before anything is priced
        bp = budget.plan_budget(sweep, SweepStore(sweep.out_dir), minutes, self.priority,
                                _only(self.batch_sizes, self.datasets, sweep), cost_model=cost_model,
                                device=self.device, vllm_version=self.vllm_version, from_scratch=self.from_scratch,
                                whole_parts=self.whole_parts)
        print(budget.format_plan(bp, sweep, self.config, self.priority))
        if self.cells:
            print()
            print(budget.format_cells(bp))
        return 0


@dataclass
class ValidateCommand(Command):
    """``sdlib validate CONFIG``: check a config, its models and workloads; start nothing."""

    parser_name = "validate"
    parser_help = "check a config, its models and workloads; start nothing"
    epilog = PATHS_HELP

    config: str

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", help="sweep YAML")

    def run(self) -> int:
        from sdlib.run.preflight import preflight  # the workloads' loaders (pandas): only when the command runs

        sweep = _load(self.config)
        preflight(sweep)
        print(f"{self.config}: ok, {len(sweep.cells())} cells")
        return 0


@dataclass
class StatusCommand(SweepFileCommand):
    """``sdlib status CONFIG``: cells done / failed / to do / stale."""

    parser_name = "status"
    parser_help = "cells done / failed / to do / stale"

    results_help = "the results folder the sweep was run with (default: the config's)"

    def run(self) -> int:
        sweep, store = self.sweep_and_store()
        cells = sweep.cells()
        ids = {c.run_id for c in cells}
        done = store.done_ids() & ids
        corrupt = store.corrupt_ids() & ids
        failed = set(store.failures(current_only=False).get("run_id", [])) & ids
        stale = store.all_ids() - ids
        todo = [c for c in cells if c.run_id not in done]
        print(f"{sweep.name}: {len(cells)} cells, {len(done)} done, {len(failed - done)} failed, {len(todo)} to do"
              + (f", {len(corrupt)} damaged (rerun)" if corrupt else "")
              + (f"; {len(stale)} stale cell(s) of an older config here (sdlib clean --stale {self.config})"
                 if stale else "") + f"; results in {store.dir}")
        for c in todo:
            if c.run_id in corrupt:
                print(f"DAMAGED {c.run_id}: {store.damage(c.run_id)}")
            else:
                print(("FAILED  " if c.run_id in failed else "todo    ") + c.run_id)
        return 0


@dataclass
class CleanCommand(SweepFileCommand):
    """``sdlib clean CONFIG``: delete cells' files: the stale cells (``--stale``) and the cells named (``--cell``).
    Lists them first and asks (or takes ``--yes``); never deletes a git-tracked file (committed results) unless
    its cell is named."""

    parser_name = "clean"
    parser_help = "remove results that no longer belong to the config (lists them, asks)"
    description = ("Delete cells' files in the config's results folder: the stale cells (--stale: not cells of "
                   "this config) and any cell named with --cell. It lists them and asks; without a terminal it "
                   "deletes only with --yes. Files git tracks (committed results) are never deleted unless their "
                   "cell is named with --cell.")

    stale: bool = False
    cell: Optional[list[str]] = None
    yes: bool = False

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_cli_args(parser)
        parser.add_argument("--stale", action="store_true",
                            help="remove the cells of an older config (not in this one)")
        parser.add_argument("--cell", action="append", metavar="RUN_ID", help="remove this cell (repeatable), even if "
                            "git tracks its files")
        parser.add_argument("--yes", "-y", action="store_true", help="delete without asking")

    def run(self) -> int:
        from sdlib.store import FolderLock, SweepBusy  # pandas, pyarrow: only when the command runs
        from sdlib.store.provenance import git_tracked

        named = set(self.cell or [])
        if not self.stale and not named:
            raise UsageError("clean: say what to remove (--stale, or --cell RUN_ID)")
        sweep, store = self.sweep_and_store()
        if not store.dir.is_dir():
            print(f"{sweep.name}: {store.dir} does not exist; nothing to delete")
            return 0
        try:
            with FolderLock(store.dir):
                have = store.all_ids()
                unknown = sorted(named - have)
                if unknown:
                    raise UsageError(f"clean --cell: {unknown[:3]} are not cells in {store.dir}")
                stale = (have - {c.run_id for c in sweep.cells()}) if self.stale else set()
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
                    committed = tracked is None or any(f.resolve() in (tracked or set())
                                                       for f in store.cell_files(rid))
                    print(f"  {rid}" + (" (named; its files are committed)" if committed else ""))
                if not _confirm(f"delete these {len(files)} file(s)?", self.yes):
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


@dataclass
class RekeyCommand(SweepFileCommand):
    """``sdlib rekey CONFIG``: rename finished cells to the current run-id scheme (see sdlib.store.rekey)."""

    parser_name = "rekey"
    parser_help = "rename finished cells to the current run-id scheme (after an sdlib upgrade)"

    config_help = "sweep YAML (must equal the config the cells were measured under)"

    def run(self) -> int:
        from sdlib.config import parse_sweep  # pydantic, the policy registry (pandas): only when the command runs
        from sdlib.store import FolderLock, SweepBusy
        from sdlib.store.rekey import cell_coordinates, rekey

        sweep, store = self.sweep_and_store()
        prov_cfg = store.read_provenance().get("config")
        if not prov_cfg:
            raise UsageError(f"rekey: {store.dir} has no recorded config (provenance.json)")
        recorded = parse_sweep(prov_cfg).to_dict()  # the recorded config as today's classes read it (defaults filled)
        current = sweep.to_dict()
        for d in (recorded, current):
            for k in ("results_dir", "description", "executor", "ray_address"):  # how it ran, not what it measured
                d.pop(k, None)
        if recorded != current:
            diff = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
            raise UsageError(f"rekey: the cells here were measured under another config (differs in {diff}); "
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
