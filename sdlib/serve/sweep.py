"""Run a serving sweep: per (model, method) one real OpenAI-compatible vLLM server, open-loop traffic from the
mix at each rate, per-request records and /metrics counters into tables; then the fleets (routed or one
method for all) at the same total hardware.

Sequential execution (the default, one device): each method's server starts once and serves, in turn, its
method cells and its share of every fleet cell that routes requests to that method (each share replays
exactly the requests the router sent to that server, at their arrival times). Concurrent execution: a fleet's
servers run at once behind one client (one device per server: ``server.env_per_server``).

Servers always stop (normal end, failed start, client error, Ctrl-C or SIGTERM: ``finally``); a supervisor
killed with ``kill -9`` leaves its servers registered, and the next sweep ends them first
(:func:`sdlib.serve.server.reap_orphans`). Finished cells are skipped on a rerun; failures are recorded and
the sweep goes on.

Usage:
    sdlib serve configs/embedded_serving.yaml
    from sdlib.serve.sweep import run_serving; store = run_serving("configs/embedded_serving.yaml")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import traceback
import urllib.request
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd

from sdlib.analysis.serving import percentile, summarize
from sdlib.config import ConfigError
from sdlib.models.shapes import write_shape
from sdlib.paths import REPO_ROOT, resolve
from sdlib.serve.arrivals import arrival_times, realised_rate
from sdlib.serve.client import ClientRequest, RequestRecord, run_open_loop
from sdlib.serve.config import ServerConfig, ServingCell, ServingConfig, load_serving
from sdlib.serve.router import Router, prompt_overlap_score
from sdlib.serve.server import Server, ServerError, reap_orphans
from sdlib.store import git_commit, utc_now
from sdlib.store.provenance import device_name, device_uuid
from sdlib.store.schema import columns
from sdlib.store.serving_store import SHARE_TABLES, ServingStore
from sdlib.vllm.server import diff_spec_counters, installed_vllm_version, parse_metrics, server_command, spec_counters

#: Builds a server's command line: (model, method, server settings, port) -> argv.
Launcher = Callable[[Any, Any, ServerConfig, int], list[str]]
#: The name every server is served under (the client's ``model`` field).
SERVED_NAME = "model"


def vllm_launcher(model, method, server: ServerConfig, port: int) -> list[str]:
    """The real thing: ``python -m vllm.entrypoints.openai.api_server ...`` (sdlib.vllm.server)."""

    return server_command(model, method, server, port, served_name=SERVED_NAME)


# ---------------------------------------------------------------------------------------------------------
# the request stream of a cell


@dataclass
class StreamRequest:
    """One request of a cell's stream (the same in every cell of one rate and repeat)."""

    request_id: str
    arrival_s: float
    task: str
    dataset: str
    prompt_index: int
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float
    ignore_eos: bool
    seed: Optional[int]
    overlap_score: float


def load_tokenizer(model):
    """The model's tokenizer (transformers), or None for ``skip_tokenizer_init`` models (token-id workloads)."""
    if model.skip_tokenizer_init:
        return None
    # deferred: transformers takes seconds to import, and only this path needs it
    from transformers import AutoTokenizer

    src = model.tokenizer or model.path
    p = resolve(src)
    return AutoTokenizer.from_pretrained(str(p) if p.exists() else src)


def load_pools(cfg: ServingConfig, model) -> dict[str, list]:
    """``{task: [Prompt, ...]}``: each task's prompt pool (token ids), in the workload's seeded order."""
    # deferred: sdlib.workloads loads pydantic, and only this path needs it
    from sdlib.workloads import load_prompts

    tok = load_tokenizer(model)
    pools = {}
    for t in cfg.mix:
        pool = load_prompts(t.workload, tok)
        if not pool or pool[0].prompt_token_ids is None:
            raise ConfigError(f"mix.{t.task}.workload: no token-id prompts (a tokenizer or a token-id source is needed)")
        pools[t.task] = pool
    return pools


