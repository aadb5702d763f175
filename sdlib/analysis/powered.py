"""Comparisons a powered sweep can support: paired ratios over prompts, repeats and engine starts, the A/A check
of the same engines, the minimum detectable effect, and which differences are established.

A powered sweep (``engine_starts`` >= 2, ``order: abba``, an A/A twin ``methods.*.aa_of``; e.g.
configs/h200_powered_ngram.yaml) runs every arm on every engine start, ``repeats`` times, over the same prompts.
The unit of comparison is a (engine start, repeat, prompt): its value in a cell is the prompt's decode rate,
``(output tokens - 1) / (finish - first token)`` of its requests (closed loop: a prompt cycled at large batch
sizes has several; they are averaged). Two arms at one (dataset, batch size) are paired on the units both ran,
and their ratio is a ratio of means, ``sum(rate_a) / sum(rate_b)``.

Its interval has to carry what varies from one cell to the next, not only the prompts: on the H200 two cells of
identical plans on one engine start differed by up to 8% (2026-12-02), far outside a bootstrap over their
prompts. So the clusters are the cells, (engine start, repeat): a two-level bootstrap
(:func:`sdlib.core.bootstrap.cluster_weights`: cells drawn with replacement, then prompts within each) gives
the standard error, and :func:`sdlib.core.bootstrap.few_cluster_interval` turns it into an interval with
Student's t on ``C - 1`` degrees of freedom (``C`` cells per arm: 2 engine starts x 2 repeats gives 3), since
a percentile interval over a handful of clusters is far too narrow.

* The **A/A check** of a block (dataset, batch size): the twin over its arm, whose interval must contain 1
  (``contains_1``); ``drift`` is how far that interval reaches from 1, ``max(|lo - 1|, |hi - 1|)``.
* A difference is **established** when the block's A/A interval contains 1 (the intervals are then to be
  believed) and its own interval excludes 1 by more than the block's A/A drift (``lo > 1 + drift`` or
  ``hi < 1 - drift``: the convention's "excludes 1 by more than the A/A drift on the same engines"); otherwise it
  is "not established". ``aa_drift`` in each comparison's row is the drift it was held to.
* ``starts`` (:func:`start_table`): each arm's rate at each later engine start over its rate at the first, and
  the block's median over its arms: a machine or engine that moved between the starts shows there. A move that
  is the same for every arm cancels in the comparisons; one that differs by engine (a slowdown that begins in
  the middle of the run) biases the ratios between arms of different engines.
* ``mde``: the minimum detectable effect of the block, ``exp((t_0.975 + t_0.8) * se(log A/A)) - 1`` on the same
  degrees of freedom: the smallest relative difference a paired comparison of this size detects with 80% power
  at the 5% level.

Usage:
    from sdlib.analysis.powered import powered_tables
    t = powered_tables("data/sweeps/h200_powered_ngram")
    # {"units", "arms", "speedups", "aa", "headline", "fixed", "same_engine", "versus", "starts", "blocks"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from sdlib.analysis.replay import method_info
from sdlib.core import bootstrap
from sdlib.core.registry import method_spec, replay_ref
from sdlib.store import SweepStore

#: Columns every comparison row carries (what it rests on).
SUPPORT = ["n_prompts", "n_starts", "n_cells", "n_units", "output_tokens"]
#: What a cluster (a cell of one arm) is: the unit's coordinates other than the prompt.
CLUSTER = ["engine_start", "repeat"]
#: The 80% power quantile of the minimum detectable effect.
POWER = 0.8


def request_rates(runs: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Per measured request: its cell's coordinates and ``rate`` = (output tokens - 1) / (finish - first token),
    tokens per second (requests of one token or no decode time are left out)."""
    r = requests.merge(runs[["run_id", "method_label", "dataset", "batch_size", "engine_start", "repeat"]],
                       on="run_id")
    dur = r["finish_s"] - r["first_token_s"]
    ok = (r["output_tokens"] > 1) & (dur > 0)
    r = r[ok].assign(rate=(r["output_tokens"][ok] - 1) / dur[ok])
    return r[["run_id", "method_label", "dataset", "batch_size", "engine_start", "repeat", "prompt_index",
              "output_tokens", "rate"]].reset_index(drop=True)


