"""A stub of vLLM's OpenAI server for tests and the client benchmark: streams completions the way vLLM does
under speculative decoding (one SSE message per engine step, carrying 1 + accepted tokens), at once or
with set delays, and serves ``/health``, ``/version`` and a ``/metrics`` with the spec-decode counters.

Messages follow vLLM 0.32's ``/v1/completions`` stream with ``return_token_ids`` and
``stream_options.include_usage``: ``{"choices": [{"index": 0, "text": "", "token_ids": [...],
"finish_reason": null}]}`` per step, ``finish_reason: "length"`` on the last, then a usage message
(``choices: []``) and ``data: [DONE]``.

Usage:
    python -m sdlib.serve.stub --port 8123 --chunks 1,3,2,4 --step-ms 20 --ttft-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Optional

from aiohttp import web


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class StubState:
    """What the stub does: tokens per message (cycled), delays, counters; ``fail_after``: requests answered
    before every further one gets HTTP 500."""

    def __init__(self, chunks: list[int], step_ms: float = 0.0, ttft_ms: float = 0.0, ready_after_s: float = 0.0,
                 fail_after: Optional[int] = None, k: int = 3, coalesce: bool = False):
        self.chunks = chunks or [1]
        self.step_s = step_ms / 1e3
        self.ttft_s = ttft_ms / 1e3
        self.k = k
        self.fail_after = fail_after
        self.coalesce = coalesce  # write every message of a request in one write (tests: coalesced reads)
        self.ready_at = asyncio.get_event_loop().time() + ready_after_s if ready_after_s else 0.0
        self.requests = 0
        self.prompts: list = []
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * k, "generation": 0,
                         "prompt": 0}


async def health(request: web.Request) -> web.Response:
    st: StubState = request.app["state"]
    if st.ready_at and asyncio.get_event_loop().time() < st.ready_at:
        return web.Response(status=503, text="starting")
    return web.Response(text="")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": "stub"})


async def metrics(request: web.Request) -> web.Response:
    c = request.app["state"].counters
    lab = 'engine="0",model_name="model"'
    lines = [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(c['drafts'])}",
             f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e9",
             f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(c['draft_tokens'])}",
             f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(c['accepted'])}",
             f"vllm:generation_tokens_total{{{lab}}} {float(c['generation'])}",
             f"vllm:prompt_tokens_total{{{lab}}} {float(c['prompt'])}"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(v)}'
              for i, v in enumerate(c["per_pos"])]
    return web.Response(text="# HELP stub\n" + "\n".join(lines) + "\n")


async def completions(request: web.Request) -> web.StreamResponse:
    st: StubState = request.app["state"]
    body = await request.json()
    st.requests += 1
    if st.fail_after is not None and st.requests > st.fail_after:
        return web.json_response({"error": "stub failure"}, status=500)
    prompt = body.get("prompt") or []
    st.prompts.append(prompt)
    n = int(body.get("max_tokens", 16))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if st.ttft_s:
        await asyncio.sleep(st.ttft_s)
    made, i, buf = 0, 0, []
    c = st.counters
    while made < n:
        g = min(st.chunks[(i - 1) % len(st.chunks)], n - made) if i else 1  # the prefill step gives one token
        if i:  # a verify step: k drafted, g - 1 accepted
            c["drafts"] += 1
            c["draft_tokens"] += st.k
            c["accepted"] += g - 1
            for p in range(min(g - 1, st.k)):
                c["per_pos"][p] += 1
        ids = list(range(made, made + g))
        made += g
        msg = _sse({"id": "cmpl-stub", "object": "text_completion", "model": body.get("model"),
                    "choices": [{"index": 0, "text": "", "token_ids": ids,
                                 "finish_reason": "length" if made >= n else None}]})
        if st.coalesce:
            buf.append(msg)
        else:
            await resp.write(msg)
            if made < n and st.step_s:
                await asyncio.sleep(st.step_s)
        i += 1
    c["generation"] += made
    c["prompt"] += len(prompt) if isinstance(prompt, list) else 1
    usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 1, "completion_tokens": made,
             "total_tokens": made + (len(prompt) if isinstance(prompt, list) else 1)}
    tail = [_sse({"id": "cmpl-stub", "object": "text_completion", "choices": [], "usage": usage}), b"data: [DONE]\n\n"]
    await resp.write(b"".join(buf + tail))
    await resp.write_eof()
    return resp


def make_app(state: StubState) -> web.Application:
    app = web.Application()
    app["state"] = state
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    return app


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdlib.serve.stub", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", default="1", help="tokens per message after the first, cycled (e.g. 1,3,2,4)")
    ap.add_argument("--step-ms", type=float, default=0.0, help="delay between messages, ms")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first message, ms")
    ap.add_argument("--ready-after-s", type=float, default=0.0, help="/health answers 503 until then")
    ap.add_argument("--fail-after", type=int, default=None, help="answer HTTP 500 after this many requests")
    ap.add_argument("--coalesce", action="store_true", help="write all of a request's messages at once")
    ap.add_argument("--pid-file", default=None, help="write this process's pid here once listening")
    a = ap.parse_args(argv)

    async def run() -> None:
        st = StubState([int(x) for x in a.chunks.split(",") if x], a.step_ms, a.ttft_ms, a.ready_after_s,
                       a.fail_after, coalesce=a.coalesce)
        runner = web.AppRunner(make_app(st), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, a.host, a.port).start()
        if a.pid_file:
            with open(a.pid_file, "w") as f:
                f.write(str(os.getpid()))
        print(f"stub listening on {a.host}:{a.port}", file=sys.stderr, flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
