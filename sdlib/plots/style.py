"""One helper that saves every figure: PNG (for the README) and SVG, fixed style.

Where figures go: ``set_figures_dir(path)`` (a notebook's ``FIGURES_DIR`` parameter), else the
environment variable ``SDLIB_FIGURES_DIR`` (the tests set it to a temporary folder), else the
repository's ``figures/``. Only ``make notebooks`` / ``make figures`` write ``figures/``.

Usage:
    from sdlib.plots.style import new_figure, save_figure, set_figures_dir
    set_figures_dir(None)                              # figures/ (or $SDLIB_FIGURES_DIR)
    fig, ax = new_figure()
    ax[0][0].plot([1, 2], [3, 4])
    save_figure(fig, "01_throughput_sweep", "speedup")  # <figures dir>/01_throughput_sweep__speedup.{png,svg}
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

import matplotlib
import numpy as np

matplotlib.use("Agg") if matplotlib.get_backend().lower() in {"", "agg"} else None
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from sdlib.paths import FIGURES_DIR, resolve  # noqa: E402

STYLE = {"context": "paper", "style": "whitegrid", "font_scale": 1.2}
DPI = 150
FORMATS = ("png", "svg")
#: Float format of every CSV written beside a figure.
FLOAT_FORMAT = "%.10g"
#: Environment variable naming the figures folder when no notebook parameter sets it.
FIGURES_ENV = "SDLIB_FIGURES_DIR"
_figures_dir: Optional[Path] = None


def set_figures_dir(path: Optional[str | os.PathLike[str]]) -> Path:
    """Send every later figure and table to ``path`` (relative: to the repo root); None: the default
    (``$SDLIB_FIGURES_DIR``, else ``figures/``). Returns the folder now in use."""
    global _figures_dir
    _figures_dir = resolve(path) if path is not None else None
    return figures_dir()


def figures_dir() -> Path:
    """The folder figures and tables are written to (see the module docstring)."""
    if _figures_dir is not None:
        return _figures_dir
    env = os.environ.get(FIGURES_ENV)
    return resolve(env) if env else FIGURES_DIR


def set_style() -> None:
    """Apply the project's one plotting style."""
    sns.set_theme(context=STYLE["context"], style=STYLE["style"], font_scale=STYLE["font_scale"])
    plt.rcParams["svg.hashsalt"] = "sdlib"  # reproducible SVG ids
    plt.rcParams["svg.fonttype"] = "none"


def interval_bars(d, col: str, lo: str, hi: str):
    """Asymmetric error bars (2 x n array) of ``d[col]`` from its interval columns ``lo`` and ``hi`` (negative
    lengths, from rounding, clipped to 0; NaN stays NaN: no bar)."""
    return np.vstack([(d[col] - d[lo]).clip(lower=0), (d[hi] - d[col]).clip(lower=0)]).astype(float)


def new_figure(nrows: int = 1, ncols: int = 1, width: float = 6.0, height: float = 4.0, **kw):
    """A figure of ``ncols*width`` by ``nrows*height`` inches in the project style."""
    set_style()
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)


def log_axis_plain(ax, axis: str = "y") -> None:
    """Log scale on ``axis`` labelled with plain numbers at 1, 2, 5 x 10^n (``150``, ``2,000``), not powers of
    ten: readable when the data span less than a decade too."""
    # deferred: matplotlib is slow to import, and only this path needs it
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    a = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def figure_name(notebook: str, what: str, **params) -> str:
    """``<notebook>__<what>[__k=v...]`` with only filename-safe characters."""
    parts = [notebook, what] + [f"{k}={v}" for k, v in sorted(params.items())]
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", "__".join(parts))


def save_figure(fig, notebook: str, what: str, out_dir: Path | None = None, close: bool = True, **params) -> list[Path]:
    """Save ``fig`` as PNG and SVG under :func:`figures_dir` (or ``out_dir``); return the paths."""
    out = Path(out_dir) if out_dir is not None else figures_dir()
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
    """Write the small table that backs a figure's quoted numbers, next to the figure (CSV). Floats keep
    10 significant digits, so that reruns on another machine (other BLAS, numpy) give the same file."""
    out = Path(out_dir) if out_dir is not None else figures_dir()
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"{figure_name(notebook, what, **params)}.csv"
    df.to_csv(p, index=False, float_format=FLOAT_FORMAT)
    return p
