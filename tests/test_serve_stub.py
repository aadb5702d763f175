"""Serving sweep against the stub server (sdlib.serve.stub; unit tier, no vLLM): the client's timestamps and
token counts, the server lifecycle (start, /health timeout, failed start, stop, orphan reaping after kill -9),
and the whole runner (tables, summary = recomputation, resume, client failures)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from sdlib.analysis.serving import summarize, token_gaps
from sdlib.paths import REPO_ROOT
from sdlib.serve import client as C
from sdlib.serve.config import parse_serving
from sdlib.serve.server import Server, ServerError, port_is_free, reap_orphans
from sdlib.run.supervise import group_alive
from sdlib.store.serving_store import ServingStore
from tests.conftest import sigint_as_at_a_terminal


def stub_cmd(*args):
    return lambda port: [sys.executable, "-m", "sdlib.serve.stub", "--port", str(port), *map(str, args)]


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture
def stub(tmp_path):
    servers = []

    def make(*args, registry=None):
        s = Server(stub_cmd(*args), tmp_path / f"stub{len(servers)}.log", label="stub", env=_env(),
                   registry_dir=registry or tmp_path / "reg")
        s.start()
        s.wait_healthy(30)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def _gone(srv: Server) -> bool:
    return not group_alive(srv.pgid) and port_is_free(srv.port)


# ------------------------------------------------------------------------------------------------ client


def test_client_times_every_message_and_counts_its_tokens(stub):
    srv = stub("--chunks", "3,2,4", "--step-ms", 30, "--ttft-ms", 40)
    reqs = [C.ClientRequest(f"r{i}", 0.05 * i, 0, [1, 2, 3], 10) for i in range(3)]
    recs, info = C.run_open_loop_sync(reqs, [srv.url])
    for rec in recs:
        assert rec.ok, rec.error
        assert rec.msg_n == [1, 3, 2, 4]  # prefill token, then steps of 1 + accepted
        assert rec.output_tokens == 10 and rec.prompt_tokens == 3 and rec.finish_reason == "length"
        # sent on time: a client that waited for the previous request (about 130 ms each) would send r2 ~160 ms
        # late; 100 ms leaves room for a loaded 2-core machine (the fast tier under xdist)
        assert rec.send_s - rec.arrival_s < 0.1
        ttft = rec.first_token_s - rec.send_s
        assert 0.035 <= ttft < 0.5
        gaps = np.diff(rec.msg_t)
        # the server paces its messages 30 ms apart; a starved client may read two at once (one gap of ~0), but a
        # client that stamps a batch of messages at one moment leaves two or more gaps of ~0
        assert np.all(gaps >= 0) and (gaps < 0.01).sum() <= 1, gaps
        itl = token_gaps(np.array(rec.msg_t) - rec.send_s, rec.msg_n)
        assert len(itl) == rec.output_tokens - 1
        assert itl.sum() == pytest.approx(rec.finish_s - rec.first_token_s)
        # a message of 3 tokens 30 ms after the previous one: three gaps of ~10 ms
        assert np.allclose(itl[:3], gaps[0] / 3)
    assert info["client_cpu_s"] >= 0


def test_coalesced_messages_get_one_timestamp(stub):
    """All of a request's messages in one write: they arrive together, so their gaps are ~0 (what the client
    sees; the server's own per-step timing is not visible in the stream)."""
    srv = stub("--chunks", "2", "--coalesce")
    recs, _ = C.run_open_loop_sync([C.ClientRequest("r", 0.0, 0, [1], 7)], [srv.url])
    assert recs[0].msg_n == [1, 2, 2, 2] and recs[0].output_tokens == 7 and max(np.diff(recs[0].msg_t)) < 0.01


