"""The Ray executor: a sweep's engine groups as tasks on a Ray cluster, with the local executor's tables, resume
and fault rules.

Each engine group (:attr:`sdlib.config.Cell.group`: one engine start) is one Ray task with ``num_gpus`` = the
model's tensor-parallel size (on a cluster without GPUs: ``num_cpus=1`` and no GPU), inside a placement group
of one bundle holding those GPUs on one node when the size is above 1 (vLLM's own processes then share the node,
as they do under the local executor). The task runs on its node exactly what the local executor runs here:
:func:`sdlib.run.sweep.run_group`, i.e. :class:`sdlib.run.supervise.EngineProcess` starting ``sdlib worker SPEC``
in its own process group, with the start-up timeout, the log under ``logs/`` and the ``.engines/`` marker.

**Where the tables are written.** Each task writes its cells itself, through the same atomic store
(:class:`sdlib.store.SweepStore`) into the one results folder, which every node must see at the same path (a
shared file system; the model folders too). That keeps resume and failure records identical to the local
executor's: a cell is done when its commit marker is, whichever node wrote it; the worker records the cells that
fail while its engine runs; a worker that dies is recorded by the task that supervised it, and a task or node
that dies by the driver, from the group's run ids; a resumed sweep, local or Ray, skips the done cells. The
alternative, tasks returning their tables to the driver to write, would need no shared file system, but a cell
would be finished only once the driver had it: a driver that dies loses every cell in flight, each table crosses
the network twice, and the worker's own failure records and replay checks would need a second path.

**The driver** (this process) keeps the folder's lock (:class:`sdlib.store.FolderLock`: flock, and a lease with a
heartbeat for hosts that share the folder over NFS, where flock may not reach across hosts). A task refuses to
start its engine once the lease is not the driver's. Before any group starts, one task per node ends what a
killed sweep left running on that host (the ``.engines/`` markers). Groups are submitted longest first by the
planner's estimate (:mod:`sdlib.run.budget`; the cell count where no cost model applies), so a cluster finishes
at about the total divided by the GPUs (Ray queues tasks of one shape in submission order); the plan is printed
before, and each group's node after.

**Faults.** Tasks are never retried by Ray (``max_retries=0``): a task whose worker or node dies fails, the driver
records the group's unfinished cells as failures (as the local executor does for a dead worker) and the sweep
goes on; the next run redoes them. An engine dies with its task: its worker asks the kernel for SIGTERM when its
parent (the Ray worker) dies and watches its parent besides (:mod:`sdlib.run.worker`), and ends its own process
group (Ray's own clean-up, which SIGKILLs a dying Ray worker's child alone and would leave vLLM's processes, is
turned off for the sweep's tasks); after a failed group, and before any group starts, one task per live node ends
whatever engine group a marker in ``.engines/`` names on its host. Ctrl-C or SIGTERM of the driver cancels every
task (each ends its engine), then forces those left.

Ray is imported only here, inside functions: ``import sdlib`` and the local executor never load it (1-2 s, and
an optional dependency: ``pip install 'sdlib[ray]'``).

Usage:
    sdlib sweep configs/embedded_default.yaml --executor ray               # start Ray on this machine
    sdlib sweep my.yaml --executor ray --address auto                      # the cluster `ray start` made here
    sdlib sweep my.yaml --executor ray --address 10.0.0.1:6379             # or in the config: executor: ray
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, Optional

from sdlib.config import EXECUTORS, ConfigError, SweepConfig, parse_sweep
from sdlib.paths import REPO_ROOT
from sdlib.run import budget
from sdlib.run.budget import pack_longest_first
from sdlib.run.groups import (
    _child_env,
    _on_sigterm,
    _orphans,
    _Progress,
    begin_invocation,
    end_invocation,
    failure_line,
    group_label,
    group_tag,
    record_group_failure,
    run_group,
)
from sdlib.run.supervise import TERM_GRACE_S
from sdlib.store import SweepStore, utc_now, write_json_atomic
from sdlib.store.lease import lease_holder

#: Seconds to wait for the cluster's address to answer before saying it is unreachable (``ray.init`` itself
#: waits minutes for a GCS that is not there).
RAY_CONNECT_TIMEOUT_S = 5.0
#: The driver's environment variables that go with every group to its node (vLLM's, sdlib's, the Hugging Face
#: libraries', thread counts): the rest of a node's environment is its own (PATH, CUDA_VISIBLE_DEVICES set by Ray).
FORWARDED_ENV_PREFIXES = ("VLLM_", "SDLIB_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_", "MKL_", "TORCH")
#: ...but never these: the supervisor of a group is its task's process, not the driver.
NOT_FORWARDED = ("SDLIB_SUPERVISOR_PID",)
#: Seconds the driver gives cancelled tasks to end their engines before it forces them.
CANCEL_GRACE_S = TERM_GRACE_S + 10.0
#: Seconds between two looks of the driver at which groups started and which cells are done.
POLL_S = 1.0
#: Ray's usage reporting off for a Ray instance this process starts (the user's own setting wins).
RAY_OFFLINE = {"RAY_USAGE_STATS_ENABLED": "0"}
#: Ray's switch for killing a worker's child processes when the worker exits (see :func:`connect`).
RAY_CHILD_KILL = "RAY_kill_child_processes_on_worker_exit"


class RayUnavailable(ConfigError):
    """Ray cannot be used (not installed, or the cluster does not answer): one line, exit 2, nothing started."""


# ------------------------------------------------------------------------------------------- command line
def add_executor_arguments(parser) -> None:
    """``--executor`` and ``--address`` on ``sdlib sweep``'s parser."""
    parser.add_argument("--executor", choices=EXECUTORS,
                        help="local: engine groups one after another here (default, or the config's executor); "
                             "ray: each group a task on a Ray cluster (sdlib.run.ray_executor)")
    parser.add_argument("--address", metavar="auto|HOST:PORT",
                        help="with --executor ray: the cluster (auto: the one `ray start` made; default: the "
                             "config's ray_address, else start Ray on this machine)")


