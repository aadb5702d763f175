"""Trace-driven speculative-decoding simulator (fixed k, Oracle Proposal, Oracle Combine) and Leviathan's bound.

A reimplementation, vectorised with numpy, of the authors' simulator
(SpecDecode-Bench/simulator commit 2fdccbd, ``simulator.py``), driven by long-form
acceptance traces (:mod:`sdlib.sim.traces`) and a :class:`~sdlib.sim.costmodel.CostModel`.

Model (the authors' definitions):

* a batch of ``B`` = ``B`` copies of one request; every copy advances by the same
  gain each step. After the prefill (``T(0, B*P)`` + overhead) a request holds 1
  output token; a decode step that starts with ``c`` output tokens costs
  ``draft + T(kv=B*(P+c), n=B*n_i) + overhead`` where ``n_i`` = tokens proposed + 1;
* policies (:class:`sdlib.core.registry.PolicyRef`; the authors call them predict methods): fixed k
  (their ``FIXED_k``) proposes ``k`` and gains ``min(acc, k+1)``; Oracle Proposal (``ORACLE``) proposes
  exactly ``acc - 1`` and gains ``acc``; each for a drafter ``eagle3`` or ``ngram``; Oracle Combine (their
  proposer ``combined``) takes per step the larger of the two drafters' ``acc``;
* the request ends once it holds ``L`` output tokens (the last step may overshoot);
  throughput = ``B*L / time``; the no-SD baseline is the same cost model with one
  token per copy per step (``L - 1`` decode steps); speedup = mean throughput with
  SD / mean throughput without, over the requests (a ratio of means, B cancels).

Conventions (:data:`CONVENTIONS`), i.e. which of the authors' quirks to follow:

========================  =================================  ==================================
                          ``authors`` (their code)           ``corrected`` (ours)
========================  =================================  ==================================
acc look-up at ``c``      ``acc[c-1]`` (first decode step    ``acc[c]`` (``acc[p]`` is the step
                          reads the prefill entry, always 1) starting with ``p`` output tokens;
                                                             checked: re-running the n-gram
                                                             lookup on the token ids gives
                                                             ``acc_ngram[p]`` exactly)
Combine drafting price    n-gram's (``ngram_frac*T``) even   EAGLE + n-gram: both drafters run
                          when EAGLE wins                    every step, since which one wins is
                                                             not known before verifying
Combine output length     shorter of the two lists           the request's output length
                                                             (``len(output_token_ids)``); max of
                                                             the two only where both lists
                                                             cover the position, n-gram beyond
n-gram FIXED_k, acc 1     no match with prob.                re-run the n-gram lookup (min 3,
                          ``1 - AUTHORS_NGRAM_MATCH_PROB``   max 7) on prompt + output: no
                          (their random rule, taken here in  match -> propose nothing
                          expectation): propose nothing,
                          no drafting cost
n-gram drafting when      free                               charged (the lookup runs anyway)
nothing is proposed
========================  =================================  ==================================

Combine with a k (``PolicyRef("combine", k=3)``, their ``combined`` with ``FIXED_k``) = oracle choice of
the method, ``k`` proposed (their code allows it; their ``main.py`` only runs ``combined`` with ``ORACLE``).
Tables carry the authors' names (``proposer``, ``predict_method``) beside ours (``policy``, ``k``), written
from the instance, never read back.

The steps come from the one simulator walk (:func:`sdlib.sim.policy.walk.position_steps`, which takes the
convention) and are priced by :func:`sdlib.sim.policy.walk.request_times` / ``no_sd_times``: the same walk
and prices ``sdlib simulate`` and the trace replay use. The authors'
method-switching overhead is 0 and is not modelled. ``sample="authors"`` takes
their 300-request subset per dataset (``random.seed(42); random.sample(data, 300)``).

Checked against their code run unchanged (``tests/test_oracle.py``): with
``convention="authors"`` and ``sample="authors"`` the speedups agree to 1e-9 relative,
except EAGLE-3 at bs > 1 (their loop over the copies bumps the KV count copy by copy
inside a step, so later copies' EAGLE drafting sees slightly more KV; ~1e-5 relative,
not modelled) and n-gram ``FIXED_k`` (their random rule vs its expectation; ~1e-4).

Usage:
    from sdlib.sim.traces import load_reference_traces
    from sdlib.sim.oracle import simulate
    table = simulate(load_reference_traces(), batch_sizes=[1, 128], sample="authors")
    table = simulate(traces, policies=authors_policies(fixed_ks=(3,)), conventions=["corrected"])
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.core.registry import PolicyRef
from sdlib.sim.conventions import CONVENTIONS, Convention, get_convention  # noqa: F401  (the simulator's API)
from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B, CostModel
from sdlib.sim.policy.walk import PolicyInputs, no_sd_times, position_steps, request_times
from sdlib.sim.prepared import PreparedTraces, prepare_traces, select_requests

#: the authors' drafters (their proposers; ``combined`` = Oracle Combine) and fixed k (notebook 05's grid)
PROPOSERS = ("eagle3", "ngram", "combined")
FIXED_KS = (1, 3, 5)
BATCH_SIZES = (1, 8, 16, 32, 64, 128)
#: columns of the speedup table (figures/05_oracle_bounds.csv)
TABLE_COLUMNS = ["dataset", "proposer", "predict_method", "batch_size", "convention", "cost_model", "speedup"]
#: the columns that identify a policy in the simulator's tables (ours beside the authors' names)
POLICY_COLUMNS = ["policy", "kind", "k"]


def authors_policies(proposers: Sequence[str] = PROPOSERS, fixed_ks: Sequence[int] = FIXED_KS,
                     oracle: bool = True) -> list[PolicyRef]:
    """The authors' grid: per proposer (``eagle3``, ``ngram``, ``combined``), fixed k for each of ``fixed_ks``,
    then Oracle Proposal (Oracle Combine for ``combined``) when ``oracle``."""
    out = []
    for prop in proposers:
        if prop not in PROPOSERS:
            raise ValueError(f"proposer {prop!r} not in {PROPOSERS}")
        for k in fixed_ks:
            out.append(PolicyRef("combine", None, int(k)) if prop == "combined" else PolicyRef("fixed", prop, int(k)))
        if oracle:
            out.append(PolicyRef("combine") if prop == "combined" else PolicyRef("oracle", prop))
    return out


def authors_names(ref: PolicyRef, cap: Optional[int] = None) -> tuple[str, str]:
    """(proposer, predict method) as the authors' simulator names ``ref`` (``ORACLE_<cap>`` for an oracle
    capped at an engine's K)."""
    if ref.name not in ("fixed", "oracle", "combine"):
        raise ValueError(f"{ref.label} has no name in the authors' simulator")
    prop = "combined" if ref.name == "combine" else ref.drafter
    if ref.k is not None:
        return prop, f"FIXED_{ref.k}"
    return prop, "ORACLE" if cap is None else f"ORACLE_{cap}"


