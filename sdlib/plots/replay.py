"""Notebook 06's figures: trace replay in a real engine (calibration, the price of K, simulated vs measured,
the measured bounds stack, speedup vs batch size with real acceptance).

Usage:
    from sdlib.plots.replay import plot_calibration
    fig = plot_calibration(calibration_table(batches, info), title)
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.patches import Patch, Rectangle

from sdlib.analysis.powered import VERDICTS
from sdlib.analysis.replay import DEFAULT_GRAPH_MODE, graph_mode
from sdlib.plots.bounds import REFERENCE_STACK, plot_bounds_stack
from sdlib.plots.style import interval_bars, log_axis_plain, new_figure
from sdlib.store.provenance import recorded_engine

#: colours per policy family
FAMILY_COLORS = {"fixed": "C0", "oracle": "C1", "combine": "C2"}
#: replay policies that are not per-step choices (left out of the "vs best fixed k" panel)
CALIBRATION_OR_FIXED = ("fixed", "accept_all", "accept_none", "propose_nothing")
#: marker per engine path
PATH_MARKERS = {"eagle3": "o", "ngram": "s", "draft_model": "^", "eagle": "v"}


def plot_calibration(cal: pd.DataFrame, title: str, tolerance: float = 0.03):
    """Replay / synthetic tok/s per batch size (accept all vs L = K + 1; accept none vs L = 1) with the
    paired interval, inside the ± ``tolerance`` band."""
    fig, axes = new_figure(1, 1, width=5.6, height=3.6)
    ax = axes[0][0]
    kinds = list(dict.fromkeys(cal["kind"]))
    bss = sorted(cal["batch_size"].unique())
    w = 0.8 / max(len(kinds), 1)
    for i, kind in enumerate(kinds):
        d = cal[cal["kind"] == kind].set_index("batch_size").reindex(bss)
        x = np.arange(len(bss)) + (i - (len(kinds) - 1) / 2) * w
        L = int(d["synthetic_L"].dropna().iloc[0])
        ax.errorbar(x, d["ratio"], yerr=interval_bars(d, "ratio", "ratio_lo", "ratio_hi"), fmt="o", capsize=3,
                    label=f"replay {kind.replace('_', ' ')} / synthetic L={L}")
    ax.axhspan(1 - tolerance, 1 + tolerance, color="grey", alpha=0.15, label=f"±{100 * tolerance:.0f}%")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xticks(np.arange(len(bss)), [str(b) for b in bss])
    ax.set(xlabel="batch size", ylabel="tok/s ratio (95% CI over prompts)")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title, fontsize=9)
    return fig


def plot_price_of_k(costs: pd.DataFrame, title: str):
    """Median engine-step time (interquartile bar) vs K per engine path, a line per batch size; the no-SD
    step at K = 0."""
    paths = [p for p in ("eagle3", "ngram") if costs["engine"].str.startswith(p).any()]
    fig, axes = new_figure(1, len(paths), width=4.4, height=3.6, sharey=True)
    base = costs[costs["engine"] == "none"]
    for ax, path in zip(axes[0], paths):
        d = costs[costs["engine"].str.startswith(path) & costs["replay"].isin(["fixed", "oracle"])]
        for j, (bs, g) in enumerate(d.groupby("batch_size")):
            g = g.groupby("K").agg(step_ms=("step_ms", "median"), q25=("step_ms_q25", "median"),
                                   q75=("step_ms_q75", "median")).reset_index()
            b = base[base["batch_size"] == bs]
            ks = [0] + g["K"].tolist()
            ms = [float(b["step_ms"].iloc[0]) if len(b) else np.nan] + g["step_ms"].tolist()
            ax.plot(ks, ms, marker="o", color=f"C{j}", label=f"bs {bs}")
            ax.vlines(g["K"], g["q25"], g["q75"], color=f"C{j}", lw=1)
        ax.set(title=f"{path} path", xlabel="K = num_speculative_tokens (0: no SD)",
               ylabel="median engine step, ms" if path == paths[0] else "")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    return fig


def plot_sim_vs_measured(cmp_: pd.DataFrame, predictors: Sequence[str], title: str):
    """Predicted (y) vs measured (x, 95% CI) speedup per replayed cell, a panel per predictor, colour =
    policy family, marker = engine path; the diagonal is a perfect prediction."""
    fig, axes = new_figure(1, len(predictors), width=4.0, height=4.0, sharex=True, sharey=True)
    hi = float(max(cmp_["speedup_hi"].max(), cmp_["speedup_sim"].max())) * 1.05
    for ax, pred in zip(axes[0], predictors):
        d = cmp_[cmp_["predictor"] == pred]
        for (fam, path), g in d.groupby(["replay", "method"]):
            ax.errorbar(g["speedup"], g["speedup_sim"], xerr=interval_bars(g, "speedup", "speedup_lo", "speedup_hi"),
                        fmt=PATH_MARKERS.get(path, "o"), color=FAMILY_COLORS.get(fam, "k"), ms=4, alpha=0.8,
                        elinewidth=0.6, label=f"{path} {fam}")
        ax.plot([0, hi], [0, hi], color="grey", lw=0.8)
        err = (d["speedup_sim"] / d["speedup"] - 1).abs()
        ax.set(xlim=(0, hi), ylim=(0, hi), xlabel="measured speedup (H200)", title=f"{pred}\nmedian |error| "
               f"{100 * float(err.median()):.0f}%")
    axes[0][0].set_ylabel("predicted speedup")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.08))
    fig.suptitle(title, fontsize=9)
    return fig


def plot_stacks(measured: pd.DataFrame, simulated: pd.DataFrame, datasets: Sequence[str],
                batch_sizes: Sequence[int], title_measured: str, title_simulated: str):
    """The bounds stack (best fixed, + Oracle Proposal, + Oracle Combine) measured (with the best Combine's
    interval as a whisker) and simulated over the same cells; two figures."""
    style = dataclasses.replace(REFERENCE_STACK, legend_axis=-1, legend_loc="upper right")
    fm = plot_bounds_stack(measured, datasets, batch_sizes, title_measured, style)
    for ax, bs in zip(fm.axes, batch_sizes):
        s = measured[measured["batch_size"] == bs].set_index("dataset").reindex(list(datasets))
        top = s["combine_oracle"]
        ax.errorbar(np.arange(len(datasets)), top, yerr=interval_bars(s, "combine_oracle", "combine_oracle_lo",
                                                             "combine_oracle_hi"), fmt="none", color="k", capsize=3)
    fs = plot_bounds_stack(simulated, datasets, batch_sizes, title_simulated, style)
    return fm, fs


def plot_speedup_vs_batch(sp: pd.DataFrame, labels: Sequence[str], title: str,
                          ylabel: str = "measured speedup over no SD", value: str = "speedup"):
    """Measured speedup vs batch size with its 95% band, a panel per dataset, a line per policy; ``value``:
    the column drawn (its interval in ``<value>_lo``/``<value>_hi``)."""
    ds = sorted(sp["dataset"].unique())
    fig, axes = new_figure(1, len(ds), width=3.6, height=3.6, sharey=True)
    for ax, d in zip(axes[0], ds):
        for i, lab in enumerate(labels):
            g = sp[(sp["dataset"] == d) & (sp["method_label"] == lab)].sort_values("batch_size")
            if g.empty:
                continue
            ax.plot(g["batch_size"], g[value], marker="o", ms=3, color=f"C{i % 10}", label=lab,
                    ls="-" if i < 10 else "--")
            ax.fill_between(g["batch_size"], g[f"{value}_lo"], g[f"{value}_hi"], color=f"C{i % 10}", alpha=0.15)
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        bss = sorted(sp["batch_size"].unique())
        ax.set_xticks(bss, [str(b) for b in bss])
        ax.set(title=d, xlabel="batch size", ylabel=ylabel if d == ds[0] else "")
    handles: dict = {}
    for ax in axes[0]:  # every label once, even one a panel lacks
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    # legend right of the panels (a row of them below hid the x labels once there were more than 4 lines)
    fig.legend(list(handles.values()), list(handles), loc="center left", fontsize=8, bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(title, fontsize=9)
    return fig


def replay_title(store, what: str = "", acceptance: Optional[str] = None) -> str:
    """``<what>\\n<sweep>: <model> (<weights>), acceptance replayed from <traces>; <device>, vLLM <v>``, from
    the sweep's provenance (what produced the data, for every figure of notebook 06), with ``, CUDA graphs <mode>``
    where a GPU sweep's config sets a mode other than vLLM's default (:func:`sdlib.analysis.replay.graph_mode`);
    ``acceptance`` replaces the acceptance clause where a sweep's methods fix acceptance themselves (calibration,
    controls)."""
    prov = store.read_provenance()
    cfg = prov.get("config", {})
    cards = {k: v for inv in prov.get("invocations", []) for k, v in inv.get("models", {}).items()}
    models = []
    for m in cfg.get("models", []):
        card = cards.get(m.get("name"), {})
        weights = "dummy weights" if m.get("load_format") == "dummy" else (
            "trained" if card.get("trained") else ("random weights" if card.get("random_weights") else ""))
        models.append(f"{m.get('name')} ({weights}, pinned)" if weights else m.get("name"))
    srcs = sorted({"the authors' Llama-3.1-8B/H100 traces" if w.get("source") == "reference"
                   else f"our traces ({w.get('path')})" for w in cfg.get("workloads", [])})
    device, ver = recorded_engine(prov, "device"), recorded_engine(prov, "vllm_version")
    acc = acceptance or f"acceptance replayed from {' and '.join(srcs)}"
    line = f"{prov.get('sweep', store.dir.name)}: {', '.join(models)}; {acc}; {device.replace('CPU: ', 'CPU ')}, vLLM {ver}"
    mode = graph_mode(prov)
    if mode != DEFAULT_GRAPH_MODE and device and not device.startswith("CPU"):  # CPU: eager, no graphs to name
        line += f", CUDA graphs {mode}"
    return f"{what}\n{line}" if what else line


def plot_hook_control(ctl: pd.DataFrame, title: str):
    """The n-gram path's hook-off control: median engine step (bar: interquartile range) per batch size, a
    marker per engine method (filled: replay hooks installed), one panel per vLLM version and CUDA-graph mode."""
    panel = "CUDA graphs: " + ctl["graph_mode"].astype(str)
    ctl = ctl.assign(panel=("vLLM " + ctl["vllm"].astype(str) + ", " + panel) if "vllm" in ctl else panel)
    modes = list(dict.fromkeys(ctl["panel"]))
    labels = list(dict.fromkeys(ctl.sort_values(["hooks", "K", "method_label"])["method_label"]))
    bss = sorted(ctl["batch_size"].unique())
    fig, axes = new_figure(1, len(modes), width=5.2, height=3.8, sharey=True)
    w = 0.8 / max(len(labels), 1)
    handles = {}
    for ax, mode in zip(axes[0], modes):
        for i, lab in enumerate(labels):
            d = ctl[(ctl["panel"] == mode) & (ctl["method_label"] == lab)].set_index("batch_size").reindex(bss)
            if d["step_ms"].isna().all():
                continue
            x = np.arange(len(bss)) + (i - (len(labels) - 1) / 2) * w
            hooked = bool(d["hooks"].dropna().iloc[0])
            h = ax.errorbar(x, d["step_ms"], yerr=interval_bars(d, "step_ms", "step_ms_q25", "step_ms_q75"), fmt="o",
                            capsize=2, color=f"C{i}", mfc=f"C{i}" if hooked else "white")
            handles.setdefault(lab + (" (hooks)" if hooked else ""), h)
        ax.set_xticks(np.arange(len(bss)), [str(b) for b in bss])
        ax.set(title=mode, xlabel="batch size",
               ylabel="median engine step, ms (IQR)" if mode == modes[0] else "")
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=9, y=1.04)
    return fig


def plot_graph_modes(cmp_: pd.DataFrame, title: str, datasets: Optional[Sequence[str]] = None):
    """The same replayed cells under each CUDA-graph mode: top, speedup over the mode's own no-SD cells (95%
    interval) per method (filled: the later mode, hollow: the first); bottom, each per-step policy (Oracle
    Proposal, online, adaptive rules) relative to the best fixed k of the same mode and cell (paired 95%
    interval)."""
    modes = list(dict.fromkeys(cmp_["graph_mode"]))
    ds = list(datasets or dict.fromkeys(cmp_["dataset"]))
    labels = list(dict.fromkeys(cmp_.sort_values(["replay", "K"])["method_label"]))
    bss = sorted(cmp_["batch_size"].unique())
    fig, axes = new_figure(2, len(ds), width=4.6, height=3.2, sharey="row")
    w = 0.8 / max(len(labels) * len(modes), 1)
    handles = {}
    for j, d in enumerate(ds):
        top, bot = axes[0][j], axes[1][j]
        for i, lab in enumerate(labels):
            for m, mode in enumerate(modes):
                g = cmp_[(cmp_["dataset"] == d) & (cmp_["method_label"] == lab) & (cmp_["graph_mode"] == mode)]
                g = g.set_index("batch_size").reindex(bss)
                if g["speedup"].isna().all():
                    continue
                x = np.arange(len(bss)) + ((i * len(modes) + m) - (len(labels) * len(modes) - 1) / 2) * w
                face = f"C{i}" if m == len(modes) - 1 else "white"
                h = top.errorbar(x, g["speedup"], yerr=interval_bars(g, "speedup", "speedup_lo", "speedup_hi"), fmt="o",
                                 capsize=2, color=f"C{i}", mfc=face)
                handles.setdefault(f"{lab}, {mode}", h)
                if set(g["replay"].dropna()) - set(CALIBRATION_OR_FIXED):
                    bot.errorbar(x, g["vs_best_fixed"], yerr=interval_bars(g, "vs_best_fixed", "vs_best_fixed_lo",
                                                                  "vs_best_fixed_hi"),
                                 fmt="o", capsize=2, color=f"C{i}", mfc=face)
        top.axhline(1, color="grey", lw=0.8)
        bot.axhline(1, color="grey", lw=0.8)
        top.set_title(d, fontsize=9)
        for ax in (top, bot):
            ax.set_xticks(np.arange(len(bss)), [str(b) for b in bss])
        bot.set_xlabel("batch size")
    axes[0][0].set_ylabel("speedup over no SD\n(same graph mode, 95% CI)")
    axes[1][0].set_ylabel("per-step policy /\nbest fixed k (paired 95% CI)")
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=9, y=1.04)
    return fig


def plot_powered(headline: pd.DataFrame, aa: pd.DataFrame, title: str, ncols: int = 3):
    """A powered sweep's comparisons (:mod:`sdlib.analysis.powered`), one panel per (dataset, batch size), three
    to a row: each policy over the best fixed arm (dot, 95% interval over cells and prompts; filled =
    established) and the A/A pair (diamond: grey when its interval contains 1, red when not, which leaves the
    block's differences unestablished)."""
    blocks = list(headline[["dataset", "batch_size"]].drop_duplicates().itertuples(index=False, name=None))
    n = max(len(blocks), 1)
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    width = 4.2 if ncols > 1 else 5.6  # one panel: room for its arms' names and the title
    fig, axes = new_figure(nrows, ncols, width=width, height=3.8 if ncols > 1 else 5.2, sharey=True)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(blocks):]:
        ax.set_visible(False)
    for ax, (ds, bs) in zip(flat, blocks):
        h = headline[(headline["dataset"] == ds) & (headline["batch_size"] == bs)].reset_index(drop=True)
        a = aa[(aa["dataset"] == ds) & (aa["batch_size"] == bs)]
        ax.axhline(1, color="grey", lw=0.8)
        labels = []
        arms = [*h["arm"], *h["best_fixed"]]
        prefix = os.path.commonprefix(arms)
        prefix = prefix[:prefix.rfind("-") + 1] if len(arms) > 1 else ""
        for i, r in h.iterrows():
            ax.errorbar([i], [r.ratio], yerr=[[r.ratio - r.ratio_lo], [r.ratio_hi - r.ratio]], fmt="o", capsize=3,
                        color="C0", mfc="C0" if r.established else "white")
            labels.append(r.arm[len(prefix):])
        for j, r in enumerate(a.itertuples(), start=len(h)):
            ax.errorbar([j], [r.ratio], yerr=[[r.ratio - r.ratio_lo], [r.ratio_hi - r.ratio]], fmt="D", capsize=3,
                        color="0.4" if r.contains_1 else "C3")
            labels.append("A/A")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", rotation_mode="anchor", fontsize=7)
        best = h["best_fixed"].iloc[0][len(prefix):] if len(h) else ""
        cells = int(h["n_cells"].min()) if len(h) and "n_cells" in h else 0
        common = f"{prefix}*, " if prefix else ""  # arms named without the prefix they share
        ax.set_title(f"{ds} · bs {bs}: over {best}\n{common}{cells} cells per arm", fontsize=8)
    for row in axes:
        row[0].set_ylabel("ratio of per-request\ndecode rates")
    chars = int(width * ncols * 12)  # about what a line of 9-point text holds across the figure
    lines = [part for line in title.split("\n") for part in textwrap.wrap(line, chars)]
    fig.suptitle("\n".join(lines), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.13 * len(lines) / fig.get_size_inches()[1]))  # 9 pt: ~0.13 in a line
    return fig