def executor_from_args(sweep: SweepConfig, args) -> SweepConfig:
    """The sweep with ``--executor`` / ``--address`` applied (neither changes a run id)."""
    executor = getattr(args, "executor", None) or sweep.executor
    address = getattr(args, "address", None)
    if address is not None and executor != "ray":
        raise ConfigError("--address: only with --executor ray (or executor: ray in the config)")
    if executor == sweep.executor and address is None:
        return sweep
    return dataclasses.replace(sweep, executor=executor,
                               ray_address=address if address is not None else
                               (sweep.ray_address if executor == "ray" else None))


# ------------------------------------------------------------------------------------------- connecting
def _import_ray():
    try:
        import ray  # an optional dependency, imported only by this executor (see the module docstring)
    except ImportError as err:
        raise RayUnavailable(f"executor ray: the ray package is not installed ({err}); pip install 'sdlib[ray]' "
                             "or run with --executor local") from None
    return ray


def _bootstrap_address(address: str) -> Optional[str]:
    """``HOST:PORT`` that ``address`` names (``auto``: RAY_ADDRESS, else the cluster ``ray start`` recorded
    here), or None when it cannot be told without connecting."""
    try:
        from ray._private.services import canonicalize_bootstrap_address  # Ray's own rule; private, so guarded
    except ImportError:
        return None if address == "auto" else address
    try:
        return canonicalize_bootstrap_address(address)
    except ValueError as err:
        raise RayUnavailable(f"executor ray: address {address!r}: {err}") from None
    except Exception:  # noqa: BLE001 - Ray's look-up failed in some other way: let ray.init say
        return None if address == "auto" else address


