"""Is sdlib's serving client ever the bottleneck? Its own cost per request and how closely it keeps the
requested arrival rate, against a stub server that answers at once (sdlib.serve.stub: no model, no delays).

For each rate: N = rate x duration requests of ``--tokens`` output tokens, streamed as vLLM streams under SD
(one message per engine step, ``--chunks`` tokens per message after the first). Printed per rate and
arrival process:

* requested / scheduled / sent rate: the scheduled arrivals' realised rate, and the rate at which the client
  actually sent them. Arrivals: near-constant gaps (burstiness 1000: gamma with CV 0.03); free Poisson (its
  realised rate scatters by ~1/sqrt(N)); Poisson with ``exact_rate`` (the sweep's default: gaps rescaled to
  the requested rate, sdlib.serve.arrivals). ``sent/sched`` is the client's own fidelity;
* send lag p50 / p99: how late the client sent a request after its scheduled time;
* client CPU per request: this process's CPU time / N (parsing every SSE message included);
* e2e p50 against the stub: the floor the client + loopback + stub add to every latency.

Usage:
    python benchmarks/serving_client_overhead.py                       # rates 16, 32, 128 req/s, 20 s each
    python benchmarks/serving_client_overhead.py --rates 8 --duration-s 60
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sdlib.analysis.serving import percentile  # noqa: E402
from sdlib.serve.arrivals import arrival_times, realised_rate  # noqa: E402
from sdlib.serve.client import ClientRequest, run_open_loop_sync  # noqa: E402
from sdlib.serve.server import Server  # noqa: E402
from sdlib.store.provenance import device_name  # noqa: E402


def run_rate(url: str, rate: float, duration_s: float, burstiness: float, tokens: int, seed: int,
             exact_rate: bool = False) -> dict:
    n = max(int(rate * duration_s), 2)
    arr = arrival_times(rate, n, burstiness, seed=seed, start_at_zero=True, exact_rate=exact_rate)
    reqs = [ClientRequest(f"r{i}", float(a), 0, list(range(100 + i % 50, 164 + i % 50)), tokens)
            for i, a in enumerate(arr)]
    recs, info = run_open_loop_sync(reqs, [url])
    bad = [r.error for r in recs if r.error]
    sends = np.array([r.send_s for r in recs])
    lag = sends - arr
    e2e = np.array([r.finish_s - r.send_s for r in recs if r.ok])
    msgs = np.mean([len(r.msg_t) for r in recs if r.ok])
    return {"rate": rate, "burstiness": burstiness, "n": n, "errors": len(bad), "scheduled": realised_rate(arr),
            "sent": realised_rate(sends), "lag_p50_ms": percentile(lag, 50) * 1e3, "lag_p99_ms": percentile(lag, 99) * 1e3,
            "cpu_ms_per_req": info["client_cpu_s"] / n * 1e3, "e2e_p50_ms": percentile(e2e, 50) * 1e3,
            "msgs_per_req": msgs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="16,32,128",
                    help="requests/s, comma-separated (16: the most one client run of the embedded sweep sends; "
                         "32: its top fleet rate; 128: GPU scale)")
    ap.add_argument("--duration-s", type=float, default=20.0, help="seconds of arrivals per rate")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--chunks", default="1,3,2,4", help="tokens per stream message after the first (cycled)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    import aiohttp

    print(f"{device_name()}, {os.cpu_count()} cores | Python {platform.python_version()}, aiohttp "
          f"{aiohttp.__version__} | stub server answering at once, {a.tokens} tokens per request in messages of "
          f"{a.chunks} | {a.duration_s:g} s of arrivals per row")
    hdr = (f"{'rate':>6} {'arrivals':>13} {'n':>5} {'scheduled':>9} {'sent':>8} {'sent/req':>8} {'sent/sched':>10} "
           f"{'lag p50':>8} {'lag p99':>8} {'cpu/req':>8} {'e2e p50':>8} {'msgs':>5} {'err':>4}")
    print(hdr + "\n" + " " * 6 + f" {'':>13} {'':>5} {'req/s':>9} {'req/s':>8} {'':>8} {'':>10} "
          f"{'ms':>8} {'ms':>8} {'ms':>8} {'ms':>8} {'/req':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        srv = Server(lambda port: [sys.executable, "-m", "sdlib.serve.stub", "--port", str(port), "--chunks", a.chunks],
                     Path(tmp) / "stub.log", label="stub",
                     env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                     registry_dir=Path(tmp) / "reg")
        with srv:
            srv.wait_healthy(60)
            run_rate(srv.url, 20, 1.0, 1000.0, a.tokens, a.seed)  # warm the connection pool and the stub
            for rate in rates:
                for b, name, exact in ((1000.0, "near-const", False), (1.0, "Poisson free", False),
                                       (1.0, "Poisson exact", True)):
                    r = run_rate(srv.url, rate, a.duration_s, b, a.tokens, a.seed, exact)
                    print(f"{rate:6g} {name:>13} {r['n']:5d} {r['scheduled']:9.2f} {r['sent']:8.2f} "
                          f"{r['sent'] / rate:8.3f} {r['sent'] / r['scheduled']:10.4f} {r['lag_p50_ms']:8.2f} "
                          f"{r['lag_p99_ms']:8.2f} {r['cpu_ms_per_req']:8.2f} {r['e2e_p50_ms']:8.2f} "
                          f"{r['msgs_per_req']:5.1f} {r['errors']:4d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
