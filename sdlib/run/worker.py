"""The engine process: one vLLM engine for one (model, method), every cell of that group.

Started by :mod:`sdlib.run.sweep` as ``python -m sdlib worker <spec.json>`` so that
memory is released and a crash is contained. Each finished cell is written at
once (atomically); a failing cell is recorded and the next one runs; if the
engine itself dies, the remaining cells are recorded as failed. A worker whose supervisor is gone (or that
is stopping) starts and writes no further cell: the sweep that held the folder has recorded them as failed,
and a resume may hold it by then.

Spec JSON: ``{"sweep": <SweepConfig dict>, "run_ids": [...], "env_out": <path>}``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from sdlib.config import parse_sweep
from sdlib.models.shapes import write_shape
from sdlib.run.driver import drive
from sdlib.run.supervise import SHM_TRACK_S, group_pids, remove_unused, shm_files
from sdlib.store import SweepStore, utc_now, write_json_atomic
from sdlib.store.gpu_state import card, sample as gpu_sample
from sdlib.store.provenance import device_name, device_uuid
from sdlib.vllm import compat as vc
from sdlib.vllm import confidence_stop as cs
from sdlib.vllm import replay as vr
from sdlib.vllm.options import kv_knob

log = logging.getLogger("sdlib.run.worker")


def _environment(llm) -> dict[str, Any]:
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

    return {
        "vllm_version": vc.vllm_version(),
        "torch_version": torch.__version__,
        "device": device_name(),
        "device_uuid": device_uuid(),
        "detailed_metrics": vc.has_detailed_metrics(),
        "kv_cache_capacity_tokens": vc.kv_cache_capacity_tokens(llm),
        "python": sys.version.split()[0],
    }


def write_shapes(sweep) -> None:
    """Write the ``@shapes/<name>`` folders the engine loads on this host (run ids hash their files without them;
    the supervisor's preflight writes them only where it runs, and a Ray task may run elsewhere)."""
    for path in {m.path for m in sweep.models} | {m.model for m in sweep.methods if m.model}:
        if path.startswith("@shapes/"):
            write_shape(path[len("@shapes/"):])


def run_group(spec: dict[str, Any]) -> int:
    """Run the cells named in ``spec`` on one engine. Returns a process exit code."""
    # deferred: sdlib.extract.tables loads pandas, and only this path needs it
    from sdlib.extract.tables import build_tables, check_concurrency, phases_frame
    from sdlib.run import replay as rr

    # deferred: sdlib.workloads loads pydantic, and only this path needs it
    from sdlib.workloads import load_prompts, load_trace_table

    sweep = parse_sweep(spec["sweep"])
    write_shapes(sweep)
    wanted = set(spec["run_ids"])
    cells = [c for c in sweep.cells() if c.run_id in wanted]
    if len(cells) != len(wanted):  # the supervisor and this process must agree on every cell's identity
        have = sorted(c.run_id for c in sweep.cells())
        print(f"worker: {len(wanted) - len(cells)} of {len(wanted)} run ids are not cells of this config here "
              f"(e.g. {sorted(wanted - {c.run_id for c in cells})[:2]}; this process computes {have[:2]}...)",
              file=sys.stderr)
        return 4
    store = SweepStore(sweep.out_dir)
    model, method = cells[0].model, cells[0].method
    max_batch = max(c.batch_size for c in cells)
    detailed = method.k > 0 and vc.has_detailed_metrics()
    remote_timers = sweep.engine.phase_timers and model.tensor_parallel_size > 1
    if sweep.engine.phase_timers and not remote_timers:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # hooks must reach the model runner
    conf_stop = any(c.method.confidence_stop is not None for c in cells)
    if sweep.engine.pin_target or remote_timers or conf_stop:  # functions sent to the engine's workers
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    t = time.perf_counter()
    llm = vc.make_llm(model, method, sweep.engine, max_batch=max_batch, seed=sweep.seed, detailed=detailed)
    engine_start_s = time.perf_counter() - t
    conf_drafter = None
    if conf_stop:  # before the phase timers, so the cut is timed inside the draft phase
        conf_drafter = cs.install(llm)
    timers = None
    if sweep.engine.phase_timers:
        # deferred: sdlib.vllm.phase_hooks loads pandas, and only this path needs it
        from sdlib.vllm.phase_hooks import RemoteTimers, install_phase_timers

        # tensor parallel: the runners live in worker processes, so the timers go there (rank 0 reports)
        timers = RemoteTimers(llm) if remote_timers else install_phase_timers(llm)
    replay_kind = None
    if sweep.engine.pin_target:
        vr.pin_target(llm)
    if any(c.method.replay for c in cells):
        replay_kind = vr.install(llm, method.num_spec_tokens)
    env = {**_environment(llm), "engine_start_s": engine_start_s, "model": model.name,
           "method": method.engine_label if method.shares_engine else method.label,
           "in_process_engine": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0",
           "phase_timers": timers.describe() if timers is not None else None,
           "pinned_target": sweep.engine.pin_target, "replay_runner": replay_kind,
           "confidence_stop_drafter": conf_drafter}
    if spec.get("env_out"):
        write_json_atomic(env, Path(spec["env_out"]))
    _SHM_SEEN.update(shm_files(group_pids(os.getpgid(0))))
    _ENGINE_UP.set()
    tokenizer = None if model.skip_tokenizer_init else llm.get_tokenizer()
    engine = llm.llm_engine
    prompts_cache: dict[str, list] = {}
    checks: dict[str, dict[str, int]] = {}  # per workload: prompts kept / skipped (reported in provenance)
    traces_cache: dict[str, Any] = {}
    warmed: set[int] = set()  # batch sizes warmed up on this engine (warmup_scope "batch_size")
    dead = None
    bar = tqdm(cells, desc=f"{model.name} / {method.label}", unit="cell", file=sys.stderr)
    gpu_card = card(env.get("device_uuid"))  # nvidia-smi asked by the engine's own card, not by CUDA's numbering
    for cell in bar:
        if _STOPPING.is_set() or not supervisor_alive():  # as before a write (below): no cell starts either
            return 5
        if dead is not None:
            store.write_failure(cell.run_id, _fail_info(cell, f"engine died earlier in this process: {dead}"))
            continue
        bar.set_postfix_str(f"{cell.workload.dataset} bs={cell.batch_size} r={cell.repeat}")
        try:
            wl = cell.workload
            if wl.label not in prompts_cache:
                need = max(c.num_requests for c in cells if c.workload.label == wl.label)
                loaded = load_prompts(dataclasses.replace(wl, num_requests=need), tokenizer)
                prompts_cache[wl.label], checks[wl.label] = fit_prompts(loaded, wl, model.max_model_len,
                                                                        skipped_rows(wl))
                if checks[wl.label]["skipped_too_long"] or checks[wl.label]["skipped_empty"]:
                    tqdm.write(f"workload {wl.label}: {checks[wl.label]}", file=sys.stderr)
                env["workload_checks"] = checks
                if spec.get("env_out"):
                    write_json_atomic(env, Path(spec["env_out"]))
            pool = prompts_cache[wl.label]
            if not pool:
                raise RuntimeError(f"workload {wl.label}: no prompt fits (of {checks[wl.label]}; max_model_len "
                                   f"{model.max_model_len}, max_output_tokens {wl.max_output_tokens})")
            kv_short = kv_shortfall(cell, pool, env.get("kv_cache_capacity_tokens"))
            if kv_short:
                raise RuntimeError(kv_short)
            # closed loop with requests_per_slot: reuse prompts in order when more requests are needed
            n_req = cell.num_requests if cell.batch_mode == "closed_loop" else len(pool)
            prompts = [pool[i % len(pool)] for i in range(max(n_req, 1))]
            by_index = None
            if cell.method.replay:
                if wl.label not in traces_cache:
                    traces_cache[wl.label] = load_trace_table(wl)
                plans, by_index = rr.cell_plans(cell, pool, traces_cache[wl.label])
                vr.set_plans(llm, plans)
                prompts = rr.keyed(prompts)

            if conf_stop:
                cs.set_threshold(llm, cell.method.confidence_stop)  # None: vLLM's fixed k, passed through

            def params(p, wl=wl):
                mt = getattr(p, "max_output_tokens", None) or wl.max_output_tokens
                return vc.delta_sampling_params(mt, wl.temperature, wl.seed, wl.ignore_eos)

            if cell.warmup_requests and (cell.warmup_scope == "cell" or cell.batch_size not in warmed):
                warmed.add(cell.batch_size)
                if cell.warmup_tokens is None:
                    warm = prompts[: cell.warmup_requests]
                    drive(engine, warm, min(cell.batch_size, len(warm)), params, id_prefix=f"warm-{cell.run_id}-")
                else:  # a full batch of short requests: the shape B warm at little cost
                    n_warm = max(cell.warmup_requests, cell.batch_size)
                    warm = [prompts[i % len(prompts)] for i in range(n_warm)]
                    drive(engine, warm, cell.batch_size,
                          lambda p: vc.delta_sampling_params(cell.warmup_tokens, wl.temperature, wl.seed, wl.ignore_eos),
                          id_prefix=f"warm-{cell.run_id}-")
            # the card's clocks, temperature, power, throttle reasons and clock-event counters: sampled outside the
            # timed requests (the counters' growth between the two samples is the window's, runs.gpu_slowdown_ms
            # and, reason by reason, runs.gpu_held_*_ms)
            gpu_start = gpu_sample(gpu_card)
            started_at = utc_now()
            if timers is not None:
                timers.reset()
            if cell.method.replay:
                vr.reset_timers(llm)
            if conf_stop:
                cs.reset(llm)
            before = vc.read_spec_counters(llm)
            n = len(prompts) * (cell.batch_size if cell.batch_mode == "paper" else 1)
            with tqdm(total=n, desc="requests", unit="req", leave=False, file=sys.stderr) as pbar:
                result = drive(engine, prompts, cell.batch_size, params, mode=cell.batch_mode,
                               spec_metrics=vc.request_spec_metrics, progress=pbar)
            gpu_end = gpu_sample(gpu_card, counters_first=True)  # the counters' span: the requests alone
            counters = vc.diff_counters(vc.read_spec_counters(llm), before)
            replay = None
            if by_index is not None:
                padded = replay_kind == "v2"
                K = cell.method.num_spec_tokens
                check = rr.check_cell(result, by_index, counters, K, padded, hook_stats=vr.stats(llm))
                rr.raise_if_off_plan(check)  # a replay that drifted from its plan is a failure, not a number
                store.write_json(f"replay/{cell.run_id}.json", check)
                replay = {i: rr.drafted_per_step(p, K, padded) for i, p in by_index.items()}
            if cell.method.confidence_stop is not None:
                store.write_json(f"confidence_stop/{cell.run_id}.json", cs.stats(llm))
            tables = build_tables(cell, result, counters, sweep=sweep.name, started_at=started_at,
                                  detailed_requested=detailed, replay=replay, gpu_start=gpu_start, gpu_end=gpu_end)
            check_concurrency(cell, tables["runs"])  # a batch the engine capped below B is a failure
            tables["step_phases"] = phases_frame(cell.run_id, timers.collect() if timers is not None else [])
            if _STOPPING.is_set() or not supervisor_alive():
                # stopping, or orphaned: the sweep that holds the folder has recorded this cell as failed (or
                # gone, and a resume may hold the folder now); a cell written after that would mix in
                return 5
            store.write_cell(cell.run_id, tables)
        except Exception as err:  # noqa: BLE001 - record and go on
            if not supervisor_alive():  # orphaned: a failure now would be ours, not the cell's
                return 5
            if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
                raise  # the results folder cannot take files: every later cell would fail the same way
            store.write_failure(cell.run_id, _fail_info(cell, f"{type(err).__name__}: {err}",
                                                         traceback.format_exc()))
            tqdm.write(f"FAILED {cell.run_id}: {type(err).__name__}: {err}", file=sys.stderr)
            if type(err).__name__ in ("EngineDeadError", "EngineGenerateError"):
                dead = f"{type(err).__name__}: {err}"
    return 0 if dead is None else 3


def skipped_rows(wl) -> int:
    """Rows of a custom file without a prompt (skipped by its reader before any prompt exists; counted in the
    provenance as ``skipped_empty`` with the empty prompts)."""
    if wl.dataset != "custom":
        return 0
    # deferred: sdlib.workloads.custom loads pydantic, and only this path needs it
    from sdlib.workloads.custom import check_custom_rows

    return check_custom_rows(wl)[1]


def kv_shortfall(cell, pool: list, capacity_tokens) -> str:
    """Why the engine's KV cache cannot hold the cell's batch (B requests of the pool's mean prompt + output
    length), or '' when it can or its capacity is unknown: checked before a cell runs, so a cell the cache
    would cap is a failure, not a measurement of a smaller batch."""
    if not capacity_tokens or not pool:
        return ""
    k = cell.method.k
    lens = [len(p.prompt_token_ids or []) + (getattr(p, "max_output_tokens", None) or cell.workload.max_output_tokens)
            + k for p in pool]
    need = cell.batch_size * sum(lens) / len(lens)
    if need <= capacity_tokens:
        return ""
    engine = getattr(cell, "engine", None)
    knob = kv_knob(engine.extra if engine is not None else None)
    return (f"KV cache too small for the batch: {cell.batch_size} requests of {sum(lens) / len(lens):.0f} tokens "
            f"on average need {need:.0f} tokens, the engine holds {capacity_tokens} (raise {knob} or lower the "
            "batch size)")


def fit_prompts(prompts: list, wl, max_model_len: int, skipped_rows: int = 0) -> tuple[list, dict[str, int]]:
    """Drop empty prompts, and prompts whose tokens plus their output budget do not fit ``max_model_len``
    (vLLM would reject the request and the cell would be lost); returns the rest and the counts
    (``skipped_empty`` adds ``skipped_rows``: rows the reader dropped for having no prompt)."""
    keep, empty, long_ = [], skipped_rows, 0
    for p in prompts:
        ids = p.prompt_token_ids
        if ids is not None and len(ids) == 0:
            empty += 1
            continue
        budget = getattr(p, "max_output_tokens", None) or wl.max_output_tokens
        if ids is not None and len(ids) + budget > max_model_len:
            long_ += 1
            continue
        keep.append(p)
    return keep, {"kept": len(keep), "skipped_empty": empty, "skipped_too_long": long_}


def _fail_info(cell, error: str, tb: str = "") -> dict[str, Any]:
    return {"model": cell.model.name, "method_label": cell.method.label, "dataset": cell.workload.dataset,
            "batch_size": cell.batch_size, "repeat": cell.repeat, "error": error, "traceback": tb}


_SUPERVISOR = os.environ.get("SDLIB_SUPERVISOR_PID")
#: Every /dev/shm file a process of this worker's group was seen mapping (:func:`_watch_supervisor` looks).
_SHM_SEEN: set[str] = set()
#: Set once this worker's engine is up (then the watcher stops looking at memory maps).
_ENGINE_UP = threading.Event()
#: Errors writing results that no later cell would escape: the worker stops and says so (exit code 6).
WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}
EXIT_CANNOT_WRITE = 6