def build_stream(cell: ServingCell, pools: dict[str, list], n: Optional[int] = None, rate: Optional[float] = None,
                 seed: Optional[int] = None) -> list[StreamRequest]:
    """The cell's requests: gamma arrivals at ``cell.rate`` (first at 0), a task per request drawn by weight,
    a prompt drawn uniformly from the task's pool; seeded by ``cell.seed`` (tasks and prompts do not depend on
    the rate)."""
    n = cell.num_requests if n is None else n
    seed = cell.seed if seed is None else seed
    s_arr, s_mix, s_prompt = (int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(3))
    arr = arrival_times(rate or cell.rate, n, cell.traffic.burstiness, seed=s_arr, start_at_zero=True,
                        exact_rate=cell.traffic.exact_rate)
    w = np.array([t.weight for t in cell.mix], dtype=float)
    tasks = np.random.default_rng(s_mix).choice(len(cell.mix), size=n, p=w / w.sum())
    prng = np.random.default_rng(s_prompt)
    out = []
    for i in range(n):
        t = cell.mix[int(tasks[i])]
        pool = pools[t.task]
        j = int(prng.integers(len(pool)))
        p = pool[j]
        ids = list(map(int, p.prompt_token_ids))
        wl = t.workload
        out.append(StreamRequest(
            request_id=f"req{i:05d}", arrival_s=float(arr[i]), task=t.task, dataset=wl.dataset, prompt_index=j,
            prompt_token_ids=ids, max_tokens=int(p.max_output_tokens or wl.max_output_tokens),
            temperature=wl.temperature, ignore_eos=wl.ignore_eos,
            seed=(wl.seed + i) if wl.temperature > 0 else None, overlap_score=prompt_overlap_score(ids)))
    return out


def route_stream(cell: ServingCell, stream: list[StreamRequest]) -> list[int]:
    """The server index of every request, decided one by one in arrival order (:class:`Router`)."""
    router = Router(cell.rule, len(cell.backends), cell.routes, cell.default, cell.threshold, seed=cell.seed)
    return [router.route(task=r.task, prompt=r.prompt_token_ids, score=r.overlap_score) for r in stream]


def client_requests(stream: list[StreamRequest], servers: list[int]) -> list[ClientRequest]:
    return [ClientRequest(r.request_id, r.arrival_s, s, r.prompt_token_ids, r.max_tokens, r.temperature,
                          r.ignore_eos, r.seed) for r, s in zip(stream, servers)]


# ---------------------------------------------------------------------------------------------------------
# tables


def _num(x) -> Optional[float]:
    return None if x is None else float(x)


def share_tables(cell: ServingCell, server: int, stream: list[StreamRequest], records: list[RequestRecord],
                 before: dict, after: dict, client_cpu_s: float, started_at: str) -> dict[str, pd.DataFrame]:
    """The share's rows of ``serve_requests``, ``serve_chunks`` and ``serve_counters``."""

    backend = cell.backends[server].label
    rid = cell.run_id
    req_rows, chunk_rows = [], []
    for r, rec in zip(stream, records):
        send = rec.send_s
        ttft = (rec.first_token_s - send) if rec.first_token_s is not None and send is not None else None
        e2e = (rec.finish_s - send) if rec.finish_s is not None and send is not None else None
        out_tok = rec.output_tokens
        tpot = (e2e - ttft) / (out_tok - 1) if (ttft is not None and e2e is not None and out_tok and out_tok > 1) else None
        sm = rec.server_metrics or {}
        sd = sm.get("speculative_decoding") or {}
        q = sm.get("queue_time_ms")
        req_rows.append({
            "run_id": rid, "request_id": r.request_id, "server": server, "backend": backend, "task": r.task,
            "dataset": r.dataset, "prompt_index": r.prompt_index, "overlap_score": r.overlap_score,
            "arrival_s": r.arrival_s, "send_s": _num(send), "first_token_s": _num(rec.first_token_s),
            "finish_s": _num(rec.finish_s), "ttft_s": _num(ttft), "e2e_s": _num(e2e), "tpot_s": _num(tpot),
            "prompt_tokens": rec.prompt_tokens if rec.prompt_tokens is not None else len(r.prompt_token_ids),
            "output_tokens": out_tok, "max_tokens": r.max_tokens, "num_messages": len(rec.msg_t),
            "finish_reason": rec.finish_reason, "server_queue_s": None if q is None else q / 1e3,
            "num_drafts": sd.get("num_spec_steps"), "num_draft_tokens": sd.get("num_draft_tokens"),
            "num_accepted_tokens": sd.get("num_accepted_draft_tokens"), "error": rec.error})
        if send is not None:
            for j, (t, k) in enumerate(zip(rec.msg_t, rec.msg_n)):
                chunk_rows.append({"run_id": rid, "request_id": r.request_id, "message": j, "t_s": t - send,
                                   "num_tokens": k})
    d = diff_spec_counters(after, before) if after and before else {}
    sends = [x.send_s for x in records if x.send_s is not None]
    ends = [x.finish_s for x in records if x.finish_s is not None]
    counters = {"run_id": rid, "server": server, "backend": backend, "num_requests": len(records),
                "span_s": (max(ends) - min(sends)) if sends and ends else None,
                "num_drafts": d.get("num_drafts"), "num_draft_tokens": d.get("num_draft_tokens"),
                "num_accepted_tokens": d.get("num_accepted_tokens"),
                "accepted_per_pos": json.dumps(d.get("accepted_per_pos", [])),
                "generation_tokens": d.get("generation_tokens"), "prompt_tokens": d.get("prompt_tokens"),
                "num_preemptions": d.get("num_preemptions"), "client_cpu_s": client_cpu_s, "started_at": started_at}

    def frame(table, rows):
        return pd.DataFrame(rows, columns=columns(table)) if rows else pd.DataFrame({c: [] for c in columns(table)})

    return {"serve_requests": frame("serve_requests", req_rows), "serve_chunks": frame("serve_chunks", chunk_rows),
            "serve_counters": frame("serve_counters", [counters])}


def cell_summary(cfg: ServingConfig, cell: ServingCell, shares: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The cell's ``serve_runs`` row from all its shares (percentiles: :func:`sdlib.analysis.serving.summarize`)."""
    req, ch, cnt = shares["serve_requests"], shares["serve_chunks"], shares["serve_counters"]
    done = req[req["error"].isna() & req["ttft_s"].notna()]
    start = float(req["arrival_s"].min()) if len(req) else 0.0
    end = float(done["finish_s"].max()) if len(done) else float("nan")
    duration = end - start
    out_tok = int(done["output_tokens"].fillna(0).sum())
    row = {
        "run_id": cell.run_id, "serving": cfg.name, "model": cell.model.name, "kind": cell.kind, "label": cell.label,
        "backends": json.dumps([b.label for b in cell.backends]), "num_servers": len(cell.backends),
        "rule": cell.rule, "execution": cfg.execution if cell.kind == "fleet" else "single",
        "rate_rps": cell.rate, "burstiness": cell.traffic.burstiness, "repeat": cell.repeat, "seed": cell.seed,
        "num_requests": len(req), "completed": len(done), "failed": len(req) - len(done),
        "scheduled_rate_rps": realised_rate(req["arrival_s"]), "sent_rate_rps": realised_rate(req["send_s"].dropna()),
        "send_lag_p99_s": percentile((req["send_s"] - req["arrival_s"]).dropna(), 99),
        "duration_s": duration, "request_throughput_rps": len(done) / duration if duration > 0 else float("nan"),
        "output_tokens": out_tok, "output_tok_per_s": out_tok / duration if duration > 0 else float("nan"),
        **summarize(req, ch),
        "counter_num_drafts": int(cnt["num_drafts"].fillna(0).sum()),
        "counter_num_draft_tokens": int(cnt["num_draft_tokens"].fillna(0).sum()),
        "counter_num_accepted_tokens": int(cnt["num_accepted_tokens"].fillna(0).sum()),
        "client_cpu_s": float(cnt["client_cpu_s"].fillna(0).sum()),
        "status": "ok" if len(done) == len(req) else "errors",
        "started_at": str(cnt["started_at"].dropna().min()) if cnt["started_at"].notna().any() else utc_now(),
    }
    return pd.DataFrame([row], columns=columns("serve_runs"))


# ---------------------------------------------------------------------------------------------------------
# running


@contextlib.contextmanager
def client_priority(nice: Optional[int]):
    """Run the block with this thread's nice value at ``nice`` (the client), then restore it, so servers
    started later keep the default priority. Without the permission it warns and goes on."""
    if nice is None:
        yield
        return
    old = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        warnings.warn(f"traffic.client_nice={nice}: not permitted here; the client runs at nice {old}", stacklevel=3)
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, old)


