"""Notebook 08's figures: latency-throughput curves (P50/P99 TTFT and ITL vs request rate, bootstrap
intervals), goodput vs rate, and the design-document figure; titles from the serving sweep's provenance.

Usage:
    from sdlib.plots.serving import plot_latency_curves, serving_title
    fig = plot_latency_curves(intervals, runs, serving_title(store, "Latency vs load"), sla=SLA())
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.analysis.serving import SLA, cost_per_million_tokens
from sdlib.plots.style import log_axis_plain, new_figure
from sdlib.plots.titles import _notes, invocation_facts

METRIC_NAMES = {"ttft": "TTFT", "itl": "ITL (per token)", "msg_itl": "ITL (per message)", "tpot": "TPOT",
                "e2e": "end-to-end latency"}


def serving_title(store, what: str = "") -> str:
    """``<what>\\n<name>: <model> (<weights>, trained drafters, real acceptance), <arrivals>\\n<device>, vLLM <v>``
    from a serving sweep's provenance.json (store: :class:`sdlib.store.serving_store.ServingStore`)."""
    prov = store.read_provenance()
    cfg = prov.get("config", {})
    cards, servers, models = invocation_facts(prov, "servers")
    notes = _notes(cards, models)
    synthetic = any("synthetic" in str(m.get("options", {})) for m in cfg.get("methods", []))
    dummy = any(m.get("load_format") == "dummy" for m in cfg.get("models", []))
    notes += ["dummy weights"] if dummy and not any("dummy weights" in n for n in notes) else []
    notes += ["synthetic acceptance" if synthetic else "real acceptance"]
    b = (cfg.get("traffic") or {}).get("burstiness", 1.0)
    arrivals = "Poisson arrivals" if b == 1 else f"gamma arrivals (burstiness {b:g})"
    device = next((s.get("device") for s in reversed(servers) if s.get("device")), "")
    ver = next((s.get("vllm_version") for s in reversed(servers) if s.get("vllm_version")), "")
    line1 = f"{prov.get('sweep', store.dir.name)}: {', '.join(models)} ({', '.join(notes)}), {arrivals}"
    tail = ", ".join(x for x in [device.replace("CPU: ", "CPU ") if device else "", f"vLLM {ver} OpenAI server"
                                 if ver else ""] if x)
    title = line1 + (f"\n{tail}" if tail else "")
    return f"{what}\n{title}" if what else title


def _log_ms(ax) -> None:
    """Log y axis with plain numbers (ms), not powers of ten."""
    log_axis_plain(ax, "y")


def _colors(labels: Sequence[str]) -> dict[str, str]:
    return {lab: f"C{i % 10}" for i, lab in enumerate(labels)}


def _band(ax, d: pd.DataFrame, x: str, label: str, color: str, style: str = "o-") -> None:
    d = d.sort_values(x)
    y = d["value_s"] * 1e3
    err = np.vstack([(d["value_s"] - d["lo_s"]).clip(lower=0), (d["hi_s"] - d["value_s"]).clip(lower=0)]) * 1e3
    ax.errorbar(d[x], y, yerr=err, fmt=style, color=color, label=label, capsize=3, ms=4, lw=1.3)
    if "client_lagged" in d and d["client_lagged"].any():  # cells whose client was starved: marked
        lag = d[d["client_lagged"].astype(bool)]
        ax.plot(lag[x], lag["value_s"] * 1e3, "x", color="black", ms=7, label="_lag")


def _lag_note(ax, d: pd.DataFrame) -> None:
    if "client_lagged" in d and d["client_lagged"].any():
        ax.plot([], [], "x", color="black", label="x: client lagged (send lag p99 > 50 ms)")


def plot_latency_curves(intervals: pd.DataFrame, title: str, kind: str = "method",
                        metrics: Sequence[str] = ("ttft", "itl"), percentiles: Sequence[float] = (50, 99),
                        sla: Optional[SLA] = None, throughput: Optional[pd.DataFrame] = None):
    """One panel per metric: P50 (solid) and P99 (dashed) vs request rate, one colour per method (or fleet),
    95% bootstrap intervals over requests; the SLA's limits as grey lines; with ``throughput`` (serve_runs)
    a last panel of output tokens/s vs rate."""
    d = intervals[intervals["kind"] == kind]
    labels = list(dict.fromkeys(d.sort_values("label", key=lambda s: s != "none")["label"]))
    colors = _colors(labels)
    n = len(metrics) + (throughput is not None)
    fig, axes = new_figure(1, n, width=4.6, height=3.8)
    styles = {p: s for p, s in zip(percentiles, ["o-", "s--", "^:"])}
    for ax, metric in zip(axes[0], metrics):
        for lab in labels:
            for q in percentiles:
                s = d[(d["label"] == lab) & (d["metric"] == metric) & (d["percentile"] == q)]
                if len(s):
                    _band(ax, s, "rate_rps", f"{lab} P{q:g}", colors[lab], styles[q])
        _lag_note(ax, d[d["metric"] == metric])
        if sla is not None and metric in ("ttft", "itl"):
            lim = sla.ttft_ms if metric == "ttft" else sla.itl_ms
            ax.axhline(lim, color="grey", lw=1, ls=":", label=f"SLA P{sla.percentile:g} {lim:g} ms")
        _log_ms(ax)
        ax.set_xlabel("request rate (req/s)" + (" into the fleet" if kind == "fleet" else ""))
        ax.set_ylabel(f"{METRIC_NAMES.get(metric, metric)} (ms)")
        ax.set_title(METRIC_NAMES.get(metric, metric))
    if throughput is not None:
        ax = axes[0][-1]
        t = throughput[throughput["kind"] == kind]
        for lab in labels:
            s = t[t["label"] == lab].sort_values("rate_rps")
            ax.plot(s["rate_rps"], s["output_tok_per_s"], "o-", color=colors[lab], label=lab)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("output tokens/s")
        ax.set_title("throughput")
    _legend_below(fig, axes[0][0])
    fig.suptitle(title, fontsize=9)
    return fig


