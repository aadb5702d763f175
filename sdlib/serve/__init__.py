"""Serving stage: speculative decoding behind vLLM's OpenAI server under open-loop traffic.

config (YAML, validated) -> server (process group, /health, stop, orphan check) -> arrivals + router +
client (aiohttp, per-message timestamps) -> sweep (cells, tables in data/serving/<name>/). Measures are in
:mod:`sdlib.analysis.serving`, figures in :mod:`sdlib.plots.serving`; vLLM's command line and /metrics parser
in :mod:`sdlib.vllm.server`.

Usage:
    sdlib serve configs/embedded_serving.yaml
"""