def supervisor_alive() -> bool:
    """True while the sweep that started this worker runs (always True when started by hand)."""
    return _SUPERVISOR is None or os.getppid() == int(_SUPERVISOR)


def _die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the supervisor dies (Linux), so a killed sweep leaves no worker."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if not supervisor_alive():  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


#: Seconds a worker whose supervisor died gives vLLM to shut down before it ends its whole process group.
ORPHAN_GRACE_S = 5.0
#: Seconds :func:`_end_own_group` waits for the group's other processes to be gone (a SIGKILLed engine that
#: maps gigabytes of KV cache can take seconds to exit on a loaded machine; its files are in use until then).
REAP_WAIT_S = 20.0
#: Set by the first SIGTERM or by :func:`_end_own_group`: from then on a further SIGTERM (the kernel's
#: parent-death signal and the watcher's own both arrive when the supervisor dies) must not raise again in the
#: main thread, which may be in the middle of the clean-up by then.
_STOPPING = threading.Event()
#: Held by the one thread that ends the group (the main thread's ``finally``, the supervisor watcher and the
#: SIGTERM back-stop can all get there); the others wait for it to end the process.
_ENDING = threading.Lock()


def _end_own_group() -> None:
    """SIGKILL to this worker's process group (vLLM's engine processes, the resource tracker, then itself), and
    once the others are gone, unlink the /dev/shm files (semaphores, shared memory) the group maps or was seen
    mapping and no live process holds any more (nobody else will: the supervisor is gone or gave up).

    Runs once: a second caller (another thread) waits for the first to end the process. Signals cannot cut it
    short (:data:`_STOPPING` turns :func:`_on_term` into a no-op)."""
    _STOPPING.set()
    pg, me = os.getpgid(0), os.getpid()
    if not _ENDING.acquire(blocking=False):
        time.sleep(REAP_WAIT_S + 30.0)  # the first caller ends the process long before this
        os.killpg(pg, signal.SIGKILL)
        return
    pids = group_pids(pg)
    shm = shm_files(pids) | _SHM_SEEN
    for pid in pids:
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + REAP_WAIT_S
    while time.monotonic() < deadline and any(p != me for p in group_pids(pg)):
        time.sleep(0.05)
    mine = shm_files([me])
    for f in mine:  # this process dies next: what only it maps is left behind otherwise
        try:
            os.unlink(f)
        except OSError:
            pass
    rest = shm - mine
    remove_unused(rest)  # the rest, unless a live process outside the group maps it
    deadline = time.monotonic() + 5.0  # a file still mapped by a process that is exiting: again once it is gone
    while time.monotonic() < deadline and any(Path(f).exists() for f in rest):
        time.sleep(0.2)
        remove_unused(rest)
    os.killpg(pg, signal.SIGKILL)


