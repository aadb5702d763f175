"""Notebook 07's figures: the share of the gap each policy closes, per-position choices beside Oracle
Combine's (paper Fig. 11 form), and where the baselines lose.

Every figure here is simulated; titles say which traces and cost model (:func:`sim_policy_title`).

Usage:
    from sdlib.plots.policies import plot_gap_shares
    fig = plot_gap_shares(gap_wide(gaps, POLICIES), "authors_h100_llama8b", POLICIES, "title")
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from sdlib.plots.style import interval_bars, new_figure

DRAFTER_COLORS = {"ngram": "C1", "eagle3": "C0", "none": "0.6"}
#: ``policy`` of the rows of :func:`sdlib.sim.policy.views.choices` that hold the traces at every position.
TRACE = "trace"


def sim_policy_title(cm_name: str, what: str, traces: str = "authors' traces (Llama-3.1-8B, H100)") -> str:
    """``<what>`` + a line saying the figure is simulated: whose traces, which cost model."""
    return f"{what}\nsimulated: {traces} + cost model {cm_name}, corrected convention"


def our_traces_label(pattern: str) -> str:
    """What produced our traces, from their provenance: ``our traces (<target>, acceptance from vLLM <v> on
    <device>) + EAGLE-3 confidences (offline, float32)``."""

    # deferred: sdlib.sim.traces loads pandas, and only this path needs it
    from sdlib.sim.traces import provenance_path

    provs = [json.loads(provenance_path(Path(f)).read_text()) for f in sorted(glob.glob(pattern))
             if provenance_path(Path(f)).exists()]

    def eagle(p: dict) -> str:  # sdlib traces --eagle3-engine: vLLM (the default, and every older file) or offline
        return "the head's offline draft chain (torch float32)" if str(p.get("eagle3_engine", "")).startswith("offline") else "vLLM"

    parts = sorted({f"{p.get('target', '?')}, greedy outputs from vLLM {p.get('vllm_version', '?')} on "
                    f"{p.get('device') or 'CPU'}, acceptance: n-gram exact, EAGLE-3 from {eagle(p)}" for p in provs}) \
        or ["no provenance"]
    reqs = sorted({int(p.get("num_requests", 0)) for p in provs})
    n = f"{'/'.join(map(str, reqs))} requests per dataset, " if reqs else ""
    return f"our traces ({n}trained tiny models: {'; '.join(parts)})\n+ EAGLE-3 confidences (offline, float32)"


def plot_gap_shares(wide: pd.DataFrame, cost_model: str, policies: Sequence[str], title: str):
    """A heat table: rows (dataset, batch size), columns policies, cells the share of the gap (best fixed ->
    Oracle Combine) closed; the gap itself (% of the best fixed) in the last column."""
    w = wide[wide.cost_model == cost_model].sort_values(["dataset", "batch_size"])
    vals = w[list(policies)].to_numpy(dtype=float)
    fig, axes = new_figure(1, 1, width=1.0 + 0.85 * (len(policies) + 1), height=0.9 + 0.32 * len(w))
    ax = axes[0][0]
    ax.imshow(np.clip(vals, -1, 1.2), cmap="RdYlGn", vmin=-1, vmax=1.2, aspect="auto")
    for i in range(vals.shape[0]):
        for j in range(vals.shape[1]):
            ax.text(j, i, f"{vals[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.text(len(policies), i, f"{100 * w.gap_rel.iloc[i]:.0f}%", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(policies) + 1), list(policies) + ["gap"], rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(w)), [f"{d} · bs {b}" for d, b in zip(w.dataset, w.batch_size)], fontsize=8)
    ax.set_xlim(-0.5, len(policies) + 0.5)
    ax.grid(False)
    ax.set_title(title, fontsize=9)
    return fig


def plot_choices(ch: pd.DataFrame, policies: Sequence[str], title: str):
    """Per request (a column) and policy (a row): tokens drafted at each step (bars, coloured by drafter) and
    gained (black ticks) against the output position; the traces' acceptance of both drafters as thin lines."""
    reqs = list(dict.fromkeys(ch.request))
    fig, axes = new_figure(len(policies), len(reqs), width=4.4, height=2.4, sharex="col")
    for c, r in enumerate(reqs):
        for i, pol in enumerate(policies):
            ax = axes[i][c]
            s = ch[(ch.request == r) & (ch.policy == pol)]
            trace = ch[(ch.request == r) & (ch.policy == TRACE)].sort_values("pos")
            ax.plot(trace.pos, trace.acc_ngram - 1, color=DRAFTER_COLORS["ngram"], lw=0.6, alpha=0.5)
            ax.plot(trace.pos, trace.acc_eagle3 - 1, color=DRAFTER_COLORS["eagle3"], lw=0.6, alpha=0.5)
            for d, col in DRAFTER_COLORS.items():
                sd = s[s.drafter == d]
                if len(sd):
                    ax.bar(sd.pos, sd.drafted, width=0.9, color=col, label=f"drafted: {d}")
            ax.plot(s.pos, s.gained - 1, "k_", ms=5, label="accepted")
            ax.set_ylabel(f"{pol}\ntokens", fontsize=8)
            if i == 0:
                ax.set_title(f"{s.dataset.iloc[0] if len(s) else ''} · request {s.request_id.iloc[0] if len(s) else r}",
                             fontsize=9)
            if i == len(policies) - 1:
                ax.set_xlabel("output position")
    handles, labels = {}, []
    for row in axes:
        for a in row:
            for h, lab in zip(*a.get_legend_handles_labels()):
                handles.setdefault(lab, h)
    labels = list(handles) + ["thin lines: accepted if drafted here (traces)"]
    fig.legend(list(handles.values()) + [axes[0][0].lines[0]], labels, loc="lower center", ncol=5, fontsize=8,
               bbox_to_anchor=(0.5, -0.05))
    fig.suptitle(title, fontsize=10)
    return fig


