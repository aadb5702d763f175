"""Notebook 02's figures: phase shares per step (paper Fig. 4 form) and memory overhead per method.

Usage:
    from sdlib.plots.breakdown import plot_phase_shares
    fig = plot_phase_shares(pooled_shares(bt), "title")
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from sdlib.analysis.breakdown import SHARE_PHASES
from sdlib.analysis.memory import setup_label
from sdlib.core.registry import method_order
from sdlib.plots.style import new_figure

#: Colours of the stacked phases (bottom to top: draft, verify, sample, other).
PHASE_COLORS = {"draft": "#dd8452", "verify": "#4c72b0", "sample": "#c44e52", "other": "#b8b8b8"}
def _method_sort_key(label: str, method: str) -> tuple:
    return (method_order(method), label)


def plot_phase_shares(pooled: pd.DataFrame, title: str, row: str = "model", col: str = "method_label",
                      annotate_min: float = 0.06):
    """Stacked bars of phase shares (paper Fig. 4 form): a panel per ``col`` value (method), a row
    per ``row`` value (model; a list of columns joins them), one bar per batch size; shares >=
    ``annotate_min`` are written on the bar and the mean step time (ms) under each bar. With
    ``share_verify_lo/hi`` columns (:func:`sdlib.analysis.breakdown.share_intervals`), a whisker at the top
    of the verify segment shows the verify share's interval."""
    d = pooled.copy()
    if isinstance(row, (list, tuple)):  # several columns -> one row label "a / b"
        cols_ = [c for c in row if c in d.columns]
        d["_row"] = d[cols_].astype(str).agg(" / ".join, axis=1) if cols_ else None
        row = "_row"
    meth = d.drop_duplicates(col).set_index(col)["method"] if "method" in d.columns else pd.Series(dtype=str)
    cols = sorted(d[col].dropna().unique(), key=lambda c: _method_sort_key(str(c), str(meth.get(c, ""))))
    rows = sorted(d[row].dropna().unique()) if row in d.columns else [None]
    n_bs = max(d["batch_size"].nunique(), 1)
    fig, axes = new_figure(len(rows), max(len(cols), 1), width=max(2.6, 0.55 * n_bs + 0.9), height=3.6, sharey=True)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            ax = axes[i][j]
            s = d[(d[col] == c) & ((d[row] == r) if r is not None else True)].sort_values("batch_size")
            x = np.arange(len(s))
            bottom = np.zeros(len(s))
            for ph in SHARE_PHASES:
                v = s[f"share_{ph}"].to_numpy(dtype=float)
                v = np.nan_to_num(v, nan=0.0)
                ax.bar(x, v, bottom=bottom, color=PHASE_COLORS[ph], width=0.7, edgecolor="white", linewidth=0.5,
                       label=ph if (i, j) == (0, 0) else None)
                for xi, (b, h) in enumerate(zip(bottom, v)):
                    if h >= annotate_min:
                        ax.text(xi, b + h / 2, f"{100 * h:.0f}%", ha="center", va="center", fontsize=8,
                                color="white" if ph in ("verify", "sample") else "black")
                if ph == "verify" and "share_verify_lo" in s.columns:  # the verify share's interval
                    lo, hi = s["share_verify_lo"].to_numpy(float), s["share_verify_hi"].to_numpy(float)
                    ok = np.isfinite(lo) & np.isfinite(hi)
                    top = bottom + v  # the verify segment's top, where its share ends
                    ax.errorbar(x[ok], top[ok], yerr=np.vstack([v[ok] - lo[ok], hi[ok] - v[ok]]), fmt="none",
                                ecolor="black", elinewidth=1, capsize=3)
                bottom += v
            labels = [f"{int(b)}\n{ms:.0f} ms" if np.isfinite(ms) else f"{int(b)}"
                      for b, ms in zip(s["batch_size"], s["step_ms"].astype(float))]
            ax.set_xticks(x, labels, fontsize=8)
            ax.set_ylim(0, 1.0)
            name = "\n".join(textwrap.wrap(str(c), 22, break_on_hyphens=True))  # long labels: one per panel
            ax.set_title(name if r is None or len(rows) == 1 else f"{r}\n{name}", fontsize=10)
            ax.grid(axis="x", visible=False)
        axes[i][0].set_ylabel("share of step time")
        axes[i][0].yaxis.set_major_formatter(lambda v, _: f"{100 * v:.0f}%")
    fig.supxlabel("batch size (mean step time)", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.0, 0.9), frameon=False,
               title="phase")
    fig.suptitle(title, fontsize=10)
    return fig


def plot_memory(mt: pd.DataFrame, title: str):
    """Two panels per setup: extra weights as % of the target's, extra KV bytes/token as % of the target's."""
    d = mt[mt["method"] != "none"].reset_index(drop=True)
    labels = [setup_label(r) for _, r in d.iterrows()]
    fig, axes = new_figure(1, 2, width=4.4, height=0.5 * max(len(d), 1) + 1.5, sharey=True)
    y = np.arange(len(d))
    for ax, col, what in ((axes[0][0], "static_frac_of_target", "extra weights\n(% of the target's weights)"),
                          (axes[0][1], "kv_overhead_frac", "extra KV-cache bytes per token\n(% of the target's)")):
        v = 100 * d[col].astype(float).fillna(0).to_numpy()
        ax.barh(y, v, color="#4c72b0")
        for yi, (vi, raw) in enumerate(zip(v, d[col])):
            ax.text(vi, yi, f" {vi:.1f}%" if pd.notna(raw) else " n/a", va="center", fontsize=8)
        ax.set_xlabel(what, fontsize=9)
        ax.set_xlim(0, max(v.max() if len(v) else 1, 1) * 1.25)
        ax.grid(axis="y", visible=False)
    axes[0][0].set_yticks(y, labels, fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle(title, fontsize=10)
    return fig
