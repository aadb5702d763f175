"""What a confidence stop did in a sweep (configs/embedded_confidence_stop.yaml): per arm, the drafts verified per
step, the acceptance rate and the tokens per step (bootstrap over prompts); per arm against a
reference arm (fixed-k EAGLE-3 on the same engine) and against no SD, the paired ratios of decode rate and of
verify steps per second (:func:`sdlib.analysis.powered.compare`: two-level bootstrap over cells and prompts,
Student's t on the cells), each "established" only when the block's A/A interval contains 1 and its own
interval excludes 1 by more than the block's A/A drift.

Usage:
    from sdlib.analysis.confidence_stop import cut_tables
    t = cut_tables("data/sweeps/embedded_confidence_stop")   # {"arms", "ratios", "aa"}
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sdlib.analysis import powered
from sdlib.analysis.intervals import ratio_by_request
from sdlib.core import bootstrap
from sdlib.store import SweepStore

#: Per-arm measures: name -> (numerator, denominator, offset) of sums over a request's verify steps.
MEASURES = {"drafted_per_step": ("drafted", "n_steps", 0.0), "acceptance_rate": ("accepted", "drafted", 0.0),
            "tokens_per_step": ("accepted", "n_steps", 1.0)}


def arm_measures(runs: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame,
                 n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size, method label): :data:`MEASURES` with intervals from a bootstrap over prompts
    (a prompt's steps summed over the cells that ran it: repeats and engine starts of a greedy run repeat the
    same drafts, so they are not independent draws)."""
    s = steps.dropna(subset=["drafted"]).astype({"drafted": float, "accepted": float})
    s = s.merge(requests[["run_id", "request_id", "prompt_index"]], on=["run_id", "request_id"]).merge(
        runs[["run_id", "dataset", "batch_size", "method_label"]], on="run_id")
    group = ["dataset", "batch_size", "method_label"]
    per = s.groupby([*group, "prompt_index"]).agg(drafted=("drafted", "sum"), accepted=("accepted", "sum"),
                                                  n_steps=("step", "size")).reset_index()
    per["stratum"] = 0
    out = None
    for name, (num, den, off) in MEASURES.items():
        t = ratio_by_request(per, group, num, den, strata="stratum", n_boot=n_boot, offset=off).rename(
            columns={"value": name, "value_lo": f"{name}_lo", "value_hi": f"{name}_hi", "n_requests": "n_prompts"})
        out = t if out is None else out.merge(t.drop(columns="n_prompts"), on=group)
    return out


def step_units(runs: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """:func:`sdlib.analysis.powered.units` of verify steps per second of decode time (``rate``), per prompt;
    ``output_tokens`` there counts the request's steps + 1."""
    return powered.units(powered.request_rates(runs, requests.assign(output_tokens=requests["num_steps"] + 1)))


def cut_tables(sweep_dir: str | Path, reference: str = "eagle3-k5", baseline: str = "none",
               n_boot: int = bootstrap.N_BOOT) -> dict[str, pd.DataFrame]:
    """``arms`` (:func:`arm_measures` and each arm's hook counts where written), ``ratios`` (every SD arm over
    ``reference`` and over ``baseline``, paired: ``measure`` tok_per_s, the decode rate, or, over ``reference`` only,
    steps_per_s, verify steps per second of decode time, the inverse of the step time), ``aa``
    (the A/A twins' decode-rate check)."""
    store = SweepStore(sweep_dir)
    runs, requests, steps = store.read("runs"), store.read("requests"), store.read("steps")
    arms = powered.arm_info(store.read_provenance())
    u_tok = powered.units(powered.request_rates(runs, requests))
    u_step = step_units(runs, requests)
    aa = powered.aa_table(u_tok, arms, n_boot)
    twins = set(arms.loc[arms["aa_of"].notna(), "method_label"])
    rows = []
    for (ds, bs), cell in u_tok.groupby(["dataset", "batch_size"]):
        gate = powered.aa_gate(aa, ds, int(bs))
        for a in sorted(set(cell["method_label"]) - {baseline} - twins):
            for ref in (reference, baseline):
                if a == ref or ref not in set(cell["method_label"]):
                    continue
                for measure, u in (("tok_per_s", u_tok), ("steps_per_s", u_step)):
                    if measure == "steps_per_s" and ref == baseline:  # no verify steps without SD
                        continue
                    rows.append({"measure": measure, **powered.compare(u, ds, int(bs), a, ref, n_boot=n_boot, **gate)})
    return {"arms": arm_measures(runs, requests, steps, n_boot), "ratios": pd.DataFrame(rows), "aa": aa}


def prefix_agreement(runs: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame, reference: str = "eagle3-k5"
                     ) -> pd.DataFrame:
    """Whether a cut arm's drafter saw what the reference's did: per arm, over the verify steps that start at the
    same output position of the same prompt (same batch size, engine start and repeat) in both, the share where
    ``accepted = min(accepted of the reference, drafted)``. Greedy outputs are identical, so a drafter whose
    state after a cut (fewer tokens verified the step before) is right proposes the same first tokens as at
    fixed k; a share well below 1 would mean the cut corrupts the next step's draft (the "EAGLE padding"
    question)."""
    keys = ["dataset", "batch_size", "engine_start", "repeat", "prompt_index", "position"]
    s = steps.merge(requests[["run_id", "request_id", "prompt_index"]], on=["run_id", "request_id"]).merge(
        runs[["run_id", "method_label", "dataset", "batch_size", "engine_start", "repeat"]], on="run_id")
    ref = s.loc[s["method_label"] == reference, keys + ["accepted"]].rename(columns={"accepted": "accepted_ref"})
    rows = []
    for arm, g in s[s["method_label"] != reference].groupby("method_label"):
        m = g.merge(ref, on=keys)
        if not len(m):
            continue
        ok = m["accepted"] == m[["accepted_ref", "drafted"]].min(axis=1)
        rows.append({"arm": arm, "reference": reference, "n_steps": int(len(m)), "agree": float(ok.mean())})
    return pd.DataFrame(rows, columns=["arm", "reference", "n_steps", "agree"])