def _legend_below(fig, ax, ncol: int = 4) -> None:
    """One legend under the panels (from ``ax``'s lines), so no curve is hidden."""
    handles, labels = ax.get_legend_handles_labels()
    keep = [(h, lab) for h, lab in zip(handles, labels) if not lab.startswith("_")]
    if keep:
        fig.legend(*zip(*keep), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8, frameon=False)


def plot_goodput(goodput: pd.DataFrame, title: str, sla: SLA, kind: Optional[str] = None):
    """Goodput (requests/s meeting TTFT and TPOT limits) vs offered rate, one line per method or fleet, with
    95% bootstrap intervals; the dotted diagonal is the offered rate (every request meets it)."""
    kinds = [kind] if kind else [k for k in ("method", "fleet") if (goodput["kind"] == k).any()]
    fig, axes = new_figure(1, len(kinds), width=5.0, height=3.8)
    for ax, k in zip(axes[0], kinds):
        d = goodput[goodput["kind"] == k]
        labels = list(dict.fromkeys(d.sort_values("label", key=lambda s: s != "none")["label"]))
        colors = _colors(labels)
        for lab in labels:
            s = d[d["label"] == lab].sort_values("rate_rps")
            err = np.vstack([(s["goodput_rps"] - s["goodput_lo_rps"]).clip(lower=0),
                             (s["goodput_hi_rps"] - s["goodput_rps"]).clip(lower=0)])
            ax.errorbar(s["rate_rps"], s["goodput_rps"], yerr=err, fmt="o-", color=colors[lab], label=lab, capsize=3)
        top = float(d["rate_rps"].max()) if len(d) else 1.0
        ax.plot([0, top], [0, top], color="grey", lw=1, ls=":", label="offered rate")
        ax.set_xlabel("request rate (req/s)" + (" into the fleet" if k == "fleet" else ""))
        ax.set_ylabel("goodput (req/s)")
        ax.set_title(f"{'fleets' if k == 'fleet' else 'one server per method'}: TTFT <= {sla.ttft_ms:g} ms, "
                     f"TPOT <= {sla.itl_ms:g} ms", fontsize=9)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3, fontsize=7, frameon=False)
        ax.xaxis.labelpad = 2
    fig.suptitle(title, fontsize=9)
    return fig


def plot_design(intervals: pd.DataFrame, runs: pd.DataFrame, sla: SLA, price_per_hour: float, title: str,
                names: Optional[dict[str, str]] = None, kind: str = "fleet"):
    """The design-document figure: the SLA percentile of TTFT and of ITL vs request rate per option (fleet;
    ``names``: label -> what to call it), 95% bootstrap intervals, the region within the SLA shaded, and the
    cost per million output tokens at ``price_per_hour`` per server vs rate (servers x price / output tokens
    per hour)."""
    names = names or {}
    q = sla.percentile
    d = intervals[(intervals["kind"] == kind) & (intervals["percentile"] == q)]
    labels = list(dict.fromkeys(d["label"]))
    colors = _colors(labels)
    fig, axes = new_figure(1, 3, width=4.4, height=3.8)
    for ax, metric, lim in ((axes[0][0], "ttft", sla.ttft_ms), (axes[0][1], "itl", sla.itl_ms)):
        for lab in labels:
            s = d[(d["label"] == lab) & (d["metric"] == metric)]
            if len(s):
                _band(ax, s, "rate_rps", names.get(lab, lab), colors[lab])
        _lag_note(ax, d[d["metric"] == metric])
        _log_ms(ax)
        lo = ax.get_ylim()[0]
        ax.axhspan(lo, lim, color="green", alpha=0.07, lw=0)
        ax.axhline(lim, color="green", lw=1, ls=":", label=f"SLA: P{q:g} <= {lim:g} ms")
        ax.set_xlabel("request rate into the fleet (req/s)")
        ax.set_ylabel(f"P{q:g} {METRIC_NAMES[metric]} (ms)")
        ax.set_title(f"P{q:g} {METRIC_NAMES[metric]}")
    ax = axes[0][2]
    r = runs[runs["kind"] == kind]
    for lab in labels:
        s = r[r["label"] == lab].sort_values("rate_rps")
        cost = [cost_per_million_tokens(t, price_per_hour, n) for t, n in zip(s["output_tok_per_s"], s["num_servers"])]
        ax.plot(s["rate_rps"], cost, "o-", color=colors[lab], label=names.get(lab, lab))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("request rate into the fleet (req/s)")
    ax.set_ylabel("cost per million output tokens")
    ax.set_title(f"cost at {price_per_hour:g} per server-hour (an input)", fontsize=10)
    _legend_below(fig, axes[0][0], ncol=3)
    fig.suptitle(title, fontsize=9)
    return fig
