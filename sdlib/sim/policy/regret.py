"""Where an online policy's time goes, step by step, against a clairvoyant choice at the same position.

The gap share says how much of the way from the best fixed method to Oracle Select a policy gets; this view says
at which steps the rest is lost, and whether the policy could have seen it coming.

At a step the policy took at output position ``p`` (``kv`` = the batch's KV tokens then), the clairvoyant rate
``r*(p)`` is the best tokens per second any single action reaches there, knowing each drafter's acceptance at
``p``: no SD (1 token), the n-gram at any ``l`` up to its continuation (``min(l, a_ngram) + 1`` tokens) or EAGLE-3
at any ``l`` up to the traces' k (``min(l, a_eagle3) + 1``), each at the price Oracle Select charges it (the
cheapest any registered policy pays for that action: :func:`sdlib.sim.policy.select.select_prices`, no catch-up).
The step's regret is its own time (the cost model's, as :func:`~sdlib.sim.policy.walk.request_times` prices it)
minus the time its tokens take at ``r*(p)``: ``t - g / r*(p) >= 0`` (the action the step took is among those ``r*``
ranges over, and no policy pays less for it). It is myopic: the sum over a policy's steps is the time it
loses against running each of its own steps at that position's best rate, not its distance to Oracle Select
(whose positions differ).

Each step gets an ``outcome``: ``no draft`` (a plain decode step), ``first rejected`` (it drafted and the first
draft was rejected), ``partial`` (some drafts accepted, not all) or ``whole`` (every draft accepted); and the
policy's own predicted acceptance of its first draft as it decided (``predicted_first``:
:meth:`sdlib.sim.policy.online.OnlinePolicy.first_draft_acceptance`), beside how often it was accepted
(``accepted_first``; both only at steps that drafted: a confidence stop at 0 drafts nothing). For EAGLE-3 the
prediction is the head's calibrated confidence, read after the drafter was chosen from the predictor's expected
gains. Where a category holds much of the regret and its ``predicted_first`` is high, the policy
drafted where it expected its draft to be accepted: the loss is in what it could not see, not in how it weighed
what it saw.

Usage:
    tab = regret_table(inp, predictor, ["online-with-agreement"], [(cm, 128)])
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from sdlib.core.registry import BuildRequest
from sdlib.sim.policy.walk import EAGLE, NGRAM, NONE, DRAFTER_NAMES, WRAP, Policy, PolicyInputs, PolicySteps

#: Step outcomes, in table order.
OUTCOMES = ("no draft", "first rejected", "partial", "whole")


class Recording(Policy):
    """``policy`` as it is, with its predicted acceptance of each step's first draft kept in step order
    (``policy.first_draft_acceptance(inp, lanes, drafter)`` after each decision)."""

    def __init__(self, policy: Policy):
        self.inner = policy
        self.name, self.lengths, self.path = policy.name, policy.lengths, policy.path
        self.cfg: list = []
        self.predicted: list = []

    def init_state(self, cfg, req):
        return self.inner.init_state(cfg, req)

    def decide(self, inp, lanes):
        d = self.inner.decide(inp, lanes)
        self.cfg.append(lanes.cfg.copy())
        pred = self.inner.first_draft_acceptance(inp, lanes, np.asarray(d[0]))
        pred[np.broadcast_to(np.asarray(d[1]), pred.shape) == 0] = np.nan  # drafted nothing (a confidence stop at 0)
        self.predicted.append(pred)
        return d

    def observe(self, inp, lanes, decision, gain):
        self.inner.observe(inp, lanes, decision, gain)

    def per_config(self, n_configs: int) -> list[np.ndarray]:
        """The predictions of each configuration's steps, in the order :func:`walk` returns them."""
        cfg, pred = np.concatenate(self.cfg), np.concatenate(self.predicted)
        return [pred[cfg == c] for c in range(n_configs)]


def recorded_steps(inp: PolicyInputs, predictor, name: str, configs: Sequence[tuple]) -> tuple[list, list]:
    """The steps of the registered policy ``name`` at each (cost model, batch size) of ``configs``, through its own
    build, and what it predicted at each step (:class:`Recording`, handed to the build as
    :data:`~sdlib.sim.policy.walk.WRAP`). ``predictor``: the online policies' (None: cross-fitted here). Raises
    ValueError for a policy whose build takes no recorder or that does not say what it predicted."""
    # deferred: the policy table loads every registered policy, which only this view needs
    from sdlib.sim.policy.table import resolve_refs
    from sdlib.sim.policy.training import ensure_predictor

    (ref,) = resolve_refs([name], inp.kmax)
    recs: list = []

    def wrap(policy):
        if not hasattr(policy, "first_draft_acceptance"):
            raise ValueError(f"regret view: {name} does not say what it predicted (no first_draft_acceptance)")
        recs.append(Recording(policy))
        return recs[-1]

    req = BuildRequest(inp, list(configs), predictor=ensure_predictor(inp, [ref], predictor), resources={WRAP: wrap})
    steps = ref.spec.build(req, ref)
    if len(recs) != 1:
        raise ValueError(f"regret view: {name}'s build takes no recorder (sdlib.sim.policy.walk.WRAP)")
    return steps, recs[0].per_config(len(configs))