def portable_cmd(cmd: list[str]) -> list[str]:
    """A command line for provenance: the interpreter as ``python``, paths inside the repository relative to
    it (provenance carries no absolute paths of the machine that ran it)."""
    root = str(REPO_ROOT) + os.sep
    out = [a.replace(root, "") for a in cmd]
    return (["python"] + out[1:]) if cmd and cmd[0] == sys.executable else out


def _get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - local URL
        return r.read().decode()


def read_counters(server: Server) -> dict:
    """The server's spec-decode counters now (``GET /metrics``)."""

    return spec_counters(parse_metrics(_get(server.url + "/metrics")))


def server_version(server: Server) -> Optional[str]:
    try:
        return json.loads(_get(server.url + "/version")).get("version")
    except Exception:  # noqa: BLE001 - a server without /version
        return None


@dataclass
class Work:
    """One share to run on a server: cell ``cell``, server index ``server``."""

    cell: ServingCell
    server: int


class ServingRun:
    """State of one invocation: config, store, prompt pools, provenance entry."""

    def __init__(self, cfg: ServingConfig, store: ServingStore, launcher: Launcher, quiet: bool,
                 env: Optional[dict[str, str]], registry_dir: Optional[Path] = None):
        self.cfg, self.store, self.launcher, self.quiet = cfg, store, launcher, quiet
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **cfg.server.env, **(env or {})}
        self.env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        self.pools: dict[str, dict[str, list]] = {}
        self.streams: dict[str, list[StreamRequest]] = {}
        self.servers_info: list[dict] = []
        self.failed_now: set[str] = set()
        self.registry_dir = registry_dir
        self.device = device_name()  # once, before any server starts
        self.device_uuid = device_uuid()  # which physical card (a lent machine's host name says nothing)

    def say(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def stream(self, cell: ServingCell) -> list[StreamRequest]:
        if cell.run_id not in self.streams:
            if cell.model.name not in self.pools:
                self.pools[cell.model.name] = load_pools(self.cfg, cell.model)
            self.streams[cell.run_id] = build_stream(cell, self.pools[cell.model.name])
        return self.streams[cell.run_id]

    def shares(self, cell: ServingCell) -> list[tuple[list[StreamRequest], list[int]]]:
        """Per server index: (its requests, their positions in the stream)."""
        st = self.stream(cell)
        routes = route_stream(cell, st)
        out = []
        for s in range(len(cell.backends)):
            idx = [i for i, x in enumerate(routes) if x == s]
            out.append(([st[i] for i in idx], idx))
        return out

    # servers -------------------------------------------------------------------------------------------
    def start_server(self, cell: ServingCell, server_index: int, tag: str, extra_env: Optional[dict] = None) -> Server:
        method = cell.backends[server_index]
        label = f"{cell.model.name}__{tag}"
        srv = Server(lambda port: self.launcher(cell.model, method, self.cfg.server, port),
                     self.store.log_path(label), label=label, env={**self.env, **(extra_env or {})},
                     echo=not self.quiet, registry_dir=self.registry_dir)
        srv.start()
        self.say(f"[{label}] starting server on port {srv.port}; log: {srv.log_file}")
        return srv

    def ready(self, srv: Server, cell: ServingCell, server_index: int) -> None:
        """Wait for /health, record the server in provenance, warm it up."""
        startup = srv.wait_healthy(self.cfg.server.startup_timeout_s)
        info = {"label": srv.label, "method": cell.backends[server_index].label, "port": srv.port,
                "cmd": portable_cmd(srv.cmd),
                "startup_s": round(startup, 2), "vllm_version": server_version(srv), "device": self.device,
                "device_uuid": self.device_uuid,
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "log": str(srv.log_file.relative_to(self.store.dir)), "started_at": utc_now()}
        self.servers_info.append(info)
        self.store.update_invocation(-1, {"servers": self.servers_info})
        self.say(f"[{srv.label}] up after {startup:.0f} s (vLLM {info['vllm_version']})")
        n = self.cfg.traffic.warmup_requests
        if n:
            warm = build_stream(cell, self.pools[cell.model.name], n=n, rate=1e6, seed=cell.seed + 7919)
            reqs = [ClientRequest(f"warm{i}", 0.0, 0, r.prompt_token_ids, r.max_tokens, r.temperature, r.ignore_eos,
                                  r.seed) for i, r in enumerate(warm)]
            with client_priority(self.cfg.traffic.client_nice):
                recs, _ = asyncio.run(run_open_loop(reqs, [srv.url], model=SERVED_NAME,
                                                    timeout_s=self.cfg.traffic.request_timeout_s))
            bad = [r.error for r in recs if r.error]
            if bad:
                raise ServerError(f"{srv.label}: warm-up requests failed: {bad[0]}")

    def stop_all(self, servers: list[Server]) -> None:
        for s in servers:
            s.stop()
            info = next((i for i in self.servers_info if i["label"] == s.label and i["port"] == s.port), None)
            if info is not None:
                info["stopped_at"] = utc_now()
        self.store.update_invocation(-1, {"servers": self.servers_info})

    # cells -----------------------------------------------------------------------------------------------
    def run_shares(self, cell: ServingCell, servers: dict[int, Server]) -> None:
        """Send the requests of the shares of ``cell`` whose servers are given, at once; write the shares."""
        shares = self.shares(cell)
        urls: list[Optional[str]] = [None] * len(cell.backends)
        reqs: list[ClientRequest] = []
        for s, srv in servers.items():
            urls[s] = srv.url
            reqs += client_requests(shares[s][0], [s] * len(shares[s][0]))
        started = utc_now()
        before = {s: read_counters(srv) for s, srv in servers.items()}
        with client_priority(self.cfg.traffic.client_nice):
            recs, info = asyncio.run(run_open_loop(reqs, urls, model=SERVED_NAME,
                                                   timeout_s=self.cfg.traffic.request_timeout_s)) if reqs else ([], {})
        after = {s: read_counters(srv) for s, srv in servers.items()}
        by_id = {r.request_id: r for r in recs}
        n_total = max(len(reqs), 1)
        for s in servers:
            st = shares[s][0]
            mine = [by_id[r.request_id] for r in st]
            cpu = info.get("client_cpu_s", 0.0) * len(st) / n_total
            self.store.write_share(cell.run_id, s, share_tables(cell, s, st, mine, before[s], after[s], cpu, started))

    def finish_cell(self, cell: ServingCell) -> None:
        """Write the summary once every share is there; a cell where every request failed is a failure."""
        if not all(self.store.share_done(cell.run_id, s) for s in range(len(cell.backends))):
            return
        shares = self.store.read_shares(cell.run_id)
        req = shares["serve_requests"]
        if len(req) and req["error"].notna().all():
            self.fail(cell, f"every request failed, e.g. {req['error'].dropna().iloc[0]}")
            return
        row = cell_summary(self.cfg, cell, shares)
        self.store.write_cell(cell.run_id, {"serve_runs": row})
        r = row.iloc[0]
        self.say(f"  {cell.label} @ {cell.rate:g} req/s: {r.completed}/{r.num_requests} ok, "
                 f"sent {r.sent_rate_rps:.2f} req/s, TTFT p50 {r.ttft_p50_s * 1e3:.0f} ms, "
                 f"ITL p50 {r.itl_p50_s * 1e3:.1f} ms, {r.output_tok_per_s:.0f} tok/s")

    def fail(self, cell: ServingCell, error: str, tb: str = "") -> None:
        """Record the cell as failed and drop its shares (a retry runs it whole)."""
        self.failed_now.add(cell.run_id)
        for t in SHARE_TABLES:
            for f in (self.store.dir / t).glob(f"{cell.run_id}__s*.parquet"):
                f.unlink()
        self.store.write_failure(cell.run_id, {"kind": cell.kind, "label": cell.label, "rate_rps": cell.rate,
                                               "repeat": cell.repeat, "error": error, "traceback": tb})
        self.say(f"FAILED {cell.run_id}: {error.splitlines()[0] if error else ''}")

    def run_group(self, works: list[Work], tag: str, concurrent: bool) -> None:
        """Start the servers ``works`` need (one, or one per server index when ``concurrent``), run every
        share, stop them all whatever happens (``finally``)."""
        works = [w for w in works if w.cell.run_id not in self.failed_now]
        if not works:
            return
        first = works[0]
        idxs = sorted({w.server for w in works}) if concurrent else [first.server]
        servers: dict[int, Server] = {}
        try:
            try:
                for s in idxs:
                    per = self.cfg.server.env_per_server
                    extra = per[s] if concurrent and s < len(per) else None
                    servers[s] = self.start_server(first.cell, s, f"{tag}__s{s}" if concurrent else tag, extra)
                for s, srv in servers.items():
                    self.ready(srv, first.cell, s)
            except (ServerError, OSError) as err:
                for w in works:
                    self.fail(w.cell, f"{type(err).__name__}: {err}")
                return
            # concurrent: one entry per cell (all its servers at once); sequential: one per (cell, server)
            todo = list(OrderedDict((w.cell.run_id, w) for w in works).values()) if concurrent else works
            for n, w in enumerate(todo):
                # sequential: the one server plays server index w.server of this cell
                mine = servers if concurrent else {w.server: servers[first.server]}
                try:
                    self.run_shares(w.cell, mine)
                    self.finish_cell(w.cell)
                except Exception as err:  # noqa: BLE001 - record the cell and go on (Ctrl-C still stops)
                    self.fail(w.cell, f"{type(err).__name__}: {err}", traceback.format_exc())
                dead = [srv.label for srv in servers.values() if not srv.running()]
                if dead:
                    for x in todo[n + 1:]:
                        self.fail(x.cell, f"server {dead[0]} died during an earlier cell; see its log")
                    return
        finally:
            self.stop_all(list(servers.values()))


def plan_sequential(cells: list[ServingCell], store: ServingStore) -> "OrderedDict[tuple, list[Work]]":
    """Shares to run, grouped by (model, method label): one server start per group."""
    groups: "OrderedDict[tuple, list[Work]]" = OrderedDict()
    order = sorted(cells, key=lambda c: c.kind != "method")  # method cells first, then fleet shares
    for c in order:
        for s, b in enumerate(c.backends):
            if not store.share_done(c.run_id, s):
                groups.setdefault((c.model.name, b.label), []).append(Work(c, s))
    # baseline first
    return OrderedDict(sorted(groups.items(), key=lambda kv: kv[0][1] != "none"))


def _check_paths(cfg: ServingConfig) -> None:
    for p in [m.path for m in cfg.models] + [me.model for me in cfg.methods if me.model]:
        if p.startswith("@shapes/"):  # config-only paper-scale shapes are written on demand
            write_shape(p[len("@shapes/"):])
    for i, m in enumerate(cfg.models):
        if m.path.startswith(("@", ".", "/")) and not resolve(m.path).exists():
            raise ConfigError(f"models.{i}.path: {resolve(m.path)} does not exist")
    for i, me in enumerate(cfg.methods):
        if me.model and me.model.startswith(("@", ".", "/")) and not resolve(me.model).exists():
            raise ConfigError(f"methods.{i}.model: {resolve(me.model)} does not exist")


def _sigterm_as_interrupt():
    """While a sweep runs, SIGTERM ends it like Ctrl-C (so every ``finally`` stops its servers)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


def run_serving(config: str | Path | ServingConfig, retry_failed: bool = True, only: Optional[list[str]] = None,
                quiet: bool = False, launcher: Launcher = vllm_launcher, env: Optional[dict[str, str]] = None,
                registry_dir: Optional[Path] = None) -> ServingStore:
    """Run every unfinished cell of a serving sweep; returns its store.

    ``only``: method labels / fleet names to run (default all). ``launcher``: the server command line
    (tests pass the stub's).
    """
    cfg = config if isinstance(config, ServingConfig) else load_serving(config)
    _check_paths(cfg)
    for e in reap_orphans(registry_dir):
        print(f"serve: ended orphaned server {e.get('label')} from an earlier run", file=sys.stderr)
    store = ServingStore(cfg.out_dir)
    failed = set(store.failures().get("run_id", [])) if not retry_failed else set()
    selected = {c.run_id for c in cfg.cells() if not only or c.label in only}  # what this invocation may run
    todo = [c for c in cfg.cells() if c.run_id in selected and not store.is_done(c.run_id) and c.run_id not in failed]
    if not todo:
        print(f"serving {cfg.name}: nothing to run; {len(store.done_ids())} cell(s) done, {len(store.failures())} "
              f"failed; results in {store.dir}", file=sys.stderr)
        return store
    # deferred: aiohttp and sdlib.run.plan (pydantic) are slow to import, and only this path needs them
    import aiohttp

    from sdlib.run.plan import model_cards

    entry = {"started_at": utc_now(), "git_commit": git_commit(), "argv": portable_cmd(sys.argv),
             "host": os.uname().nodename,
             "cells_planned": len(todo), "cells_already_done": len(store.done_ids() & selected),
             "models": model_cards(cfg),
             "execution": cfg.execution, "installed_vllm": installed_vllm_version(),
             "client": {"kind": "sdlib.serve.client", "aiohttp": aiohttp.__version__,
                        "python": sys.version.split()[0], "nice": cfg.traffic.client_nice},
             "load_average_at_start": list(os.getloadavg()),
             "servers": []}
    store.record_invocation(cfg.to_dict(), entry)
    run = ServingRun(cfg, store, launcher, quiet, env, registry_dir)
    print(f"serving {cfg.name}: {len(todo)} cell(s) to run; results in {store.dir}", file=sys.stderr)
    old = _sigterm_as_interrupt()
    try:
        for c in todo:  # load prompts before any server starts: a workload error costs no start-up
            run.stream(c)
        method_cells = [c for c in todo if c.kind == "method" or cfg.execution == "sequential"]
        for (model, label), works in plan_sequential(method_cells, store).items():
            run.run_group(works, label, concurrent=False)
        if cfg.execution == "concurrent":
            fleets: "OrderedDict[tuple, list[Work]]" = OrderedDict()
            for c in todo:
                if c.kind == "fleet":
                    fleets.setdefault((c.model.name, c.label), []).extend(Work(c, s) for s in range(len(c.backends)))
            for (model, name), works in fleets.items():
                run.run_group(works, name, concurrent=True)
        for c in todo:  # cells whose shares were all done before (a resumed run)
            if not store.is_done(c.run_id) and all(store.share_done(c.run_id, s) for s in range(len(c.backends))):
                run.finish_cell(c)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        failures = store.failures()
        n_failed = len(set(failures["run_id"]) & selected) if len(failures) else 0
        n_done = len(store.done_ids() & selected)  # among the selected cells, as cells_already_done
        store.update_invocation(-1, {"finished_at": utc_now(), "cells_done": n_done, "cells_failed": n_failed})
    print(f"serving {cfg.name}: {n_done} of {len(selected)} cell(s) done, {n_failed} failed", file=sys.stderr)
    return store


__all__ = ["run_serving", "build_stream", "route_stream", "share_tables", "cell_summary", "vllm_launcher"]
