"""Measure a GPU's copy bandwidth and bf16 matmul throughput (for notebook 01's roofline lines) as JSON.

Usage (on a GPU box):  python benchmarks/device_roofline.py --out data/sweeps/<name>/roofline.json
                       (or `make roofline ROOFLINE_SWEEP=<name>`; without --out the JSON is printed)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Named in the JSON so that every committed roofline.json says what wrote it.
PRODUCER = "benchmarks/device_roofline.py (make roofline)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the JSON here (folders created) instead of printing it")
    a = ap.parse_args(argv)
    text = json.dumps({**measure(), "producer": PRODUCER})
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    else:
        print(text)
    return 0


def measure() -> dict:
    """Copy bandwidth (GB/s, read + write bytes) and bf16 matmul rate (TFLOP/s) of CUDA device 0."""
    import torch

    dev = torch.device("cuda")
    n = 4 * 1024**3 // 2  # 4 GiB of bf16
    a = torch.empty(n, dtype=torch.bfloat16, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    s.record()
    for _ in range(reps):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    sec = s.elapsed_time(e) / 1e3 / reps
    copy_gbs = 2 * a.numel() * a.element_size() / sec / 1e9  # read + write
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    y = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    s.record()
    reps = 50
    for _ in range(reps):
        x @ y
    e.record()
    torch.cuda.synchronize()
    sec = s.elapsed_time(e) / 1e3 / reps
    tflops = 2 * m**3 / sec / 1e12
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "copy_bandwidth_gb_s": round(copy_gbs, 1),
            "bf16_matmul_tflop_s": round(tflops, 1),
            "method": "copy_ 4 GiB bf16 (read+write bytes), 20 reps; 8192^3 bf16 matmul, 50 reps; CUDA events"}


if __name__ == "__main__":
    sys.exit(main())
