"""Notebook 05's figures: Leviathan's closed form vs the simulator, fixed k vs Oracle Proposal vs batch size,
Oracle Combine, the stacked bounds (authors' traces and ours, one function), and the two conventions.

Every figure here is simulated; titles say so (:func:`sim_title`).

Usage:
    from sdlib.plots.bounds import plot_bounds_stack, REFERENCE_STACK
    fig = plot_bounds_stack(bounds_stack(table), ["gsm8k"], [1, 32], "title", REFERENCE_STACK)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.plots.style import new_figure
from sdlib.sim.bounds import SINGLE_PROPOSERS


def sim_title(cm, what: str, traces: str = "authors' traces (Llama-3.1-8B, H100)") -> str:
    """``<what>`` + a line saying the figure is simulated: whose traces, which cost model; for a fitted
    cost model a third line with its fit over all steps (:func:`sdlib.sim.costmodel.fit_summary`)."""
    # deferred: sdlib.sim.costmodel loads pandas, and only this path needs it
    from sdlib.sim.costmodel import fit_summary

    fit = f"\n{cm.name} fit: {fit_summary(cm.meta)}" if "r2_all" in (cm.meta or {}) else ""
    return f"{what}\nsimulated: {traces} + {cm.name}{fit}"


def _line_style(conventions: Sequence[str], main: str) -> dict:
    """Solid for the main convention, dashed for the others."""
    return {c: ("-" if c == main else "--") for c in conventions}


def plot_leviathan(lev: pd.DataFrame, sim: pd.DataFrame, datasets: Sequence[str], title: str,
                   methods: Sequence[str] = SINGLE_PROPOSERS):
    """A panel per method: Leviathan's closed-form speedup vs k (a line per dataset, α in the legend)
    and the simulator's fixed-k speedups (open markers).

    ``lev``: :func:`sdlib.sim.closed_form.leviathan_table`; ``sim``: :func:`sdlib.sim.bounds.fixed_k_rows`.
    """
    fig, axes = new_figure(1, len(methods), width=5.2, height=4.0)
    for ax, meth in zip(axes[0], methods):
        for i, ds in enumerate(datasets):
            line = lev[(lev.method == meth) & (lev.dataset == ds)]
            s = sim[(sim.proposer == meth) & (sim.dataset == ds)]
            ax.plot(line.k, line.speedup, color=f"C{i}", label=f"{ds} (α={line.alpha.iloc[0]:.2f})")
            ax.plot(s.k, s.speedup, "o", color=f"C{i}", ms=6, mfc="white")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set(title=f"{meth}", xlabel="draft length k", ylabel="speedup over no SD (bs 1)")
        ax.set_xticks([1, 5, 10, 15, 20])
        ax.legend(fontsize=8, title="line: closed form; o: simulator", title_fontsize=8,
                  loc="upper left" if meth == "ngram" else "lower right")
    fig.suptitle(title, fontsize=11)
    return fig


def _batch_axis(ax, batch_sizes: Sequence[int]) -> None:
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])


def plot_vs_batch(t: pd.DataFrame, datasets: Sequence[str], predict_methods: Sequence[str],
                  conventions: Sequence[str], main: str, batch_sizes: Sequence[int], title: str,
                  proposers: Sequence[str] = SINGLE_PROPOSERS):
    """Speedup vs batch size (paper Fig. 10 form): a row per proposer, a column per dataset, a colour per
    predict method; ``main`` convention solid and thicker, the others dashed.

    ``t``: one cost model's rows of :func:`sdlib.sim.oracle.simulate`.
    """
    style = _line_style(conventions, main)
    fig, axes = new_figure(len(proposers), len(datasets), width=3.6, height=3.3, sharey="row")
    for r, prop in enumerate(proposers):
        for c, ds in enumerate(datasets):
            ax = axes[r][c]
            for i, pm in enumerate(predict_methods):
                for conv in conventions:
                    s = t[(t.proposer == prop) & (t.dataset == ds) & (t.predict_method == pm) & (t.convention == conv)]
                    ax.plot(s.batch_size, s.speedup, style[conv], marker="o", ms=3, color=f"C{i}",
                            lw=1.8 if conv == main else 1.0,
                            label=f"{pm} ({conv})" if (r, c) == (0, 0) else None)
            _batch_axis(ax, batch_sizes)
            ax.set(title=f"{prop} · {ds}", xlabel="batch size" if r == len(proposers) - 1 else "",
                   ylabel="speedup" if c == 0 else "")
    fig.legend(loc="lower center", ncol=len(predict_methods), fontsize=9, bbox_to_anchor=(0.5, -0.06))
    fig.suptitle(title, fontsize=12)
    return fig


def _unique_legend(axes_row) -> tuple[list, list]:
    """Handles and labels of a row of axes, each label once, in order of first appearance."""
    handles, labels = [], []
    for a in axes_row:
        for h, lab in zip(*a.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    return handles, labels


def plot_combine(t: pd.DataFrame, datasets: Sequence[str], proposers: Sequence[str], conventions: Sequence[str],
                 main: str, batch_sizes: Sequence[int], title: str, paper: Optional[pd.DataFrame] = None):
    """Oracle Proposal per proposer and Oracle Combine vs batch size (paper Fig. 12 form), a panel per dataset.

    ``t``: one cost model's ``ORACLE`` rows; ``paper``: cited numbers (``dataset, batch_size, speedup,
    short``; :data:`sdlib.sim.bounds.PAPER_BOUNDS`) drawn as black crosses with a note, never as ours.
    """
    style = _line_style(conventions, main)
    fig, axes = new_figure(1, len(datasets), width=3.6, height=3.6, sharey=True)
    for c, ds in enumerate(datasets):
        ax = axes[0][c]
        for i, prop in enumerate(proposers):
            for conv in conventions:
                s = t[(t.proposer == prop) & (t.dataset == ds) & (t.convention == conv)]
                ax.plot(s.batch_size, s.speedup, style[conv], marker="o", ms=3, color=f"C{i}",
                        lw=1.8 if conv == main else 1.0, label=f"Oracle {prop} ({conv})" if c == 0 else None)
        p = paper[paper.dataset == ds] if paper is not None else ()
        if len(p):
            ax.plot(p.batch_size, p.speedup, "kx", ms=8, mew=2, label="paper (cited), bs 1")
            ax.text(0.97, 0.97, "paper (cited), bs 1:\n" + "\n".join(f"× {q.short}" for _, q in p.iterrows()),
                    transform=ax.transAxes, ha="right", va="top", fontsize=8,
                    bbox=dict(boxstyle="round", fc="white", ec="grey"))
        _batch_axis(ax, batch_sizes)
        ax.set(title=ds, xlabel="batch size", ylabel="speedup" if c == 0 else "")
    handles, labels = _unique_legend(axes[0])
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, bbox_to_anchor=(0.5, -0.1))
    fig.suptitle(title, fontsize=12)
    return fig


@dataclass(frozen=True)
class StackStyle:
    """How :func:`plot_bounds_stack` dresses the bars (the two views of notebook 05 differ only in this)."""

    inner_labels: bool = True  # best fixed k's value and label written inside its bar
    top_format: str = "Combine {:.2f}"  # text on top of each stack, formatted with Combine's own speedup
    top_offset: float = 0.05  # its height above the stack (speedup units)
    top_fontsize: float = 7
    hline_color: str = "k"  # the speedup = 1 line
    wrap_names: bool = True  # dataset names split at "_" under the bars
    tick_fontsize: float = 9
    ylabel: str = "speedup over no SD"
    ylabel_first_only: bool = True
    ylim_headroom: Optional[float] = None  # None: matplotlib's limits; else top = headroom x the tallest stack
    legend_axis: int = 0  # the panel holding the legend
    legend_loc: str = "upper left"
    title_fontsize: float = 12


#: The authors' traces view (notebook 05, ``stacked``).
REFERENCE_STACK = StackStyle()
#: Our traces view (notebook 05, ``ourtraces_stack``).
OURS_STACK = StackStyle(inner_labels=False, top_format="{:.2f}", top_offset=0.03, top_fontsize=8, hline_color="grey",
                        wrap_names=False, tick_fontsize=8, ylabel="simulated speedup over no SD",
                        ylabel_first_only=False, ylim_headroom=1.15, legend_axis=-1, legend_loc="upper right",
                        title_fontsize=11)


def plot_bounds_stack(st: pd.DataFrame, datasets: Optional[Sequence[str]], batch_sizes: Sequence[int], title: str,
                      style: StackStyle = REFERENCE_STACK):
    """Stacked bars per dataset, a panel per batch size: best fixed k, + what Oracle Proposal adds, + what
    Oracle Combine adds; Combine's own speedup on top.

    ``st``: :func:`sdlib.sim.bounds.bounds_stack`; ``datasets``: bar order (None: sorted from ``st``).
    """
    datasets = sorted(st.dataset.unique()) if datasets is None else list(datasets)
    fig, axes = new_figure(1, len(batch_sizes), width=4.2, height=4.0, sharey=True)
    for ax, bs in zip(axes[0], batch_sizes):
        s = st[st.batch_size == bs].set_index("dataset").reindex(datasets)
        x = np.arange(len(datasets))
        ax.bar(x, s.best_fixed, color="C0", label="best fixed k")
        ax.bar(x, s.oracle_gain, bottom=s.best_fixed, color="C1", label="+ Oracle Proposal")
        ax.bar(x, s.combine_gain, bottom=s.best_fixed + s.oracle_gain, color="C2", label="+ Oracle Combine")
        for xi, (_, row) in zip(x, s.iterrows()):
            if style.inner_labels:
                ax.text(xi, row.best_fixed / 2, f"{row.best_fixed:.2f}\n{row.best_fixed_label}", ha="center",
                        va="center", fontsize=7, color="white")
            ax.text(xi, row.stack_top + style.top_offset, style.top_format.format(row.combine_oracle), ha="center",
                    va="bottom", fontsize=style.top_fontsize)
        ax.axhline(1, color=style.hline_color, lw=0.8)
        if style.ylim_headroom is not None:
            ax.set_ylim(0, style.ylim_headroom * float(st.stack_top.max()))
        names = [d.replace("_", "\n") for d in datasets] if style.wrap_names else datasets
        ax.set_xticks(x, names, fontsize=style.tick_fontsize)
        ax.set(title=f"bs {bs}",
               ylabel=style.ylabel if (bs == batch_sizes[0] or not style.ylabel_first_only) else "")
    axes[0][style.legend_axis].legend(fontsize=8, loc=style.legend_loc)
    fig.suptitle(title, fontsize=style.title_fontsize)
    return fig


def plot_conventions(cmp_: pd.DataFrame, proposers: Sequence[str], title: str, a: str = "authors",
                     b: str = "corrected"):
    """Every simulated cell's speedup under convention ``a`` (x) vs ``b`` (y), a colour per proposer, with
    the diagonal. ``cmp_``: :func:`sdlib.sim.bounds.compare_conventions`."""
    xa, yb = f"speedup_{a}", f"speedup_{b}"
    fig, axes = new_figure(1, 1, width=5.5, height=5.0)
    ax = axes[0][0]
    for i, prop in enumerate(proposers):
        s = cmp_[cmp_.proposer == prop]
        ax.scatter(s[xa], s[yb], s=14, color=f"C{i}", label=prop, alpha=0.8)
    lim = [min(cmp_[xa].min(), cmp_[yb].min()) * 0.95, max(cmp_[xa].max(), cmp_[yb].max()) * 1.05]
    ax.plot(lim, lim, color="grey", lw=0.8)
    labels = {"authors": "authors' convention", "corrected": "corrected convention"}
    ax.set(xlim=lim, ylim=lim, xlabel=f"speedup, {labels.get(a, a + ' convention')}",
           ylabel=f"speedup, {labels.get(b, b + ' convention')}")
    ax.legend(title="proposer")
    ax.set_title(title, fontsize=10)
    return fig
