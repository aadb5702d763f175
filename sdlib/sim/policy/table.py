"""Every policy family on the same requests, batch sizes and cost models: speedups with intervals, and the
share of the gap (best fixed method -> Oracle Combine) each policy closes.

Families (``--policies`` of ``sdlib simulate``):

* ``fixed``: every fixed k of :data:`FIXED_KS` for EAGLE-3 and n-gram (rows ``fixed-eagle3-k3``, ...);
* ``oracle``: Oracle Proposal of each method (``oracle-eagle3``, ``oracle-ngram``), the step's k = what it drafts;
* ``combine``: Oracle Combine (``combine``);
* ``online``: the project's online policy (:mod:`sdlib.sim.policy.online`); ``online-ablations``: its
  one-drafter variant ``online-eagle3`` (length only; ``online-ngram`` by name);
* ``online-confidence``, ``online-confidence-raw`` and ``online-with-confidence`` by name: EAGLE-3's length
  stopped token by token on the head's own confidence, alone or inside the online policy's drafter choice
  (:mod:`sdlib.sim.policy.confidence`; needs the requests' draft confidences);
* each baseline of :data:`sdlib.sim.policy.baselines.BASELINES` by name.

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
from sdlib.sim.policy.baselines import BASELINES, BATCH_DEPENDENT, baseline_steps
from sdlib.sim.oracle import PreparedTraces
from sdlib.sim.policy.confidence import VARIANTS as CONFIDENCE_POLICIES, WITH_ONLINE
from sdlib.sim.policy.walk import (KMAX, PolicyInputs, PolicySteps, no_sd_times, position_steps, request_times,
                                  walk)

#: Draft lengths of the ``fixed`` family (per method).
FIXED_KS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20)
FAMILIES = ("fixed", "oracle", "combine", "online", "online-ablations", "baselines")
ONLINE_VARIANTS = ("online", "online-eagle3", "online-ngram")
#: ``online-ablations``: the length-only variant (``online-ngram`` is selectable by name; it never beats
#: the n-gram's best fixed k by much, and walks slowly: most of its steps gain one token).
ABLATIONS = ("online-eagle3",)
#: Policies that read the online policy's acceptance predictor.
NEEDS_PREDICTOR = (*ONLINE_VARIANTS, WITH_ONLINE)
#: Columns of the policy table (``sdlib simulate --out``).
TABLE_COLUMNS = ["dataset", "policy", "family", "batch_size", "cost_model", "speedup", "speedup_lo", "speedup_hi",
                 "tokens_per_step", "drafted_per_step", "num_requests"]
N_BOOT = bootstrap.N_BOOT
CI = bootstrap.LEVEL


def expand_policies(names: Sequence[str], kmax: int = KMAX) -> list[str]:
    """Family and policy names -> policy names (each once, in order); unknown names raise ValueError.
    ``kmax``: the traces' longest scored draft (fixed k above it are left out of the family)."""
    out: list[str] = []
    for n in names:
        if n == "fixed":
            out += [f"fixed-{m}-k{k}" for m in ("eagle3", "ngram") for k in FIXED_KS if k <= kmax]
        elif n == "oracle":
            out += ["oracle-eagle3", "oracle-ngram"]
        elif n == "online-ablations":
            out += list(ABLATIONS)
        elif n == "baselines":
            out += list(BASELINES)
        elif n in ("combine", "oracle-eagle3", "oracle-ngram", *ONLINE_VARIANTS, *CONFIDENCE_POLICIES, *BASELINES) \
                or _fixed_spec(n):
            out.append(n)
        else:
            raise ValueError(f"unknown policy {n!r}: families {list(FAMILIES)}, baselines {list(BASELINES)}, "
                             f"fixed-<eagle3|ngram>-k<k>, {list(ONLINE_VARIANTS + CONFIDENCE_POLICIES)}")
    return list(dict.fromkeys(out))


def family_of(policy: str) -> str:
    if policy.startswith("fixed-"):
        return "fixed"
    if policy.startswith("oracle-"):
        return "oracle"
    if policy.startswith("online"):
        return "online"
    return "combine" if policy == "combine" else "baseline"