def units(rates: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, batch size, method label, engine start, repeat, prompt): the mean rate of the prompt's
    requests, how many there were and their output tokens."""
    g = rates.groupby(["dataset", "batch_size", "method_label", *CLUSTER, "prompt_index"])
    return g.agg(rate=("rate", "mean"), n_requests=("rate", "size"), output_tokens=("output_tokens", "sum")
                 ).reset_index()


def arm_info(provenance: dict) -> pd.DataFrame:
    """Per method label: ``method_label, method, K, replay, family`` (``none`` for no SD, the replayed
    policy's registry family, ``fixed`` for a real method with its own k) and ``aa_of`` (the arm an A/A twin
    repeats, else None)."""
    info = method_info(provenance)
    aa = {m["label"]: m.get("aa_of") for m in provenance.get("config", {}).get("methods", [])}
    fam = []
    for m in info.itertuples():
        if not method_spec(m.method).is_sd:
            fam.append("none")
        elif isinstance(m.replay, str) and m.replay:
            fam.append(replay_ref(m.replay, m.method, int(m.K)).spec.family)
        else:
            fam.append("fixed")
    return info.assign(family=fam, aa_of=info["method_label"].map(aa))


def _pair(u: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    keys = [*CLUSTER, "prompt_index"]
    ua = u.loc[u["method_label"] == a, keys + ["rate", "output_tokens"]]
    ub = u.loc[u["method_label"] == b, keys + ["rate", "output_tokens"]]
    return ua.merge(ub, on=keys, suffixes=("_a", "_b")).sort_values(keys).reset_index(drop=True)


def ratio_replicates(u: pd.DataFrame, a: str, b: str, key: tuple, n_boot: int = bootstrap.N_BOOT):
    """(point ratio of means a / b over their paired units, its two-level bootstrap replicates over cells and
    prompts, the pairs; sorted by cell)."""
    p = _pair(u, a, b)
    if len(p) < bootstrap.MIN_UNITS:
        return float("nan"), np.full(n_boot, np.nan), p
    sizes = p.groupby(CLUSTER, sort=True).size().to_numpy()
    W = bootstrap.cluster_weights(sizes, n_boot, bootstrap.rng("analysis.powered", *key, a, b))
    reps = bootstrap.ratio(W, p["rate_a"].to_numpy(float), p["rate_b"].to_numpy(float))
    return float(p["rate_a"].sum() / p["rate_b"].sum()), reps, p


def compare(u: pd.DataFrame, dataset: str, batch_size: int, a: str, b: str, aa_ok: bool = True,
            n_boot: int = bootstrap.N_BOOT, drift: float = 0.0) -> dict:
    """One paired comparison a / b at (dataset, batch size): ratio, interval, what it rests on, whether it
    is established (``aa_ok``: the block's A/A check passed; ``drift``: the block's A/A drift, which the
    interval must clear)."""
    cell = u[(u["dataset"] == dataset) & (u["batch_size"] == batch_size)]
    r, reps, p = ratio_replicates(cell, a, b, (dataset, int(batch_size)), n_boot)
    lo, hi = bootstrap.few_cluster_interval(r, reps, _n_cells(p))
    return {"dataset": dataset, "batch_size": int(batch_size), "arm": a, "reference": b, "ratio": r,
            "ratio_lo": lo, "ratio_hi": hi, **support(p), "aa_ok": bool(aa_ok), "aa_drift": float(drift),
            "established": bool(established(lo, hi, aa_ok, drift))}


def _n_cells(p: pd.DataFrame) -> int:
    return int(len(p.drop_duplicates(CLUSTER))) if len(p) else 0


def support(p: pd.DataFrame) -> dict:
    """What a comparison rests on (:data:`SUPPORT`): distinct prompts, engine starts, cells per arm, paired
    units and output tokens of both arms."""
    if not len(p):
        return {"n_prompts": 0, "n_starts": 0, "n_cells": 0, "n_units": 0, "output_tokens": 0}
    return {"n_prompts": int(p["prompt_index"].nunique()), "n_starts": int(p["engine_start"].nunique()),
            "n_cells": _n_cells(p), "n_units": int(len(p)),
            "output_tokens": int(p["output_tokens_a"].sum() + p["output_tokens_b"].sum())}


def established(lo: float, hi: float, aa_ok: bool = True, drift: float = 0.0) -> bool:
    """The block's A/A interval contains 1 (``aa_ok``) and the interval excludes 1 by more than the A/A
    ``drift`` (NaN drift: not established)."""
    return bool(aa_ok and np.isfinite(lo) and np.isfinite(hi) and np.isfinite(drift)
                and (lo > 1 + drift or hi < 1 - drift))


def aa_table(u: pd.DataFrame, arms: pd.DataFrame, n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size, A/A twin): the twin over its arm (should be 1), its interval, the smallest and
    largest ratio of a single cell pair, the block's ``drift`` and ``mde``."""
    rows = []
    for twin in arms[arms["aa_of"].notna()].itertuples():
        for (ds, bs), cell in u.groupby(["dataset", "batch_size"]):
            if not {twin.method_label, twin.aa_of} <= set(cell["method_label"]):
                continue
            r, reps, p = ratio_replicates(cell, twin.method_label, twin.aa_of, (ds, int(bs)), n_boot)
            C = _n_cells(p)
            lo, hi = bootstrap.few_cluster_interval(r, reps, C)
            logs = np.log(reps[np.isfinite(reps) & (reps > 0)])
            se = float(np.std(logs, ddof=1)) * np.sqrt(C / (C - 1)) if logs.size > 1 and C > 1 else float("nan")
            q = bootstrap.t_quantile(1 - (1 - bootstrap.LEVEL) / 2, C - 1) + bootstrap.t_quantile(POWER, C - 1)
            per_cell = cell_ratios(p)
            rows.append({"dataset": ds, "batch_size": int(bs), "arm": twin.method_label, "reference": twin.aa_of,
                         "ratio": r, "ratio_lo": lo, "ratio_hi": hi, "contains_1": bool(lo <= 1 <= hi),
                         "cell_ratio_min": float(per_cell.min()) if len(per_cell) else float("nan"),
                         "cell_ratio_max": float(per_cell.max()) if len(per_cell) else float("nan"),
                         "drift": float(max(abs(lo - 1), abs(hi - 1))) if np.isfinite(lo) else float("nan"),
                         "mde": float(np.exp(q * se) - 1) if np.isfinite(se) else float("nan"), **support(p)})
    return pd.DataFrame(rows, columns=["dataset", "batch_size", "arm", "reference", "ratio", "ratio_lo", "ratio_hi",
                                       "contains_1", "cell_ratio_min", "cell_ratio_max", "drift", "mde", *SUPPORT])


