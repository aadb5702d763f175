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

from sdlib.plots.style import log_axis_plain, new_figure


def _facets(df: pd.DataFrame, col: str) -> list:
    return sorted(df[col].dropna().unique().tolist())


def _dodge(i: int, n: int, spread: float = 0.06) -> float:
    """Multiplicative x offset of series ``i`` of ``n`` on a log axis, so error bars do not overlap."""
    return float(2 ** (spread * (i - (n - 1) / 2)))


def _yerr(d: pd.DataFrame, value: str, lo: str, hi: str) -> Optional[np.ndarray]:
    """Asymmetric error bars from interval columns (None when the table has none; NaN -> no bar)."""
    if lo not in d.columns or hi not in d.columns:
        return None
    v = d[value].to_numpy(float)
    return np.vstack([np.nan_to_num(v - d[lo].to_numpy(float)), np.nan_to_num(d[hi].to_numpy(float) - v)])


def _method_lines(ax, sub: pd.DataFrame, methods: list, y: str, colors: list) -> None:
    """One line per method label of ``sub`` (``y`` vs batch size, points dodged apart), with the
    ``<y>_lo``/``<y>_hi`` interval as error bars."""
    for i, m in enumerate(methods):
        s = sub[sub["method_label"] == m].sort_values("batch_size")
        if len(s):
            ax.errorbar(s["batch_size"] * _dodge(i, len(methods)), s[y], yerr=_yerr(s, y, f"{y}_lo", f"{y}_hi"),
                        fmt="o-", color=colors[i], label=m, capsize=2, lw=1.2, ms=4)


def _panel_width(datasets: list) -> float:
    """Inches per dataset panel: wider when there is one panel only."""
    return 4.8 if len(datasets) > 1 else 8.0


