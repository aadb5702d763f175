"""Intervals on measured throughput and speedup: bootstrap within a cell, across repeats, paired for ratios.

What is resampled (one *unit* per row of the resampling):

* ``closed_loop`` cells: a block bootstrap over the steady window's engine steps. The window's
  steps, in order, are cut into ``n_blocks`` fixed contiguous blocks (block length ~ n^(1/3) steps,
  :func:`sdlib.core.bootstrap.n_blocks`); a replicate draws blocks with replacement and computes
  tokens / seconds over them. A step's seconds are the time to the next step's start (the last step: its duration), so
  the whole window gives exactly ``runs.tok_per_s`` (= ``window_output_tokens / window_s``).
* ``paper`` cells: a bootstrap over batches (one prompt x B copies each); a replicate is the mean
  over the drawn batches of tokens / batch duration (from the ``requests`` table: first arrival to
  last finish of the batch), rescaled so that all batches give exactly ``runs.tok_per_s``.
* Several repeats of a cell: a replicate first draws repeats with replacement, then units within
  each drawn repeat, and averages the repeats' throughputs (the point estimate is the mean over
  repeats, as in :func:`sdlib.analysis.measures.throughput_table`): the two-level scheme of
  :func:`sdlib.core.bootstrap.cluster_stats`.

A speedup (SD tok/s / no-SD tok/s) is resampled *paired*: the same draws are applied to the SD
cell and its no-SD baseline -- the same blocks by position in the window (block j of each covers
the same share of the same admission order), or the same prompts in paper mode, and the same
repeat indices when both have the same repeats. The interval is the percentile interval of the
replicates (``LEVEL`` = 95%, ``N_BOOT`` replicates, seeded per cell so reruns give the same numbers:
:mod:`sdlib.core.bootstrap`, whose seeding rule, replicates and level every interval of sdlib shares).

What the interval does *not* hold: with one repeat, run-to-run variation (another engine start,
another machine state) is not in it; only the cell's own step-to-step (or prompt-to-prompt)
variation is. :func:`interval_note` says which applies, for figure titles.

Usage:
    from sdlib.analysis.intervals import sweep_intervals, compare_methods
    tp, sp = sweep_intervals("data/sweeps/embedded_default")   # + tok_per_s_lo/hi, speedup_lo/hi
    compare_methods(sp)                                        # which differences the intervals establish
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.analysis.measures import KEYS, acceptance_by_method, speedup_table, throughput_table
from sdlib.core import bootstrap
from sdlib.core.bootstrap import LEVEL, MIN_UNITS, N_BOOT, n_blocks
from sdlib.core.crossover import crossover_table

#: What a cell's units are, by batch mode (for tables and titles).
UNIT_NAMES = {"closed_loop": "blocks of steady-window steps", "paper": "batches (prompts)"}


@dataclass
class CellSample:
    """What one run's throughput is resampled from: per unit, tokens (``num``) and seconds (``den``).

    ``kind``: ``steps`` (closed loop: ratio of sums over blocks of steps, in window order) or
    ``batches`` (paper: mean of per-batch rates, ``keys`` = prompt index of each batch).
    ``scale`` makes the full sample reproduce ``runs.tok_per_s`` exactly.
    """

    kind: str
    num: np.ndarray
    den: np.ndarray
    keys: Optional[np.ndarray] = None
    scale: float = 1.0

    @property
    def n(self) -> int:
        return len(self.num)


def _step_sample(es: pd.DataFrame) -> CellSample:
    """A closed-loop run's steady-window steps: tokens and seconds to the next step (window order)."""
    w = es[es["in_window"].fillna(False).astype(bool)].sort_values("engine_step")
    start = w["start_s"].to_numpy(float)
    dur = w["duration_s"].to_numpy(float)
    secs = np.append(np.diff(start), dur[-1:]) if len(w) else np.zeros(0)
    return CellSample("steps", w["num_new_tokens"].to_numpy(float), secs)