def plot_losses(losses: pd.DataFrame, cost_model: str, policies: Sequence[str], datasets: Sequence[str], title: str):
    """Top row: each policy's speedup / the cell's best fixed method vs batch size, a panel per dataset; bottom
    row: drafted tokens rejected per step (what over-drafting costs) for the same policies."""
    t = losses[losses.cost_model == cost_model]
    fig, axes = new_figure(2, len(datasets), width=3.4, height=2.9, sharey="row")
    for c, ds in enumerate(datasets):
        for i, pol in enumerate(policies):
            s = t[(t.dataset == ds) & (t.policy == pol)].sort_values("batch_size")
            kw = dict(marker="o", ms=3, color=f"C{i}", lw=2.0 if pol == "online" else 1.0)
            axes[0][c].plot(s.batch_size, s.vs_best_fixed, label=pol if c == 0 else None, **kw)
            axes[1][c].plot(s.batch_size, s.rejected_per_step, **kw)
        for r in (0, 1):
            axes[r][c].set_xscale("log", base=2)
            axes[r][c].set_xticks(sorted(t.batch_size.unique()), [str(b) for b in sorted(t.batch_size.unique())])
        axes[0][c].axhline(1, color="grey", lw=0.8)
        axes[0][c].set_title(ds, fontsize=9)
        axes[1][c].set_xlabel("batch size")
    axes[0][0].set_ylabel("speedup / best fixed")
    axes[1][0].set_ylabel("rejected drafts per step")
    fig.legend(loc="lower center", ncol=min(len(policies), 5), fontsize=8, bbox_to_anchor=(0.5, -0.08))
    fig.suptitle(title, fontsize=10)
    return fig


def plot_measured(meas: pd.DataFrame, title: str):
    """Measured speedup over no SD with its bootstrap interval vs batch size, a panel per dataset and a line
    per method (:func:`sdlib.analysis.speedup_ci.measured_speedups`)."""
    datasets = sorted(meas.dataset.unique())
    labels = list(dict.fromkeys(meas.sort_values("method").method_label))
    fig, axes = new_figure(1, len(datasets), width=3.6, height=3.4, sharey=True)
    for c, ds in enumerate(datasets):
        ax = axes[0][c]
        for i, lab in enumerate(labels):
            s = meas[(meas.dataset == ds) & (meas.method_label == lab)].sort_values("batch_size")
            ax.errorbar(s.batch_size, s.speedup, yerr=[s.speedup - s.speedup_lo, s.speedup_hi - s.speedup],
                        marker="o", ms=4, capsize=3, color=f"C{i}", label=lab if c == 0 else None)
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(meas.batch_size.unique()), [str(b) for b in sorted(meas.batch_size.unique())])
        ax.set(title=ds, xlabel="batch size", ylabel="speedup over no SD" if c == 0 else "")
    fig.legend(loc="lower center", ncol=len(labels), fontsize=8, bbox_to_anchor=(0.5, -0.08))
    fig.suptitle(title, fontsize=10)
    return fig


