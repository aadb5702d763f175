#!/usr/bin/env python3
"""Check, in one call on a GPU machine, what a sweep cell records of the GPU's state: two samples of
``sdlib/store/gpu_state.py`` a moment apart, as a cell takes them around its measured requests (the counters
read last before and first after), and the clock-event counters' growth between them, reason by reason.

Standard library only: ``sdlib/store/gpu_state.py`` is loaded by its file path (importing the ``sdlib.store``
package would pull pandas, which the bare GPU machine lacks), and the growth is its own ``counter_growth``, the
function behind the ``runs`` table's ``gpu_slowdown_ms`` and ``gpu_held_*_ms`` columns.

Prints one JSON object: where nvidia-smi is (null without one), the card asked about, the seconds from the first
sample's start to the second's end, the two samples (``start``, ``end``: clocks, temperature, power draw and
limit, reasons mask and names, each counter and their sum in ms), ``growth_ms`` (each counter's and the sum's
growth from start to end), the nvidia-smi calls each sample made (two: the state, the counters), and ``raw``:
nvidia-smi's own answers to the two queries, read once more after the samples, to hold the parse against.
Unknowns are null (NaN in the module).
Exits 0 whatever the GPU answers (the module never raises); on a machine without nvidia-smi every value is null.

Usage:
    python3 gpu/check_gpu_state.py                  # GPU 0 (or the first of CUDA_VISIBLE_DEVICES), 2 s apart
    python3 gpu/check_gpu_state.py --seconds 5 --device GPU-7983f8c6-4982-3663-b94c-787d585de6f1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

MODULE = Path(__file__).resolve().parents[1] / "sdlib" / "store" / "gpu_state.py"


def load() -> ModuleType:
    """``sdlib/store/gpu_state.py`` as a module of its own, without the ``sdlib`` package."""
    spec = importlib.util.spec_from_file_location("gpu_state", MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plain(x: Any) -> Any:
    """``x`` with every NaN as None, so that the JSON is JSON (null for unknown)."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def check(seconds: float, device: str | None = None) -> dict[str, Any]:
    """The two samples ``seconds`` apart, their counters' growth and nvidia-smi's raw answers (see the module)."""
    gs = load()
    calls: list[list[str]] = []
    run = gs._run

    def counted(cmd: list[str], timeout: float) -> tuple[int, str]:
        calls.append(cmd)
        return run(cmd, timeout)

    gs._run = counted
    t0 = time.monotonic()
    start = gs.sample(device)
    calls_start = len(calls)
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    end = gs.sample(device, counters_first=True)
    elapsed = time.monotonic() - t0
    calls_end = len(calls) - calls_start
    gs._run = run
    for s in (start, end):
        s["clock_event_names"] = gs.clock_event_names(s.get("clock_events"))

    def raw(fields: tuple[str, ...], fmt: str) -> str | None:
        try:
            return gs._query(device, fields, fmt)
        except Exception as e:  # noqa: BLE001 - the check reports, it does not fail
            return f"error: {e!r}"

    state_answer = raw((*gs.FIELDS, gs._working_event_field or gs.EVENT_FIELDS[0]), "csv,noheader,nounits")
    counters_answer = None if gs._no_counters else raw(gs.COUNTER_FIELDS, "csv")
    return {
        "module": str(MODULE),
        "nvidia_smi": shutil.which("nvidia-smi"),
        "device": device or gs._device(),
        "seconds": round(elapsed, 3),
        "start": start,
        "end": end,
        "growth_ms": {k: gs.counter_growth(start, end, k) for k in (*gs.HELD_KEYS, gs.SLOWDOWN_KEY)},
        "nvidia_smi_calls": {"start": calls_start, "end": calls_end},
        "raw": {"state": state_answer, "counters": counters_answer},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="time from the first sample to the second (2)")
    ap.add_argument("--device", default=None, help="the card as nvidia-smi -i takes it (default: gpu_state's)")
    a = ap.parse_args(argv)
    print(json.dumps(plain(check(a.seconds, a.device)), indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
