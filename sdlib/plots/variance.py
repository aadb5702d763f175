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
    markers/dashes for short and long outputs. ``pb``: :func:`sdlib.analysis.variance.position_bins`;
    ``title``: the source's."""
    pb = pb.assign(series=series_label(pb))
    datasets = sorted(pb["dataset"].unique())
    fig, axes = new_figure(1, len(datasets), width=4.2, height=3.6, sharey=True)
    for ax, ds in zip(axes[0], datasets):
        sns.lineplot(data=pb[pb["dataset"] == ds], x="bin_mid", y="mean_gained", hue="series",
                     style="length_class", style_order=["short", "long"], markers=True, ax=ax,
                     legend=ax is axes[0][-1])
        ax.set(title=ds, xlabel="relative position in output", ylabel="mean tokens gained / step", xlim=(0, 1))
    if axes[0][-1].get_legend() is not None:
        sns.move_legend(axes[0][-1], "upper left", bbox_to_anchor=(1.02, 1), title=None, frameon=False)
    fig.suptitle(f"Acceptance along the output — {title}", y=1.02)
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


def cheat_sheet_grid(cs: pd.DataFrame) -> pd.DataFrame:
    """The cheat sheet (:func:`sdlib.analysis.variance.cheat_sheet`) as a grid: a row per method (k) — and
    batch size when there are several —, a column per dataset, mean acceptance length in the cells."""
    multi_bs = cs["batch_size"].nunique() > 1
    cs = cs.sort_values(["method", "k", "batch_size"])
    cs["row"] = series_label(cs) + (", bs " + cs["batch_size"].astype(str) if multi_bs else "")
    return cs.pivot(index="row", columns="dataset", values="mean_acc_len").loc[cs["row"].unique()]


def plot_cheat_sheet(grid: pd.DataFrame, title: str):
    """Heatmap of :func:`cheat_sheet_grid`, annotated, sized to the grid."""
    fig, axes = new_figure(1, 1, width=1.6 * grid.shape[1] + 2.5, height=0.55 * grid.shape[0] + 1.6)
    ax = axes[0][0]
    sns.heatmap(grid, annot=True, fmt=".2f", cmap="viridis", vmin=1, cbar_kws={"label": "mean acceptance length"}, ax=ax)
    ax.set(xlabel=None, ylabel=None, title=f"Mean acceptance length\n{title}")
    ax.tick_params(axis="y", rotation=0)
    return fig


def plot_greedy_drift(drift: pd.DataFrame, lossless: pd.DataFrame, title: str):
    """Three panels vs batch size: no-SD mean output length, fraction of no-SD outputs that differ from
    the smallest batch size's (:func:`sdlib.analysis.variance.greedy_drift`), and fraction of SD outputs
    identical to the no-SD one (:func:`sdlib.analysis.variance.lossless_check`); an empty table leaves
    its panels blank."""
    fig, axes = new_figure(1, 3, width=4.2, height=3.6)
    if not drift.empty:
        sns.lineplot(data=drift, x="batch_size", y="mean_output_tokens", hue="dataset", marker="o", ax=axes[0][0])
        sns.lineplot(data=drift, x="batch_size", y="frac_differ", hue="dataset", marker="o", ax=axes[0][1], legend=False)
        axes[0][0].set(title="no SD: mean output length", ylabel="output tokens")
        axes[0][0].legend(title=None, fontsize="small")
        axes[0][1].set(title="no SD: output differs from smallest bs", ylabel="fraction of requests", ylim=(-0.02, 1.02))
    if not lossless.empty:
        sns.lineplot(data=lossless, x="batch_size", y="frac_identical", hue="method_label", style="dataset",
                     marker="o", ax=axes[0][2])
        axes[0][2].set(title="SD output identical to no-SD output", ylabel="fraction of requests", ylim=(-0.02, 1.02))
        sns.move_legend(axes[0][2], "upper left", bbox_to_anchor=(1.02, 1), title=None, frameon=False)
    bss = sorted(set(drift.get("batch_size", [])) | set(lossless.get("batch_size", [])))
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bss, [str(b) for b in bss])
        ax.minorticks_off()
    fig.suptitle(f"Greedy drift — {title}", y=1.02)
    return fig
