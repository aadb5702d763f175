"""Every policy family on the same requests, batch sizes and cost models: speedups with intervals, and the
share of the gap (best fixed method -> Oracle Combine, or -> Oracle Select with ``upper="oracle-select"``) each
policy closes.

Policies (``--policies`` of ``sdlib simulate``) are those registered in :mod:`sdlib.core.registry` (``import
sdlib.sim.policy`` registers them): group names (``fixed``: every k of
:data:`sdlib.sim.policy.static.FIXED_KS` for EAGLE-3 and n-gram, rows ``fixed-eagle3-k3``, ...; ``oracle``:
Oracle Proposal of each drafter; ``online-ablations``: ``online-eagle3``; ``baselines``: the shipped rules of
:mod:`sdlib.sim.policy.baselines` and :mod:`sdlib.sim.policy.arctic`), policy names (``combine``, ``online``,
``online-confidence``, ...) or instance labels (``fixed-ngram-k5``). Each instance's steps come from its
registered ``build``, the same one a trace replay uses.

Speedup per (cost model, dataset, batch size, policy) = mean throughput with SD / mean throughput without,
over the requests (the simulator's definition); its interval is a bootstrap over requests (paired: the same
resamples for every policy of a cell, and for every cost model and batch size of a dataset;
:mod:`sdlib.core.bootstrap`). ``gap_share`` = (policy - best fixed) / (Oracle Combine - best fixed),
with the best fixed picked per cell; ``diff_lo``/``diff_hi`` bound policy - best fixed (paired bootstrap).

Usage:
    from sdlib.sim.policy.table import simulate_policies, gap_table
    per_req = simulate_policies(prep, ["fixed", "oracle", "combine", "online"], [1, 32], [cm])
    table = policy_table(per_req); gaps = gap_table(per_req)
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.core import bootstrap
from sdlib.core.registry import KMAX, BuildRequest, PolicyRef, expand_policies
from sdlib.sim.policy.training import ensure_predictor
from sdlib.sim.policy.walk import PolicyInputs, PolicySteps, no_sd_times, request_times
from sdlib.sim.prepared import PreparedTraces

#: Columns of the policy table (``sdlib simulate --out``).
TABLE_COLUMNS = ["dataset", "policy", "family", "batch_size", "cost_model", "speedup", "speedup_lo", "speedup_hi",
                 "tokens_per_step", "drafted_per_step", "num_requests"]
N_BOOT = bootstrap.N_BOOT
CI = bootstrap.LEVEL


def _rows(inp, st: PolicySteps, ref: PolicyRef, cm, B: int, base_cache: dict) -> dict:
    prep = inp.prep
    L = st.output_len
    key = (cm.name, B, L.tobytes())
    if key not in base_cache:
        base_cache[key] = no_sd_times(inp, L, cm, B)
    tb = base_cache[key]
    ts = request_times(inp, st, cm, B)
    w = st.weight
    R = len(prep)
    return {"policy": np.full(R, ref.label, dtype=object), "family": np.full(R, ref.spec.family, dtype=object),
            "batch_size": np.full(R, int(B)), "cost_model": np.full(R, cm.name, dtype=object), "output_len": L,
            "num_steps": np.bincount(st.req, weights=w, minlength=R),
            "gained": np.bincount(st.req, weights=w * st.gain, minlength=R),
            "drafted": np.bincount(st.req, weights=w * (st.n_i - 1), minlength=R),
            "sd_time_s": ts, "base_time_s": tb, "sd_tok_per_s": B * L / ts, "base_tok_per_s": B * L / tb}


def simulate_policies(prep: PreparedTraces, policies: Sequence[str | PolicyRef], batch_sizes: Sequence[int],
                      cost_models: Sequence, predictor=None, kmax: int = KMAX,
                      confidences: Optional[dict] = None) -> pd.DataFrame:
    """One row per (request, policy, cost model, batch size); see :func:`policy_table` for the aggregate.

    ``policies``: group names, policy names or labels (:func:`sdlib.core.registry.expand_policies`), or
    instances. ``predictor``: a :class:`sdlib.sim.policy.training.Predictor` for the online policies (None:
    cross-fitted here, once for all of them); ``kmax``: the traces' k (the longest draft they score);
    ``confidences``: {(dataset, request id): rows} for the confidence policies
    (:func:`sdlib.sim.policy.confidence.attach_confidences`).
    """
    inp = PolicyInputs.of(prep, kmax)
    refs = resolve_refs(policies, inp.kmax)
    if confidences is not None and any("confidences" in r.spec.needs for r in refs):
        # deferred: sdlib.sim.policy.confidence loads pandas, and only this path needs it
        from sdlib.sim.policy.confidence import attach_confidences

        attach_confidences(inp, confidences)
    predictor = ensure_predictor(inp, refs, predictor)
    parts, base_cache = [], {}
    cfg = [(cm, int(B)) for cm in cost_models for B in batch_sizes]
    for ref in refs:
        for (cm, B), st in zip(cfg, policy_steps_at(inp, ref, cfg, predictor)):
            parts.append(_rows(inp, st, ref, cm, B, base_cache))
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    n = len(parts)
    return pd.DataFrame({"dataset": np.tile(prep.dataset, n), "request_id": np.tile(prep.request_id, n), **cols})


def resolve_refs(policies: Sequence[str | PolicyRef], kmax: int = KMAX) -> list[PolicyRef]:
    """Names (groups, specs, labels) and instances -> instances, each once, in order."""
    out: list[PolicyRef] = []
    for p in policies:
        out += [p] if isinstance(p, PolicyRef) else expand_policies([p], kmax)
    return list(dict.fromkeys(out))


def policy_steps_at(inp: PolicyInputs, policy: str | PolicyRef, cfg: Sequence[tuple], predictor=None) -> list[PolicySteps]:
    """The steps of ``policy`` (an instance or its label) at each (cost model, batch size) of ``cfg``, through its
    registered build. The online policies need ``predictor`` (None: cross-fitted on ``inp``'s requests)."""
    (ref,) = resolve_refs([policy], inp.kmax)
    predictor = ensure_predictor(inp, [ref], predictor)
    return ref.spec.build(BuildRequest(inp, list(cfg), predictor=predictor), ref)


def _boot_weights(dataset: str, n: int, n_boot: int = N_BOOT) -> np.ndarray:
    """(n_boot, n) resampling counts of a dataset's ``n`` requests (:func:`sdlib.core.bootstrap.keyed_unit_weights`,
    cached): the same for every cost model, batch size and policy of the dataset, so every comparison of them
    is paired."""
    return bootstrap.keyed_unit_weights(("sim.policy.table", dataset, n), n, n_boot)


def summarise(per_req: pd.DataFrame, n_boot: int = N_BOOT, upper: str = "combine") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`policy_table`, :func:`gap_table`) in one pass over the cells (one bootstrap per cell).

    ``upper``: the bound the gap runs to (``combine``; ``oracle-select``, the clairvoyant per-step bound of
    :mod:`sdlib.sim.policy.select`; ``oracle-eagle3`` for EAGLE-3's length gap when only EAGLE-3's fixed k are
    simulated). Oracle Combine's gap is kept beside it (``combine_*``, NaN without a ``combine`` row)."""
    keys = ["cost_model", "dataset", "batch_size"]
    wide = per_req.set_index(keys + ["request_id", "policy"])[["sd_tok_per_s", "base_tok_per_s"]].unstack("policy")
    policies = np.asarray(wide["sd_tok_per_s"].columns)
    sd_all, base_all = wide["sd_tok_per_s"].to_numpy(), wide["base_tok_per_s"][policies].to_numpy()
    rows_of = wide.groupby(level=[0, 1, 2], sort=False).indices  # cell -> its rows (requests)
    sums = per_req.groupby(keys + ["policy"], sort=False)[["num_steps", "gained", "drafted"]].sum().to_dict("index")
    family = dict(zip(per_req["policy"], per_req["family"]))
    rows, gaps = [], []
    for cell in per_req[keys].drop_duplicates().itertuples(index=False, name=None):
        sd = sd_all[rows_of[cell]]
        ok = ~np.isnan(sd).any(axis=0)  # the policies simulated in this cell
        cols = list(policies[ok])
        # C order: a column's mean sums its requests in the order it always did (the same bits)
        S, Bm = np.ascontiguousarray(sd[:, ok]), np.ascontiguousarray(base_all[rows_of[cell]][:, ok])
        cm, ds, B = cell
        W = _boot_weights(ds, len(S), n_boot)
        first = {}  # policies share the no-SD runs of one output length: one product per distinct column
        inv = [first.setdefault(Bm[:, j].tobytes(), j) for j in range(Bm.shape[1])]
        uniq = sorted(set(inv))
        boot = (W @ S) / (W @ Bm[:, uniq])[:, [uniq.index(j) for j in inv]]
        sp = S.mean(axis=0) / Bm.mean(axis=0)
        lo, hi = bootstrap.interval(boot, CI)
        for j, pol in enumerate(cols):
            t = sums[(cm, ds, B, pol)]
            rows.append({"dataset": ds, "policy": pol, "family": family[pol], "batch_size": int(B),
                         "cost_model": cm, "speedup": float(sp[j]), "speedup_lo": float(lo[j]),
                         "speedup_hi": float(hi[j]), "tokens_per_step": float(t["gained"] / t["num_steps"]),
                         "drafted_per_step": float(t["drafted"] / t["num_steps"]), "num_requests": int(len(S))})
        fixed = [j for j, c in enumerate(cols) if family[c] == "fixed"]
        if not fixed or upper not in cols:
            continue
        jb = fixed[int(np.argmax(sp[fixed]))]
        jc = cols.index(upper)
        comb = float(sp[cols.index("combine")]) if "combine" in cols else float("nan")
        comb_gap = comb - float(sp[jb])
        other = [j for j, c in enumerate(cols) if family[c] != "fixed"]
        d_lo, d_hi = bootstrap.interval(boot[:, other] - boot[:, [jb]], CI)
        r_lo, r_hi = bootstrap.interval(boot[:, other] / boot[:, [jb]], CI)
        gap = float(sp[jc] - sp[jb])
        for i, j in enumerate(other):
            pol = cols[j]
            gaps.append({"cost_model": cm, "dataset": ds, "batch_size": int(B), "policy": pol,
                         "family": family[pol], "speedup": float(sp[j]), "best_fixed": cols[jb],
                         "best_fixed_speedup": float(sp[jb]), "best_fixed_lo": float(lo[jb]),
                         "upper_speedup": float(sp[jc]), "gap": gap, "gap_rel": gap / float(sp[jb]),
                         "gap_share": float((sp[j] - sp[jb]) / gap) if gap > 0 else float("nan"),
                         "combine_speedup": comb, "combine_gap": comb_gap,
                         "combine_gap_share": float((sp[j] - sp[jb]) / comb_gap) if comb_gap > 0 else float("nan"),
                         "diff_lo": float(d_lo[i]), "diff_hi": float(d_hi[i]),
                         "vs_best_fixed": float(sp[j] / sp[jb]), "vs_best_fixed_lo": float(r_lo[i]),
                         "vs_best_fixed_hi": float(r_hi[i]), "upper": upper})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS), pd.DataFrame(gaps)


def policy_table(per_req: pd.DataFrame, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Per (dataset, policy, batch size, cost model): speedup with a bootstrap interval over requests,
    tokens gained per step and tokens drafted per step (pooled over the requests' steps)."""
    return summarise(per_req, n_boot)[0]


def gap_table(per_req: pd.DataFrame, n_boot: int = N_BOOT, upper: str = "combine") -> pd.DataFrame:
    """Per cell and non-fixed policy: the best fixed method (and its interval's lower end), the bound ``upper``
    (``combine`` or ``oracle-select``; its speedup in ``upper_speedup``, the gap to it in ``gap``), the policy's
    speedup, its share of that gap (``gap_share``), Oracle Combine's speedup, gap and share beside it
    (``combine_speedup``, ``combine_gap``, ``combine_gap_share``: equal to the upper's when ``upper`` is
    ``combine``), and paired bootstrap intervals of (policy - best fixed) and of policy / best fixed
    (``vs_best_fixed``)."""
    return summarise(per_req, n_boot, upper)[1]
