"""Notebook 03's figures: acceptance along the output, per-request spread, the cheat sheet, greedy drift;
and the sources it draws them for (the authors' traces, our traces, our sweeps), each titled from provenance.

Usage:
    from sdlib.plots.variance import variance_sources, plot_cheat_sheet, cheat_sheet_grid
    for s in variance_sources(k=3, datasets=["gsm8k"]):
        fig = plot_cheat_sheet(cheat_sheet_grid(V.cheat_sheet(s.gains)), s.title)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import seaborn as sns

from sdlib.analysis import variance as V
from sdlib.plots.style import new_figure
from sdlib.plots.titles import our_sweep_title, traces_title
from sdlib.sim.traces import load_our_traces, load_reference_traces

#: Columns that identify one (request, method) pair of a gains table.
PAIR_KEYS = ["dataset", "method", "k", "batch_size", "run_id", "request_id"]


@dataclass
class Source:
    """One input of notebook 03: its verify steps (``gains``, :data:`sdlib.analysis.variance.GAIN_COLUMNS`),
    title, figure-name parameters (``tag``), and for our sweeps their ``runs`` / ``requests`` tables.

    ``plot_gains`` / ``plot_title``: what the position and box plots draw: a sweep's steps at one
    batch size (:func:`at_batch_size`), the traces' steps as they are.
    """

    key: str
    title: str
    gains: pd.DataFrame
    tag: dict
    runs: Optional[pd.DataFrame] = None
    requests: Optional[pd.DataFrame] = None
    plot_gains: pd.DataFrame = field(default=None, repr=False)
    plot_title: str = ""

    def __post_init__(self):
        if self.plot_gains is None:
            self.plot_gains, self.plot_title = self.gains, self.title

    @property
    def is_sweep(self) -> bool:
        return self.runs is not None

    def summary(self) -> str:
        """``<title>: <n> verify steps, <m> (request, method) pairs``."""
        g = self.gains
        n_req = g[PAIR_KEYS].drop_duplicates().shape[0]
        return f"{self.title}: {len(g):,} verify steps, {n_req:,} (request, method) pairs"


def at_batch_size(gains: pd.DataFrame, batch_size: Optional[int] = None) -> tuple[pd.DataFrame, int]:
    """The steps at ``batch_size`` (None: the smallest present), and that batch size."""
    bs = batch_size if batch_size is not None else int(gains["batch_size"].min())
    return gains[gains["batch_size"] == bs], bs


def reference_source(datasets: Sequence[str], k: int, authors_shift: bool = False) -> Source:
    """The authors' traces replayed as a fixed-k chain."""
    gains = V.trace_gains(load_reference_traces(datasets), k=k, authors_shift=authors_shift)
    return Source("reference", f"authors' traces, Llama-3.1-8B, H100 (k={k})", gains, {"source": "reference", "k": k})


def ourtraces_source(ours: pd.DataFrame, k: int) -> Source:
    """Our teacher-forced traces (:func:`sdlib.sim.traces.load_our_traces`) replayed as a fixed-k chain."""
    gains = V.trace_gains(ours, k=k, model="tiny-target", source="ourtraces")
    return Source("ourtraces", f"{traces_title(ours)} (k={k})", gains, {"source": "ourtraces", "k": k})


def sweep_source(sweep_dir: str | Path, batch_size: Optional[int] = None) -> Source:
    """One of our sweeps: its verify steps, and the ones at ``batch_size`` (None: smallest) for the plots."""
    d = Path(sweep_dir)
    t = V.load_sweep_tables(d)
    s = Source(d.name, our_sweep_title(d, t["runs"]),
               V.sweep_gains(t["runs"], t["requests"], t["steps"], source=f"sweep:{d.name}"),
               {"source": d.name}, runs=t["runs"], requests=t["requests"])
    if len(s.gains):
        s.plot_gains, bs = at_batch_size(s.gains, batch_size)
        s.plot_title = s.title + f", bs {bs}"
    return s


