"""The one bootstrap behind every interval in sdlib: one seeding rule, one replicate count and level, and the
resampling schemes the analyses need, as weight matrices so that a replicate's statistic is a matrix product.

Seeding rule: :func:`rng` ``(*key)`` is ``np.random.default_rng(np.random.SeedSequence([BASE_SEED,
*key_ints(key)]))``. The caller passes a key that names what is resampled (the cell: e.g.
``("sim.policy.table", dataset, n_requests)`` or a table's key columns); each part becomes a stable 32-bit integer (CRC-32 of its
canonical text: numpy scalars as Python ones, whole floats as integers, None / NaN / NA as ``NA``). So a cell
gets the same draws on every run and machine, whichever other cells are computed and in whatever order, and two
cells share draws only when their keys are equal. Changing :data:`BASE_SEED` shows how far intervals move with
the seed alone (their Monte Carlo error).

Schemes; each returns ``W`` (``n_boot`` x units): how often replicate ``b`` drew unit ``i``:

* :func:`unit_weights`: independent units (requests, prompts, batches) drawn ``n`` times with replacement;
  :func:`draw_indices` are the same draws as indices, for statistics that are not linear in ``W`` (a
  percentile of pooled values).
* Blocks of a time series of engine steps: :func:`block_sums` cuts the series, in order, into
  :func:`n_blocks` fixed, contiguous, non-overlapping blocks of about ``n^(1/3)`` steps (the rate that is
  MSE-optimal for the variance; Hall, Horowitz and Jing 1995), and the blocks are resampled as units (the
  non-overlapping block bootstrap, Carlstein 1986). Fixed rather than moving blocks because a speedup pairs
  two runs whose windows hold different numbers of steps: fixed block ``j`` of each covers the same share of
  the same admission order, so one draw of block indices pairs them, and a ratio of sums over blocks is a
  ratio of block totals, the unit scheme again. (Moving blocks have a little less variance at a given block
  length, Lahiri 1999, but their start positions do not pair across windows of different lengths.)
* Paired: one ``W`` applied to several series at once (the columns of a matrix: every policy of a cell; an
  SD arm and its no-SD baseline on the same prompts), as in :func:`ratio` and :func:`paired_ratio_interval`;
  the identical arms give exactly 1 in every replicate.
* :func:`cluster_weights`: two levels (a hierarchical bootstrap): clusters (engine starts, repeats) drawn
  with replacement, then the units (prompts) within each drawn cluster; ``resample_clusters=False`` draws
  within each cluster only (a stratified bootstrap: each run keeps its requests' count). With one cluster it
  is :func:`unit_weights` draw for draw; :func:`cluster_ratio_interval` is the ratio of means of paired arms
  over engine starts and their prompts. :func:`cluster_stats` gives the same draws when the statistic is
  computed per drawn cluster (a throughput per repeat, averaged over the drawn repeats).

:func:`interval` is the percentile interval (numpy's linear quantiles) of the finite replicates at ``level``.
With few clusters (a handful of engine starts and repeats) a percentile interval of a cluster bootstrap is too
narrow: with two clusters it is about the range of their two values. :func:`few_cluster_interval` is the
interval to use then: the bootstrap's standard error on the log scale, scaled by ``sqrt(C / (C - 1))`` (the
bootstrap variance of a mean of ``C`` clusters is ``(C - 1) / C`` of the usual estimate), with Student's t
quantiles on ``C - 1`` degrees of freedom (Cameron and Miller 2015, "A practitioner's guide to cluster-robust
inference", section VI: few clusters). :func:`t_quantile` is scipy's.

Usage:
    from sdlib.core import bootstrap as B
    W = B.unit_weights(len(x), B.N_BOOT, B.rng("cell", "gsm8k", 32))
    lo, hi = B.interval(B.ratio(W, x, y))                       # paired ratio of means, 95%
    W2 = B.cluster_weights([40, 40, 40], B.N_BOOT, B.rng("cell", "gsm8k"))   # 3 engine starts x 40 prompts
"""

from __future__ import annotations

import functools
import warnings
import zlib
from statistics import NormalDist
from typing import Callable, Sequence

import numpy as np

#: The seed every key is mixed with (:func:`rng`).
BASE_SEED = 0
#: Bootstrap replicates of every interval.
N_BOOT = 2000
#: Two-sided coverage of every interval.
LEVEL = 0.95
#: Fewer units than this: no interval (NaN).
MIN_UNITS = 2


# --------------------------------------------------------------------------- seeding
def _canon(x) -> str:
    """Canonical text of one key part (stable across numpy / Python scalar types)."""
    if isinstance(x, np.generic):
        x = x.item()
    if x is None or type(x).__name__ in ("NAType", "NaTType") or (isinstance(x, float) and x != x):
        return "NA"
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    if isinstance(x, (tuple, list)):
        return "(" + ",".join(_canon(v) for v in x) + ")"
    return str(x)


