"""Notebook 01's figures: speedup and throughput vs batch size, acceptance, roofline, speedup surface.

Usage:
    from sdlib.plots.throughput import plot_speedup
    from sdlib.plots.titles import sweep_title
    fig = plot_speedup(speedup_table(runs), title=sweep_title(store))
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from sdlib.plots.style import new_figure


def _facets(df: pd.DataFrame, col: str) -> list:
    return sorted(df[col].dropna().unique().tolist())


def plot_speedup(sp: pd.DataFrame, title: str, reference: Optional[pd.DataFrame] = None):
    """Speedup over no-SD vs batch size, one panel per dataset, one line per method (paper Fig. 1 form).

    ``reference``: optional rows (dataset, method_label, batch_size, speedup, source) drawn dashed
    and labelled as cited, never as ours.
    """
    d = sp[sp["method"] != "none"]
    datasets = _facets(d, "dataset")
    fig, axes = new_figure(1, max(len(datasets), 1), width=4.8, height=3.8, sharey=True)
    methods = _facets(d, "method_label")
    colors = dict(zip(methods, ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7"]))
    for ax, ds in zip(axes[0], datasets or [None]):
        sub = d[d["dataset"] == ds]
        for m in methods:
            s = sub[sub["method_label"] == m].sort_values("batch_size")
            if len(s):
                ax.plot(s["batch_size"], s["speedup"], "o-", color=colors[m], label=m)
        if reference is not None and len(reference):
            r = reference[reference["dataset"] == ds]
            for (m, src), s in r.groupby(["method_label", "source"]):
                ax.plot(s["batch_size"], s["speedup"], "s--", alpha=0.6, label=f"{m} ({src})")
        ax.axhline(1.0, color="grey", lw=1, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_title(str(ds))
    axes[0][0].set_ylabel("speedup over no SD (×)")
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=10)
    return fig


def plot_throughput(tp: pd.DataFrame, title: str):
    """Output tokens/s vs batch size, one panel per dataset, one line per method (no SD included)."""
    datasets = _facets(tp, "dataset")
    fig, axes = new_figure(1, max(len(datasets), 1), width=4.8, height=3.8, sharey=True)
    for ax, ds in zip(axes[0], datasets or [None]):
        sub = tp[tp["dataset"] == ds]
        for m, s in sub.groupby("method_label"):
            s = s.sort_values("batch_size")
            ax.errorbar(s["batch_size"], s["tok_per_s"], yerr=s["tok_per_s_std"].fillna(0), fmt="o-", label=m,
                        capsize=2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_title(str(ds))
    axes[0][0].set_ylabel("output tokens/s")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_acceptance_table(acc: pd.DataFrame, title: str, value: str = "mean_acceptance_length"):
    """Heatmap of mean acceptance length, method x workload (the paper's cheat-sheet form)."""
    import seaborn as sns

    piv = acc.pivot_table(index="method_label", columns="dataset", values=value, aggfunc="mean")
    fig, axes = new_figure(1, 1, width=1.6 + 1.4 * max(piv.shape[1], 1), height=1.2 + 0.5 * max(piv.shape[0], 1))
    ax = axes[0][0]
    if piv.size and np.isfinite(piv.to_numpy(dtype=float)).any():
        sns.heatmap(piv, annot=True, fmt=".2f", cmap="viridis", ax=ax, cbar_kws={"label": value})
    ax.set_xlabel("workload")
    ax.set_ylabel("method")
    ax.set_title(title, fontsize=9)
    return fig


def roofline_title(device: dict) -> str:
    """``No-SD decode vs roofline (<device>: <bandwidth> GB/s copy, <rate> TFLOP/s bf16)``."""
    return (f"No-SD decode vs roofline ({device['device']}: {device['copy_bandwidth_gb_s']:.0f} GB/s copy, "
            f"{device['bf16_matmul_tflop_s']:.0f} TFLOP/s bf16)")


def plot_roofline(tp_none: pd.DataFrame, roof: pd.DataFrame, title: str):
    """Measured no-SD tokens/s vs batch size against the memory- and compute-bound rooflines."""
    fig, axes = new_figure(1, 1, width=6.0, height=4.2)
    ax = axes[0][0]
    for ds, s in tp_none.groupby("dataset"):
        s = s.sort_values("batch_size")
        ax.plot(s["batch_size"], s["tok_per_s"], "o-", label=f"measured, no SD ({ds})")
    ax.plot(roof["batch_size"], roof["memory_bound_tok_per_s"], "--", color="grey", label="memory-bound bound")
    ax.plot(roof["batch_size"], roof["compute_bound_tok_per_s"], ":", color="black", label="compute-bound bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig


def plot_speedup_surface(sp: pd.DataFrame, title: str):
    """Heatmap of measured speedup, method (rows) x batch size (columns); below 1 shows red."""
    import seaborn as sns

    d = sp[sp["method"] != "none"]
    piv = d.pivot_table(index="method_label", columns="batch_size", values="speedup", aggfunc="mean")
    # room for the 3-line title, the colour bar and the method labels even with one or two rows
    fig, axes = new_figure(1, 1, width=max(6.5, 2.5 + 0.8 * max(piv.shape[1], 1)),
                           height=max(3.2, 1.6 + 0.45 * max(piv.shape[0], 1)))
    ax = axes[0][0]
    if piv.size:
        sns.heatmap(piv, annot=True, fmt=".2f", cmap="RdYlGn", center=1.0, ax=ax,
                    cbar_kws={"label": "speedup over no SD (×)"})
    ax.set_xlabel("batch size")
    ax.set_ylabel("method (k, synthetic L)" if piv.shape[0] < 3 else "method (k, synthetic acceptance L)")
    ax.set_title(title, fontsize=9)
    return fig
