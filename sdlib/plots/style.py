"""One helper that saves every figure: PNG (for the README) and SVG, fixed style.

Usage:
    from sdlib.plots.style import new_figure, save_figure
    fig, ax = new_figure()
    ax.plot([1, 2], [3, 4])
    save_figure(fig, "01_throughput_sweep", "speedup")  # figures/01_throughput_sweep__speedup.{png,svg}
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg") if matplotlib.get_backend().lower() in {"", "agg"} else None
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from sdlib.paths import FIGURES_DIR  # noqa: E402

STYLE = {"context": "paper", "style": "whitegrid", "font_scale": 1.2}
DPI = 150
FORMATS = ("png", "svg")


def set_style() -> None:
    """Apply the project's one plotting style."""
    sns.set_theme(context=STYLE["context"], style=STYLE["style"], font_scale=STYLE["font_scale"])
    plt.rcParams["svg.hashsalt"] = "sdlib"  # reproducible SVG ids
    plt.rcParams["svg.fonttype"] = "none"


def new_figure(nrows: int = 1, ncols: int = 1, width: float = 6.0, height: float = 4.0, **kw):
    """A figure of ``ncols*width`` by ``nrows*height`` inches in the project style."""
    set_style()
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)


def figure_name(notebook: str, what: str, **params) -> str:
    """``<notebook>__<what>[__k=v...]`` with only filename-safe characters."""
    parts = [notebook, what] + [f"{k}={v}" for k, v in sorted(params.items())]
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", "__".join(parts))


def save_figure(fig, notebook: str, what: str, out_dir: Path | None = None, close: bool = True, **params) -> list[Path]:
    """Save ``fig`` as PNG and SVG under ``figures/`` (or ``out_dir``); return the paths."""
    out = Path(out_dir) if out_dir is not None else FIGURES_DIR
    out.mkdir(parents=True, exist_ok=True)
    name = figure_name(notebook, what, **params)
    fig.tight_layout()
    paths = []
    for ext in FORMATS:
        p = out / f"{name}.{ext}"
        fig.savefig(p, dpi=DPI, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
        paths.append(p)
    if close:
        plt.close(fig)
    return paths


def save_table(df, notebook: str, what: str, out_dir: Path | None = None, **params) -> Path:
    """Write the small table that backs a figure's quoted numbers, next to the figure (CSV)."""
    out = Path(out_dir) if out_dir is not None else FIGURES_DIR
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"{figure_name(notebook, what, **params)}.csv"
    df.to_csv(p, index=False)
    return p