def _batch_sample(req: pd.DataFrame, tok_per_s: float) -> CellSample:
    """A paper-mode run's batches: tokens and duration per batch, keyed by prompt index."""
    g = req.groupby("batch_index").agg(tok=("output_tokens", "sum"), a=("arrival_s", "min"),
                                       f=("finish_s", "max"), key=("prompt_index", "first"))
    num, den = g["tok"].to_numpy(float), (g["f"] - g["a"]).to_numpy(float)
    ok = den > 0
    plug = float(np.mean(num[ok] / den[ok])) if ok.any() else np.nan
    scale = tok_per_s / plug if np.isfinite(plug) and plug > 0 and np.isfinite(tok_per_s) else 1.0
    return CellSample("batches", num[ok], den[ok], g["key"].to_numpy()[ok], scale)


def cell_samples(runs: pd.DataFrame, engine_steps: Optional[pd.DataFrame] = None,
                 requests: Optional[pd.DataFrame] = None) -> dict[str, CellSample]:
    """Per run id, its :class:`CellSample` (closed loop from ``engine_steps``, paper from ``requests``)."""
    out: dict[str, CellSample] = {}
    by_es = dict(tuple(engine_steps.groupby("run_id"))) if engine_steps is not None and len(engine_steps) else {}
    by_rq = dict(tuple(requests.groupby("run_id"))) if requests is not None and len(requests) else {}
    for r in runs.itertuples():
        if r.batch_mode == "paper":
            if r.run_id in by_rq:
                out[r.run_id] = _batch_sample(by_rq[r.run_id], float(r.tok_per_s))
        elif r.run_id in by_es:
            out[r.run_id] = _step_sample(by_es[r.run_id])
    return out


def _n_units(s: CellSample) -> int:
    """Units a run's throughput is resampled over: blocks of steps, or batches."""
    return n_blocks(s.n) if s.kind == "steps" else s.n


def _units(s: CellSample, nb: int, keys: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, seconds) per unit: ``nb`` contiguous blocks of steps, or the batches (in ``keys`` order)."""
    if s.kind == "steps":
        return bootstrap.block_sums(s.num, nb), bootstrap.block_sums(s.den, nb)
    if keys is None:
        return s.num, s.den
    pos = {k: i for i, k in enumerate(s.keys)}
    idx = np.array([pos[k] for k in keys], dtype=int)
    return s.num[idx], s.den[idx]


def _rate(s: CellSample, W: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Throughput of each replicate (rows of ``W``: unit counts): tokens / seconds over the drawn blocks, or
    the mean of the drawn batches' rates (rescaled)."""
    if s.kind == "steps":
        return bootstrap.ratio(W, num, den)
    return bootstrap.mean(W, num / den) * s.scale


def _replicates(ss: list[CellSample], gen, n_boot: int) -> np.ndarray:
    """Two-level replicates of the mean throughput over a cell's repeats ``ss``: repeats drawn with
    replacement, units within each (one repeat: units only); NaN where a drawn repeat has too few units."""
    nbs = [_n_units(s) for s in ss]
    units = [_units(s, nb) for s, nb in zip(ss, nbs)]

    def stat(c, W):
        return _rate(ss[c], W, *units[c]) if nbs[c] >= MIN_UNITS else np.full(len(W), np.nan)

    return bootstrap.cluster_stats(nbs, n_boot, gen, stat).mean(axis=1)


def _paired_units(a: CellSample, b: CellSample):
    """(units, (a's tokens, seconds), (b's)) on units both runs have: the same block positions (as many
    blocks as the shorter window gives) or the same prompts; None when they cannot be paired."""
    if a.kind != b.kind:
        return None
    if a.kind == "steps":
        nb, keys = min(n_blocks(a.n), n_blocks(b.n)), None
    else:
        keys = np.array(sorted(set(a.keys.tolist()) & set(b.keys.tolist())), dtype=object)
        nb = len(keys)
    return (nb, _units(a, nb, keys), _units(b, nb, keys)) if nb >= MIN_UNITS else None


