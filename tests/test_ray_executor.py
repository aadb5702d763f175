"""The Ray executor's fast tier (sdlib.run.ray_executor): the executor is no part of a run id or of an existing
sweep's provenance; the command line's --executor / --address; Ray absent or the cluster unreachable is one
line and exit 2 before anything starts; what a group asks of the cluster; longest-first order and packing;
``import sdlib`` never imports Ray. The real cluster, a killed node and resume: tests/test_faults_ray.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from argparse import Namespace

import pytest
import yaml

from sdlib import cli
from sdlib.config import ConfigError, parse_sweep
from sdlib.paths import REPO_ROOT
from sdlib.run import budget, ray_executor as rx


def _cfg(tmp_path, **over) -> dict:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "architectures": ["X"]}))
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    d = {"name": "rx", "results_dir": str(tmp_path / "out"), "models": [{"path": str(model), "name": "m"}],
         "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
         "workloads": [{"dataset": "custom", "name": "mine", "path": str(tmp_path / "data.jsonl"), "num_requests": 4,
                        "max_output_tokens": 32}],
         "batch_sizes": [1, 2]}
    d.update(over)
    return d


def test_the_executor_is_no_part_of_a_run_id_nor_of_an_old_sweeps_provenance(tmp_path):
    local = parse_sweep(_cfg(tmp_path))
    ray = parse_sweep(_cfg(tmp_path, executor="ray", ray_address="10.0.0.1:6379"))
    assert [c.run_id for c in local.cells()] == [c.run_id for c in ray.cells()]
    assert "executor" not in local.to_dict() and "ray_address" not in local.to_dict()  # provenance as before
    assert ray.to_dict()["executor"] == "ray" and parse_sweep(ray.to_dict()).ray_address == "10.0.0.1:6379"
    with pytest.raises(ConfigError, match="ray_address: only with executor: ray"):
        parse_sweep(_cfg(tmp_path, ray_address="auto"))
    with pytest.raises(ConfigError, match="executor"):
        parse_sweep(_cfg(tmp_path, executor="slurm"))


def test_the_committed_configs_keep_their_run_ids():
    """A committed sweep's recorded cells are its config's cells today (the new fields changed no run id)."""
    from sdlib.config import load_sweep
    from sdlib.store import current_cells

    cfg = load_sweep(REPO_ROOT / "configs" / "embedded_default.yaml")
    recorded = current_cells(cfg.out_dir)
    if recorded is None:
        pytest.skip("the embedded sweep's provenance is not here")
    assert {c.run_id for c in cfg.cells()} == recorded


def test_executor_from_the_command_line(tmp_path):
    s = parse_sweep(_cfg(tmp_path))
    assert rx.executor_from_args(s, Namespace(executor=None, address=None)) is s
    r = rx.executor_from_args(s, Namespace(executor="ray", address="auto"))
    assert (r.executor, r.ray_address) == ("ray", "auto")
    assert [c.run_id for c in r.cells()] == [c.run_id for c in s.cells()]
    cfg_ray = parse_sweep(_cfg(tmp_path, executor="ray", ray_address="h:1"))
    assert rx.executor_from_args(cfg_ray, Namespace(executor="local", address=None)).ray_address is None
    with pytest.raises(ConfigError, match="--address: only with --executor ray"):
        rx.executor_from_args(s, Namespace(executor=None, address="auto"))


@pytest.fixture
def no_engine(monkeypatch):
    started = []
    monkeypatch.setattr("sdlib.run.groups.EngineProcess", lambda *a, **k: started.append(a) or 1 / 0)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return started


def _one_line_exit_2(tmp_path, capsys, argv, no_engine) -> str:
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert not no_engine, "an engine was started"
    assert not (tmp_path / "out").exists(), "the results folder was touched before the error"
    return err


def test_ray_not_installed_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, no_engine):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_cfg(tmp_path)))
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the package
    err = _one_line_exit_2(tmp_path, capsys, ["sweep", str(p), "--executor", "ray", "--no-summary"], no_engine)
    assert "the ray package is not installed" in err and "sdlib[ray]" in err
    p.write_text(yaml.safe_dump(_cfg(tmp_path, executor="ray")))  # the same from the config
    assert "not installed" in _one_line_exit_2(tmp_path, capsys, ["sweep", str(p)], no_engine)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_cluster_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, no_engine):
    pytest.importorskip("ray")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_cfg(tmp_path)))
    port = _free_port()
    err = _one_line_exit_2(tmp_path, capsys, ["sweep", str(p), "--executor", "ray", "--address",
                                              f"127.0.0.1:{port}"], no_engine)
    assert f"no Ray cluster answers at" in err and str(port) in err
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # auto: the address the environment names
    err = _one_line_exit_2(tmp_path, capsys, ["sweep", str(p), "--executor", "ray", "--address", "auto"], no_engine)
    assert "no Ray cluster answers" in err
    err = _one_line_exit_2(tmp_path, capsys, ["sweep", str(p), "--address", "auto"], no_engine)
    assert "--address: only with --executor ray" in err


def test_what_a_group_asks_of_the_cluster():
    assert rx.group_resources(1, cluster_has_gpus=False) == {"num_cpus": 1, "num_gpus": 0, "bundle": None}
    assert rx.group_resources(4, cluster_has_gpus=False)["num_gpus"] == 0  # a CPU cluster: tensor parallel on CPUs
    assert rx.group_resources(1, cluster_has_gpus=True) == {"num_cpus": 1, "num_gpus": 1, "bundle": None}
    assert rx.group_resources(2, cluster_has_gpus=True) == {"num_cpus": 1, "num_gpus": 2,
                                                            "bundle": {"GPU": 2, "CPU": 1}}
    nodes = [{"Resources": {"CPU": 16, "GPU": 8}}, {"Resources": {"CPU": 4, "GPU": 8}}, {"Resources": {"CPU": 1}}]
    assert rx.slots(nodes, rx.group_resources(2, True)) == 4 + 4
    assert rx.slots(nodes, rx.group_resources(1, True)) == 8 + 4  # the second node has 4 CPUs for 8 GPUs
    assert rx.slots(nodes, rx.group_resources(1, False)) == 16 + 4 + 1
    assert rx.packing_pool(nodes, [rx.group_resources(2, True)] * 3) == (16, [2, 2, 2])
    assert rx.packing_pool(nodes[2:], [rx.group_resources(1, False)] * 2) == (1, [1, 1])


def test_groups_go_longest_first_by_estimate_else_by_cells(tmp_path):
    s = parse_sweep(_cfg(tmp_path, batch_sizes=[1, 2, 4], methods=[{"name": "none"}, {"name": "ngram"},
                                                                     {"name": "ngram", "num_spec_tokens": 5}]))
    from sdlib.run.plan import plan
    from sdlib.store import SweepStore

    groups = plan(s, SweepStore(tmp_path / "out" / "rx"))
    keys = list(groups)
    mins = {keys[0]: 1.0, keys[1]: 3.0, keys[2]: 2.0}
    assert [g.key for g in rx.order_groups(groups, mins)] == [keys[1], keys[2], keys[0]]
    groups[keys[2]] = groups[keys[2]] + groups[keys[2]]  # more cells
    assert [g.key for g in rx.order_groups(groups, None)] == [keys[2], keys[0], keys[1]]  # ties: config order


def test_estimates_come_from_the_planner(tmp_path, monkeypatch):
    from tests.test_budget import calibration, planner

    monkeypatch.setattr(budget, "calibrated_planner", lambda *a, **k: planner())
    s = parse_sweep(_cfg(tmp_path, workloads=[{"dataset": "gsm8k", "source": "hub", "num_requests": 2,
                                               "max_output_tokens": 11, "max_prompt_tokens": 10}]))
    from sdlib.run.plan import plan
    from sdlib.store import SweepStore

    store = SweepStore(tmp_path / "out" / "rx")
    groups = plan(s, store)
    mins, source = rx.estimate_minutes(s, store, groups)
    est = planner().estimate(s, store)
    for r in est.groups.itertuples():  # every cell of each group is to run: the group's total
        assert mins[tuple(r.group)] == pytest.approx(r.total_s / 60)
    assert "hand" in source and calibration().source == "hand"
    monkeypatch.setattr(budget, "calibrated_planner", lambda *a, **k: (_ for _ in ()).throw(
        FileNotFoundError("no cost model")))
    assert rx.estimate_minutes(s, store, groups) == (None, "cell count (no cost model applies: no cost model)")


def test_the_plan_names_each_group_and_its_node(tmp_path):
    s = parse_sweep(_cfg(tmp_path))
    from sdlib.run.plan import plan
    from sdlib.store import SweepStore

    groups = plan(s, SweepStore(tmp_path / "out" / "rx"))
    planned = rx.order_groups(groups, {k: m for k, m in zip(groups, (2.0, 3.0))})
    for g in planned:
        g.resources = rx.group_resources(1, False)
    text = rx.format_plan(planned, "the planner's estimate", (2, [1, 1]), 3)
    lines = text.splitlines()
    assert "2 engine group(s)" in lines[0] and "3 node(s)" in lines[0]
    assert lines[2].split()[:4] == ["m", "/", "ngram-k3", "2"] and "3.00" in lines[2]
    assert "5.0 min in all" in lines[-1] and "3.0 min" in lines[-1]  # makespan on 2 slots: the longer group
    planned[0].node, planned[0].ran_s, planned[0].outcome = "abcd1234 (10.0.0.2)", 90.0, "2/2 done"
    done = rx.format_plan(planned, "x", (2, [1, 1]), 3, done=True)
    assert "abcd1234 (10.0.0.2)" in done and "1.50" in done and "2/2 done" in done


def test_longest_first_packing_by_hand():
    span, starts = budget.pack_longest_first([5, 4, 3, 3, 2], [1, 1, 1, 1, 1], 2)
    # GPU a: 5, then 3 (at 5) = 8 ... b: 4, 3 (at 4) = 7, 2 (at 7) = 9
    assert span == 9 and starts == [0, 0, 4, 5, 7]
    span, starts = budget.pack_longest_first([4, 3, 1], [2, 1, 1], 2)  # a 2-GPU group holds both
    assert span == 7 and starts == [0, 4, 4]
    with pytest.raises(ValueError):
        budget.pack_longest_first([1], [3], 2)


def test_the_error_of_a_failed_task_is_one_line():
    class NodeDiedError(Exception):
        pass

    class RayTaskError(Exception):
        cause = RuntimeError("first\nValueError: the last line says it")

    assert rx._ray_error(NodeDiedError("long\ntext")) == "its Ray task failed (NodeDiedError: the node it ran on died)"
    assert rx._ray_error(RayTaskError()).endswith("ValueError: the last line says it)")


def test_forwarded_environment(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    monkeypatch.setenv("SDLIB_SUPERVISOR_PID", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = rx.forwarded_env({"X": "1"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["X"] == "1"
    assert "SDLIB_SUPERVISOR_PID" not in env and "CUDA_VISIBLE_DEVICES" not in env and "PATH" not in env


def test_sdlib_and_test_collection_never_import_ray():
    code = ("import sys; import sdlib, sdlib.cli, sdlib.run.sweep, sdlib.run.ray_executor, sdlib.store; "
            "from sdlib.cli import main; "
            "import pytest; pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests/test_ray_executor.py', "
            "'tests/test_faults_ray.py']); "
            "print('RAY_IMPORTED' if 'ray' in sys.modules else 'NO_RAY')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.stdout.strip().splitlines()[-1] == "NO_RAY", out.stdout[-2000:] + out.stderr[-2000:]