#: Colours of :func:`plot_verdicts`' cells, by verdict (:data:`sdlib.analysis.powered.VERDICTS`: ahead, behind,
#: not established).
VERDICT_COLORS = dict(zip(VERDICTS, ("#8fd19e", "#f4a6a6", "#e6e6e6")))


def plot_verdicts(table: pd.DataFrame, title: str, arm_table: Optional[pd.DataFrame] = None):
    """Every (dataset, batch size) block of a powered sweep in one matrix, a column per block and a row per arm:
    each cell gives the arm's paired ratio over the block's reference (``best_fixed`` in the headline, else
    ``reference``, which must then be one arm per block) with its 95% interval, coloured by its verdict
    (``verdict``, :func:`sdlib.analysis.powered.verdicts`): established ahead, established behind, or not
    established. An arm with no row in a block leaves its cell white. With ``arm_table``
    (:func:`sdlib.analysis.powered.arm_info`) a reference is named by its replayed policy and its engine, from those
    fields (a label is never parsed back: :mod:`sdlib.core.registry`)."""
    ref = "best_fixed" if "best_fixed" in table else "reference"
    per_block = table.groupby(["dataset", "batch_size"])[ref]
    if (per_block.nunique() > 1).any():
        raise ValueError(f"plot_verdicts: a block has more than one {ref} (one column is one reference); "
                         f"draw a table of one reference per block (the headline's best fixed arm)")
    refs = per_block.first()  # the block's one reference
    blocks = list(refs.index)
    arms = list(dict.fromkeys(table["arm"]))
    width = max(6.5, 1.25 * len(blocks) + 2.4)
    chars = int(width * 12)  # about what a line of 9-point text holds across the figure
    lines = [part for line in title.split("\n") for part in textwrap.wrap(line, chars)]
    # the rows, the blocks' labels below them, the title above (9 pt: ~0.16 in a line)
    fig, axes = new_figure(1, 1, width=width, height=0.62 * len(arms) + 1.5 + 0.16 * len(lines))
    ax = axes[0][0]
    ax.grid(False)
    rows = {(r.dataset, r.batch_size, r.arm): r  # each (block, arm)'s row, looked up once per cell below
            for r in table.drop_duplicates(["dataset", "batch_size", "arm"]).itertuples()}
    for j, (ds, bs) in enumerate(blocks):
        for i, arm in enumerate(arms):
            r = rows.get((ds, bs, arm))
            ax.add_patch(Rectangle((j - 0.48, i - 0.46), 0.96, 0.92, edgecolor="white",
                                   facecolor=VERDICT_COLORS[r.verdict] if r is not None else "white"))
            if r is not None:
                text = (f"{r.ratio:.3f}\n[{r.ratio_lo:.3f}, {r.ratio_hi:.3f}]" if np.isfinite(r.ratio)
                        and np.isfinite(r.ratio_lo) and np.isfinite(r.ratio_hi) else "n/a")
                ax.text(j, i, text, ha="center", va="center", fontsize=6.5)
    names = {} if arm_table is None else {a.method_label: f"{a.replay}\non {a.engine}"
                                          for a in arm_table.itertuples() if isinstance(a.replay, str) and a.replay}
    ax.set_xticks(range(len(blocks)), [f"{ds}\nbs {bs}\nover {names.get(refs[(ds, bs)], refs[(ds, bs)])}"
                                       for ds, bs in blocks], fontsize=6.5)
    ax.set_yticks(range(len(arms)), arms, fontsize=7.5)
    ax.set_xlim(-0.5, len(blocks) - 0.5)
    ax.set_ylim(len(arms) - 0.5, -0.5)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.legend(handles=[Patch(facecolor=c, edgecolor="0.5", label=v) for v, c in VERDICT_COLORS.items()],
               loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(VERDICT_COLORS), fontsize=7, frameon=False)
    fig.suptitle("\n".join(lines), fontsize=9)
    return fig


def plot_adaptive_ab(calls: pd.DataFrame, ratios: pd.DataFrame, table: pd.DataFrame, tokens: pd.DataFrame,
                     title: str):
    """vLLM 0.34's adaptive verification (:mod:`sdlib.analysis.adaptive_ab`): left, the verify cost table the
    engine profiled at start-up (ms by tokens verified in a step; dotted: its CUDA-graph token limit) with the
    A/B's untrimmed and drafted-only token counts marked; middle, every timed call's step per arm (bar: mean);
    right, the step-time ratios with their 95% intervals (call-to-call only: one engine start per arm)."""
    fig, axes = new_figure(1, 3, width=4.6, height=3.6)
    ax = axes[0][0]
    v = table[table["what"] == "verify"]
    v = v[v["n"] > 0]
    ax.plot(v["n"], v["ms"], "o-", ms=3, color="C0", label="verify (start-up table)")
    lim = table["graph_limit"].dropna()
    if len(lim):
        ax.axvline(float(lim.iloc[0]), ls=":", color="grey", label=f"CUDA-graph limit ({int(lim.iloc[0])} tokens)")
    padded = tokens[tokens["k"] > tokens["drafted"]]
    for col, style, name in (("tokens_untrimmed", "s", "padded arms, 1 + K per row"),
                             ("tokens_drafted", "D", "1 + drafted per row")):
        for n in sorted(set(padded[col])):
            ms = float(np.interp(n, v["n"], v["ms"]))
            ax.plot([n], [ms], style, color="C3" if col == "tokens_untrimmed" else "C2", ms=7, mfc="white",
                    label=f"{name}: {n} tokens")
    ax.set_xscale("log")
    log_axis_plain(ax, "y")
    ax.set(xlabel="tokens verified in a step", ylabel="ms", title="cost table (adaptive engine)")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[0][1]
    arms = list(dict.fromkeys(calls.sort_values(["k", "adaptive"])["arm"]))
    for i, arm in enumerate(arms):
        d = calls[calls["arm"] == arm]
        ax.plot(np.full(len(d), i) + np.linspace(-0.08, 0.08, len(d)), d["step_ms"], "o", color=f"C{i}")
        ax.hlines(d["step_ms"].mean(), i - 0.25, i + 0.25, color=f"C{i}")
    bs = sorted(calls["bs"].unique())
    ax.set_xticks(range(len(arms)), arms)
    ax.set(ylabel="ms per decode step (wall / steps)", title=f"timed calls, bs {', '.join(map(str, bs))}")
    ax = axes[0][2]
    lab = [f"{r.arm} / {r.reference}" + (f" (bs {r.bs})" if len(bs) > 1 else "") for r in ratios.itertuples()]
    y = np.arange(len(ratios))
    ax.errorbar(ratios["ratio"], y, xerr=interval_bars(ratios, "ratio", "ratio_lo", "ratio_hi"), fmt="o", capsize=3, color="black")
    ax.axvline(1.0, ls=":", color="grey")
    ax.set_yticks(y, lab, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="step-time ratio (95% interval)", title="ratios of mean step times")
    fig.suptitle(title, fontsize=9, y=1.04)
    fig.tight_layout()
    return fig