def plot_reliability(rel: pd.DataFrame, title: str):
    """Acceptance rate of a reached draft against the drafter's top-1 confidence (a point per confidence bin,
    its Wilson 95% interval as a bar; marker area ~ drafts in the bin), a panel per dataset; the diagonal is a
    calibrated confidence."""
    ds = list(dict.fromkeys(rel["dataset"]))
    fig, axes = new_figure(1, len(ds), width=3.4, height=3.4, sharey=True)
    for ax, d in zip(axes[0], ds):
        g = rel[rel["dataset"] == d]
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="calibrated")
        ax.errorbar(g["conf"], g["rate"], yerr=[g["rate"] - g["rate_lo"], g["rate_hi"] - g["rate"]], fmt="none",
                    ecolor="C0", lw=1)
        ax.scatter(g["conf"], g["rate"], s=8 + 60 * g["n"] / max(g["n"].max(), 1), color="C0", zorder=3,
                   label="accepted / reached")
        ax.set(title=f"{d} ({int(g['n'].sum())} drafts)", xlabel="top-1 confidence of the draft",
               ylabel="acceptance rate" if d == ds[0] else "", xlim=(0, 1.02), ylim=(0, 1.02))
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    return fig


def plot_request_losses(rl: pd.DataFrame, cost_model: str, policies: Sequence[str], title: str):
    """Where each rule loses, request by request (:func:`sdlib.sim.policy.views.request_losses`): per dataset
    (panels) and batch size (x), the share of requests on which each rule is slower than the cell's best fixed
    method on the same request (one marker per rule, bar: 95% Wilson interval over the cell's requests; the dashed
    line is half the requests)."""
    d = rl[rl.cost_model == cost_model]
    ds = list(dict.fromkeys(d["dataset"]))
    bss = sorted(d["batch_size"].unique())
    pols = [p for p in policies if p in set(d["policy"])]
    fig, axes = new_figure(1, max(len(ds), 1), width=3.6, height=3.4, sharey=True)
    w = 0.8 / max(len(pols), 1)
    for ax, name in zip(axes[0], ds):
        for i, pol in enumerate(pols):
            g = d[(d.dataset == name) & (d.policy == pol)].set_index("batch_size").reindex(bss)
            x = np.arange(len(bss)) + (i - (len(pols) - 1) / 2) * w
            err = interval_bars(g, "share_lost", "share_lost_lo", "share_lost_hi") if "share_lost_lo" in g else None
            ax.errorbar(x, g["share_lost"], yerr=err, fmt="o", capsize=2, color=f"C{i}",
                        label=pol if name == ds[0] else None)
        ax.axhline(0.5, color="0.6", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(bss)), [str(b) for b in bss])
        ax.set(title=name, xlabel="batch size", ylim=(-0.03, 1.03),
               ylabel="share of requests slower than best fixed" if name == ds[0] else "")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(pols), 4), fontsize=7)
    fig.suptitle(title, fontsize=9, y=1.06)
    return fig