def _fixed_spec(name: str) -> Optional[tuple[str, int]]:
    parts = name.split("-")
    if len(parts) == 3 and parts[0] == "fixed" and parts[1] in ("eagle3", "ngram") and parts[2][1:].isdigit() \
            and parts[2].startswith("k") and int(parts[2][1:]) >= 1:
        return parts[1], int(parts[2][1:])
    return None


def static_steps(inp: PolicyInputs, name: str) -> PolicySteps:
    """Steps of a policy that depend neither on the batch size nor on the cost model."""
    spec = _fixed_spec(name)
    if spec:
        return position_steps(inp, f"fixed-{spec[0]}", spec[1])
    if name in ("oracle-eagle3", "oracle-ngram", "combine"):
        return position_steps(inp, name)
    return baseline_steps(name, inp)


def _rows(inp, st: PolicySteps, name: str, cm, B: int, base_cache: dict) -> dict:
    prep = inp.prep
    L = st.output_len
    key = (cm.name, B, L.tobytes())
    if key not in base_cache:
        base_cache[key] = no_sd_times(inp, L, cm, B)
    tb = base_cache[key]
    ts = request_times(inp, st, cm, B)
    w = st.weight
    R = len(prep)
    return {"policy": np.full(R, name, dtype=object), "family": np.full(R, family_of(name), dtype=object),
            "batch_size": np.full(R, int(B)), "cost_model": np.full(R, cm.name, dtype=object), "output_len": L,
            "num_steps": np.bincount(st.req, weights=w, minlength=R),
            "gained": np.bincount(st.req, weights=w * st.gain, minlength=R),
            "drafted": np.bincount(st.req, weights=w * (st.n_i - 1), minlength=R),
            "sd_time_s": ts, "base_time_s": tb, "sd_tok_per_s": B * L / ts, "base_tok_per_s": B * L / tb}


def simulate_policies(prep: PreparedTraces, policies: Sequence[str], batch_sizes: Sequence[int],
                      cost_models: Sequence, predictor=None, kmax: int = KMAX,
                      confidences: Optional[dict] = None) -> pd.DataFrame:
    """One row per (request, policy, cost model, batch size); see :func:`policy_table` for the aggregate.

    ``predictor``: a :class:`sdlib.sim.policy.training.Predictor` for the online policies (None: cross-fitted here);
    ``kmax``: the traces' k (the longest draft they score); ``confidences``: {(dataset, request id): rows} for
    the confidence policies (:func:`sdlib.sim.policy.confidence.attach_confidences`).
    """
    inp = PolicyInputs.of(prep, kmax)
    names = expand_policies(policies, inp.kmax)
    if confidences is not None and any(n in CONFIDENCE_POLICIES for n in names):
        from sdlib.sim.policy.confidence import attach_confidences

        attach_confidences(inp, confidences)
    if predictor is None and any(n in NEEDS_PREDICTOR for n in names):  # cross-fitted once for all of them
        from sdlib.sim.policy.features import add_features
        from sdlib.sim.policy.training import crossfit

        add_features(inp)
        predictor = crossfit(inp)
    parts, base_cache = [], {}
    cfg = [(cm, int(B)) for cm in cost_models for B in batch_sizes]
    for name in names:
        for (cm, B), st in zip(cfg, policy_steps_at(inp, name, cfg, predictor)):
            parts.append(_rows(inp, st, name, cm, B, base_cache))
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    n = len(parts)
    return pd.DataFrame({"dataset": np.tile(prep.dataset, n), "request_id": np.tile(prep.request_id, n), **cols})


