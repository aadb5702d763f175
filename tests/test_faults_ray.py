"""The Ray executor on a real Ray cluster on this machine (a head without CPUs and two worker nodes of one CPU
each, ray.cluster_utils) with real CPU vLLM engines (engine tier, slow; CI runs it):

1. a sweep of two engine groups runs split across the two worker nodes, and its tables equal the local
   executor's for the same config: run ids, acceptance per step, cells done;
2. the node running one group is killed in the middle of a cell: that group's unfinished cells are recorded as
   failures, the other group's cells complete, no engine process is left (on the dead node or the other), and
   a resume completes the failed cells, once each.

The driver is ``sdlib sweep --executor ray --address ...`` in a process of its own, as a user runs it; processes
of the sweep carry a marker in their environment (forwarded to the engines as every ``SDLIB_`` variable is).
Ray listens on the loopback address only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) and reports no usage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdlib.paths import REPO_ROOT
from sdlib.run.ray_executor import RAY_OFFLINE
from sdlib.run.supervise import shm_files
from sdlib.store import SweepStore
from tests.procs import cmdline as _cmdline, ours as _ours, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: Ray's own switch for "this machine only" (every Ray process binds and connects to 127.0.0.1), and its usage
#: reporting off (the head would report over the network).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **RAY_OFFLINE}


@pytest.fixture(scope="module")
def cluster():
    saved = {k: os.environ.get(k) for k in (*LOOPBACK, "PYTHONPATH")}
    os.environ.update(LOOPBACK)
    os.environ["PYTHONPATH"] = str(REPO_ROOT)  # the nodes' workers import this checkout's sdlib
    pytest.importorskip("ray")
    from ray._private import ray_constants  # read when ray was first imported (maybe by an earlier test)
    from ray.cluster_utils import Cluster

    was = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process too picks 127.0.0.1 (the nodes read LOOPBACK)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [c.add_node(num_cpus=1) for _ in range(2)]
    c.wait_for_nodes()
    try:
        yield c, workers
    finally:
        c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = was
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray")
    (d / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Write a haiku about the number {i}."}) + "\n"
                                       for i in range(4)))
    cfg = {"name": "raysweep", "results_dir": str(d / "out"),
           "models": [{"name": "tiny", "path": "@trained/target", "max_model_len": 512}],
           "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
           "workloads": [{"dataset": "custom", "name": "haiku", "path": str(d / "p.jsonl"), "num_requests": 4,
                          "max_output_tokens": 24, "ignore_eos": True}],
           "batch_sizes": [1, 2], "warmup_requests": 1,
           "engine": {"gpu_memory_utilization": 0.1, "enforce_eager": True}}
    p = d / "raysweep.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p, d


def _sweep(p: Path, out: Path, marker: str, *extra: str, wait: bool = True):
    env = {**os.environ, **LOOPBACK, "SDLIB_FAULT_TEST": marker, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sdlib", "sweep", str(p), "--results-dir", str(out), "--no-summary",
                             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    if not wait:
        return proc
    text, _ = proc.communicate(timeout=900)
    return proc.returncode, text


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _no_orphans(marker: str, within_s: float = 30.0) -> None:
    t_end = time.monotonic() + within_s
    left = _ours(marker)
    while left and time.monotonic() < t_end:
        time.sleep(0.2)
        left = _ours(marker)
    assert not left, f"processes left {within_s:g} s later: {[(p, _cmdline(p)[:100]) for p in left]}"


def _tables(store: SweepStore) -> dict[str, pd.DataFrame]:
    steps = store.read("steps")[["run_id", "request_id", "step", "position", "drafted", "accepted"]]
    runs = store.read("runs")[["run_id", "method_label", "batch_size", "num_requests", "output_tokens"]]
    return {"steps": steps.sort_values(["run_id", "request_id", "step"]).reset_index(drop=True),
            "runs": runs.sort_values("run_id").reset_index(drop=True)}


def _node_ids(store: SweepStore, invocation: int = -1) -> list:
    inv = store.read_provenance()["invocations"][invocation]
    return [e["node"]["node_id"] for e in inv["engines"]]


def test_a_sweep_split_over_two_nodes_equals_the_local_one(cluster, config):
    c, workers = cluster
    p, d = config
    marker = uuid.uuid4().hex
    t0 = time.monotonic()
    rc, local_out = _sweep(p, d / "local", marker)
    t_local = time.monotonic() - t0
    assert rc == 0, local_out[-3000:]
    rc, ray_out = _sweep(p, d / "ray", marker, "--executor", "ray", "--address", c.address)
    t_ray = time.monotonic() - t0 - t_local
    assert rc == 0, ray_out[-3000:]
    _no_orphans(marker)
    local, ray = SweepStore(d / "local" / "raysweep"), SweepStore(d / "ray" / "raysweep")
    from sdlib.config import load_sweep

    ids = {cell.run_id for cell in load_sweep(p).cells()}
    assert local.done_ids() == ray.done_ids() == ids and ray.failures().empty
    a, b = _tables(local), _tables(ray)
    assert b["steps"]["accepted"].sum() > 0  # n-gram drafts were accepted: the comparison has content
    for t in a:
        pd.testing.assert_frame_equal(a[t], b[t], check_dtype=False, obj=t)
    # split across the two worker nodes (the head has no CPU): one group on each
    nodes = _node_ids(ray)
    assert sorted(nodes) == sorted(w.node_id for w in workers), nodes
    assert "ray plan: 2 engine group(s), longest first" in ray_out and "where each engine group ran" in ray_out
    inv = ray.read_provenance()["invocations"][-1]
    assert inv["executor"] == "ray" and inv["ray"]["nodes"] == 3
    print(f"local {t_local:.0f} s, ray {t_ray:.0f} s")


def test_a_killed_node_fails_its_cells_the_rest_complete_and_resume_redoes_them(cluster, config):
    c, workers = cluster
    p, d = config
    out = d / "killed"
    store = SweepStore(out / "raysweep")
    marker = uuid.uuid4().hex
    proc = _sweep(p, out, marker, "--executor", "ray", "--address", c.address, wait=False)
    try:
        def a_worker_mid_cell():
            """An engine up (its env file written) with cells to do: its worker, stopped (SIGSTOP) so that it
            writes no cell from now on; the cells not done now are those the kill must fail."""
            for pid in _ours(marker):
                argv = _cmdline(pid).split()
                if "worker" not in argv or not argv[-1].endswith(".spec.json"):
                    continue
                spec = Path(argv[-1])
                if not spec.with_name(spec.name.replace(".spec.json", ".env.json")).exists():
                    continue
                run_ids = set(json.loads(spec.read_text())["run_ids"])
                os.kill(pid, signal.SIGSTOP)
                todo = run_ids - store.done_ids()
                if todo:
                    return {"pid": pid, "run_ids": run_ids, "todo": todo}
                os.kill(pid, signal.SIGCONT)
            return None

        found = wait_for(a_worker_mid_cell, 600, "an engine up with cells to do", every=0.2)
        task_pid = _ppid(found["pid"])  # the worker's supervisor: the Ray worker running its group's task
        raylet = _ppid(task_pid)
        node = next(w for w in workers if w.all_processes["raylet"][0].process.pid == raylet)
        shm = shm_files([found["pid"]])
        # the node dies: the Ray worker running the task and the node's raylet, SIGKILLed (a real node's death
        # takes our processes too; here they live on and must end themselves)
        os.kill(task_pid, signal.SIGKILL)
        c.remove_node(node, allow_graceful=False)
        # resumed only once its parent is gone (the kernel has re-parented it: its parent-death SIGTERM is
        # pending), so what it does next is what an orphan does: no cell written, its group ended
        wait_for(lambda: _ppid(found["pid"]) != task_pid, 60, "the killed task's worker re-parented", every=0.1)
        os.kill(found["pid"], signal.SIGCONT)
        text, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 1), text[-3000:]
    _no_orphans(marker)
    assert not [f for f in shm if Path(f).exists()], "shared memory left after the node died"
    from sdlib.config import load_sweep

    cells = load_sweep(p).cells()
    other = {cell.run_id for cell in cells} - found["run_ids"]
    failed = set(store.failures()["run_id"]) if len(store.failures()) else set()
    assert failed == found["todo"] == found["run_ids"] - store.done_ids(), (sorted(failed), text[-3000:])
    assert other <= store.done_ids(), "the other group's cells did not complete"
    assert "its Ray task failed" in text and "failure(s) recorded, going on" in text
    kept = {f: f.stat().st_mtime_ns for f in store.dir.glob("*/*.parquet")}
    # resume on the surviving worker node: exactly the failed cells, by one engine, each once
    rc, text = _sweep(p, out, marker, "--executor", "ray", "--address", c.address)
    assert rc == 0, text[-3000:]
    _no_orphans(marker)
    assert store.done_ids() == {cell.run_id for cell in cells} and store.failures().empty
    inv = store.read_provenance()["invocations"][-1]
    assert inv["cells_planned"] == len(failed) and len(inv["engines"]) == 1
    assert all(f.stat().st_mtime_ns == m for f, m in kept.items()), "a finished cell was rewritten by the resume"
    assert _node_ids(store) == [next(w for w in workers if w is not node).node_id]
    workers[workers.index(node)] = c.add_node(num_cpus=1)  # the cluster as it was, for any later test