def test_client_records_http_errors_and_refused_connections(stub, tmp_path):
    srv = stub("--fail-after", 1)
    dead_url = "http://127.0.0.1:9"  # discard port: nothing listens
    reqs = [C.ClientRequest("a", 0.0, 0, [1], 4), C.ClientRequest("b", 0.05, 0, [1], 4),
            C.ClientRequest("c", 0.06, 1, [1], 4)]
    recs, _ = C.run_open_loop_sync(reqs, [srv.url, dead_url])
    assert recs[0].ok
    assert recs[1].error.startswith("HTTP 500")
    assert recs[2].error and not recs[2].ok


# ------------------------------------------------------------------------------------------------ server


def test_server_stop_frees_port_and_group(stub):
    srv = stub()
    assert srv.running() and not port_is_free(srv.port)
    srv.stop()
    assert _gone(srv) and not list(srv.registry_dir.glob("*.json"))


def test_failed_start_leaves_nothing(tmp_path):
    srv = Server(lambda port: [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"],
                 tmp_path / "bad.log", env=_env(), registry_dir=tmp_path / "reg")
    srv.start()
    with pytest.raises(ServerError, match="exited with code 3"):
        srv.wait_healthy(30)
    assert _gone(srv) and not list((tmp_path / "reg").glob("*.json"))


def test_health_timeout_ends_the_server(tmp_path):
    srv = Server(stub_cmd("--ready-after-s", 300), tmp_path / "slow.log", env=_env(), registry_dir=tmp_path / "reg")
    srv.start()
    with pytest.raises(ServerError, match="did not answer within"):
        srv.wait_healthy(3)
    assert _gone(srv)


def test_kill_9_of_the_supervisor_leaves_an_orphan_that_the_next_start_ends(tmp_path):
    reg = tmp_path / "reg"
    script = textwrap.dedent(f"""
        import sys, time
        from sdlib.serve.server import Server
        s = Server(lambda port: [sys.executable, "-m", "sdlib.serve.stub", "--port", str(port)],
                   {str(tmp_path / 'orphan.log')!r}, registry_dir={str(reg)!r})
        s.start(); s.wait_healthy(30)
        print(s.pgid, s.port, flush=True)
        time.sleep(600)
    """)
    sup = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        pgid, port = map(int, sup.stdout.readline().split())
        os.kill(sup.pid, signal.SIGKILL)  # the supervisor dies without cleaning up
        sup.wait()
        assert group_alive(pgid) and not port_is_free(port)  # the server lives on: an orphan
        ended = reap_orphans(reg, log=lambda m: None)
        assert [e["pgid"] for e in ended] == [pgid]
        deadline = time.monotonic() + 10
        while (group_alive(pgid) or not port_is_free(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_alive(pgid) and port_is_free(port)
        assert not list(reg.glob("*.json"))
    finally:
        if sup.poll() is None:
            sup.kill()


def test_reap_orphans_leaves_live_supervisors_alone(stub, tmp_path):
    srv = stub()  # registered by this (live) process
    assert reap_orphans(srv.registry_dir, log=lambda m: None) == []
    assert srv.running() and list(srv.registry_dir.glob("*.json"))


# ------------------------------------------------------------------------------------------------ runner


def _serving_cfg(tmp_path, **over):
    d = {
        "name": "stubrun", "results_dir": str(tmp_path / "out"),
        "models": [{"name": "tiny", "path": "@trained/target"}],
        "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
        "mix": [{"task": "code_edit", "weight": 0.4, "workload": {"dataset": "code_edit", "source": "package",
                                                                   "num_requests": 4, "max_output_tokens": 12}},
                {"task": "reasoning", "weight": 0.6, "workload": {"dataset": "humaneval", "source": "package",
                                                                   "num_requests": 4, "max_output_tokens": 8}}],
        "traffic": {"rates": [40], "num_requests": 10, "warmup_requests": 1},
        "fleets": [{"name": "routed", "servers": ["ngram-k3", "none"], "rule": "task", "routes": {"code_edit": 0},
                    "default": 1}],
        "fleet_rates": [60],
        "server": {"startup_timeout_s": 30},
    }
    d.update(over)
    return parse_serving(d)


def stub_launcher(model, method, server, port):
    return [sys.executable, "-m", "sdlib.serve.stub", "--port", str(port), "--chunks", "1,3", "--step-ms", "2"]


def test_runner_tables_summary_and_resume(tmp_path):
    from sdlib.serve.sweep import run_serving

    cfg = _serving_cfg(tmp_path)
    store = run_serving(cfg, launcher=stub_launcher, quiet=True, registry_dir=tmp_path / "reg", env=_env())
    assert store.failures().empty
    runs = store.read("serve_runs")
    assert set(runs["label"]) == {"none", "ngram-k3", "routed"} and (runs["status"] == "ok").all()
    req, ch = store.read("serve_requests"), store.read("serve_chunks")
    for r in runs.itertuples():
        s = summarize(req[req.run_id == r.run_id], ch[ch.run_id == r.run_id])
        for k, v in s.items():
            assert getattr(r, k) == pytest.approx(v), k
    routed = req[req.run_id == runs[runs.label == "routed"].run_id.iloc[0]]
    assert set(routed[routed.task == "code_edit"]["backend"]) == {"ngram-k3"}
    assert set(routed[routed.task == "reasoning"]["backend"]) == {"none"}
    # the same requests at the same times in the routed fleet as in the method cells (same seed, one stream)
    single = req[req.run_id == runs[runs.label == "none"].run_id.iloc[0]]
    assert list(single.sort_values("request_id")["task"]) == list(routed.sort_values("request_id")["task"])
    assert len(store.read("serve_counters")) == 4  # two method cells + two shares of the fleet
    assert not list((tmp_path / "reg").glob("*.json"))
    files = {p: p.stat().st_mtime_ns for p in store.dir.rglob("*.parquet")}
    run_serving(cfg, launcher=stub_launcher, quiet=True, registry_dir=tmp_path / "reg", env=_env())
    assert files == {p: p.stat().st_mtime_ns for p in store.dir.rglob("*.parquet")}  # nothing rerun


def test_runner_records_a_failing_server_and_goes_on(tmp_path):
    from sdlib.serve.sweep import run_serving

    def launcher(model, method, server, port):
        if method.name == "ngram":  # this server answers every request with HTTP 500 after the warm-up
            return stub_launcher(model, method, server, port) + ["--fail-after", "1"]
        return stub_launcher(model, method, server, port)

    cfg = _serving_cfg(tmp_path, fleets=[], fleet_rates=[])
    store = run_serving(cfg, launcher=launcher, quiet=True, registry_dir=tmp_path / "reg", env=_env())
    fails = store.failures()
    assert len(fails) == 1 and "every request failed" in fails["error"].iloc[0]
    assert list(store.read("serve_runs")["label"]) == ["none"]
    assert not list((tmp_path / "reg").glob("*.json"))


class Boom(BaseException):
    """A client failure that is not a recorded cell error (as Ctrl-C): it must still stop the server."""


def test_client_crash_mid_stream_stops_the_server(tmp_path, monkeypatch):
    from sdlib.serve import sweep

    started = []
    real = sweep.run_open_loop

    async def crashing(reqs, urls, **kw):
        if reqs and reqs[0].request_id.startswith("warm"):
            return await real(reqs, urls, **kw)
        started.extend(u for u in urls if u)
        task = asyncio.ensure_future(real(reqs, urls, **kw))
        await asyncio.sleep(0.2)  # requests in flight
        task.cancel()
        raise Boom()

    monkeypatch.setattr(sweep, "run_open_loop", crashing)
    cfg = _serving_cfg(tmp_path, fleets=[], fleet_rates=[], traffic={"rates": [5], "num_requests": 10,
                                                                     "warmup_requests": 1})
    import gc

    with pytest.raises(Boom):
        sweep.run_serving(cfg, launcher=lambda *a: stub_launcher(*a) + ["--step-ms", "50"], quiet=True,
                          registry_dir=tmp_path / "reg", env=_env())
    assert gc.isenabled()  # the crashed client turned the collector back on
    port = int(started[0].rsplit(":", 1)[1])
    assert port_is_free(port) and not list((tmp_path / "reg").glob("*.json"))
    assert ServingStore(cfg.out_dir).done_ids() == set()


def test_concurrent_fleet_runs_both_servers_at_once(tmp_path):
    from sdlib.serve.sweep import run_serving

    cfg = _serving_cfg(tmp_path, execution="concurrent",
                       server={"startup_timeout_s": 30, "env_per_server": [{"STUB_SERVER": "0"}, {"STUB_SERVER": "1"}]})
    store = run_serving(cfg, launcher=stub_launcher, quiet=True, registry_dir=tmp_path / "reg", env=_env())
    assert store.failures().empty
    runs = store.read("serve_runs").set_index("label")
    assert runs.loc["routed", "execution"] == "concurrent" and runs.loc["routed", "completed"] == 10
    servers = store.read_provenance()["invocations"][-1]["servers"]
    fleet = [s for s in servers if "routed" in s["label"]]
    assert len(fleet) == 2 and fleet[0]["port"] != fleet[1]["port"]
    cnt = store.read("serve_counters")
    routed = cnt[cnt.run_id == runs.loc["routed", "run_id"]]
    assert sorted(routed["backend"]) == ["ngram-k3", "none"] and routed["num_requests"].sum() == 10
    assert not list((tmp_path / "reg").glob("*.json"))


def test_no_garbage_collection_while_sending(stub, monkeypatch):
    """A full collection walks the whole process (~0.3 s with the sweep's prompt pools) and would stall every
    stream at once: the client collects before t0 and keeps the collector off until the run ends."""
    import gc

    srv = stub()
    seen = []
    real = C.send_one

    async def spy(*a, **kw):
        seen.append(gc.isenabled())
        return await real(*a, **kw)

    monkeypatch.setattr(C, "send_one", spy)
    C.run_open_loop_sync([C.ClientRequest(f"r{i}", 0.01 * i, 0, [1], 4) for i in range(3)], [srv.url])
    assert seen == [False] * 3 and gc.isenabled()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_of_the_supervisor_stops_its_server(tmp_path, sig):
    import json

    reg = tmp_path / "reg"
    script = textwrap.dedent(f"""
        import sys
        from sdlib.serve.config import parse_serving
        from sdlib.serve.sweep import run_serving
        cfg = parse_serving({{"name": "sig", "results_dir": {str(tmp_path / 'out')!r},
            "models": [{{"name": "tiny", "path": "@trained/target"}}], "methods": [{{"name": "none"}}],
            "mix": [{{"task": "c", "workload": {{"dataset": "code_edit", "source": "package", "num_requests": 2,
                                               "max_output_tokens": 50}}}}],
            "traffic": {{"rates": [1], "num_requests": 60, "warmup_requests": 0}}}})
        run_serving(cfg, quiet=True, registry_dir={str(reg)!r},
                    launcher=lambda m, me, s, port: [sys.executable, "-m", "sdlib.serve.stub", "--port", str(port),
                                                     "--step-ms", "50"])
    """)
    sup = subprocess.Popen([sys.executable, "-c", script], env=_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)
    try:
        deadline = time.monotonic() + 60
        entries = []
        while time.monotonic() < deadline and not entries:
            entries = [json.loads(p.read_text()) for p in reg.glob("*.json")] if reg.is_dir() else []
            time.sleep(0.2)
        assert entries, "the server never registered"
        time.sleep(3)  # requests in flight
        sup.send_signal(sig)
        try:
            sup.wait(timeout=60)
        except subprocess.TimeoutExpired:
            sup.kill()
            raise AssertionError(f"the supervisor did not stop within 60 s of {sig!r}; its stderr:\n"
                                 + sup.communicate()[1][-3000:]) from None
        e = entries[0]
        assert not group_alive(e["pgid"]) and port_is_free(e["port"])
        assert not list(reg.glob("*.json"))
    finally:
        if sup.poll() is None:
            sup.kill()