def plot_regret(rt: pd.DataFrame, cost_model: str, policy: str, title: str):
    """Where a policy's time goes against the clairvoyant step (:func:`sdlib.sim.policy.regret.regret_table`): per
    dataset (panels) and batch size (x), its regret as a share of its time, stacked by the step's drafter and
    outcome; the number over each n-gram / EAGLE-3 block of a bar is the policy's mean predicted acceptance of the
    first draft at the steps whose first draft was rejected (how sure it was where it lost)."""
    # deferred: matplotlib loads slowly, and only the figures need it
    import matplotlib

    d = rt[(rt.cost_model == cost_model) & (rt.policy == policy)]
    ds = list(dict.fromkeys(d["dataset"]))
    bss = sorted(d["batch_size"].unique())
    shading = ("first rejected", "partial", "whole", "no draft")  # darkest first
    cats = [(dr, o) for dr in ("ngram", "eagle3", "none") for o in shading
            if ((d.drafter == dr) & (d.outcome == o)).any()]
    colors = {"ngram": "Oranges", "eagle3": "Blues", "none": "Greys"}
    fig, axes = new_figure(1, max(len(ds), 1), width=3.4, height=3.6, sharey=True)
    for ax, name in zip(axes[0], ds):
        g = d[d.dataset == name]
        bottom = np.zeros(len(bss))
        total = g.groupby("batch_size").seconds.sum().reindex(bss).to_numpy()
        for dr, o in cats:
            sel = g[(g.drafter == dr) & (g.outcome == o)].set_index("batch_size").reindex(bss)
            h = np.nan_to_num(sel["regret_s"].to_numpy() / total)
            shade = matplotlib.colormaps[colors[dr]](0.85 - 0.2 * shading.index(o))
            ax.bar(np.arange(len(bss)), h, bottom=bottom, color=shade, edgecolor="white", lw=0.5,
                   label=f"{dr}: {o}" if name == ds[0] else None)
            if o == "first rejected":
                for x, (hh, b, p) in enumerate(zip(h, bottom, sel["predicted_first"].to_numpy())):
                    if hh > 0.004 and np.isfinite(p):
                        ax.text(x, b + hh / 2, f"{p:.2f}", ha="center", va="center", fontsize=6)
            bottom += h
        ax.set_xticks(np.arange(len(bss)), [str(b) for b in bss])
        ax.set(title=name, xlabel="batch size", ylabel="regret / policy's time" if name == ds[0] else "")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=7)
    fig.suptitle(title, fontsize=9, y=1.08)
    return fig


def plot_confidence_stop(arms: pd.DataFrame, ratios: pd.DataFrame, reference: str, title: str):
    """The confidence stop measured in vLLM (:func:`sdlib.analysis.confidence_stop.cut_tables`): per arm, the
    drafts verified per step and the acceptance rate (95% bootstrap over prompts), then each arm's decode rate
    over ``reference`` (fixed-k EAGLE-3 on the same engine), paired, per batch size, with the block's A/A drift
    shaded around 1 (a difference inside it is not established)."""
    fig, axes = new_figure(1, 3, width=4.4, height=3.6)
    order = list(dict.fromkeys(arms.sort_values("drafted_per_step", ascending=False)["method_label"]))
    order = [a for a in order if not a.endswith("-AA")]
    bss = sorted(arms["batch_size"].unique())
    first = arms[arms["batch_size"] == bss[0]].set_index("method_label").reindex(order)
    y = np.arange(len(order))
    for ax, col, name in ((axes[0][0], "drafted_per_step", "drafts verified per step"),
                          (axes[0][1], "acceptance_rate", "acceptance rate (accepted / verified drafts)")):
        err = interval_bars(first, col, f"{col}_lo", f"{col}_hi")
        ax.errorbar(first[col], y, xerr=err, fmt="o", capsize=3, color="C0")
        ax.set_yticks(y, order if ax is axes[0][0] else [""] * len(order), fontsize=8)
        ax.invert_yaxis()
        ax.set(xlabel=name, title=f"{name}, bs {bss[0]}")
    ax = axes[0][2]
    r = ratios[(ratios["measure"] == "tok_per_s") & (ratios["reference"] == reference)]
    w = 0.6 / max(len(bss), 1)
    for i, bs in enumerate(bss):
        d = r[r["batch_size"] == bs].set_index("arm").reindex([a for a in order if a != reference])
        yy = np.arange(len(d)) + (i - (len(bss) - 1) / 2) * w
        err = interval_bars(d, "ratio", "ratio_lo", "ratio_hi")
        ax.errorbar(d["ratio"], yy, xerr=err, fmt="o", capsize=3, color=f"C{i}", label=f"bs {bs}")
        drift = d["aa_drift"].dropna()
        if len(drift):
            ax.axvspan(1 - drift.iloc[0], 1 + drift.iloc[0], color=f"C{i}", alpha=0.08)
    ax.axvline(1.0, ls=":", color="grey")
    labels = [a for a in order if a != reference]
    ax.set_yticks(np.arange(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel=f"decode rate over {reference} (95% interval; band: A/A drift)", title="paired, same engine")
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9, y=1.05)
    fig.tight_layout()
    return fig
