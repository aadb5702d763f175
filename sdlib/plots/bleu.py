"""Notebook 04's figures: BLEU-4 per request, relative speedup of n-gram over EAGLE-3 per prompt/output BLEU-4
bin (paper Fig. 9e form; simulated and measured), and acceptance per bin on our traces.

Usage:
    from sdlib.plots.bleu import plot_bins_paper
    fig = plot_bins_paper(bins[bins.dataset == "instructcoder"], ["n-gram k=3"], "corrected", "authors",
                          "EAGLE-3 k=3", "title")
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.analysis.bleu import MIN_BIN_REQUESTS, bleu_bins
from sdlib.core.registry import method_order
from sdlib.plots.style import new_figure


def bleu_bin_panel(ax, b: pd.DataFrame, labels: list[str], main: str, other: Optional[str], ref_label: str,
                   width: float = 0.2, min_requests: int = MIN_BIN_REQUESTS) -> None:
    """One panel of notebook 04: relative throughput of each ``labels`` row vs ``ref_label`` per BLEU-4 bin.

    ``b``: rows of :func:`sdlib.analysis.bleu.binned_relative_speedup` (``label, convention, bin,
    relative_speedup, num_requests``, and ``relative_speedup_lo/hi`` when known) for one dataset. Bars:
    convention ``main``, with their value written on them and their interval as an error bar; bins with
    fewer than ``min_requests`` requests drawn pale; black markers: convention ``other`` (None: none
    drawn). Under each bin: its number of requests.
    """
    cats = list(bleu_bins([0.0], width).categories)
    x = np.arange(len(cats))
    w = 0.8 / len(labels)
    for j, lab in enumerate(labels):
        s = b[(b.label == lab) & (b.convention == main)].set_index("bin").reindex(cats)
        xs = x - 0.4 + w * (j + 0.5)
        v = 100 * s.relative_speedup.astype(float).to_numpy()
        few = (s.num_requests.fillna(0).to_numpy(float) < min_requests)
        bars = ax.bar(xs, v, w, color=f"C{j + 1}", label=f"{lab} ({main})")
        for bar, f in zip(bars, few):
            if f:
                bar.set_alpha(0.3)
        if "relative_speedup_lo" in s.columns:
            lo, hi = (100 * s[c].astype(float).to_numpy() for c in ("relative_speedup_lo", "relative_speedup_hi"))
            ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(v)
            ax.errorbar(xs[ok], v[ok], yerr=np.vstack([v[ok] - lo[ok], hi[ok] - v[ok]]), fmt="none", ecolor="#333333",
                        elinewidth=1, capsize=2)
        if other is not None:
            o = b[(b.label == lab) & (b.convention == other)].set_index("bin").reindex(cats)
            ax.plot(xs, 100 * o.relative_speedup.astype(float).to_numpy(), "k_", ms=12, mew=2,
                    label=f"{other} convention" if j == 0 else None)
        for xi, y, f in zip(xs, v, few):
            if np.isfinite(y):
                ax.text(xi, y + (3 if y >= 0 else -3), f"{y:+.0f}%", ha="center", va="bottom" if y >= 0 else "top",
                        fontsize=7, alpha=0.4 if f else 1.0)
    n = b[b.label == labels[0]].drop_duplicates("bin").set_index("bin").reindex(cats).num_requests
    ax.set_xticks(x, [f"{c}\nn={int(v) if pd.notna(v) else 0}" for c, v in zip(cats, n)], fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="prompt/output BLEU-4 bin", ylabel=f"throughput vs {ref_label} (%)")


#: The paper's claim drawn on notebook 04's per-bin figure (cited, never ours): Fig. 9(e).
PAPER_BLEU_CUT = 0.6
PAPER_NOTE = "paper (cited), Fig. 9(e): n-gram beats EAGLE above BLEU ≈ 0.6,\nup to +100% (k=5) at 0.8–1.0"


def plot_bleu_distribution(bleu: pd.DataFrame, datasets: Sequence[str], title: str, bin_width: float = 0.2):
    """Histogram (steps of 0.05) of per-request BLEU-4, a line per dataset with its median in the legend;
    dotted lines at the ``bin_width`` bin edges."""
    fig, axes = new_figure(1, 1, width=7.5, height=4.0)
    ax = axes[0][0]
    edges = np.arange(0, 1 + 1e-9, 0.05)
    for i, ds in enumerate(datasets):
        ax.hist(bleu[bleu.dataset == ds].bleu4, bins=edges, histtype="step", lw=1.8, color=f"C{i}",
                label=f"{ds} (median {bleu[bleu.dataset == ds].bleu4.median():.2f})")
    for x in np.arange(bin_width, 1, bin_width):
        ax.axvline(x, color="grey", lw=0.6, ls=":")
    ax.set(xlabel=f"BLEU-4 (reference = prompt, hypothesis = output); dotted: {bin_width:g}-wide bins",
           ylabel="requests", xlim=(0, 1))
    ax.legend(fontsize=9)
    ax.set_title(title, fontsize=11)
    return fig


def plot_bins_paper(b: pd.DataFrame, labels: list[str], main: str, other: Optional[str], ref_label: str, title: str,
                    width: float = 0.2):
    """Paper Fig. 9(e) form for one dataset: :func:`bleu_bin_panel` plus the paper's claim (a dotted line
    at BLEU :data:`PAPER_BLEU_CUT` and its note, cited)."""
    fig, axes = new_figure(1, 1, width=7.5, height=4.8)
    ax = axes[0][0]
    bleu_bin_panel(ax, b, labels, main, other, ref_label, width=width)
    cut = PAPER_BLEU_CUT / width - 0.5  # the bin edge on the categorical axis
    ax.axvline(cut, color="k", ls=":", lw=1.2)
    ax.annotate(PAPER_NOTE, xy=(cut, ax.get_ylim()[1] * 0.9), xytext=(-8, 0), textcoords="offset points", ha="right",
                va="top", fontsize=8, bbox=dict(boxstyle="round", fc="white", ec="grey"))
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
    return fig


def plot_bins_all(bins: pd.DataFrame, datasets: Sequence[str], labels: list[str], main: str, other: Optional[str],
                  ref_label: str, title: str, width: float = 0.2):
    """:func:`bleu_bin_panel` for every dataset, side by side (shared y axis, one legend)."""
    fig, axes = _bin_panels(bins, datasets, labels, main, other, ref_label, width, 4.2, None)
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=11)
    return fig


def _bin_panels(d: pd.DataFrame, datasets: Sequence[str], labels: list[str], main: str, other: Optional[str],
                ref_label: str, width: float, panel_width: float, xlabel: Optional[str]):
    """A figure (and its axes) with :func:`bleu_bin_panel` for every dataset side by side (shared y axis, y label once)."""
    fig, axes = new_figure(1, len(datasets), width=panel_width, height=4.2, sharey=True)
    for ax, ds in zip(axes[0], datasets):
        bleu_bin_panel(ax, d[d.dataset == ds], labels, main, other, ref_label, width=width)
        ax.set_title(ds, fontsize=10)
        if xlabel is not None:
            ax.set_xlabel(xlabel, fontsize=9)
        if ds != datasets[0]:
            ax.set_ylabel("")
    return fig, axes


def plot_measured(mb: pd.DataFrame, ref_label: str, title: str, width: float = 0.2,
                  xlabel: str = "prompt/output BLEU-4 bin"):
    """Measured throughput of each n-gram label relative to ``ref_label`` (%) per BLEU bin, one panel per
    dataset (:func:`bleu_bin_panel`: intervals as error bars, pale bins with few requests, n per bin).
    ``mb``: :func:`sdlib.analysis.bleu.measured_relative_speedup`."""
    datasets = sorted(mb.dataset.unique())
    labels = sorted(mb.label.unique())
    fig, axes = _bin_panels(mb.assign(convention="measured"), datasets, labels, "measured", None, ref_label,
                            width, 4.4, xlabel)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=9)
    return fig


def plot_acceptance_by_bleu(acc_bins: pd.DataFrame, title: str, k: int, width: float = 0.2):
    """Grouped bars: mean tokens gained per verify step per BLEU-4 bin (no brevity penalty), a bar per
    method (in :func:`sdlib.core.registry.method_order`), a panel per dataset, requests per bin under it.

    ``acc_bins``: :func:`sdlib.analysis.bleu.acceptance_bins`; ``k``: the chain's draft length (axis label).
    """
    datasets = sorted(acc_bins.dataset.unique())
    methods = sorted(set(acc_bins.method), key=method_order)
    cats = list(bleu_bins([0.0], width).categories)
    fig, axes = new_figure(1, len(datasets), width=4.2, height=4.0, sharey=True)
    for ax, ds in zip(axes[0], datasets):
        b = acc_bins[acc_bins.dataset == ds]
        x = np.arange(len(cats))
        w = 0.8 / len(methods)
        for j, m in enumerate(methods):
            s = b[b.method == m].set_index("bin").reindex(cats)
            ax.bar(x - 0.4 + w * (j + 0.5), s.acc_len.astype(float).to_numpy(), w, color=f"C{j}", label=m)
        n = b.drop_duplicates("bin").set_index("bin").reindex(cats).num_requests
        ax.set_xticks(x, [f"{c}\nn={int(v) if pd.notna(v) else 0}" for c, v in zip(cats, n)], fontsize=7)
        ax.axhline(1, color="grey", lw=0.8)
        ax.set(title=ds, xlabel="prompt/output BLEU-4 bin (no brevity penalty)",
               ylabel=f"tokens per verify step (k={k} chain)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig
