"""Notebook 04's figures: relative speedup of n-gram over EAGLE-3 per prompt/output BLEU-4 bin (paper Fig. 9e form).

Usage:
    from sdlib.plots.bleu import bleu_bin_panel
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd


def bleu_bin_panel(ax, b: pd.DataFrame, labels: list[str], main: str, other: Optional[str], ref_label: str,
                   width: float = 0.2) -> None:
    """One panel of notebook 04: relative throughput of each ``labels`` row vs ``ref_label`` per BLEU-4 bin.

    ``b``: rows of :func:`sdlib.analysis.bleu.binned_relative_speedup` (``label, convention, bin,
    relative_speedup, num_requests``) for one dataset. Bars: convention ``main``, with their value
    written on them; black markers: convention ``other`` (None: none drawn). Under each bin: its
    number of requests.
    """
    from sdlib.analysis.bleu import bleu_bins

    cats = list(bleu_bins([0.0], width).categories)
    x = np.arange(len(cats))
    w = 0.8 / len(labels)
    for j, lab in enumerate(labels):
        s = b[(b.label == lab) & (b.convention == main)].set_index("bin").reindex(cats)
        xs = x - 0.4 + w * (j + 0.5)
        ax.bar(xs, 100 * s.relative_speedup.astype(float).to_numpy(), w, color=f"C{j + 1}", label=f"{lab} ({main})")
        if other is not None:
            o = b[(b.label == lab) & (b.convention == other)].set_index("bin").reindex(cats)
            ax.plot(xs, 100 * o.relative_speedup.astype(float).to_numpy(), "k_", ms=12, mew=2,
                    label=f"{other} convention" if j == 0 else None)
        for xi, v in zip(xs, s.relative_speedup):
            if pd.notna(v):
                y = 100 * float(v)
                ax.text(xi, y + (3 if y >= 0 else -3), f"{y:+.0f}%", ha="center", va="bottom" if y >= 0 else "top",
                        fontsize=7)
    n = b[b.label == labels[0]].drop_duplicates("bin").set_index("bin").reindex(cats).num_requests
    ax.set_xticks(x, [f"{c}\nn={int(v) if pd.notna(v) else 0}" for c, v in zip(cats, n)], fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="prompt/output BLEU-4 bin", ylabel=f"throughput vs {ref_label} (%)")