def _watch_supervisor(poll_s: float = 0.5) -> None:
    """A thread: once the supervisor is gone, SIGTERM to ourselves (vLLM shuts down if the main thread can
    run its handler), then the whole group ended after :data:`ORPHAN_GRACE_S`, even if the main thread is
    stuck in an engine start-up that never returns to Python."""
    pg = os.getpgid(0)
    while supervisor_alive():
        if not _ENGINE_UP.is_set():  # vLLM makes its /dev/shm files while it starts; the cells are not disturbed
            try:
                _SHM_SEEN.update(shm_files(group_pids(pg)))
            except Exception:  # noqa: BLE001 - looking must never end the worker
                pass
        time.sleep(min(poll_s, SHM_TRACK_S))
    if not _STOPPING.is_set():  # the parent-death SIGTERM may have come first (or prctl failed): once is enough
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)
    _end_own_group()


def _on_term(signum, frame):  # noqa: ARG001
    """SIGTERM (the supervisor ends us, or died): unwind so vLLM shuts its engine down; if that hangs, end the
    whole process group after a grace period. Only the first SIGTERM does this: a later one returns at once, so
    that it never interrupts the unwinding or the clean-up in :func:`_end_own_group`."""
    if _STOPPING.is_set():
        return
    _STOPPING.set()

    def hard_stop():
        time.sleep(15)
        _end_own_group()

    try:  # what the group maps now: unwinding may end vLLM's engine core before _end_own_group looks
        _SHM_SEEN.update(shm_files(group_pids(os.getpgid(0))))
    except Exception:  # noqa: BLE001 - looking must never keep the worker from stopping
        pass
    threading.Thread(target=hard_stop, daemon=True).start()
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: sdlib worker <spec.json>", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_term)
    _die_with_parent()
    if _SUPERVISOR is not None:
        threading.Thread(target=_watch_supervisor, daemon=True, name="watch-supervisor").start()
    logging.basicConfig(level=os.environ.get("SDLIB_LOG_LEVEL", "WARNING"))
    with open(argv[0]) as f:
        spec = json.load(f)
    try:
        return run_group(spec)
    except KeyboardInterrupt:
        return 130
    except OSError as err:
        if err.errno not in WRITE_ERRNOS:
            raise
        name = errno.errorcode.get(err.errno, "")
        where = f"{err.filename}: " if err.filename else ""
        print(f"worker: cannot write results: {where}{err.strerror or err} ({name})", file=sys.stderr, flush=True)
        return EXIT_CANNOT_WRITE
    finally:
        if not supervisor_alive():  # orphaned: nobody else ends what vLLM started or cleans /dev/shm after it
            _end_own_group()

