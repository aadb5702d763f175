"""Engine tier: a real vLLM OpenAI server (CPU build) on the tiny random-weight models, one rate, a few
requests, then a client that crashes mid-stream in the next cell.

Checks: the summary's percentiles equal a recomputation from the per-request tables; the /metrics counters
moved; per-message token counts add up to the output; and after the crash no server process and no bound
port remain (one server start, ~1 min on 2 cores).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sdlib.analysis.serving import summarize
from sdlib.paths import MODELS_DIR
from sdlib.serve.config import parse_serving
from sdlib.serve.server import TOKEN_ENV, port_is_free
from sdlib.store.serving_store import ServingStore

pytestmark = pytest.mark.engine


class ClientCrash(BaseException):
    """Not a recorded cell error: escapes like Ctrl-C would."""


def _our_server_processes(tokens: set[str]) -> list[int]:
    """Processes whose environment carries one of our servers' registry tokens."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(f"{TOKEN_ENV}={t}".encode() in env for t in tokens):
            out.append(int(d.name))
    return out


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory):
    from sdlib.models.tinymodels import build_models
    from sdlib.serve import server as srv_mod
    from sdlib.serve import sweep

    paths = build_models(MODELS_DIR)
    out = tmp_path_factory.mktemp("serving")
    cfg = parse_serving({
        "name": "engine_serving", "results_dir": str(out),
        "models": [{"name": "tiny", "path": str(paths["target"]), "dtype": "bfloat16", "max_model_len": 512}],
        "methods": [{"name": "ngram", "num_spec_tokens": 3, "options": {"prompt_lookup_min": 2, "prompt_lookup_max": 4}}],
        "mix": [{"task": "code_edit", "workload": {"dataset": "code_edit", "source": "package", "num_requests": 4,
                                                   "max_output_tokens": 16, "max_prompt_tokens": 256,
                                                   "ignore_eos": True}}],
        "traffic": {"rates": [4, 8], "num_requests": 6, "warmup_requests": 1},
        "server": {"gpu_memory_utilization": 0.2, "enforce_eager": True, "max_num_seqs": 16,
                   "startup_timeout_s": 300},
    })
    tokens, urls, calls = set(), [], []
    real_run, real_start = sweep.run_open_loop, srv_mod.Server.start

    def start(self):  # remember every server's token to look for its processes afterwards
        tokens.add(self.token)
        return real_start(self)

    async def client(reqs, us, **kw):
        calls.append(len(reqs))
        urls.extend(u for u in us if u)
        if len(calls) < 3:  # warm-up, then the first cell: the real client
            return await real_run(reqs, us, **kw)
        task = asyncio.ensure_future(real_run(reqs, us, **kw))
        await asyncio.sleep(0.5)  # the second cell's first requests are streaming
        task.cancel()
        raise ClientCrash()

    mp = pytest.MonkeyPatch()
    mp.setattr(srv_mod.Server, "start", start)
    mp.setattr(sweep, "run_open_loop", client)
    crashed = False
    try:
        sweep.run_serving(cfg, quiet=True, registry_dir=out / "reg")
    except ClientCrash:
        crashed = True
    finally:
        mp.undo()
    return cfg, ServingStore(cfg.out_dir), crashed, tokens, urls, out


def test_first_cell_recorded_and_summary_equals_recomputation(crashed_run):
    cfg, store, crashed, *_ = crashed_run
    assert crashed
    runs = store.read("serve_runs")
    assert len(runs) == 1, store.failures().to_dict("records")
    r = runs.iloc[0]
    assert r["rate_rps"] == 4 and r["completed"] == r["num_requests"] == 6 and r["status"] == "ok"
    req, ch = store.read("serve_requests"), store.read("serve_chunks")
    assert len(req) == 6
    s = summarize(req, ch)
    for k, v in s.items():
        assert r[k] == pytest.approx(v), k
    # every message's tokens add up to the output; ignore_eos: max_tokens each
    per = ch.groupby("request_id")["num_tokens"].sum()
    assert (per.loc[req["request_id"]].to_numpy() == req["output_tokens"].to_numpy()).all()
    assert (req["output_tokens"] == 16).all()
    # /metrics moved over the cell; vLLM's per-request acceptance agrees with its counters
    cnt = store.read("serve_counters").iloc[0]
    assert cnt["generation_tokens"] >= 6 * 16 and cnt["num_drafts"] > 0
    assert req["num_accepted_tokens"].sum() == cnt["num_accepted_tokens"]
    prov = store.read_provenance()
    srv = prov["invocations"][-1]["servers"][0]
    assert srv["vllm_version"] and srv["startup_s"] > 0 and "--speculative-config" in srv["cmd"]


def test_no_server_process_or_port_left_after_the_client_crash(crashed_run):
    cfg, store, crashed, tokens, urls, out = crashed_run
    assert crashed and tokens and urls
    assert _our_server_processes(tokens) == []
    for u in set(urls):
        assert port_is_free(int(u.rsplit(":", 1)[1]))
    assert not list((out / "reg").glob("*.json"))
    assert store.done_ids() and len(store.done_ids()) == 1
    assert not os.path.exists(store.dir / "serve_runs" / f"{cfg.cells()[1].run_id}.parquet")