def cell_ratios(p: pd.DataFrame) -> pd.Series:
    """Per cell (engine start, repeat) of paired units ``p``: the ratio of means a / b over its prompts."""
    if not len(p):
        return pd.Series(dtype=float)
    g = p.groupby(CLUSTER, sort=True)
    return g["rate_a"].sum() / g["rate_b"].sum()


def _aa_ok(aa: pd.DataFrame, ds: str, bs: int) -> bool:
    """The block has an A/A pair and every one of its A/A intervals contains 1."""
    c = aa[(aa["dataset"] == ds) & (aa["batch_size"] == bs)]["contains_1"]
    return bool(len(c) and c.all())


def aa_drift(aa: pd.DataFrame, ds: str, bs: int) -> float:
    """The block's A/A drift (the largest of its A/A pairs'); NaN without an A/A pair."""
    d = aa[(aa["dataset"] == ds) & (aa["batch_size"] == bs)]["drift"]
    return float(d.max()) if len(d) else float("nan")


def aa_gate(aa: pd.DataFrame, ds: str, bs: int) -> dict:
    """``compare``'s A/A arguments for a block: ``aa_ok`` and ``drift``."""
    return {"aa_ok": _aa_ok(aa, ds, bs), "drift": aa_drift(aa, ds, bs)}


