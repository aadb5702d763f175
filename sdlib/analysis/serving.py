"""Serving measures from the serving tables: latency percentiles with bootstrap intervals, goodput under an
SLA, capacity at an SLA, cost per million output tokens at a node price.

Definitions (times from the client's clock; ``serve_requests`` / ``serve_chunks``):

* TTFT = first token-bearing message - send; E2E = last token-bearing message - send;
* TPOT = (E2E - TTFT) / (output tokens - 1): the request's mean per-token gap (vLLM bench's definition);
* ITL (per token): a message of n tokens that came g after the previous message gives n gaps of g/n
  (under SD one message is one engine step, 1 + accepted tokens); tokens beyond the first in the first
  message get gap 0. A request has output tokens - 1 ITLs and they sum to E2E - TTFT;
* message ITL (``msg_itl``): the gap between consecutive messages, one per message (``vllm bench serve``'s
  ITL; under SD it is about TPOT x tokens per step);
* percentiles: ``numpy.percentile`` (linear), over completed requests (ITLs: pooled over their tokens);
  intervals: percentile bootstrap over requests (resample requests, pool their gaps; :mod:`sdlib.core.bootstrap`,
  seeded per cell and metric);
* goodput = completed requests with TTFT <= ``sla.ttft_ms`` and TPOT <= ``sla.itl_ms`` per second of the cell
  (vLLM bench's --goodput form); a cell *meets the SLA* when the ``sla.percentile``-th percentile of TTFT
  and of ITL are within it (the scenario's form: P50 TTFT <= 200 ms and P50 ITL <= 30 ms);
* cost per million output tokens = servers x ``price_per_hour`` / (output tokens/s x 3600) x 1e6, at the
  highest measured rate that meets the SLA. The price is an input (a parameter), never a claim of ours.

Usage:
    from sdlib.analysis.serving import SLA, summarize, latency_intervals, capacity_table
    s = summarize(requests, chunks)            # {"ttft_p50_s": ..., ...}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.core import bootstrap
from sdlib.store.schema import SERVE_METRICS, SERVE_PERCENTILES

#: A cell whose client sent its requests later than this (99th percentile of send - scheduled arrival) had a
#: starved client (a shared machine): its latencies are upper-biased and its gaps partly merged; flagged.
CLIENT_LAG_LIMIT_S = 0.05
#: Metrics measured per request (one value each) and per gap (pooled over tokens or messages).
REQUEST_METRICS = ("ttft", "tpot", "e2e")
GAP_METRICS = ("itl", "msg_itl")


@dataclass(frozen=True)
class SLA:
    """A latency target: ``percentile``-th percentile TTFT and ITL within ``ttft_ms`` / ``itl_ms``."""

    ttft_ms: float = 200.0
    itl_ms: float = 30.0
    percentile: float = 50.0

    def label(self) -> str:
        return f"P{self.percentile:g} TTFT <= {self.ttft_ms:g} ms, P{self.percentile:g} ITL <= {self.itl_ms:g} ms"


def percentile(x, q: float) -> float:
    """``numpy.percentile(x, q)`` (linear), NaN for an empty ``x``."""
    a = np.asarray(x, dtype=float)
    return float(np.percentile(a, q)) if a.size else float("nan")


def token_gaps(t: Sequence[float], n: Sequence[int]) -> np.ndarray:
    """Per-token ITLs of one request from its messages' times ``t`` (s) and token counts ``n``."""
    t = np.asarray(t, dtype=float)
    n = np.asarray(n, dtype=np.int64)
    if t.size == 0:
        return np.zeros(0)
    vals = np.concatenate([[0.0], np.diff(t) / np.maximum(n[1:], 1)])
    counts = np.concatenate([[max(int(n[0]) - 1, 0)], n[1:]])
    return np.repeat(vals, counts)


def message_gaps(t: Sequence[float]) -> np.ndarray:
    """Gaps between consecutive messages of one request (vLLM bench's ITL), s."""
    return np.diff(np.asarray(t, dtype=float))


