"""Replay plans: the steps each request must take in an engine whose acceptance is pinned to a trace.

A plan is the simulator's own step sequence for one request: at every verify step its output position
``pos``, the tokens drafted ``proposed`` and the tokens accepted ``accepted``, from the policy's registered
``build`` (:mod:`sdlib.core.registry`; the same steps ``sdlib simulate`` prices), with every proposal capped at
the engine's ``num_speculative_tokens`` K. The engine replays it exactly (:mod:`sdlib.vllm.replay`):
``accepted = min(acc[pos] - 1, proposed)`` and the next step starts at ``pos + accepted + 1``. So a measured
replay and the simulator's prediction share every step, and differ only where the engine's costs differ from
the cost model's.

A config's ``methods.*.replay`` names the policy (:func:`sdlib.core.registry.replay_names`): ``fixed`` and
``oracle`` take the method's trace list (EAGLE-3's for model drafters, the n-gram's for n-gram) and k = K;
``combine``, the online policies and the baselines run as registered; ``accept_all`` / ``accept_none`` /
``propose_nothing`` are calibration plans (acceptance fixed by the plan). The policies decided from committed
files (:data:`REPLAY_PREDICTOR`, the engine cost model :data:`REPLAY_COST_MODEL`; spec ``needs`` holds
``engine_files``) decide with those, at the cell's batch size.

Where the engine cannot verify fewer than K tokens (vLLM 0.26's V2 runner: EAGLE, EAGLE-3), a plan's
shorter proposals are padded to K with drafts that are rejected; acceptance is unchanged.

Usage:
    from sdlib.sim.replay import replay_plans
    from sdlib.sim.prepared import truncate_traces
    prep = truncate_traces(prepare_traces(traces), max_len=128)
    plans = replay_plans(prep, method="eagle3", policy="fixed", K=3)   # one RequestPlan per request
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

import sdlib.sim.policy  # noqa: F401  (registers the policies a replay may name)
from sdlib.core.registry import POLICIES, BuildRequest, PolicyRef, RegistryError, replay_ref, resolve_policy
from sdlib.paths import resolve
from sdlib.sim.costmodels import load_cost_model
from sdlib.sim.policy.confidence import attach_confidences, load_confidences
from sdlib.sim.policy.features import add_features
from sdlib.sim.policy.training import REFERENCE_PREDICTOR, load_predictor
from sdlib.sim.policy.walk import PolicyInputs
from sdlib.sim.prepared import PreparedTraces

#: The engine cost model and predictor the replayed online policies decide with (a cell's key hashes them).
REPLAY_COST_MODEL = "h200_replay_engine"
REPLAY_PREDICTOR = REFERENCE_PREDICTOR


def online_inputs(predictor: Optional[str] = None) -> list[str]:
    """Repo-relative files the plans of policies that need ``engine_files`` are decided from: the predictor
    (``predictor``, a workload's; default :data:`REPLAY_PREDICTOR`) and the engine cost model."""
    return [predictor or REPLAY_PREDICTOR, f"data/costmodels/{REPLAY_COST_MODEL}.json"]


def _needs(policy: str) -> frozenset:
    """What the spec of ``policy`` (a config's ``replay``: a spec name or an instance's label, such as
    ``vllm-adaptive-verification-k5``) decides from; nothing for a name the registry does not know."""
    try:
        return (POLICIES[policy] if policy in POLICIES else resolve_policy(policy).spec).needs
    except RegistryError:
        return frozenset()


def needs_engine_files(policy: str) -> bool:
    """Are ``policy``'s replay plans decided from :func:`online_inputs` (so a refit makes new cells)?"""
    return "engine_files" in _needs(policy)


def needs_confidences(policy: str) -> bool:
    """Are ``policy``'s plans decided from the requests' draft confidences (a workload's ``confidences``)?"""
    return "confidences" in _needs(policy)


def replay_inputs(policy: str, workload=None) -> list[str]:
    """The files a replay of ``policy`` on ``workload`` (a :class:`sdlib.config.WorkloadConfig`) decides its plans
    from besides the traces, in the order a cell's key hashes them: :func:`online_inputs` (with the workload's
    predictor) for policies that need ``engine_files``, then the workload's draft confidences for those that need
    ``confidences``."""
    out = online_inputs(getattr(workload, "predictor", None)) if needs_engine_files(policy) else []
    conf = getattr(workload, "confidences", None)
    if needs_confidences(policy) and conf:
        out.append(conf)
    return out


@dataclass
class RequestPlan:
    """The verify steps of one request: output position at the step, tokens drafted, tokens accepted."""

    pos: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    output_len: int

    def gains(self) -> list[int]:
        """Tokens each engine step adds: the prefill's 1, then ``accepted + 1`` per step (the last one cut at
        the output length, as ``max_tokens`` cuts it)."""
        left = self.output_len - self.pos
        return [1] + np.minimum(self.accepted + 1, left).astype(int).tolist()


def replay_steps(prep: PreparedTraces, ref: PolicyRef, K: int, batch_size: int = 1, method: str | None = None,
                 workload=None):
    """The :class:`~sdlib.sim.policy.walk.PolicySteps` of instance ``ref`` replayed on an engine with
    ``num_speculative_tokens = K`` at ``batch_size`` (through its registered build). ``workload`` (its
    ``predictor`` and ``confidences``, :func:`replay_inputs`) for the policies that decide from them."""
    inp = PolicyInputs.of(prep)
    cm, predictor = None, None
    if "engine_files" in ref.spec.needs:
        add_features(inp)
        pred_file, cm_file = online_inputs(getattr(workload, "predictor", None))
        cm = load_cost_model(cm_file)
        predictor = load_predictor(resolve(pred_file), inp)
    if "confidences" in ref.spec.needs:
        conf = getattr(workload, "confidences", None)
        if not conf:
            raise ValueError(f"replay of {ref.label}: needs the workload's draft confidences (workloads.*.confidences)")
        attach_confidences(inp, load_confidences(str(resolve(conf)), k=int(K), traces=str(resolve(workload.path))))
    req = BuildRequest(inp, [(cm, int(batch_size))], K=int(K), method=method, predictor=predictor)
    return ref.spec.build(req, ref)[0]


def replay_plans(prep: PreparedTraces, method: str, policy: str, K: int, batch_size: int = 1,
                 workload=None) -> list[RequestPlan]:
    """One :class:`RequestPlan` per request of ``prep`` for a config's ``replay: policy`` on ``method``'s engine
    with ``num_speculative_tokens = K`` (see the module docstring); ``batch_size``: the cell's; ``workload``:
    the cell's (what some policies decide from, :func:`replay_inputs`)."""
    if K < 1:
        raise ValueError("K must be >= 1")
    st = replay_steps(prep, replay_ref(policy, method, K), K, batch_size, method, workload)
    order = np.argsort(st.req, kind="stable")
    bounds = np.searchsorted(st.req[order], np.arange(len(prep) + 1))
    plans = []
    for r in range(len(prep)):
        sel = order[bounds[r]:bounds[r + 1]]
        plans.append(RequestPlan(st.pos[sel], st.n_i[sel] - 1, st.gain[sel] - 1, int(st.output_len[r])))
    return plans