def key_ints(key: Sequence) -> list[int]:
    """One stable 32-bit integer per part of ``key`` (CRC-32 of its canonical text)."""
    return [zlib.crc32(_canon(k).encode()) for k in key]


def rng(*key) -> np.random.Generator:
    """The generator of the resamples named by ``key`` (module docstring: the seeding rule)."""
    return np.random.default_rng(np.random.SeedSequence([BASE_SEED, *key_ints(key)]))


# --------------------------------------------------------------------------- independent units
def draw_indices(n: int, n_boot: int, gen: np.random.Generator) -> np.ndarray:
    """(n_boot, n) unit indices drawn with replacement (the draws :func:`unit_weights` counts)."""
    return gen.integers(0, n, size=(n_boot, n))


def counts(idx: np.ndarray, n: int) -> np.ndarray:
    """(rows, n) float counts of each unit in each row of ``idx`` (drawn indices)."""
    rows = idx.shape[0]
    flat = (idx + n * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(float)


def unit_weights(n: int, n_boot: int, gen: np.random.Generator) -> np.ndarray:
    """(n_boot, n): how often each of ``n`` independent units is drawn in each replicate."""
    return counts(draw_indices(n, n_boot, gen), n)


@functools.lru_cache(maxsize=64)
def keyed_unit_weights(key: tuple, n: int, n_boot: int = N_BOOT) -> np.ndarray:
    """:func:`unit_weights` of ``rng(*key)``, cached (read-only: shared by every caller with that key)."""
    w = unit_weights(n, n_boot, rng(*key))
    w.setflags(write=False)
    return w


# --------------------------------------------------------------------------- blocks of steps
def n_blocks(n_steps: int) -> int:
    """Blocks a series of ``n_steps`` steps is cut into: block length ~ n^(1/3) (at least 1 step); 0 when
    there are fewer steps than :data:`MIN_UNITS`."""
    if n_steps < MIN_UNITS:
        return 0
    length = max(1, int(round(n_steps ** (1 / 3))))
    return max(MIN_UNITS, n_steps // length)


def block_sums(x: np.ndarray, nb: int) -> np.ndarray:
    """Sums of ``x`` (a series in time order) over ``nb`` fixed contiguous blocks (edges at round(i*n/nb))."""
    x = np.asarray(x, dtype=float)
    edges = np.linspace(0, len(x), nb + 1).round().astype(int)
    return np.diff(np.concatenate([[0.0], np.cumsum(x)])[edges])


# --------------------------------------------------------------------------- two levels
def _cluster_draws(sizes: Sequence[int], n_boot: int, gen: np.random.Generator, resample_clusters: bool):
    """Clusters per replicate slot, then per cluster ``c``: the slots that drew it and their unit draws.

    Draw order (what a slow loop must reproduce): the (n_boot, C) cluster draws first, then per cluster in
    order, ``integers(0, n_c, (m_c, n_c))`` for the ``m_c`` slots (row-major) that drew it."""
    C = len(sizes)
    cl = gen.integers(0, C, size=(n_boot, C)) if resample_clusters else np.tile(np.arange(C), (n_boot, 1))
    draws = []
    for c, nc in enumerate(sizes):
        mask = cl == c
        m = int(mask.sum())
        draws.append((mask, gen.integers(0, nc, size=(m, nc)) if m and nc else np.zeros((m, nc), dtype=np.int64)))
    return cl, draws


def cluster_weights(sizes: Sequence[int], n_boot: int, gen: np.random.Generator,
                    resample_clusters: bool = True) -> np.ndarray:
    """(n_boot, sum(sizes)): two-level weights of units laid out cluster after cluster (``sizes[c]`` units in
    cluster ``c``): clusters drawn with replacement (or kept, ``resample_clusters=False``), then units within
    each drawn cluster. A cluster drawn twice adds both draws' counts."""
    sizes = [int(n) for n in sizes]
    start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    N = int(start[-1])
    _, draws = _cluster_draws(sizes, n_boot, gen, resample_clusters)
    flat = [(np.nonzero(mask)[0][:, None] * N + start[c] + idx).ravel() for c, (mask, idx) in enumerate(draws)]
    flat = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
    return np.bincount(flat, minlength=n_boot * N).reshape(n_boot, N).astype(float)


def cluster_stats(sizes: Sequence[int], n_boot: int, gen: np.random.Generator,
                  stat: Callable[[int, np.ndarray], np.ndarray], resample_clusters: bool = True) -> np.ndarray:
    """(n_boot, C, ...): per replicate and slot, ``stat(c, W)`` of the cluster ``c`` drawn into it, where ``W``
    (m, sizes[c]) are the unit counts of the ``m`` slots that drew ``c`` and ``stat`` returns one row per
    slot. The draws are :func:`cluster_weights`'s (same generator state, same numbers)."""
    sizes = [int(n) for n in sizes]
    cl, draws = _cluster_draws(sizes, n_boot, gen, resample_clusters)
    out = None
    for c, (mask, idx) in enumerate(draws):
        if not mask.any():
            continue
        v = np.asarray(stat(c, counts(idx, sizes[c])), dtype=float)
        if out is None:
            out = np.full(cl.shape + v.shape[1:], np.nan)
        out[mask] = v
    return out if out is not None else np.full(cl.shape, np.nan)


# --------------------------------------------------------------------------- statistics
def ratio(W: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Per replicate, ``sum(w * num) / sum(w * den)``: a ratio of sums, or of means of paired arms (columns of
    ``num`` / ``den`` are series resampled together); NaN where the denominator is 0."""
    d = W @ np.asarray(den, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (W @ np.asarray(num, dtype=float)) / np.where(d != 0, d, np.nan)


def mean(W: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per replicate, the weighted mean of ``x`` (columns: series resampled together)."""
    s = W.sum(axis=1)
    x = np.asarray(x, dtype=float)
    return (W @ x) / (s[:, None] if x.ndim > 1 else s)


def interval(reps: np.ndarray, level: float = LEVEL) -> tuple:
    """Percentile interval at ``level`` of the finite replicates (numpy's linear quantiles); along axis 0 for
    a matrix (one interval per column). NaN where no replicate is finite."""
    r = np.asarray(reps, dtype=float)
    q = [(1 - level) / 2, 1 - (1 - level) / 2]
    if r.ndim == 1:
        r = r[np.isfinite(r)]
        if r.size == 0:
            return float("nan"), float("nan")
        lo, hi = np.quantile(r, q)
        return float(lo), float(hi)
    finite = np.isfinite(r)
    if finite.all():
        lo, hi = np.quantile(r, q, axis=0)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column gives NaN
            lo, hi = np.nanquantile(np.where(finite, r, np.nan), q, axis=0)
    return lo, hi


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (``scipy.stats.t.ppf``); NaN for ``df`` < 1."""
    if not df >= 1:
        return float("nan")
    from scipy.stats import t  # scipy.stats takes ~0.4 s to import; only the few-cluster intervals need it

    return float(t.ppf(p, df))


def few_cluster_interval(point: float, reps: np.ndarray, n_clusters: int, level: float = LEVEL) -> tuple:
    """Interval of a positive ratio ``point`` from its cluster-bootstrap replicates when there are few clusters:
    ``point * exp(-/+ t_{C-1} * se)``, ``se`` = sd of the log replicates x ``sqrt(C / (C - 1))``. NaN with
    fewer than two clusters or two finite replicates. A ratio that does not vary between clusters keeps a
    zero-width interval, as the percentile one does."""
    r = np.asarray(reps, dtype=float)
    r = r[np.isfinite(r) & (r > 0)]
    C = int(n_clusters)
    if C < 2 or r.size < 2 or not (np.isfinite(point) and point > 0):
        return float("nan"), float("nan")
    se = float(np.std(np.log(r), ddof=1)) * np.sqrt(C / (C - 1))
    half = t_quantile(1 - (1 - level) / 2, C - 1) * se
    return float(point * np.exp(-half)), float(point * np.exp(half))


def paired_ratio_interval(num: np.ndarray, den: np.ndarray, gen: np.random.Generator, n_boot: int = N_BOOT,
                          level: float = LEVEL) -> tuple[float, float]:
    """Interval of ``mean(num) / mean(den)`` over paired units (row ``i`` of both drawn together); NaN with
    fewer than :data:`MIN_UNITS` pairs."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if len(num) < MIN_UNITS:
        return float("nan"), float("nan")
    return interval(ratio(unit_weights(len(num), n_boot, gen), num, den), level)


def cluster_ratio_interval(num: np.ndarray, den: np.ndarray, cluster: np.ndarray, gen: np.random.Generator,
                           n_boot: int = N_BOOT, level: float = LEVEL) -> tuple[float, float]:
    """Two-level interval of ``sum(num) / sum(den)`` (a ratio of means of paired arms: row ``i`` of both is one
    unit, e.g. a prompt's SD and no-SD throughput): the clusters (``cluster[i]``, e.g. the engine start) drawn
    with replacement, then the units within each (:func:`cluster_weights`; clusters in sorted order). With one
    cluster it is :func:`paired_ratio_interval`. NaN with fewer than :data:`MIN_UNITS` units."""
    num, den, cluster = np.asarray(num, dtype=float), np.asarray(den, dtype=float), np.asarray(cluster)
    if len(num) < MIN_UNITS:
        return float("nan"), float("nan")
    order = np.argsort(cluster, kind="stable")
    _, sizes = np.unique(cluster[order], return_counts=True)
    return interval(ratio(cluster_weights(sizes, n_boot, gen), num[order], den[order]), level)


def wilson(k, n, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of a proportion ``k / n`` (arrays or scalars); NaN where ``n`` is 0.

    For shares of requests (outputs that differ, outputs identical): unlike a bootstrap it has width even
    when every request agrees (0 of 24 is not proof that the share is 0)."""

    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    bad = ~(n > 0)
    return np.where(bad, np.nan, centre - half), np.where(bad, np.nan, centre + half)
