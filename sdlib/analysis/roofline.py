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
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def decode_roofline(params: float, kv_bytes_per_token: float, context_tokens: float, batch_sizes,
                    bandwidth_gb_s: float, peak_tflop_s: float, dtype_bytes: int = 2) -> pd.DataFrame:
    """Upper bounds on output tokens/s per batch size: memory-bound, compute-bound, roofline."""
    b = np.asarray(list(batch_sizes), dtype=float)
    bytes_per_step = params * dtype_bytes + b * context_tokens * kv_bytes_per_token
    mem = b / (bytes_per_step / (bandwidth_gb_s * 1e9))
    comp = np.full_like(b, peak_tflop_s * 1e12 / (2.0 * params))
    return pd.DataFrame({"batch_size": b.astype(int), "memory_bound_tok_per_s": mem,
                         "compute_bound_tok_per_s": comp, "roofline_tok_per_s": np.minimum(mem, comp)})