def check_reachable(hostport: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """:class:`RayUnavailable` unless something listens at ``HOST:PORT`` (a TCP connection within ``timeout_s``)."""
    host, _, port = hostport.rpartition(":")
    try:
        port_n = int(port)
    except ValueError:
        raise RayUnavailable(f"executor ray: address {hostport!r}: expected HOST:PORT") from None
    try:
        with socket.create_connection((host.strip("[]"), port_n), timeout=timeout_s):
            pass
    except OSError as err:
        raise RayUnavailable(f"executor ray: no Ray cluster answers at {hostport} "
                             f"({err.strerror or type(err).__name__}, within {timeout_s:g} s); start one "
                             "(ray start --head) or give its address with --address HOST:PORT") from None


def connect(address: Optional[str], verbose: bool = False) -> dict[str, Any]:
    """Connect this process to the cluster at ``address`` (None: start a Ray instance here); every failure is one
    line (:class:`RayUnavailable`), before any engine starts. ``verbose``: the tasks' output (the engines' own,
    with ``--verbose``) is shown here too. Returns what the invocation records."""
    ray = _import_ray()
    hostport = _bootstrap_address(address) if address else None
    if address == "auto" and hostport is None:
        raise RayUnavailable("executor ray: --address auto found no running Ray cluster (none recorded by "
                             "`ray start` here and RAY_ADDRESS unset); start one or give HOST:PORT")
    if hostport is not None:
        check_reachable(hostport)

    # telemetry off, as for the engines (sdlib.run.sweep.offline_env): a Ray head started here would otherwise
    # report usage over the network; the user's own setting wins
    for k, v in RAY_OFFLINE.items():
        os.environ.setdefault(k, v)
    env_vars = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                # a Ray worker that exits because its node's raylet died SIGKILLs its child, our worker, and only
                # it: vLLM's processes would be left. Off, the worker outlives it, gets its parent-death SIGTERM and
                # ends its whole process group (sdlib.run.worker), as when the local supervisor is killed
                RAY_CHILD_KILL: "0"}
    try:
        ray.init(address=hostport, logging_level=logging.WARNING, log_to_driver=verbose,
                 include_dashboard=False if hostport is None else None,
                 runtime_env={"env_vars": env_vars})  # sdlib importable on every node: the same checkout path
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise RayUnavailable(f"executor ray: cannot connect to {hostport or 'a new local Ray instance'}: "
                             f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    nodes = alive_nodes()
    return {"address": hostport or "local", "nodes": len(nodes),
            "resources": {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}}


def disconnect() -> None:
    try:
        import ray  # imported only when this executor connected
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes (Ray's records: NodeID, NodeManagerAddress, Resources)."""
    import ray  # connected by connect()

    return [n for n in ray.nodes() if n.get("Alive")]


# ------------------------------------------------------------------------------------------- resources
def group_resources(tensor_parallel_size: int, cluster_has_gpus: bool) -> dict[str, Any]:
    """What one engine group asks of the cluster: ``num_gpus`` = its tensor-parallel size (one node's GPUs held by
    a placement group of one bundle when above 1), or on a cluster without GPUs one CPU."""
    if not cluster_has_gpus:
        return {"num_cpus": 1, "num_gpus": 0, "bundle": None}
    tp = int(tensor_parallel_size)
    return {"num_cpus": 1, "num_gpus": tp, "bundle": {"GPU": tp, "CPU": 1} if tp > 1 else None}


def slots(nodes: list[dict[str, Any]], need: dict[str, Any]) -> int:
    """How many groups needing ``need`` the nodes hold at once (a group never spans nodes)."""
    n = 0
    for node in nodes:
        res = node.get("Resources", {})
        per = [int(res.get("CPU", 0) // need["num_cpus"])] if need["num_cpus"] else []
        if need["num_gpus"]:
            per.append(int(res.get("GPU", 0) // need["num_gpus"]))
        n += min(per) if per else 0
    return n


def packing_pool(nodes: list[dict[str, Any]], needs: list[dict[str, Any]]) -> tuple[int, list[int]]:
    """What the plan's makespan packs onto: the cluster's GPUs and each group's GPUs, or on a cluster without GPUs
    its slots of one group each (:func:`slots`) and 1 per group."""
    gpus = int(sum(n.get("Resources", {}).get("GPU", 0) for n in nodes))
    if gpus and all(r["num_gpus"] for r in needs):
        return gpus, [int(r["num_gpus"]) for r in needs]
    return (slots(nodes, needs[0]) if needs else 0), [1] * len(needs)


# ------------------------------------------------------------------------------------------- the plan
@dataclasses.dataclass
class PlannedGroup:
    key: tuple  # (model, engine, start): sdlib.config.Cell.group
    cells: list
    est_min: Optional[float]  # the planner's estimate (None: no cost model applied)
    resources: dict = dataclasses.field(default_factory=dict)
    node: str = ""  # where it ran (filled as it starts)
    outcome: str = "queued"
    ran_s: Optional[float] = None


def estimate_minutes(sweep: SweepConfig, store: SweepStore, groups) -> tuple[Optional[dict], str]:
    """Each group's estimated minutes (engine start, process, warm-ups, its cells) from the GPU-time planner, and
    where they came from; ``(None, why)`` when no cost model applies (then groups go by cell count)."""
    try:
        planner = budget.calibrated_planner()
        est = planner.estimate(sweep, store)
    except (ConfigError, OSError, KeyError, ValueError, ImportError) as err:
        return None, f"cell count (no cost model applies: {str(err).splitlines()[0] if str(err) else type(err).__name__})"
    per_cell = dict(zip(est.cells["run_id"], est.cells["est_s"]))
    fixed = {tuple(r.group): r.engine_start_s + r.process_s for r in est.groups.itertuples()}
    out = {key: (fixed.get(tuple(key), 0.0) + sum(per_cell.get(c.run_id, 0.0) for c in cells)) / 60
           for key, cells in groups.items()}
    return out, f"the planner's estimate (cost model {est.cost_model} on {est.device})"


def order_groups(groups, minutes: Optional[dict]) -> list[PlannedGroup]:
    """Longest first: by estimated minutes, else by cell count; ties keep the config's order."""
    planned = [PlannedGroup(key, cells, None if minutes is None else minutes[key]) for key, cells in groups.items()]
    return sorted(planned, key=lambda g: -(g.est_min if g.est_min is not None else len(g.cells)))


def _name(key: tuple) -> str:
    model, engine, start = key
    return f"{model} / {engine}" + (f" (start {start})" if start else "")


def _resources_text(r: dict) -> str:
    return f"{r['num_gpus']} GPU" if r.get("num_gpus") else f"{r.get('num_cpus', 1)} CPU"


def format_plan(planned: list[PlannedGroup], source: str, pool: tuple[int, list[int]], n_nodes: int,
                done: bool = False) -> str:
    """The plan as the driver prints it: each group's cells, estimated minutes, resources (and once run: its
    node, how it ended and its minutes), the total and the longest-first makespan on the cluster
    (``pool``: :func:`packing_pool`)."""

    size, needs = pool
    unit = "GPU(s)" if any(g.resources.get("num_gpus") for g in planned) else "slot(s) of one group"
    w = max([len(_name(g.key)) for g in planned] + [12])
    head = (f"ray plan: {len(planned)} engine group(s), longest first by {source}; {n_nodes} node(s), "
            f"{size} {unit}") if not done else "ray: where each engine group ran"
    lines = [head, f"  {'engine group':<{w}}  cells  est. min  needs   " + ("node                  ran min  outcome"
                                                                           if done else "")]
    for g in planned:
        est = f"{g.est_min:8.2f}" if g.est_min is not None else f"{'-':>8}"
        row = f"  {_name(g.key):<{w}}  {len(g.cells):5d}  {est}  {_resources_text(g.resources):<6}"
        if done:
            ran = f"{g.ran_s / 60:7.2f}" if g.ran_s is not None else f"{'-':>7}"
            row += f"  {g.node or '-':<20}  {ran}  {g.outcome}"
        lines.append(row.rstrip())
    if not done and all(g.est_min is not None for g in planned) and size and max(needs, default=1) <= size:
        mins = [g.est_min for g in planned]
        span = pack_longest_first(mins, needs, size)[0]
        total = sum(m * n for m, n in zip(mins, needs))
        lines.append(f"  estimated: {total:.1f} {'GPU-' if unit == 'GPU(s)' else ''}min in all; longest first on "
                     f"{size} {unit}: {span:.1f} min (total / {size}: {total / size:.1f})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- on a node
def _node_facts() -> dict[str, Any]:
    import ray  # inside a Ray task

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "host": socket.gethostname(),
            "pid": os.getpid(), "started_at": utc_now()}


def node_label(facts: dict[str, Any]) -> str:
    """A node as the plan names it: the start of its Ray id and its address."""
    return f"{str(facts.get('node_id', '?'))[:8]} ({facts.get('node_ip') or facts.get('host', '?')})"


def _started_path(store: SweepStore, key: tuple):

    return store.dir / ".run" / f"{group_tag(key)}.node.json"


def group_task(sweep_dict: dict, key: list, run_ids: list, env: dict, verbose: bool,
               lease_token: Optional[str]) -> dict[str, Any]:
    """The body of one group's Ray task, on its node: the local executor's :func:`sdlib.run.sweep.run_group`.
    Returns ``{"engine": facts, "node": facts, "messages": [...]}``, or ``{"error": ..., "node": ...}`` when it
    did not start its engine."""

    key = tuple(key)
    sweep = parse_sweep(sweep_dict)
    store = SweepStore(sweep.out_dir)
    node = _node_facts()
    write_json_atomic(node, _started_path(store, key))  # the driver names the node from it, even if we die
    if lease_token is not None:
        held = lease_holder(store.dir) or {}
        if held.get("token") != lease_token:
            return {"node": node, "error": f"the results folder's lease is not this sweep's any more (held by pid "
                                           f"{held.get('pid', '?')} on {held.get('host', '?')}); not started"}
    by_id = {c.run_id: c for c in sweep.cells()}
    missing = [r for r in run_ids if r not in by_id]
    if missing:
        return {"node": node, "error": f"this node computes other run ids than the driver for {len(missing)} "
                                       "cell(s) (another checkout, or other model files, at the same path?)"}
    cells = [by_id[r] for r in run_ids]
    child_env = _child_env(env, sweep)
    if "OMP_NUM_THREADS" not in env:  # Ray sets it to the task's CPUs (1); the engine picks its own, as locally
        child_env.pop("OMP_NUM_THREADS", None)
    messages: list[str] = []
    info = run_group(sweep, store, key, cells, child_env, verbose, quiet=True, say=messages.append,
                     progress=False, announce=False)
    return {"engine": info, "node": node, "messages": messages}


def clean_node(store_dir: str) -> dict[str, Any]:
    """A Ray task on one node: end the engine groups a killed sweep left running on this host."""

    return {"host": socket.gethostname(), "ended": _orphans(SweepStore(store_dir), remove_others=False)}


# ------------------------------------------------------------------------------------------- the driver
def forwarded_env(env: Optional[dict[str, str]]) -> dict[str, str]:
    """What goes with every group to its node: the driver's :data:`FORWARDED_ENV_PREFIXES` variables and ``env``."""
    out = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES) and k not in NOT_FORWARDED}
    return {**out, **(env or {})}


def _ray_error(err: BaseException) -> str:
    """A failed task's error in one line."""
    name = type(err).__name__
    what = {"NodeDiedError": "the node it ran on died", "WorkerCrashedError": "the Ray worker running it died",
            "TaskCancelledError": "it was cancelled", "OwnerDiedError": "the driver that owned it died"}.get(name)
    if what is None:
        cause = getattr(err, "cause", None)
        text = str(cause if cause is not None else err).strip().splitlines()
        what = text[-1][:300] if text else name
    return f"its Ray task failed ({name}: {what})"


def end_orphans_on_nodes(store: SweepStore, nodes: list[dict[str, Any]]) -> int:
    """Run :func:`clean_node` once on every live node (before any group starts); how many groups were ended."""
    import ray  # connected by connect()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(clean_node)
    refs = [task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(str(store.dir)) for n in nodes]
    ended = 0
    for ref in refs:
        try:
            ended += int(ray.get(ref, timeout=120).get("ended", 0))
        except Exception:  # noqa: BLE001 - a node that cannot clean up now still runs groups; say nothing more
            continue
    return ended


def run_groups(sweep: SweepConfig, store: SweepStore, groups, env, verbose: bool, quiet: bool, say,
               lease=None, connection: Optional[dict] = None) -> None:
    """Run the groups as Ray tasks (longest first), print the plan, follow them, record what the local executor
    records (provenance, failures), and print where each ran."""
    import ray  # connected by connect()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    nodes = alive_nodes()
    has_gpus = any(n.get("Resources", {}).get("GPU", 0) > 0 for n in nodes)
    tp = {m.name: m.tensor_parallel_size for m in sweep.models}
    minutes, source = estimate_minutes(sweep, store, groups)
    planned = order_groups(groups, minutes)
    for g in planned:
        g.resources = group_resources(tp[g.key[0]], has_gpus)
    pool = packing_pool(nodes, [g.resources for g in planned])
    unfit = [g for g in planned if slots(nodes, g.resources) == 0]
    if unfit:
        raise ConfigError(f"executor ray: no node of the cluster has room for {_name(unfit[0].key)} "
                          f"({_resources_text(unfit[0].resources)}; nodes: "
                          f"{[{k: v for k, v in n['Resources'].items() if k in ('CPU', 'GPU')} for n in nodes]})")
    begin_invocation(sweep, store, groups, say, executor="ray", ray={**(connection or {}), "plan_source": source})
    say(format_plan(planned, source, pool, len(nodes)))
    sweep_dict, fenv = sweep.to_dict(), forwarded_env(env)
    token = lease.token if lease is not None else None
    task = ray.remote(group_task)
    pending: dict = {}
    pgs: dict = {}
    bars = {id(g): _Progress(store, group_label(g.key), g.cells, enabled=not quiet and not verbose)
            for g in planned}
    started: dict[int, float] = {}
    engines: list = []
    terms: list = []

    def on_term(signum, frame):  # as the local executor: SIGTERM is Ctrl-C (kept by name: Ray re-raises its own)
        terms.append(signum)
        _on_sigterm(signum, frame)

    old_term = signal.signal(signal.SIGTERM, on_term) if sys.platform != "win32" else None
    lost_said = False
    try:
        for g in planned:  # all at once, longest first: Ray queues those that do not fit yet
            opts: dict[str, Any] = {"num_cpus": g.resources["num_cpus"], "num_gpus": g.resources["num_gpus"],
                                    "max_retries": 0}
            if g.resources["bundle"]:
                pg = placement_group([g.resources["bundle"]], strategy="STRICT_PACK")
                pgs[id(g)] = pg
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
            _started_path(store, g.key).unlink(missing_ok=True)
            ref = task.options(**opts).remote(sweep_dict, list(g.key), [c.run_id for c in g.cells], fenv, verbose,
                                              token)
            pending[ref] = g
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            for g in pending.values():
                if id(g) not in started:
                    facts = _read_json(_started_path(store, g.key))
                    if facts:
                        started[id(g)] = time.monotonic()
                        g.node, g.outcome = node_label(facts), "running"
                        say(f"{group_label(g.key)} started on node {g.node}: an engine for {len(g.cells)} cell(s); "
                            f"log: {store.log_path(_tag(g.key))}")
                if id(g) in started:
                    bars[id(g)].poll()
            if lease is not None and lease.lost and not lost_said:
                lost_said = True
                say(f"sweep {sweep.name}: {lease.lost}; starting no more groups")
                _cancel(ray, [r for r, g in pending.items() if id(g) not in started], force=True)
            for ref in ready:
                g = pending.pop(ref)
                engines.append(_finish(ray, ref, g, store, started, say, record_group_failure, failure_line))
                bars[id(g)].close()
                if id(g) in pgs:
                    remove_placement_group(pgs.pop(id(g)))
                store.update_invocation(-1, {"engines": engines})
    except BaseException:  # Ctrl-C, SIGTERM: every task ends its engine (KeyboardInterrupt in it), then forced
        refs = list(pending)
        if refs:
            _cancel(ray, refs, force=False)
            ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)
            _cancel(ray, refs, force=True)
        if terms:
            raise KeyboardInterrupt("SIGTERM") from None
        raise
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        for pg in pgs.values():
            remove_placement_group(pg)
    if any("failed" in g.outcome for g in planned):  # what a failed group's processes left (none should be)
        ended = end_orphans_on_nodes(store, alive_nodes())
        if ended:
            say(f"sweep {sweep.name}: ended {ended} engine group(s) the failed tasks left running")
    say(format_plan(planned, source, pool, len(nodes), done=True))
    end_invocation(sweep, store, say)


def _tag(key: tuple) -> str:

    return group_tag(key)


def _read_json(path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _cancel(ray, refs: list, force: bool) -> None:
    for ref in refs:
        try:
            ray.cancel(ref, force=force)
        except Exception:  # noqa: BLE001 - finished or gone already
            pass


def _finish(ray, ref, g: PlannedGroup, store: SweepStore, started: dict, say, record_group_failure,
            failure_line) -> dict:
    """A finished task: its engine's facts for provenance; the group's unfinished cells recorded as failures when
    the task failed or did not start its engine."""
    try:
        res = ray.get(ref)
    except Exception as err:  # noqa: BLE001 - any Ray error: the task, its worker or its node died
        res = {"error": _ray_error(err)}
    facts = res.get("node") or _read_json(_started_path(store, g.key)) or {}
    _started_path(store, g.key).unlink(missing_ok=True)
    if facts:
        g.node = node_label(facts)
    if id(g) in started:
        g.ran_s = time.monotonic() - started[id(g)]
    model, engine, start = g.key
    info = dict(res.get("engine") or {"model": model, "method": engine + (f" (start {start})" if start else ""),
                                      "exit_code": None, "error": res.get("error", "")})
    info["node"] = {k: facts.get(k) for k in ("node_id", "node_ip", "host")} if facts else None
    for msg in res.get("messages", []):
        say(msg)
    if "error" in res:
        log_file = store.log_path(_tag(g.key))
        recorded = record_group_failure(store, g.key, g.cells, res["error"], log_file)
        say(failure_line(store, g.key, g.cells, res["error"], recorded))
    done = sum(store.is_done(c.run_id) for c in g.cells)
    g.outcome = f"{done}/{len(g.cells)} done" + ("" if "error" not in res and info.get("exit_code") == 0
                                                 else " (failed)")
    return info


__all__ = ["RayUnavailable", "add_executor_arguments", "executor_from_args", "connect", "disconnect",
           "group_resources", "order_groups", "estimate_minutes", "format_plan", "run_groups"]