def variance_sources(use_reference: bool = True, datasets: Sequence[str] = (), k: int = 3, authors_shift: bool = False,
                     our_traces: Sequence[str] = (), sweep_dirs: Sequence[str | Path] = (),
                     sweep_batch_size: Optional[int] = None) -> list[Source]:
    """Every source notebook 03 draws, in order: the authors' traces (if ``use_reference``), our traces
    (globs ``our_traces``; skipped with a note when none match or their k is below ``k``), our sweeps."""
    sources = []
    if use_reference:
        sources.append(reference_source(datasets, k, authors_shift))
    ours = load_our_traces(our_traces or [])
    if len(ours) and int(ours.k.min()) < k:
        print(f"note: our traces have k={int(ours.k.min())} < K={k}: skipped")
    elif len(ours):
        sources.append(ourtraces_source(ours, k))
    else:
        print(f"note: no trace files match {our_traces}: skipped (python -m sdlib traces writes them)")
    sources += [sweep_source(d, sweep_batch_size) for d in sweep_dirs]
    return sources


def series_label(df: pd.DataFrame) -> pd.Series:
    """Legend label of a row: method and k."""
    return df["method"].astype(str) + " (k=" + df["k"].astype(str) + ")"


def plot_position_bins(pb: pd.DataFrame, title: str):
    """Mean tokens gained per step along the output, a panel per dataset, a colour per method (k),
    markers/dashes for short and long outputs, a band for each curve's interval when ``pb`` has
    ``mean_gained_lo/hi``. ``pb``: :func:`sdlib.analysis.variance.position_bins`; ``title``: the source's."""
    pb = pb.assign(series=series_label(pb))
    datasets = sorted(pb["dataset"].unique())
    series = sorted(pb["series"].unique())
    palette = {s_: f"C{i % 10}" for i, s_ in enumerate(series)}
    fig, axes = new_figure(1, len(datasets), width=4.2, height=3.6, sharey=True)
    for ax, ds in zip(axes[0], datasets):
        d = pb[pb["dataset"] == ds]
        sns.lineplot(data=d, x="bin_mid", y="mean_gained", hue="series", hue_order=series, palette=palette,
                     style="length_class", style_order=["short", "long"], markers=True, ax=ax,
                     legend=ax is axes[0][-1])
        if "mean_gained_lo" in d.columns:  # 95% interval over requests, a band per curve
            for (ser, _), c in d.sort_values("bin_mid").groupby(["series", "length_class"]):
                ax.fill_between(c["bin_mid"], c["mean_gained_lo"].astype(float), c["mean_gained_hi"].astype(float),
                                color=palette[ser], alpha=0.15, lw=0)
        ax.set(title=ds, xlabel="relative position in output", ylabel="mean tokens gained / step", xlim=(0, 1))
    if axes[0][-1].get_legend() is not None:
        sns.move_legend(axes[0][-1], "upper left", bbox_to_anchor=(1.02, 1), title=None, frameon=False)
    fig.suptitle(f"Acceptance along the output — {title}", fontsize=10)
    return fig


def plot_request_boxplot(rm: pd.DataFrame, title: str, whis: tuple[float, float] = (5, 95)):
    """Box plot of per-request mean acceptance length per dataset, a box per method (k), whiskers at the
    ``whis`` percentiles, no fliers. ``rm``: :func:`sdlib.analysis.variance.request_means`; ``title``: the
    source's."""
    rm = rm.assign(series=series_label(rm))
    fig, axes = new_figure(1, 1, width=8.0, height=4.2)
    ax = axes[0][0]
    sns.boxplot(data=rm, x="dataset", y="mean_acc_len", hue="series", whis=whis, showfliers=False, ax=ax)
    ax.set(xlabel=None, ylabel="per-request mean acceptance length",
           title=f"Per-request mean acceptance length, whiskers {whis[0]}–{whis[1]}th pct\n{title}")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1), title=None, frameon=False)
    return fig


def cheat_sheet_grid(cs: pd.DataFrame, value: str = "mean_acc_len") -> pd.DataFrame:
    """The cheat sheet (:func:`sdlib.analysis.variance.cheat_sheet`) as a grid: a row per method (k) — and
    batch size when there are several —, a column per dataset, ``value`` (mean acceptance length, or its
    ``_lo``/``_hi``) in the cells."""
    multi_bs = cs["batch_size"].nunique() > 1
    cs = cs.sort_values(["method", "k", "batch_size"])
    cs["row"] = series_label(cs) + (", bs " + cs["batch_size"].astype(str) if multi_bs else "")
    return cs.pivot(index="row", columns="dataset", values=value).loc[cs["row"].unique()]


