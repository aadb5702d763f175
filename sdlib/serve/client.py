"""An open-loop async client for vLLM's OpenAI server (aiohttp): sends each request at its scheduled time,
streams the answer, and records when every SSE message came and how many tokens it carried.

Why our own and not ``vllm bench serve`` (see docs/serving.md): vLLM's
client records one gap per SSE message but not how many tokens each message carried (under SD one message
is one engine step, 1 + accepted tokens), ignores the server's per-request metrics, saves no scheduled
arrival times, rescales its gamma gaps, cannot send token-id prompts from the CLI (needed for dummy-weight
GPU models without a tokenizer), and importing it loads all of vLLM and torch into the client process.

Requests: ``POST /v1/completions`` with ``prompt`` as token ids, ``stream``, ``stream_options.include_usage``
and ``return_token_ids`` (the token count of each message), ``ignore_eos`` as the workload says, greedy by
default. One ``aiohttp.ClientSession`` (no connection limit) per run; a dispatcher sleeps until each
request's arrival time and starts its task, so a slow stream never delays later arrivals.

Times are ``time.perf_counter()`` seconds since the run's t0 (the scheduled time of arrival 0).

Usage:
    from sdlib.serve.client import ClientRequest, run_open_loop_sync
    recs, info = run_open_loop_sync([ClientRequest("r0", 0.0, 0, [1, 2, 3], 16)], ["http://127.0.0.1:8123"])
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import aiohttp


@dataclass
class ClientRequest:
    """One request to send: when (s since t0), to which server (index into the URL list), what."""

    request_id: str
    arrival_s: float
    server: int
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = True
    seed: Optional[int] = None


@dataclass
class RequestRecord:
    """What happened to one request; times in s since the run's t0 (None if it never got there)."""

    request_id: str
    server: int
    arrival_s: float  # scheduled
    send_s: Optional[float] = None  # the POST was started
    first_token_s: Optional[float] = None  # the first message carrying a token
    finish_s: Optional[float] = None  # the last message carrying a token
    msg_t: list[float] = field(default_factory=list)  # each token-bearing message's time, s since t0
    msg_n: list[int] = field(default_factory=list)  # tokens it carried
    prompt_tokens: Optional[int] = None  # usage.prompt_tokens
    output_tokens: Optional[int] = None  # usage.completion_tokens (else the tokens counted)
    finish_reason: Optional[str] = None
    token_ids_counted: bool = True  # False: the server sent no token_ids, one token per message assumed
    server_metrics: Optional[dict[str, Any]] = None  # the final message's ``metrics`` (vLLM per-request metrics)
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_token_s is not None


def _payload(req: ClientRequest, model: str) -> dict[str, Any]:
    p: dict[str, Any] = {"model": model, "prompt": list(map(int, req.prompt_token_ids)),
                         "max_tokens": int(req.max_tokens), "temperature": float(req.temperature),
                         "ignore_eos": bool(req.ignore_eos), "stream": True,
                         "stream_options": {"include_usage": True}, "return_token_ids": True}
    if req.seed is not None and req.temperature > 0:
        p["seed"] = int(req.seed)
    return p


def _parse_message(rec: RequestRecord, data: bytes, now: float) -> None:
    """Fold one SSE ``data:`` payload (bytes after ``data:``) into ``rec``."""
    msg = json.loads(data)
    choices = msg.get("choices") or []
    if choices:
        c = choices[0]
        ids = c.get("token_ids")
        if ids is None:
            rec.token_ids_counted = False
            n = 1 if c.get("text") else 0
        else:
            n = len(ids)
        if c.get("finish_reason"):
            rec.finish_reason = c["finish_reason"]
        if n > 0:
            if rec.first_token_s is None:
                rec.first_token_s = now
            rec.finish_s = now
            rec.msg_t.append(now)
            rec.msg_n.append(n)
    usage = msg.get("usage")
    if usage:
        rec.prompt_tokens = usage.get("prompt_tokens")
        rec.output_tokens = usage.get("completion_tokens")
    if msg.get("metrics"):
        rec.server_metrics = msg["metrics"]
    if msg.get("error"):
        rec.error = f"server error: {json.dumps(msg['error'])[:300]}"


async def send_one(session: aiohttp.ClientSession, base_url: str, req: ClientRequest, model: str, t0: float,
                   timeout_s: float) -> RequestRecord:
    """Stream one completion; every failure (HTTP status, connection, timeout, bad stream) goes to ``error``."""
    rec = RequestRecord(req.request_id, req.server, req.arrival_s)
    clock = time.perf_counter
    rec.send_s = clock() - t0
    try:
        async with session.post(base_url + "/v1/completions", json=_payload(req, model),
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                body = (await resp.text())[:300]
                rec.error = f"HTTP {resp.status}: {body}"
                return rec
            async for line in resp.content:
                now = clock() - t0
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                _parse_message(rec, data, now)
    except asyncio.TimeoutError:
        rec.error = f"timeout after {timeout_s:g} s"
    except (aiohttp.ClientError, json.JSONDecodeError, ValueError) as err:
        rec.error = f"{type(err).__name__}: {err}"[:300]
    if rec.error is None and rec.first_token_s is None:
        rec.error = "stream ended without a token"
    if rec.output_tokens is None and rec.msg_n:
        rec.output_tokens = int(sum(rec.msg_n))
    return rec


async def run_open_loop(requests: Sequence[ClientRequest], urls: Sequence[Optional[str]], model: str = "model",
                        timeout_s: float = 600.0, lead_s: float = 0.05,
                        session: Optional[aiohttp.ClientSession] = None) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Send ``requests`` at their ``arrival_s`` (open loop) to ``urls[request.server]``; wait for all.

    Returns the records in the order of ``requests`` and run facts: ``t0_unix`` (wall clock of t0),
    ``client_cpu_s`` (this process's CPU time during the run), ``wall_s``.
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    # No garbage collection while sending: a full collection walks every object of the process (the prompt
    # pools, the tokenizer: ~0.3 s measured on the embedded sweep's supervisor) and stalls every stream
    # read and every send at once. Collected before t0 instead; re-enabled after.
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    own = session is None
    if own:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                        timeout=aiohttp.ClientTimeout(total=None))
    cpu0 = time.process_time()
    t0 = time.perf_counter() + lead_s
    t0_unix = time.time() + lead_s
    tasks: list[Optional[asyncio.Task]] = [None] * len(requests)
    try:
        for i in order:
            r = requests[i]
            delay = t0 + r.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            url = urls[r.server]
            if url is None:
                raise ValueError(f"request {r.request_id}: server {r.server} has no URL in this run")
            tasks[i] = asyncio.create_task(send_one(session, url, r, model, t0, timeout_s))
        out = list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            if t is not None and not t.done():
                t.cancel()
        raise
    finally:
        if gc_was_enabled:  # first: the await below can itself be cancelled
            gc.enable()
        if own:
            await session.close()
    info = {"t0_unix": t0_unix, "client_cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - t0}
    return out, info


def run_open_loop_sync(requests: Sequence[ClientRequest], urls: Sequence[Optional[str]], **kw) -> tuple[list[RequestRecord], dict[str, Any]]:
    """:func:`run_open_loop` in a fresh event loop (not from inside a running loop)."""
    return asyncio.run(run_open_loop(requests, urls, **kw))


async def get_text(url: str, timeout_s: float = 10.0) -> tuple[int, str]:
    """GET ``url``: (status, body); (0, error) when it cannot connect."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.get(url) as r:
                return r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        return 0, f"{type(err).__name__}: {err}"