def best_rates(inp: PolicyInputs, st: PolicySteps, cm, B: int) -> np.ndarray:
    """``r*(p)`` (tokens per second) at every step of ``st`` (module docstring)."""
    # deferred: the select module builds Oracle Select's program, which only its prices are needed of here
    from sdlib.sim.policy.select import select_prices

    K = inp.kmax
    pr = select_prices(cm, B, K)
    flat = inp.off[st.req] + st.pos
    kv = float(B) * (inp.prep.prompt_len[st.req] + st.pos)
    l = np.arange(K + 1)[None, :]
    best = 1.0 / (pr.base[NONE][0] + pr.slope[NONE][0] * kv)
    for d, a, cap in ((NGRAM, inp.acc_ng[flat] - 1, inp.avail[flat]), (EAGLE, inp.acc_eg[flat] - 1, np.full(flat.size, K))):
        with np.errstate(invalid="ignore"):
            t = pr.base[d][None, :] + pr.slope[d][None, :] * kv[:, None]
        ok = (l >= 1) & (l <= cap[:, None]) & np.isfinite(t)
        r = np.where(ok, (np.minimum(l, a[:, None]) + 1) / np.where(ok, t, 1.0), 0.0)
        best = np.maximum(best, r.max(axis=1))
    return best


def step_regret(inp: PolicyInputs, st: PolicySteps, cm, B: int) -> pd.DataFrame:
    """One row per step: drafter, drafted, gained, its seconds, the clairvoyant rate there, its regret and its
    outcome (module docstring)."""
    kv = float(B) * (inp.prep.prompt_len[st.req] + st.pos)
    t = cm.step_seconds(B, kv, st.n_i, st.k, st.eagle, st.eagle_n, st.ngram, st.path)
    r = best_rates(inp, st, cm, B)
    drafted = st.n_i - 1
    outcome = np.where(drafted == 0, 0, np.where(st.gain == 1, 1, np.where(st.gain < st.n_i, 2, 3)))
    return pd.DataFrame({"dataset": inp.prep.dataset[st.req], "req": st.req, "pos": st.pos,
                         "drafter": [DRAFTER_NAMES[int(d)] for d in st.drafter], "drafted": drafted, "gained": st.gain,
                         "seconds": t * st.weight, "best_rate": r,
                         "regret_s": np.maximum(t - st.gain / r, 0.0) * st.weight,  # >= 0 but for rounding (1e-16)
                         "outcome": np.asarray(OUTCOMES, dtype=object)[outcome]})


def regret_table(inp: PolicyInputs, predictor, policies: Sequence[str], configs: Sequence[tuple]) -> pd.DataFrame:
    """Per (cost model, dataset, batch size, policy, drafter, outcome): steps, their seconds and regret, the
    category's share of the cell's regret, the cell's regret as a share of its time (``cell_regret_share``), and
    the policy's mean predicted acceptance of the first draft against how often it was accepted
    (module docstring). ``policies``: registered names (:func:`recorded_steps`); ``predictor``: as there."""
    if not policies:
        raise ValueError("regret_table: no policies")
    rows = []
    for name in policies:
        steps, preds = recorded_steps(inp, predictor, name, configs)
        for (cm, B), st, pred in zip(configs, steps, preds):
            s = step_regret(inp, st, cm, int(B))
            s["predicted_first"] = pred
            s["accepted_first"] = np.where(s.drafted > 0, (s.gained > 1).astype(float), np.nan)
            for ds, g in s.groupby("dataset", sort=False):
                total_regret, total_s = g.regret_s.sum(), g.seconds.sum()
                agg = g.groupby(["drafter", "outcome"], sort=False).agg(
                    steps=("pos", "size"), seconds=("seconds", "sum"), regret_s=("regret_s", "sum"),
                    predicted_first=("predicted_first", "mean"), accepted_first=("accepted_first", "mean")).reset_index()
                agg["share_of_regret"] = agg.regret_s / total_regret if total_regret > 0 else 0.0
                agg["cell_regret_share"] = total_regret / total_s
                rows.append(agg.assign(cost_model=cm.name, dataset=ds, batch_size=int(B), policy=name))
    out = pd.concat(rows, ignore_index=True)
    order = {o: i for i, o in enumerate(OUTCOMES)}
    out = out.sort_values(["cost_model", "dataset", "batch_size", "policy", "drafter", "outcome"],
                          key=lambda c: c.map(order) if c.name == "outcome" else c, kind="stable")
    return out[["cost_model", "dataset", "batch_size", "policy", "drafter", "outcome", "steps", "seconds", "regret_s",
                "share_of_regret", "cell_regret_share", "predicted_first", "accepted_first"]].reset_index(drop=True)


def first_draft_calibration(tab: pd.DataFrame) -> pd.DataFrame:
    """Per (cost model, dataset, batch size, policy, drafter), over the steps that drafted: the policy's mean
    predicted acceptance of the first draft (``predicted_first``) against the share accepted (``accepted_first``),
    from :func:`regret_table`'s rows weighted by their steps: is the policy as sure as it should be?"""
    d = tab[tab.outcome != "no draft"].copy()
    d["p"], d["a"] = d.predicted_first * d.steps, d.accepted_first * d.steps
    g = d.groupby(["cost_model", "dataset", "batch_size", "policy", "drafter"], sort=False)[["p", "a", "steps"]].sum()
    out = pd.DataFrame({"steps": g.steps, "predicted_first": g.p / g.steps, "accepted_first": g.a / g.steps})
    return out.reset_index()


__all__ = ["OUTCOMES", "Recording", "recorded_steps", "best_rates", "step_regret", "regret_table",
           "first_draft_calibration"]