def _interval(reps: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    return bootstrap.interval(reps, level)


CELL = KEYS + ["method", "method_label", "num_spec_tokens"]


def throughput_intervals(runs: pd.DataFrame, samples: dict[str, CellSample], n_boot: int = N_BOOT,
                         level: float = LEVEL) -> pd.DataFrame:
    """:func:`sdlib.analysis.measures.throughput_table` plus ``tok_per_s_lo``, ``tok_per_s_hi``
    (``level`` percentile interval), ``ci_units`` (what was resampled) and ``n_units`` (units per
    repeat, smallest over repeats)."""
    tp = throughput_table(runs)
    lo, hi, units, n_units = [], [], [], []
    for row in tp.itertuples(index=False):
        key = tuple(getattr(row, c) for c in CELL)
        g = runs[_match(runs, CELL, key)].sort_values("repeat")
        ss = [samples.get(r) for r in g["run_id"]]
        if not ss or any(s is None for s in ss):
            lo.append(np.nan), hi.append(np.nan), units.append(""), n_units.append(0)
            continue
        a, b = _interval(_replicates(ss, bootstrap.rng("tp", *key), n_boot), level)
        lo.append(a), hi.append(b)
        units.append(_unit_label(row.batch_mode, len(ss)))
        n_units.append(min(_n_units(s) for s in ss))
    tp["tok_per_s_lo"], tp["tok_per_s_hi"] = lo, hi
    tp["ci_units"], tp["n_units"] = units, n_units
    return tp


def speedup_intervals(runs: pd.DataFrame, samples: dict[str, CellSample], n_boot: int = N_BOOT,
                      level: float = LEVEL, tp: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """:func:`sdlib.analysis.measures.speedup_table` plus ``tok_per_s_lo/hi`` and ``speedup_lo/hi``:
    paired resamples of each SD cell and its no-SD baseline (module docstring)."""
    sp = speedup_table(runs)
    tp = throughput_intervals(runs, samples, n_boot, level) if tp is None else tp
    sp = sp.merge(tp[CELL + ["tok_per_s_lo", "tok_per_s_hi", "ci_units", "n_units"]], on=CELL, how="left")
    lo, hi = [], []
    for row in sp.itertuples(index=False):
        if row.method == "none" or not np.isfinite(row.speedup):
            lo.append(np.nan), hi.append(np.nan)
            continue
        key = tuple(getattr(row, c) for c in CELL)
        g = runs[_match(runs, CELL, key)]
        base = runs[_match(runs, KEYS, key[:len(KEYS)]) & (runs["method"] == "none")]
        a, b = _interval(_paired_speedups(g, base, samples, n_boot, bootstrap.rng("sp", *key)), level)
        lo.append(a), hi.append(b)
    sp["speedup_lo"], sp["speedup_hi"] = lo, hi
    return sp


def _paired_speedups(sd: pd.DataFrame, base: pd.DataFrame, samples: dict[str, CellSample], n_boot: int,
                     rng) -> np.ndarray:
    """Replicates of mean SD tok/s / mean no-SD tok/s: repeats paired by (engine start, repeat index) when both
    have the same ones (else drawn independently), units paired within each repeat pair. A cell run on several
    engine starts (``engine_starts``) has one run per start and repeat, each a repeat of its own."""
    sd_by, base_by = _runs_by_repeat(sd), _runs_by_repeat(base)
    if any(samples.get(x) is None for x in [*sd_by.values(), *base_by.values()]):
        return np.full(n_boot, np.nan)
    if sorted(sd_by) == sorted(base_by):
        runs = [(samples[sd_by[r]], samples[base_by[r]]) for r in sorted(sd_by)]
        pairs = [_paired_units(a, b) for a, b in runs]
        nbs = [p[0] if p else 0 for p in pairs]

        def stat(c, W):
            if pairs[c] is None:
                return np.full((len(W), 2), np.nan)
            (a, b), (_, (an, ad), (bn, bd)) = runs[c], pairs[c]
            return np.column_stack([_rate(a, W, an, ad), _rate(b, W, bn, bd)])

        both = bootstrap.cluster_stats(nbs, n_boot, rng, stat).mean(axis=1)
        return both[:, 0] / both[:, 1]
    num = _replicates([samples[x] for x in sd_by.values()], rng, n_boot)
    den = _replicates([samples[x] for x in base_by.values()], rng, n_boot)
    return num / den


def _runs_by_repeat(runs: pd.DataFrame) -> dict[tuple[int, int], str]:
    """{(engine start, repeat): run id} (engine start 0 where the table predates engine starts)."""
    start = runs["engine_start"] if "engine_start" in runs else pd.Series(0, index=runs.index)
    out = {(int(e), int(r)): rid for e, r, rid in zip(start.fillna(0), runs["repeat"], runs["run_id"])}
    if len(out) != len(runs):
        raise ValueError(f"runs {sorted(runs['run_id'])[:3]}...: two runs of one cell share an engine start and repeat")
    return out


def _match(df: pd.DataFrame, cols: Sequence[str], key: tuple) -> pd.Series:
    m = pd.Series(True, index=df.index)
    for c, v in zip(cols, key):
        m &= df[c].isna() if pd.isna(v) else (df[c] == v)
    return m


def _unit_label(batch_mode: str, repeats: int) -> str:
    u = UNIT_NAMES.get(str(batch_mode), "units")
    return u + (f", then {repeats} repeats" if repeats > 1 else "")


def sweep_intervals(sweep_dir: str | Path, n_boot: int = N_BOOT, level: float = LEVEL,
                    runs: Optional[pd.DataFrame] = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(throughput, speedup) tables with intervals for one sweep folder (reads ``runs``, and
    ``engine_steps`` for closed-loop cells or ``requests`` for paper-mode cells)."""
    # deferred: sdlib.store loads pandas, and only this path needs it
    from sdlib.store import read_table

    runs = read_table(sweep_dir, "runs") if runs is None else runs
    modes = set(runs["batch_mode"].astype(str))
    ids = set(runs["run_id"])  # exactly the cells of ``runs`` (a report of a config reads that config's cells)
    es = read_table(sweep_dir, "engine_steps", cells=ids) if "closed_loop" in modes else None
    rq = read_table(sweep_dir, "requests", cells=ids) if "paper" in modes else None
    samples = cell_samples(runs, es, rq)
    tp = throughput_intervals(runs, samples, n_boot, level)
    return tp, speedup_intervals(runs, samples, n_boot, level, tp=tp)


def interval_note(runs: pd.DataFrame, level: float = LEVEL) -> str:
    """One line for a figure: what its intervals are, and whether run-to-run variation is in them."""
    modes = sorted(set(runs["batch_mode"].astype(str)))
    units = " / ".join(UNIT_NAMES.get(m, m) for m in modes)
    reps = int(runs.groupby(CELL, dropna=False)["run_id"].size().max()) if len(runs) else 0
    tail = (f"across {reps} repeats and within each" if reps > 1
            else "1 repeat: run-to-run variation not included")
    return f"{100 * level:.0f}% CI: bootstrap over {units} (paired SD vs no SD), {tail}"


def overlaps(lo_a, hi_a, lo_b, hi_b) -> bool:
    """True when two intervals share a point (or either is unknown): their order is not established."""
    if any(pd.isna(x) for x in (lo_a, hi_a, lo_b, hi_b)):
        return True
    return not (hi_a < lo_b or hi_b < lo_a)


def versus_baseline(lo, hi) -> str:
    """``faster`` / ``slower`` than no SD when the speedup interval lies above / below 1, else ``not established``."""
    if pd.isna(lo) or pd.isna(hi):
        return "not established (no interval)"
    if lo > 1:
        return "faster than no SD"
    if hi < 1:
        return "slower than no SD"
    return "not established (interval includes 1)"


def compare_methods(sp: pd.DataFrame, by: Sequence[str] = ("model", "dataset", "batch_size")) -> pd.DataFrame:
    """Per group (default: model, dataset, batch size): each SD method against no SD, and each pair of
    SD methods against each other: ``verdict`` says which is faster where the intervals do not
    overlap, and ``not established (intervals overlap)`` where they do (prose never ranks those)."""
    d = sp[(sp["method"] != "none") & sp["speedup"].notna()]
    rows = []
    for key, g in d.groupby(list(by), dropna=False):
        g = g.sort_values("speedup", ascending=False)
        base = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for r in g.itertuples(index=False):
            rows.append({**base, "a": r.method_label, "b": "none", "speedup_a": r.speedup, "lo_a": r.speedup_lo,
                         "hi_a": r.speedup_hi, "speedup_b": 1.0, "lo_b": 1.0, "hi_b": 1.0,
                         "verdict": versus_baseline(r.speedup_lo, r.speedup_hi)})
        recs = list(g.itertuples(index=False))
        for i, a in enumerate(recs):
            for b in recs[i + 1:]:
                est = not overlaps(a.speedup_lo, a.speedup_hi, b.speedup_lo, b.speedup_hi)
                rows.append({**base, "a": a.method_label, "b": b.method_label, "speedup_a": a.speedup,
                             "lo_a": a.speedup_lo, "hi_a": a.speedup_hi, "speedup_b": b.speedup,
                             "lo_b": b.speedup_lo, "hi_b": b.speedup_hi,
                             "verdict": f"{a.method_label} faster" if est else "not established (intervals overlap)"})
    return pd.DataFrame(rows)


def fmt_ci(value: float, lo: float, hi: float, digits: int = 2) -> str:
    """``1.14 [1.05, 1.22]`` (the interval left out when unknown)."""
    if pd.isna(value):
        return "n/a"
    if pd.isna(lo) or pd.isna(hi):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def comparison_sentences(cmp_: pd.DataFrame, group: Sequence[str] = ("dataset", "batch_size")) -> list[str]:
    """Prose from :func:`compare_methods`: per group, which methods are established faster or slower
    than no SD, and which method pairs the intervals cannot order."""
    out = []
    if cmp_.empty:
        return out
    for key, g in cmp_.groupby(list(group), dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        head = ", ".join(f"{c.replace('batch_size', 'bs')} {v}" for c, v in zip(group, key))
        vs = g[g["b"] == "none"]
        parts = []
        for verdict in ("faster than no SD", "slower than no SD"):
            ms = [f"{r.a} {fmt_ci(r.speedup_a, r.lo_a, r.hi_a)}" for r in vs.itertuples() if r.verdict == verdict]
            if ms:
                parts.append(f"{verdict}: " + "; ".join(ms))
        und = [f"{r.a} {fmt_ci(r.speedup_a, r.lo_a, r.hi_a)}" for r in vs.itertuples()
               if r.verdict.startswith("not established")]
        if und:
            parts.append("not established against no SD: " + "; ".join(und))
        pairs = g[(g["b"] != "none")]
        ranked = [f"{r.a} > {r.b}" for r in pairs.itertuples() if not r.verdict.startswith("not established")]
        if ranked:
            parts.append("established (intervals apart): " + ", ".join(ranked))
        tied = [f"{r.a} vs {r.b}" for r in pairs.itertuples() if r.verdict.startswith("not established")]
        if tied:
            parts.append("order not established (intervals overlap): " + ", ".join(tied))
        out.append(f"{head}: " + ". ".join(parts) + ".")
    return out


def established_crossover(sp: pd.DataFrame, by: Sequence[str] = ("model", "dataset", "method_label")) -> pd.DataFrame:
    """:func:`sdlib.core.crossover.crossover_table` plus, from the intervals, per group: the largest
    batch size whose speedup interval lies above 1 (``last_established_gain_batch_size``) and the
    smallest whose interval lies below 1 (``first_established_loss_batch_size``); NA where none does."""
    cross = crossover_table(sp, by=by)
    d = sp[(sp["method"] != "none") & sp["speedup"].notna()]
    rows = []
    for key, g in d.groupby(list(by)):
        gain = g[g["speedup_lo"] > 1]["batch_size"]
        loss = g[g["speedup_hi"] < 1]["batch_size"]
        rows.append({**dict(zip(by, key)),
                     "last_established_gain_batch_size": int(gain.max()) if len(gain) else pd.NA,
                     "first_established_loss_batch_size": int(loss.min()) if len(loss) else pd.NA})
    extra = pd.DataFrame(rows, columns=list(by) + ["last_established_gain_batch_size",
                                                   "first_established_loss_batch_size"])
    return cross.merge(extra, on=list(by), how="left") if len(cross) else cross


def ratio_by_request(per_request: pd.DataFrame, group: Sequence[str], num: str, den: str, strata: str = "run_id",
                     n_boot: int = N_BOOT, level: float = LEVEL, offset: float = 0.0) -> pd.DataFrame:
    """Per ``group``: ``offset + sum(num) / sum(den)`` over requests, with a bootstrap interval over
    requests drawn within each ``strata`` value (each run keeps its number of requests).

    ``per_request``: one row per request with the ``num`` and ``den`` sums of its steps. Returns
    ``group`` columns, ``value``, ``value_lo``, ``value_hi``, ``n_requests``.
    """
    rows = []
    for key, g in per_request.groupby(list(group), dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        tot_d = float(g[den].sum())
        value = offset + float(g[num].sum()) / tot_d if tot_d > 0 else np.nan
        parts = [s for _, s in g.groupby(strata, dropna=False)]
        W = bootstrap.cluster_weights([len(s) for s in parts], n_boot, bootstrap.rng("ratio", *key),
                                      resample_clusters=False)  # requests drawn within each run
        d = W @ np.concatenate([s[den].to_numpy(float) for s in parts])
        with np.errstate(invalid="ignore", divide="ignore"):
            reps = offset + (W @ np.concatenate([s[num].to_numpy(float) for s in parts])) / np.where(d > 0, d, np.nan)
        lo, hi = _interval(reps, level) if len(g) >= MIN_UNITS and np.isfinite(value) else (np.nan, np.nan)
        rows.append({**dict(zip(group, key)), "value": value, "value_lo": lo, "value_hi": hi, "n_requests": len(g)})
    return pd.DataFrame(rows, columns=list(group) + ["value", "value_lo", "value_hi", "n_requests"])


def acceptance_intervals(steps: pd.DataFrame, runs: pd.DataFrame,
                         group: Sequence[str] = ("model", "method_label", "dataset"),
                         n_boot: int = N_BOOT, level: float = LEVEL) -> pd.DataFrame:
    """:func:`sdlib.analysis.measures.acceptance_by_method` (1 + accepted / drafts, pooled over batch
    sizes and repeats) plus ``mean_acceptance_length_lo/hi``: bootstrap over requests within each run."""
    acc = acceptance_by_method(steps, runs)
    s = steps[["run_id", "request_id", "drafted", "accepted"]].copy()
    s["drafted"] = s["drafted"].astype("Float64")
    s["is_draft"] = (s["drafted"].fillna(0) > 0).astype(float)
    s["acc_draft"] = s["accepted"].astype("Float64").fillna(0).astype(float) * s["is_draft"]
    per = s.groupby(["run_id", "request_id"], as_index=False)[["is_draft", "acc_draft"]].sum()
    per = per.merge(runs[["run_id"] + list(group)], on="run_id")
    ci = ratio_by_request(per, group, "acc_draft", "is_draft", n_boot=n_boot, level=level, offset=1.0)
    ci = ci.rename(columns={"value_lo": "mean_acceptance_length_lo", "value_hi": "mean_acceptance_length_hi",
                            "n_requests": "n_requests"}).drop(columns="value")
    return acc.merge(ci, on=list(group), how="left")
