"""Roofline bounds for no-SD decode throughput of a dense model on one device.

Per decode step with B requests of average context L: the weights are read once
(``weight_bytes``) and every request's KV is read (``B*L*kv_bytes_per_token``), so
memory-bound throughput is ``B / ((weight_bytes + B*L*kv) / bandwidth)``; each output
token costs ``2*params`` FLOPs (attention FLOPs ignored), so compute-bound throughput
is ``peak_flops / (2*params)``. The roofline is the smaller of the two.

Usage:
    from sdlib.analysis.roofline import decode_roofline
    df = decode_roofline(params=8.03e9, kv_bytes_per_token=131072, context_tokens=300,
                         batch_sizes=[1, 8, 64, 512], bandwidth_gb_s=4300, peak_tflop_s=740)
    # a sweep measured against it (notebook 01; roofline.json from benchmarks/device_roofline.py):
    roof = measured_roofline(tp_none, sweep_shape(store.read_provenance()),
                             mean_context_tokens(store.read("requests")), read_device_roofline(store.dir))
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from sdlib.models.shapes import SHAPES, kv_bytes_per_token, param_count


def decode_roofline(params: float, kv_bytes_per_token: float, context_tokens: float, batch_sizes,
                    bandwidth_gb_s: float, peak_tflop_s: float, dtype_bytes: int = 2) -> pd.DataFrame:
    """Upper bounds on output tokens/s per batch size: memory-bound, compute-bound, roofline."""
    b = np.asarray(list(batch_sizes), dtype=float)
    bytes_per_step = params * dtype_bytes + b * context_tokens * kv_bytes_per_token
    mem = b / (bytes_per_step / (bandwidth_gb_s * 1e9))
    comp = np.full_like(b, peak_tflop_s * 1e12 / (2.0 * params))
    return pd.DataFrame({"batch_size": b.astype(int), "memory_bound_tok_per_s": mem,
                         "compute_bound_tok_per_s": comp, "roofline_tok_per_s": np.minimum(mem, comp)})


def read_device_roofline(sweep_dir: str | os.PathLike[str]) -> Optional[dict[str, Any]]:
    """A sweep's measured device rates (``<sweep_dir>/roofline.json``: ``device``,
    ``copy_bandwidth_gb_s``, ``bf16_matmul_tflop_s``), or None when it has none (CPU sweeps)."""
    p = Path(sweep_dir) / "roofline.json"
    return json.loads(p.read_text()) if p.exists() else None


def sweep_shape(provenance: dict[str, Any]) -> dict:
    """The model shape (:data:`sdlib.models.shapes.SHAPES`) of a sweep's first model, looked up by the last
    part of its path (``@shapes/llama-3.1-8b`` -> ``llama-3.1-8b``)."""
    model_path = provenance["config"]["models"][0]["path"]
    return SHAPES[model_path.split("/")[-1]]


def mean_context_tokens(requests: pd.DataFrame) -> float:
    """Mean context of a decode step over the measured requests: prompt + half the output, tokens."""
    return float((requests["prompt_tokens"] + requests["output_tokens"] / 2).mean())


def measured_roofline(tp_none: pd.DataFrame, shape: dict, context_tokens: float, device: dict[str, Any]) -> pd.DataFrame:
    """:func:`decode_roofline` at the measured no-SD batch sizes, joined with their measured tok/s:
    adds ``tok_per_s`` and ``fraction_of_roofline`` = measured / roofline (and their ``_lo``/``_hi`` when
    ``tp_none`` has ``tok_per_s_lo``/``tok_per_s_hi``: :func:`sdlib.analysis.intervals.throughput_intervals`).

    ``tp_none``: the no-SD rows of :func:`sdlib.analysis.measures.throughput_table`; ``shape``: a
    model config (:func:`sweep_shape`); ``device``: :func:`read_device_roofline`.
    """
    roof = decode_roofline(param_count(shape), kv_bytes_per_token(shape), context_tokens,
                           sorted(tp_none["batch_size"].unique()), device["copy_bandwidth_gb_s"],
                           device["bf16_matmul_tflop_s"])
    ci = [c for c in ("tok_per_s_lo", "tok_per_s_hi") if c in tp_none.columns]
    roof = roof.merge(tp_none[["batch_size", "tok_per_s"] + ci], on="batch_size")
    roof["fraction_of_roofline"] = roof["tok_per_s"] / roof["roofline_tok_per_s"]
    for c in ci:  # the measured throughput's interval, as a fraction of the (computed) roofline
        roof[c.replace("tok_per_s", "fraction_of_roofline")] = roof[c] / roof["roofline_tok_per_s"]
    return roof