def _legend_outside(ax) -> None:
    """The legend right of ``ax``, where it hides no point."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)


def batch_tick_labels(bss: list, min_octaves: float = 0.25) -> list[str]:
    """Tick labels for batch sizes on a log2 axis in two lines: a size within ``min_octaves`` of the last label on
    the first line (63 beside 64, a threshold's two sides) goes on the second, so no two print over each other
    (unless both lines are taken, then the first)."""
    labels, last = [], [None, None]
    for b in bss:
        line = next((i for i in (0, 1) if last[i] is None or np.log2(b / last[i]) >= min_octaves), 0)
        labels.append("\n" * line + str(b))
        last[line] = b
    return labels


def _batch_axis(ax, sub: pd.DataFrame, ds) -> None:
    """The batch sizes of ``sub`` as plain x ticks, the axis label and the dataset as the panel title."""
    bss = sorted(sub["batch_size"].unique())
    ax.set_xticks(bss, batch_tick_labels(bss))
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_title(str(ds))


def plot_speedup(sp: pd.DataFrame, title: str, reference: Optional[pd.DataFrame] = None):
    """Speedup over no-SD vs batch size, one panel per dataset, one line per method (paper Fig. 1 form),
    with the interval of each point as an error bar (``speedup_lo``/``speedup_hi``, when present).

    ``reference``: optional rows (dataset, method_label, batch_size, speedup, source) drawn dashed
    and labelled as cited, never as ours.
    """
    d = sp[sp["method"] != "none"]
    datasets = _facets(d, "dataset")
    fig, axes = new_figure(1, max(len(datasets), 1), width=_panel_width(datasets), height=3.8, sharey=True)
    methods = _facets(d, "method_label")
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    for ax, ds in zip(axes[0], datasets or [None]):
        sub = d[d["dataset"] == ds]
        _method_lines(ax, sub, methods, "speedup", [colors[m] for m in methods])
        if reference is not None and len(reference):
            r = reference[reference["dataset"] == ds]
            for (m, src), s in r.groupby(["method_label", "source"]):
                ax.plot(s["batch_size"], s["speedup"], "s--", alpha=0.6, label=f"{m} ({src})")
        ax.axhline(1.0, color="grey", lw=1, ls=":")
        ax.set_xscale("log", base=2)
        _batch_axis(ax, sub, ds)
    axes[0][0].set_ylabel("speedup over no SD (×)")
    _legend_outside(axes[0][-1])
    fig.suptitle(title, fontsize=9)
    return fig


def plot_throughput(tp: pd.DataFrame, title: str):
    """Output tokens/s vs batch size, one panel per dataset, one line per method (no SD included), with
    each point's interval (``tok_per_s_lo``/``tok_per_s_hi``) as an error bar."""
    datasets = _facets(tp, "dataset")
    fig, axes = new_figure(1, max(len(datasets), 1), width=_panel_width(datasets), height=3.8, sharey=True)
    methods = _facets(tp, "method_label")
    for ax, ds in zip(axes[0], datasets or [None]):
        sub = tp[tp["dataset"] == ds]
        _method_lines(ax, sub, methods, "tok_per_s", [f"C{i % 10}" for i in range(len(methods))])
        ax.set_xscale("log", base=2)
        log_axis_plain(ax, "y")
        _batch_axis(ax, sub, ds)
    axes[0][0].set_ylabel("output tokens/s")
    _legend_outside(axes[0][-1])
    fig.suptitle(title, fontsize=9)
    return fig


def plot_acceptance_table(acc: pd.DataFrame, title: str, value: str = "mean_acceptance_length"):
    """Heatmap of mean acceptance length, method x workload (the paper's cheat-sheet form), each cell with
    its interval when ``acc`` has ``<value>_lo``/``<value>_hi``
    (:func:`sdlib.analysis.intervals.acceptance_intervals`)."""
    # deferred: seaborn is slow to import, and only this path needs it
    import seaborn as sns

    piv = acc.pivot_table(index="method_label", columns="dataset", values=value, aggfunc="first")
    fig, axes = new_figure(1, 1, width=2.6 + 1.5 * max(piv.shape[1], 1), height=2.2 + 0.6 * max(piv.shape[0], 1))
    ax = axes[0][0]
    if piv.size and np.isfinite(piv.to_numpy(dtype=float)).any():
        lo, hi = (acc.pivot_table(index="method_label", columns="dataset", values=f"{value}_{x}", aggfunc="first")
                  .reindex(index=piv.index, columns=piv.columns) if f"{value}_{x}" in acc.columns else piv * np.nan
                  for x in ("lo", "hi"))
        sns.heatmap(piv, annot=surface_annotations(piv, lo, hi), fmt="", annot_kws={"fontsize": 8}, cmap="viridis",
                    ax=ax, cbar_kws={"label": value.replace("_", " ")})
        ax.tick_params(axis="y", rotation=0)
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
    fig, axes = new_figure(1, 1, width=8.0, height=4.2)
    ax = axes[0][0]
    for ds, s in tp_none.groupby("dataset"):
        s = s.sort_values("batch_size")
        ax.errorbar(s["batch_size"], s["tok_per_s"], yerr=_yerr(s, "tok_per_s", "tok_per_s_lo", "tok_per_s_hi"),
                    fmt="o-", capsize=2, label=f"measured, no SD ({ds})")
    ax.plot(roof["batch_size"], roof["memory_bound_tok_per_s"], "--", color="grey", label="memory-bound roofline")
    ax.plot(roof["batch_size"], roof["compute_bound_tok_per_s"], ":", color="black", label="compute-bound roofline")
    ax.set_xscale("log", base=2)
    bss = sorted(set(roof["batch_size"]) | set(tp_none["batch_size"]))
    ax.set_xticks(bss, [str(b) for b in bss])
    ax.minorticks_off()
    log_axis_plain(ax, "y")
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig


def surface_annotations(piv: pd.DataFrame, lo: pd.DataFrame, hi: pd.DataFrame) -> np.ndarray:
    """Cell texts of the speedup surface: ``1.14`` over ``[1.05, 1.22]`` (the value alone without an interval)."""
    out = np.empty(piv.shape, dtype=object)
    for i in range(piv.shape[0]):
        for j in range(piv.shape[1]):
            v, a, b = piv.iat[i, j], lo.iat[i, j], hi.iat[i, j]
            out[i, j] = "" if pd.isna(v) else (f"{v:.2f}" if pd.isna(a) or pd.isna(b) else f"{v:.2f}\n[{a:.2f}, {b:.2f}]")
    return out


def plot_speedup_surface(sp: pd.DataFrame, title: str, method_axis: str = "method"):
    """Heatmaps of measured speedup, method (rows) x batch size (columns), one panel per dataset (nothing
    averaged over datasets); each cell gives the speedup and its interval; below 1 shows red.
    ``method_axis``: the method axis label (:func:`sdlib.plots.titles.method_axis_label`)."""
    # deferred: seaborn is slow to import, and only this path needs it
    import seaborn as sns

    d = sp[sp["method"] != "none"]
    datasets = _facets(d, "dataset") or [None]
    n_bs = max(d["batch_size"].nunique(), 1)
    n_m = max(d["method_label"].nunique(), 1)
    fig, axes = new_figure(1, len(datasets), width=max(4.6, 1.6 + 0.95 * n_bs), height=max(3.4, 1.9 + 0.5 * n_m),
                           sharey=True)
    vals = d["speedup"].astype(float)
    span = max(abs(vals.max() - 1.0), abs(1.0 - vals.min()), 0.05) if len(vals) else 1.0
    for k, (ax, ds) in enumerate(zip(axes[0], datasets)):
        sub = d[d["dataset"] == ds] if ds is not None else d
        piv = sub.pivot_table(index="method_label", columns="batch_size", values="speedup", aggfunc="first")
        if piv.size:
            cols = {c: sub.pivot_table(index="method_label", columns="batch_size", values=c, aggfunc="first")
                    .reindex(index=piv.index, columns=piv.columns) if c in sub.columns else piv * np.nan
                    for c in ("speedup_lo", "speedup_hi")}
            sns.heatmap(piv, annot=surface_annotations(piv, cols["speedup_lo"], cols["speedup_hi"]), fmt="",
                        annot_kws={"fontsize": 7}, cmap="RdYlGn", vmin=1 - span, vmax=1 + span, ax=ax,
                        cbar=k == len(datasets) - 1, cbar_kws={"label": "speedup over no SD (×)"})
        ax.set_xlabel("batch size")
        ax.set_ylabel(method_axis if k == 0 else "")
        ax.set_title(str(ds) if ds is not None else "", fontsize=10)
    fig.suptitle(title, fontsize=9)
    return fig