def policy_steps_at(inp: PolicyInputs, name: str, cfg: Sequence[tuple], predictor=None) -> list[PolicySteps]:
    """The steps of policy ``name`` at each (cost model, batch size) of ``cfg`` (shared where they do not
    depend on them). The online variants need ``predictor`` (None: cross-fitted on ``inp``'s requests)."""
    from sdlib.sim.policy.features import add_features
    from sdlib.sim.policy.online import OnlinePolicy

    if name in NEEDS_PREDICTOR:
        add_features(inp)
        if predictor is None:
            from sdlib.sim.policy.training import crossfit

            predictor = crossfit(inp)
    if name in ONLINE_VARIANTS:
        pol = OnlinePolicy(predictor.models, [c for c, _ in cfg], [b for _, b in cfg], variant=name,
                           model_of_request=predictor.model_of_request(), kmax=inp.kmax)
        return walk(inp, pol, n_configs=len(cfg))
    if name in CONFIDENCE_POLICIES:
        from sdlib.sim.policy.confidence import confidence_steps

        return confidence_steps(inp, name, cfg, predictor)
    if name in BATCH_DEPENDENT:
        by_b = {B: baseline_steps(name, inp, B) for B in dict.fromkeys(b for _, b in cfg)}
        return [by_b[b] for _, b in cfg]
    st = static_steps(inp, name)
    return [st] * len(cfg)


def _boot_weights(dataset: str, n: int, n_boot: int = N_BOOT) -> np.ndarray:
    """(n_boot, n) resampling counts of a dataset's ``n`` requests (:func:`sdlib.core.bootstrap.keyed_unit_weights`,
    cached): the same for every cost model, batch size and policy of the dataset, so every comparison of them
    is paired."""
    return bootstrap.keyed_unit_weights(("sim.policy.table", dataset, n), n, n_boot)


def summarise(per_req: pd.DataFrame, n_boot: int = N_BOOT, upper: str = "combine") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`policy_table`, :func:`gap_table`) in one pass over the cells (one bootstrap per cell).

    ``upper``: the bound the gap runs to (``combine``; ``oracle-eagle3`` for EAGLE-3's length gap when only
    EAGLE-3's fixed k are simulated)."""
    keys = ["cost_model", "dataset", "batch_size"]
    wide = per_req.set_index(keys + ["request_id", "policy"])[["sd_tok_per_s", "base_tok_per_s"]].unstack("policy")
    policies = np.asarray(wide["sd_tok_per_s"].columns)
    sd_all, base_all = wide["sd_tok_per_s"].to_numpy(), wide["base_tok_per_s"][policies].to_numpy()
    rows_of = wide.groupby(level=[0, 1, 2], sort=False).indices  # cell -> its rows (requests)
    sums = per_req.groupby(keys + ["policy"], sort=False)[["num_steps", "gained", "drafted"]].sum().to_dict("index")
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
            rows.append({"dataset": ds, "policy": pol, "family": family_of(pol), "batch_size": int(B),
                         "cost_model": cm, "speedup": float(sp[j]), "speedup_lo": float(lo[j]),
                         "speedup_hi": float(hi[j]), "tokens_per_step": float(t["gained"] / t["num_steps"]),
                         "drafted_per_step": float(t["drafted"] / t["num_steps"]), "num_requests": int(len(S))})
        fixed = [j for j, c in enumerate(cols) if c.startswith("fixed-")]
        if not fixed or upper not in cols:
            continue
        jb = fixed[int(np.argmax(sp[fixed]))]
        jc = cols.index(upper)
        other = [j for j, c in enumerate(cols) if not c.startswith("fixed-")]
        d_lo, d_hi = bootstrap.interval(boot[:, other] - boot[:, [jb]], CI)
        r_lo, r_hi = bootstrap.interval(boot[:, other] / boot[:, [jb]], CI)
        gap = float(sp[jc] - sp[jb])
        for i, j in enumerate(other):
            pol = cols[j]
            gaps.append({"cost_model": cm, "dataset": ds, "batch_size": int(B), "policy": pol,
                         "family": family_of(pol), "speedup": float(sp[j]), "best_fixed": cols[jb],
                         "best_fixed_speedup": float(sp[jb]), "best_fixed_lo": float(lo[jb]),
                         "combine_speedup": float(sp[jc]), "gap": gap, "gap_rel": gap / float(sp[jb]),
                         "gap_share": float((sp[j] - sp[jb]) / gap) if gap > 0 else float("nan"),
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
    (its speedup in ``combine_speedup``), the policy's speedup, its share of the gap, and paired bootstrap
    intervals of (policy - best fixed) and of policy / best fixed (``vs_best_fixed``)."""
    return summarise(per_req, n_boot, upper)[1]
