"""Open-loop arrival times: i.i.d. gamma gaps (shape = burstiness; 1 = Poisson), seeded, not rescaled.

Mean gap = 1/rate for every burstiness; the coefficient of variation of the gaps is 1/sqrt(burstiness)
(b < 1: burstier than Poisson, b > 1: more regular). The realised rate of N free arrivals scatters around
``rate`` by about 1/sqrt(N·b) (24 Poisson arrivals: +-20%), so with ``exact_rate`` the gaps are rescaled to
span exactly (N - 1)/rate, as ``vllm bench serve`` does. For i.i.d. gamma gaps this is exact conditioning,
not a distortion: gamma variables divided by their sum are Dirichlet-distributed and independent of the
sum (Lukacs), so the rescaled arrivals are the renewal process conditioned on its realised rate.

Usage:
    from sdlib.serve.arrivals import arrival_times
    t = arrival_times(rate=4.0, n=100, burstiness=1.0, seed=0)   # seconds from the start, t[0] = first gap
"""

from __future__ import annotations

import numpy as np


def arrival_times(rate: float, n: int, burstiness: float = 1.0, seed: int = 0, start_at_zero: bool = False,
                  exact_rate: bool = False) -> np.ndarray:
    """``n`` arrival times (s) of a renewal process with gamma(``burstiness``, 1/(rate·burstiness)) gaps.

    ``start_at_zero``: shift so the first request arrives at 0 (the client then starts at once).
    ``exact_rate``: also rescale so the last arrival is at (n - 1)/rate (realised rate = ``rate``; implies
    ``start_at_zero``; see the module docstring for why this is conditioning, not distortion).
    """
    if rate <= 0 or not np.isfinite(rate):
        raise ValueError(f"rate must be a positive finite number of requests/s (got {rate})")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0 (got {burstiness})")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=int(n))
    t = np.cumsum(gaps)
    if exact_rate and n >= 2:
        t = t - t[0]
        return t * ((n - 1) / rate / t[-1])
    return t - t[0] if (start_at_zero and n) else t


def realised_rate(times) -> float:
    """Arrivals per second between the first and the last: (n - 1) / (t[-1] - t[0]); NaN with < 2 arrivals."""
    t = np.sort(np.asarray(times, dtype=float))
    if len(t) < 2 or t[-1] <= t[0]:
        return float("nan")
    return (len(t) - 1) / (t[-1] - t[0])