def plot_cheat_sheet(grid: pd.DataFrame, title: str, lo: Optional[pd.DataFrame] = None,
                     hi: Optional[pd.DataFrame] = None):
    """Heatmap of :func:`cheat_sheet_grid`, annotated, sized to the grid; with ``lo``/``hi`` grids (the
    interval's ends) each cell shows its interval under the value."""
    # deferred: sdlib.plots.throughput loads pandas, and only this path needs it
    from sdlib.plots.throughput import surface_annotations

    ci = lo is not None and hi is not None
    fig, axes = new_figure(1, 1, width=(1.9 if ci else 1.6) * grid.shape[1] + 2.5,
                           height=(0.75 if ci else 0.55) * grid.shape[0] + 1.6)
    ax = axes[0][0]
    annot = surface_annotations(grid, lo.reindex_like(grid), hi.reindex_like(grid)) if ci else True
    sns.heatmap(grid, annot=annot, fmt="" if ci else ".2f", annot_kws={"fontsize": 8} if ci else None, cmap="viridis",
                vmin=1, cbar_kws={"label": "mean acceptance length"}, ax=ax)
    ax.set(xlabel=None, ylabel=None, title=f"Mean acceptance length\n{title}")
    ax.tick_params(axis="y", rotation=0)
    return fig


def _lines_with_bars(ax, d: pd.DataFrame, y: str, hue: str, style: Optional[str] = None, legend: bool = True) -> None:
    """A line per ``hue`` (and ``style``) value vs batch size, with ``<y>_lo``/``<y>_hi`` as error bars."""
    hues = sorted(d[hue].astype(str).unique())
    styles = sorted(d[style].astype(str).unique()) if style else [None]
    marks = ["o", "s", "^", "D", "v"]
    for i, h in enumerate(hues):
        for j, st in enumerate(styles):
            s = d[(d[hue].astype(str) == h) & ((d[style].astype(str) == st) if style else True)].sort_values("batch_size")
            if s.empty:
                continue
            v = s[y].astype(float).to_numpy()
            err = None
            if f"{y}_lo" in s.columns:
                err = np.vstack([np.nan_to_num(v - s[f"{y}_lo"].astype(float).to_numpy()),
                                 np.nan_to_num(s[f"{y}_hi"].astype(float).to_numpy() - v)])
            ax.errorbar(s["batch_size"], v, yerr=err, color=f"C{i % 10}", marker=marks[j % len(marks)], capsize=2,
                        ls="-" if j == 0 else "--", label=h if st is None else f"{h}, {st}")
    if legend:
        ax.legend(fontsize="small")


def plot_greedy_drift(drift: pd.DataFrame, lossless: pd.DataFrame, title: str):
    """Three panels vs batch size: no-SD mean output length, fraction of no-SD outputs that differ from
    the smallest batch size's (:func:`sdlib.analysis.variance.greedy_drift`), and fraction of SD outputs
    identical to the no-SD one (:func:`sdlib.analysis.variance.lossless_check`), each with its 95% interval
    (bootstrap over requests for the length, Wilson for the fractions) as error bars; an empty table leaves
    its panels blank."""
    fig, axes = new_figure(1, 3, width=4.2, height=3.6)
    if not drift.empty:
        _lines_with_bars(axes[0][0], drift, "mean_output_tokens", "dataset")
        _lines_with_bars(axes[0][1], drift, "frac_differ", "dataset", legend=False)
        axes[0][0].set(title="no SD: mean output length", ylabel="output tokens")
        axes[0][1].set(title="no SD: output differs from smallest bs", ylabel="fraction of requests", ylim=(-0.02, 1.02))
    if not lossless.empty:
        _lines_with_bars(axes[0][2], lossless, "frac_identical", "method_label", style="dataset", legend=False)
        axes[0][2].legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize="small")
        axes[0][2].set(title="SD output identical to no-SD output", ylabel="fraction of requests", ylim=(-0.02, 1.02))
    bss = sorted(set(drift.get("batch_size", [])) | set(lossless.get("batch_size", [])))
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bss, [str(b) for b in bss])
        ax.minorticks_off()
        ax.set_xlabel("batch size")
    fig.suptitle(f"Greedy drift — {title}\nerror bars: 95% CI (length: bootstrap over requests; fractions: Wilson)",
                 fontsize=10)
    return fig