def _completed(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[requests["error"].isna() & requests["ttft_s"].notna()]


def gaps_by_request(requests: pd.DataFrame, chunks: pd.DataFrame, kind: str = "itl") -> dict[str, np.ndarray]:
    """``{request_id: gaps}`` for the completed requests of one cell (``kind``: itl per token or msg_itl)."""
    ok = set(_completed(requests)["request_id"])
    out: dict[str, np.ndarray] = {}
    c = chunks[chunks["request_id"].isin(ok)].sort_values(["request_id", "message"])
    for rid, g in c.groupby("request_id", sort=False):
        t = g["t_s"].to_numpy(float)
        out[rid] = token_gaps(t, g["num_tokens"].to_numpy()) if kind == "itl" else message_gaps(t)
    for rid in ok - set(out):
        out[rid] = np.zeros(0)
    return out


def summarize(requests: pd.DataFrame, chunks: pd.DataFrame,
              percentiles: Sequence[float] = SERVE_PERCENTILES) -> dict[str, float]:
    """``<metric>_p<q>_s`` for every metric of :data:`SERVE_METRICS` over one cell's completed requests."""
    done = _completed(requests)
    out: dict[str, float] = {}
    vals: dict[str, np.ndarray] = {m: done[f"{m}_s"].to_numpy(float) for m in REQUEST_METRICS}
    for kind in GAP_METRICS:
        g = gaps_by_request(requests, chunks, kind)
        vals[kind] = np.concatenate(list(g.values())) if g else np.zeros(0)
    for m in SERVE_METRICS:
        v = vals[m]
        v = v[~np.isnan(v)]
        for q in percentiles:
            out[f"{m}_p{q:g}_s"] = percentile(v, q)
    return out


def bootstrap_percentile(per_request: Sequence[np.ndarray], q: float, n_boot: int = bootstrap.N_BOOT,
                         key: tuple = (), level: float = bootstrap.LEVEL) -> tuple[float, float, float]:
    """(estimate, low, high): the ``q``-th percentile of the pooled values and its percentile-bootstrap
    interval, resampling requests (each request's values stay together; draws seeded by ``key``)."""
    arrs = [np.asarray(a, dtype=float) for a in per_request]
    arrs = [a[~np.isnan(a)] for a in arrs]
    if not arrs or not sum(a.size for a in arrs):
        return float("nan"), float("nan"), float("nan")
    est = percentile(np.concatenate(arrs), q)
    idx = bootstrap.draw_indices(len(arrs), n_boot, bootstrap.rng("serving", *key))
    if all(a.size == 1 for a in arrs):  # one value per request: every replicate at once
        boots = np.percentile(np.concatenate(arrs)[idx], q, axis=1)
    else:  # a percentile of pooled values is not linear in the weights: pool each replicate's requests
        boots = np.empty(n_boot)
        for b in range(n_boot):
            pooled = np.concatenate([arrs[i] for i in idx[b]])
            boots[b] = np.percentile(pooled, q) if pooled.size else np.nan
    lo, hi = bootstrap.interval(boots, level)
    return est, lo, hi


def latency_intervals(runs: pd.DataFrame, requests: pd.DataFrame, chunks: pd.DataFrame,
                      metrics: Sequence[str] = ("ttft", "itl", "tpot", "e2e"),
                      percentiles: Sequence[float] = (50, 99), n_boot: int = bootstrap.N_BOOT,
                      by_task: bool = False) -> pd.DataFrame:
    """Tidy percentiles with bootstrap intervals: one row per (cell[, task], metric, percentile).

    Columns: ``run_id, kind, label, rate_rps, [task,] metric, percentile, value_s, lo_s, hi_s, n_requests,
    client_lagged`` (the cell's send lag p99 > :data:`CLIENT_LAG_LIMIT_S`).
    """
    rows = []
    meta = runs.set_index("run_id")
    for rid, req in requests.groupby("run_id"):
        if rid not in meta.index:
            continue
        m = meta.loc[rid]
        ch = chunks[chunks["run_id"] == rid]
        groups = req.groupby("task") if by_task else [(None, req)]
        for task, r in groups:
            done = _completed(r)
            gaps = {k: gaps_by_request(r, ch, k) for k in GAP_METRICS if k in metrics}
            for metric in metrics:
                if metric in GAP_METRICS:
                    per = list(gaps[metric].values())
                else:
                    per = [np.array([v]) for v in done[f"{metric}_s"].to_numpy(float)]
                for q in percentiles:
                    est, lo, hi = bootstrap_percentile(per, q, n_boot, (rid, task, metric))
                    row = {"run_id": rid, "kind": m["kind"], "label": m["label"], "rate_rps": float(m["rate_rps"]),
                           "metric": metric, "percentile": q, "value_s": est, "lo_s": lo, "hi_s": hi,
                           "n_requests": len(done), "client_lagged": bool(m["send_lag_p99_s"] > CLIENT_LAG_LIMIT_S)}
                    if by_task:
                        row["task"] = task
                    rows.append(row)
    return pd.DataFrame(rows)


def goodput_table(runs: pd.DataFrame, requests: pd.DataFrame, sla: SLA = SLA()) -> pd.DataFrame:
    """Per cell: requests/s that met ``ttft <= sla.ttft_ms`` and ``tpot <= sla.itl_ms`` (goodput), with the
    share of requests that did; ``goodput_lo/hi_rps`` bootstrap the share over requests (95%)."""
    rows = []
    for r in runs.itertuples():
        req = requests[requests["run_id"] == r.run_id]
        done = _completed(req)
        good = ((done["ttft_s"] * 1e3 <= sla.ttft_ms) & (done["tpot_s"].fillna(0) * 1e3 <= sla.itl_ms)).to_numpy()
        # failed requests count as not meeting the SLA
        ok = np.concatenate([good, np.zeros(len(req) - len(done), dtype=bool)])
        share = float(ok.mean()) if ok.size else float("nan")
        lo = hi = float("nan")
        if ok.size:
            W = bootstrap.unit_weights(ok.size, bootstrap.N_BOOT, bootstrap.rng("goodput", r.run_id))
            lo, hi = bootstrap.interval(bootstrap.mean(W, ok.astype(float)))
        rate = len(req) / r.duration_s if r.duration_s and r.duration_s > 0 else float("nan")
        rows.append({"run_id": r.run_id, "kind": r.kind, "label": r.label, "rate_rps": r.rate_rps,
                     "num_servers": r.num_servers, "send_lag_p99_s": getattr(r, "send_lag_p99_s", np.nan), "sla_share": share, "goodput_rps": share * rate,
                     "goodput_lo_rps": lo * rate, "goodput_hi_rps": hi * rate,
                     "request_throughput_rps": r.request_throughput_rps, "output_tok_per_s": r.output_tok_per_s})
    return pd.DataFrame(rows)


def sla_table(intervals: pd.DataFrame, sla: SLA = SLA()) -> pd.DataFrame:
    """Per cell: the SLA percentile of TTFT and ITL (ms, with intervals) and whether the cell meets the SLA:
    ``meets`` on the estimates; ``certain`` when both intervals lie on the same side of their limits."""
    q = sla.percentile
    d = intervals[(intervals["percentile"] == q) & intervals["metric"].isin(["ttft", "itl"])]
    keys = ["run_id", "kind", "label", "rate_rps"]
    rows = []
    for k, g in d.groupby(keys):
        row = dict(zip(keys, k))
        verdicts = []
        for metric, limit in (("ttft", sla.ttft_ms), ("itl", sla.itl_ms)):
            x = g[g["metric"] == metric].iloc[0]
            row[f"{metric}_p{q:g}_ms"] = x["value_s"] * 1e3
            row[f"{metric}_p{q:g}_lo_ms"] = x["lo_s"] * 1e3
            row[f"{metric}_p{q:g}_hi_ms"] = x["hi_s"] * 1e3
            verdicts.append((x["value_s"] * 1e3 <= limit, x["hi_s"] * 1e3 <= limit or x["lo_s"] * 1e3 > limit))
        row["client_lagged"] = bool(g["client_lagged"].any()) if "client_lagged" in g else False
        row["meets"] = all(v for v, _ in verdicts)
        row["certain"] = all(c for _, c in verdicts) or any((not v) and c for v, c in verdicts)
        rows.append(row)
    return pd.DataFrame(rows)


def cost_per_million_tokens(output_tok_per_s: float, price_per_hour: float, num_servers: int = 1) -> float:
    """USD (or the price's unit) per million output tokens: servers x price per hour / tokens per hour x 1e6."""
    if not output_tok_per_s or output_tok_per_s <= 0:
        return float("nan")
    return num_servers * price_per_hour / (output_tok_per_s * 3600.0) * 1e6


def capacity_table(runs: pd.DataFrame, sla_rows: pd.DataFrame, goodput: pd.DataFrame,
                   price_per_hour: float) -> pd.DataFrame:
    """Per (kind, label): the highest measured rate whose cell meets the SLA (every lower rate too), the
    output tokens/s and goodput there, and the cost per million output tokens at ``price_per_hour`` per server."""
    rows = []
    s = sla_rows.merge(runs[["run_id", "num_servers", "output_tok_per_s", "request_throughput_rps"]], on="run_id")
    s = s.merge(goodput[["run_id", "goodput_rps", "sla_share"]], on="run_id")
    for (kind, label), g in s.groupby(["kind", "label"], sort=False):
        g = g.sort_values("rate_rps")
        ok = g["meets"].to_numpy()
        n_ok = int(np.argmin(ok)) if not ok.all() else len(ok)  # leading run of rates that meet it
        best = g.iloc[n_ok - 1] if n_ok else None
        rows.append({
            "kind": kind, "label": label, "num_servers": int(g["num_servers"].iloc[0]),
            "rates_measured": ", ".join(f"{x:g}" for x in g["rate_rps"]),
            "max_rate_meeting_sla_rps": float(best["rate_rps"]) if best is not None else float("nan"),
            # every measured rate met it: the capacity is at least this, not found
            "capacity_censored": bool(n_ok == len(ok)),
            "certain": bool(best["certain"]) if best is not None else bool(g["certain"].iloc[0]),
            "client_lagged_at_max": bool(best["client_lagged"]) if best is not None else False,
            "output_tok_per_s_at_max": float(best["output_tok_per_s"]) if best is not None else float("nan"),
            "goodput_rps_at_max": float(best["goodput_rps"]) if best is not None else float("nan"),
            "cost_per_m_output_tokens": cost_per_million_tokens(
                float(best["output_tok_per_s"]), price_per_hour, int(best["num_servers"])) if best is not None
            else float("nan"),
        })
    return pd.DataFrame(rows)


def acceptance_by_backend(counters: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """vLLM's counters per (cell, server): mean acceptance length = 1 + accepted / drafts (NaN without SD)."""
    c = counters.merge(runs[["run_id", "kind", "label", "rate_rps"]], on="run_id")
    c = c.assign(mean_acceptance_length=1 + c["num_accepted_tokens"] / c["num_drafts"].replace(0, np.nan))
    return c[["run_id", "kind", "label", "rate_rps", "server", "backend", "num_requests", "num_drafts",
              "num_accepted_tokens", "mean_acceptance_length"]]


def mixed_traffic_table(intervals_by_task: pd.DataFrame, runs: pd.DataFrame, q: float = 50) -> pd.DataFrame:
    """Per fleet cell and task: the ``q``-th percentile TTFT and ITL (ms) with intervals, from
    :func:`latency_intervals` (``by_task=True``)."""
    d = intervals_by_task[(intervals_by_task["kind"] == "fleet") & (intervals_by_task["percentile"] == q)
                          & intervals_by_task["metric"].isin(["ttft", "itl"])]
    if d.empty:
        return pd.DataFrame()
    d = d.assign(ms=lambda x: (x["value_s"] * 1e3).round(1),
                 ci=lambda x: "[" + (x["lo_s"] * 1e3).round(1).astype(str) + ", " + (x["hi_s"] * 1e3).round(1).astype(str) + "]")
    out = d.pivot_table(index=["label", "rate_rps", "task"], columns="metric", values=["ms", "ci"], aggfunc="first")
    out.columns = [f"{m}_p{q:g}_{v}" for v, m in out.columns]
    return out.reset_index()


def backends_of(runs: pd.DataFrame) -> dict[str, list[str]]:
    """``{label: method label per server}`` from ``serve_runs.backends``."""
    return {r.label: json.loads(r.backends) for r in runs.drop_duplicates("label").itertuples()}


def stale_free(runs: pd.DataFrame, run_ids: Optional[set[str]]) -> pd.DataFrame:
    """Rows of ``runs`` (or any table with ``run_id``) whose cell is in the config (``run_ids``); all if None."""
    return runs if run_ids is None else runs[runs["run_id"].isin(run_ids)].reset_index(drop=True)


def read_serving(store, run_ids: Optional[set[str]] = None) -> dict[str, pd.DataFrame]:
    """The serving tables of a store (:class:`sdlib.store.serving_store.ServingStore`), keeping only rows of
    finished cells that ``run_ids`` (the config's cells) names: stale rows are never averaged in."""
    runs = stale_free(store.read("serve_runs"), run_ids)
    done = set(runs["run_id"])
    return {"serve_runs": runs, **{t: stale_free(store.read(t), done)
                                   for t in ("serve_requests", "serve_chunks", "serve_counters")}}


def decision_table(capacity: pd.DataFrame, sla_rows: pd.DataFrame, descriptions: dict[str, str],
                   price_per_hour: float, sla: SLA = SLA()) -> pd.DataFrame:
    """The scenario's decision table, one row per fleet (option): servers, the highest measured rate meeting
    the SLA (``capacity_censored``: the highest rate measured still met it, so the capacity is at least
    that), the SLA percentiles there (ms, with 95% intervals), output tokens/s, goodput and cost per million
    output tokens at ``price_per_hour`` per server. Rows with no rate meeting the SLA show NaN there."""
    q = sla.percentile
    cap = capacity[capacity["kind"] == "fleet"]
    rows = []
    for c in cap.itertuples():
        at = sla_rows[(sla_rows["label"] == c.label) & (sla_rows["rate_rps"] == c.max_rate_meeting_sla_rps)]
        a = at.iloc[0] if len(at) else None

        def ms(metric, a=a):
            if a is None:
                return float("nan"), ""
            return (round(float(a[f"{metric}_p{q:g}_ms"]), 1),
                    f"[{a[f'{metric}_p{q:g}_lo_ms']:.1f}, {a[f'{metric}_p{q:g}_hi_ms']:.1f}]")

        (t, tci), (i, ici) = ms("ttft"), ms("itl")
        rows.append({"option": descriptions.get(c.label, c.label), "fleet": c.label, "servers": c.num_servers,
                     "rates_measured_rps": c.rates_measured,
                     "max_rate_meeting_sla_rps": c.max_rate_meeting_sla_rps,
                     "capacity_censored": c.capacity_censored, "sla_verdict_certain": c.certain,
                     "client_lagged_at_max": c.client_lagged_at_max,
                     f"ttft_p{q:g}_ms": t, f"ttft_p{q:g}_ci_ms": tci, f"itl_p{q:g}_ms": i, f"itl_p{q:g}_ci_ms": ici,
                     "output_tok_per_s": c.output_tok_per_s_at_max, "goodput_rps": c.goodput_rps_at_max,
                     "price_per_server_hour": price_per_hour,
                     "cost_per_m_output_tokens": c.cost_per_m_output_tokens})
    return pd.DataFrame(rows)