def simulate_requests(traces: pd.DataFrame | PreparedTraces,
                      cost_models: Sequence[CostModel] = (AUTHORS_H100_LLAMA8B,),
                      batch_sizes: Sequence[int] = BATCH_SIZES, policies: Optional[Sequence[PolicyRef]] = None,
                      conventions: Sequence[str | Convention] = ("authors", "corrected"),
                      sample: Optional[str | int] = None) -> pd.DataFrame:
    """One row per (request, policy, convention, cost model, batch size); ``policies``: fixed / oracle /
    combine instances (default :func:`authors_policies`).

    Columns: dataset, request_id, proposer, predict_method (the authors' names), policy, kind, k, convention,
    cost_model, batch_size, output_len, num_steps, mean_acc_len (tokens per decode step), sd_time_s,
    base_time_s, sd_tok_per_s, base_tok_per_s (per batch: B*L/time).
    """
    if isinstance(cost_models, CostModel):
        cost_models = [cost_models]
    prep = traces if isinstance(traces, PreparedTraces) else prepare_traces(traces)
    if sample is not None:
        prep = select_requests(prep, sample)
    refs = authors_policies() if policies is None else list(policies)
    lookup = any(get_convention(c).ngram_match == "tokens" for c in conventions) and \
        any(r.name == "fixed" and r.drafter == "ngram" for r in refs)
    inp = PolicyInputs.of(prep, need_lookup=lookup)
    frames = []
    base_cache: dict = {}
    for conv in map(get_convention, conventions):
        for ref in refs:
            st = position_steps(inp, ref.name, ref.drafter, ref.k, convention=conv)
            prop, pm = authors_names(ref)
            L = st.output_len
            gained = np.maximum(L - 1, 0)
            num_steps = np.rint(np.bincount(st.req, weights=st.weight, minlength=len(prep))).astype(np.int64)
            for cm in cost_models:
                for B in batch_sizes:
                    key = (cm.name, B, L.tobytes())
                    if key not in base_cache:
                        base_cache[key] = no_sd_times(inp, L, cm, B)
                    tb = base_cache[key]
                    ts = request_times(inp, st, cm, B)
                    frames.append(pd.DataFrame({
                        "dataset": prep.dataset, "request_id": prep.request_id, "proposer": prop,
                        "predict_method": pm, "policy": ref.label, "kind": ref.name,
                        "k": np.nan if ref.k is None else float(ref.k), "convention": conv.name,
                        "cost_model": cm.name, "batch_size": int(B), "output_len": L, "num_steps": num_steps,
                        "mean_acc_len": np.divide(gained, num_steps, out=np.full(len(L), np.nan),
                                                  where=num_steps > 0),
                        "sd_time_s": ts, "base_time_s": tb,
                        "sd_tok_per_s": B * L / ts, "base_tok_per_s": B * L / tb}))
    return pd.concat(frames, ignore_index=True)


def speedup_table(per_request: pd.DataFrame) -> pd.DataFrame:
    """Aggregate :func:`simulate_requests`: speedup = mean SD throughput / mean no-SD throughput per cell.

    Columns :data:`TABLE_COLUMNS` + policy, kind, k, num_requests, sd_tok_per_s, base_tok_per_s (means).
    """
    keys = [c for c in TABLE_COLUMNS if c != "speedup"]
    g = per_request.groupby(keys + POLICY_COLUMNS, sort=False, dropna=False)
    out = g.agg(num_requests=("request_id", "size"), sd_tok_per_s=("sd_tok_per_s", "mean"),
                base_tok_per_s=("base_tok_per_s", "mean")).reset_index()
    out["speedup"] = out["sd_tok_per_s"] / out["base_tok_per_s"]
    return out[TABLE_COLUMNS + POLICY_COLUMNS + ["num_requests", "sd_tok_per_s", "base_tok_per_s"]]


def simulate(traces: pd.DataFrame | PreparedTraces, **kw) -> pd.DataFrame:
    """:func:`simulate_requests` then :func:`speedup_table` (same keyword arguments)."""
    return speedup_table(simulate_requests(traces, **kw))