def speedup_table(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, baseline: str = "none",
                  n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Every SD arm over the no-SD ``baseline`` at each (dataset, batch size), paired over prompts and starts."""
    return _over(u, arms, aa, baseline, {baseline}, n_boot)


def _over(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, reference: str, skip: set,
          n_boot: int) -> pd.DataFrame:
    """Every arm but ``skip`` over ``reference`` at each (dataset, batch size), paired (:func:`compare`, held to
    the block's A/A gate), with the arm's ``family``."""
    rows = []
    fam = dict(zip(arms["method_label"], arms["family"]))
    for (ds, bs), cell in u.groupby(["dataset", "batch_size"]):
        for a in sorted(set(cell["method_label"]) - skip):
            row = compare(u, ds, int(bs), a, reference, n_boot=n_boot, **aa_gate(aa, ds, int(bs)))
            rows.append({**row, "family": fam.get(a)})
    return pd.DataFrame(rows)


def _over_best_fixed(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, speedups: pd.DataFrame,
                     fixed_arms: bool, n_boot: int) -> pd.DataFrame:
    """Per (dataset, batch size): the policy arms (``fixed_arms`` False) or the other fixed arms (True) over the
    block's best fixed arm (the fixed arm with the highest speedup point; A/A twins left out), paired;
    ``best_fixed`` names it."""
    twins = set(arms.loc[arms["aa_of"].notna(), "method_label"])
    fam = dict(zip(arms["method_label"], arms["family"]))
    rows = []
    for (ds, bs), sp in speedups.groupby(["dataset", "batch_size"]):
        sp = sp[~sp["arm"].isin(twins)]
        fixed = sp[sp["family"] == "fixed"]
        if fixed.empty:
            continue
        best = fixed.loc[fixed["ratio"].idxmax(), "arm"]
        which = fixed["arm"][fixed["arm"] != best] if fixed_arms else sp.loc[~sp["family"].isin(["fixed", "none"]),
                                                                              "arm"]
        for a in which:
            row = compare(u, ds, int(bs), a, best, n_boot=n_boot, **aa_gate(aa, ds, int(bs)))
            rows.append({**row, "family": fam.get(a), "best_fixed": best})
    return pd.DataFrame(rows)


def headline_table(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, speedups: pd.DataFrame,
                   n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size): every non-fixed arm over the best fixed arm of that block (the fixed arm with
    the highest speedup point; A/A twins excluded), paired; ``best_fixed`` names it. The choice of the best
    fixed arm uses the same data, which favours it slightly: a policy called ahead of it is ahead of the
    strongest fixed arm this sweep measured."""
    return _over_best_fixed(u, arms, aa, speedups, False, n_boot)


def fixed_table(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, speedups: pd.DataFrame,
                n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size): every other fixed arm (A/A twins left out) over the block's best fixed arm,
    paired like :func:`headline_table`. With :func:`same_engine_table` it splits a policy's ratio over the best
    fixed arm in two, ``policy / best = (policy / its engine's fixed arm) x (that fixed arm / best)``, the second
    factor being what the policy's engine (its drafter and K) costs against the best fixed arm; where the
    engine's fixed arm is the best one it has no row here, and the factor is 1. The points multiply exactly when
    the three arms ran the same units (a whole block in which no arm lost a prompt); the intervals do not. Two
    fixed arms' speedups over no SD divide to the same point on the same units, but as two unpaired intervals."""
    return _over_best_fixed(u, arms, aa, speedups, True, n_boot)


#: What :func:`verdicts` calls a comparison: established ahead of its reference, behind it, or neither.
VERDICTS = ("ahead", "behind", "not established")


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """A comparison table's rows (``headline``, ``fixed``, ``same_engine``) with ``verdict``: "ahead" where the
    difference is established and its interval lies above 1, "behind" where established and below 1, else "not
    established" (the A/A rule decides, in ``established``; the interval's side names the direction)."""
    est = table["established"].astype(bool)
    both = est & ~(table["ratio_lo"] > 1) & ~(table["ratio_hi"] < 1)
    if both.any():  # established() cannot give this (its drift is never negative): a table edited by hand
        raise ValueError(f"verdicts: {int(both.sum())} row(s) marked established whose interval contains 1")
    v = np.where(est & (table["ratio_lo"] > 1), VERDICTS[0], np.where(est & (table["ratio_hi"] < 1), VERDICTS[1],
                                                                      VERDICTS[2]))
    return table.assign(verdict=v)


def same_engine_table(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame,
                      n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size): every policy arm (not fixed, not no SD, not an A/A twin) over the fixed arm that
    runs on the same engine and drafts that engine's whole K (its replayed policy's k is K), paired like
    :func:`compare`; ``same_engine_fixed`` names it. Where a vLLM engine verifies its K on every row (0.34), this
    separates what a policy's plan gains from what its engine's K costs, which the ratio over the best fixed arm
    (:func:`headline_table`) joins. A policy with no such fixed arm beside it has no row."""
    twins = set(arms.loc[arms["aa_of"].notna(), "method_label"])
    fixed = arms[(arms["family"] == "fixed") & ~arms["method_label"].isin(twins) & arms["replay"].notna()]
    same = {f.engine: f.method_label for f in fixed.itertuples()  # the registry's k of the replayed policy
            if replay_ref(f.replay, f.method, int(f.K)).k == int(f.K)}
    policies = arms[~arms["family"].isin(["fixed", "none"]) & ~arms["method_label"].isin(twins)
                    & arms["engine"].isin(list(same))]
    rows = []
    for (ds, bs), cell in u.groupby(["dataset", "batch_size"]):
        ran = set(cell["method_label"])
        for a in policies.itertuples():
            ref = same[a.engine]
            if a.method_label in ran and ref in ran:
                row = compare(u, ds, int(bs), a.method_label, ref, n_boot=n_boot, **aa_gate(aa, ds, int(bs)))
                rows.append({**row, "family": a.family, "same_engine_fixed": ref})
    return pd.DataFrame(rows)


def versus_table(u: pd.DataFrame, arms: pd.DataFrame, aa: pd.DataFrame, reference: str,
                 n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Every SD arm over one named arm ``reference`` (a shipped rule, e.g. vLLM's adaptive verification) at each
    (dataset, batch size) where it ran, paired over prompts and cells like :func:`compare`; no SD and the A/A
    twins are left out. ``reference`` names the arm each row was divided by."""
    twins = set(arms.loc[arms["aa_of"].notna(), "method_label"])
    skip = set(arms.loc[arms["family"] == "none", "method_label"]) | twins | {reference}
    ran = u.groupby(["dataset", "batch_size"])["method_label"].transform(lambda m: (m == reference).any())
    return _over(u[ran.astype(bool)], arms, aa, reference, skip, n_boot)


def start_table(u: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, batch size, arm) and engine start after the arm's first: ``ratio``, the arm's rate at that
    start over its rate at its first, a ratio of sums paired on (repeat, prompt) like every comparison here
    (``n_units`` pairs); ``block_median`` / ``block_min`` / ``block_max`` over the block's arms at that start (an
    engine that serves several arms counts once per arm). A steady machine gives ratios near 1 for every arm. No
    interval: it describes the run, it is not a finding. Like the comparisons, it pools a block's models."""
    cols = ["dataset", "batch_size", "arm", "engine_start", "ratio", "n_units"]
    rows = []
    for (ds, bs, arm), g in u.groupby(["dataset", "batch_size", "method_label"]):
        starts = sorted(g["engine_start"].unique())
        first = g[g["engine_start"] == starts[0]]
        for s in starts[1:]:
            m = g[g["engine_start"] == s].merge(first, on=["repeat", "prompt_index"], suffixes=("", "_0"))
            if len(m) and m["rate_0"].sum() > 0:
                rows.append((ds, int(bs), arm, int(s), float(m["rate"].sum() / m["rate_0"].sum()), len(m)))
    df = pd.DataFrame(rows, columns=cols)
    g = df.groupby(["dataset", "batch_size", "engine_start"])["ratio"]
    return df.assign(block_median=g.transform("median"), block_min=g.transform("min"), block_max=g.transform("max"))


def block_status(runs: pd.DataFrame, provenance: dict) -> pd.DataFrame:
    """Per (model, dataset, batch size) the sweep holds cells of: ``cells_expected`` (every arm the config runs
    there, at every engine start and repeat of the design), ``cells_done`` and ``complete``. A sweep still being
    added to across GPU sessions holds parts of blocks; only complete blocks are compared, since a best fixed arm
    chosen without one of the arms, or an arm seen on one engine start, would read as a finding. The arms and the
    design come from the recorded config (a method's selections, ``targets``, ``datasets``, ``batch_sizes``, are
    part of its cells' keys, so they do not change under a sweep); starts and repeats also from the cells, where a
    later invocation added some."""
    from sdlib.config import parse_sweep  # deferred: pydantic, and only this path needs it

    cols = ["model", "dataset", "batch_size", "cells_expected", "cells_done", "complete"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    sw = parse_sweep(provenance["config"])
    starts = max(sw.engine_starts, int(runs["engine_start"].max()) + 1)
    reps = max(sw.repeats, int(runs["repeat"].max()) + 1)
    # the arms of each block: the config's own cells (its method selections applied by SweepConfig.cells)
    arms: dict[tuple, set] = {}
    for c in sw.cells():
        arms.setdefault((c.model.name, c.workload.label, c.batch_size), set()).add(c.method.label)
    rows = []
    for (model, ds, bs), g in runs.groupby(["model", "dataset", "batch_size"]):
        labels = arms.get((model, ds, int(bs)), set()) | set(g["method_label"])
        want = {(lab, s, r) for lab in labels for s in range(starts) for r in range(reps)}
        have = set(zip(g["method_label"], g["engine_start"], g["repeat"]))
        rows.append({"model": model, "dataset": ds, "batch_size": int(bs), "cells_expected": len(want),
                     "cells_done": len(want & have), "complete": want <= have})
    return pd.DataFrame(rows, columns=cols)


def powered_tables(sweep_dir: str | Path, n_boot: int = bootstrap.N_BOOT,
                   baseline: Optional[str] = "none") -> dict[str, pd.DataFrame]:
    """``units``, ``arms`` (:func:`arm_info`), ``speedups`` (each arm over no SD), ``aa`` (A/A twins, drift,
    MDE), ``headline`` (each policy over the best fixed arm), ``fixed`` (each other fixed arm over the best one:
    :func:`fixed_table`), ``same_engine`` (each policy over the fixed arm of
    its own engine: :func:`same_engine_table`), ``versus`` (each SD arm over each replayed
    shipped rule, family ``baseline``: :func:`versus_table`; empty without one) and ``starts`` (each arm's later
    engine starts over its first: :func:`start_table`) of one powered sweep's current cells, in its complete
    blocks only; ``blocks`` (:func:`block_status`) says which blocks those are."""
    store = SweepStore(sweep_dir)
    runs, requests = store.read("runs"), store.read("requests")
    prov = store.read_provenance()
    arms = arm_info(prov)
    blocks = block_status(runs, prov)
    # the comparisons pool a (dataset, batch size) over models: kept when every model's block there is whole
    whole = blocks.groupby(["dataset", "batch_size"])["complete"].all()
    done = whole[whole].reset_index()[["dataset", "batch_size"]]
    runs = runs.merge(done, on=["dataset", "batch_size"])
    u = units(request_rates(runs, requests))
    if u.empty:  # no block complete yet: nothing to compare
        return {"units": u, "arms": arms, "speedups": pd.DataFrame(), "aa": pd.DataFrame(),
                "headline": pd.DataFrame(), "fixed": pd.DataFrame(), "same_engine": pd.DataFrame(),
                "versus": pd.DataFrame(),
                "starts": pd.DataFrame(), "blocks": blocks}
    aa = aa_table(u, arms, n_boot)
    sp = speedup_table(u, arms, aa, baseline, n_boot)
    rules = arms.loc[(arms["family"] == "baseline") & arms["aa_of"].isna(), "method_label"]
    vs = [versus_table(u, arms, aa, r, n_boot) for r in rules]
    return {"units": u, "arms": arms, "speedups": sp, "aa": aa, "headline": headline_table(u, arms, aa, sp, n_boot),
            "fixed": fixed_table(u, arms, aa, sp, n_boot), "same_engine": same_engine_table(u, arms, aa, n_boot),
            "versus": pd.concat(vs, ignore_index=True) if vs else pd.DataFrame(), "starts": start_table(u),
            "blocks": blocks}


def replayed_tokens_per_step(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.Series:
    """Per method label: tokens each row gained per verify step (mean of ``accepted + 1`` over every step of its
    cells' ``steps`` table), what the replayed plans gave; NaN-free labels only (no SD has no steps)."""
    if steps.empty:
        return pd.Series(dtype="float64", name="tokens_per_step")
    s = steps.merge(runs[["run_id", "method_label"]], on="run_id")
    return (s["accepted"].astype("float64") + 1).groupby(s["method_label"]).mean().rename("tokens_per_step")


def policies_vs_simulated(headline: pd.DataFrame, arms: pd.DataFrame, gaps: pd.DataFrame, cost_model: str,
                          table: Optional[pd.DataFrame] = None,
                          replayed: Optional[pd.Series] = None) -> pd.DataFrame:
    """Measured against simulated as paired ratios, for replayed policies: each arm of ``headline`` (the arm over
    the block's best fixed arm, measured, with its interval) beside the simulator's ratio of the policy it replays
    over the best fixed method of the same cell (``gaps``: :func:`sdlib.sim.policy.table.summarise`'s gap table,
    its ``vs_best_fixed`` and bootstrap interval over requests, under ``cost_model``).

    ``sim_over_measured`` = simulated / measured and its range ``sim_over_measured_lo``/``_hi`` (simulated over
    the measured interval's ends: the measured interval only); NaN where the simulator's best fixed policy
    (``best_fixed_sim``) is not the one the measured block's best fixed arm replays (``best_fixed_replay``), since
    the two ratios then have different references. ``tokens_per_step_sim`` (``table``: the simulator's policy
    table, its ``tokens_per_step``) against ``tokens_per_step_replayed`` (``replayed``:
    :func:`replayed_tokens_per_step`) says whether the simulation decided as the replayed plans did
    (``same_plans``: within 0.5%); where it did not (a policy whose calibration is cross-fitted over a different
    set of requests decides differently), the ratio compares different decisions, not only the cost model."""
    cols = ["dataset", "batch_size", "arm", "replay", "best_fixed", "best_fixed_replay", "ratio", "ratio_lo",
            "ratio_hi", "established", "n_prompts", "n_starts", "n_cells", "best_fixed_sim", "simulated",
            "simulated_lo", "simulated_hi", "sim_over_measured", "sim_over_measured_lo", "sim_over_measured_hi",
            "tokens_per_step_sim", "tokens_per_step_replayed", "same_plans"]
    if headline.empty or gaps.empty:
        return pd.DataFrame(columns=cols)
    rep = dict(zip(arms["method_label"], arms["replay"]))
    h = headline.assign(replay=headline["arm"].map(rep), best_fixed_replay=headline["best_fixed"].map(rep))
    g = gaps[gaps["cost_model"] == cost_model].rename(columns={
        "policy": "replay", "best_fixed": "best_fixed_sim", "vs_best_fixed": "simulated",
        "vs_best_fixed_lo": "simulated_lo", "vs_best_fixed_hi": "simulated_hi"})
    out = h.merge(g[["dataset", "batch_size", "replay", "best_fixed_sim", "simulated", "simulated_lo",
                     "simulated_hi"]], on=["dataset", "batch_size", "replay"])
    same_ref = out["best_fixed_sim"] == out["best_fixed_replay"]
    for col, div in (("sim_over_measured", "ratio"), ("sim_over_measured_lo", "ratio_hi"),
                     ("sim_over_measured_hi", "ratio_lo")):
        out[col] = (out["simulated"] / out[div]).where(same_ref)
    if table is not None and len(table):
        t = table[table["cost_model"] == cost_model][["dataset", "batch_size", "policy", "tokens_per_step"]]
        out = out.merge(t.rename(columns={"policy": "replay", "tokens_per_step": "tokens_per_step_sim"}),
                        on=["dataset", "batch_size", "replay"], how="left")
    else:
        out["tokens_per_step_sim"] = np.nan
    out["tokens_per_step_replayed"] = out["arm"].map(replayed) if replayed is not None else np.nan
    rel = (out["tokens_per_step_sim"] / out["tokens_per_step_replayed"] - 1).abs()
    out["same_plans"] = (rel <= 0.005).where(rel.notna())
    return out[cols]


def powered_vs_simulated(headline: pd.DataFrame, paired_gains: pd.DataFrame) -> pd.DataFrame:
    """Measured against simulated as paired ratios, on a powered sweep: each oracle arm of ``headline``
    (:func:`headline_table`: the arm over the best fixed arm, its 95% t interval over cells and prompts) beside
    the simulator's ratio of the same two arms over the same prompts from each predictor (``paired_gains``:
    :func:`sdlib.analysis.replay_report.paired_gains`, whose own ``measured`` interval spans prompts only, so it
    is not used). ``sim_over_measured`` = simulated / measured; ``fixed_overprediction`` (the predictor's
    speedup of the best fixed cell over the measured one, - 1) is kept apart; ``same_fixed``: both chose the
    same best fixed arm."""
    cols = ["dataset", "batch_size", "arm", "best_fixed", "ratio", "ratio_lo", "ratio_hi", "established",
            "n_prompts", "n_starts", "n_cells"]
    if headline.empty or paired_gains.empty:
        return pd.DataFrame(columns=cols + ["predictor", "simulated", "sim_over_measured", "fixed_overprediction",
                                            "same_fixed"])
    pg = paired_gains.rename(columns={"arm": "oracle", "arm_label": "arm"})[
        ["dataset", "batch_size", "arm", "oracle", "predictor", "best_fixed_label", "simulated",
         "fixed_overprediction"]]
    out = headline[cols].merge(pg, on=["dataset", "batch_size", "arm"])
    out["sim_over_measured"] = out["simulated"] / out["ratio"]
    out["same_fixed"] = out["best_fixed"] == out["best_fixed_label"]
    return out.drop(columns="best_fixed_label")
