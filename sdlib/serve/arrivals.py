"""Open-loop arrival times: i.i.d. gamma gaps (shape = burstiness; 1 = Poisson), seeded, not rescaled.

Mean gap = 1/rate for every burstiness; the coefficient of variation of the gaps is 1/sqrt(burstiness)
(b < 1: burstier than Poisson, b > 1: more regular). Unlike ``vllm bench serve`` the gaps are not rescaled
to end exactly at N/rate, so the process stays an exact renewal process; the realised rate of N arrivals
scatters around ``rate`` by about 1/sqrt(N·b) (the tables record both).

Usage:
    from sdlib.serve.arrivals import arrival_times
    t = arrival_times(rate=4.0, n=100, burstiness=1.0, seed=0)   # seconds from the start, t[0] = first gap
"""

from __future__ import annotations

import numpy as np


def arrival_times(rate: float, n: int, burstiness: float = 1.0, seed: int = 0, start_at_zero: bool = False) -> np.ndarray:
    """``n`` arrival times (s) of a renewal process with gamma(``burstiness``, 1/(rate·burstiness)) gaps.

    ``start_at_zero``: shift so the first request arrives at 0 (the client then starts at once).
    """
    if rate <= 0 or not np.isfinite(rate):
        raise ValueError(f"rate must be a positive finite number of requests/s (got {rate})")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0 (got {burstiness})")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=int(n))
    t = np.cumsum(gaps)
    return t - t[0] if (start_at_zero and n) else t


def realised_rate(times) -> float:
    """Arrivals per second between the first and the last: (n - 1) / (t[-1] - t[0]); NaN with < 2 arrivals."""
    t = np.sort(np.asarray(times, dtype=float))
    if len(t) < 2 or t[-1] <= t[0]:
        return float("nan")
    return (len(t) - 1) / (t[-1] - t[0])
