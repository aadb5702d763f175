"""Replay plans of the per-step policies: the online policy and the baselines, as steps an engine replays.

:func:`policy_steps` walks a policy (:mod:`sdlib.sim.policy.online`, :mod:`sdlib.sim.policy.baselines`) on a cell's
requests with every proposal capped at the engine's ``num_speculative_tokens`` K
(:class:`~sdlib.sim.policy.walk.Capped`), so the plan's ``(pos, proposed, accepted)`` is exactly what the
engine hooks (:mod:`sdlib.vllm.replay`) can pin. Policies that depend on the batch size (the online policy,
SGLang's tiers, Dynamic SD) take the cell's.

The online policy decides with :data:`REPLAY_COST_MODEL` (the H200 replay's engine model) and the committed
cross-fitted predictor (:data:`REPLAY_PREDICTOR`; each request decided by the model of the fold it is not in).
``online`` prices a step by what it drafts (the engine model's per-step k); ``online-at-k`` prices every
option at the engine's K, as vLLM 0.26's EAGLE-3 path charges it (measured: the step time there depends on K
and the batch size, not on what is drafted), so it drafts up to K every step and chooses the drafter.
``online-ngram`` is the one-drafter variant (the n-gram's length per step, 0..K, priced by what it drafts),
replayed on the n-gram path, where rows verify what they drafted.

Which engine path each can stand for (:data:`POLICY_METHODS`): policies that mix drafters run on the EAGLE-3
path (V2 runner: its head drafts every step, every row verifies K, and vLLM's n-gram look-up also runs on
the host: :data:`MIXED`), one-drafter rules on their drafter's path.

Usage:
    from sdlib.sim.policy.replay_plans import policy_steps
    steps = policy_steps(prep, method="eagle3", policy="online", K=10, batch_size=32)
"""

from __future__ import annotations

from sdlib.sim.policy.baselines import NgramOrEagle, SpecDecodeAdaptive, _plain_decode, dynamic_sd_k, sglang_steps
from sdlib.sim.oracle import PreparedTraces, step_records
from sdlib.sim.policy.training import REFERENCE_PREDICTOR
from sdlib.sim.policy.walk import Capped, Policy, PolicyInputs, PolicySteps, from_step_records, walk

#: Replay policy -> methods (engine paths) it can be replayed on.
POLICY_METHODS = {"online": ("eagle3",), "online-at-k": ("eagle3",), "online-ngram": ("ngram",), "ngram-eagle": ("eagle3",),
                  "ngram-eagle-long": ("eagle3",), "arctic": ("eagle3",), "sglang-adaptive": ("eagle3",), "dynamic-sd": ("eagle3",),
                  "specdecode-adaptive": ("eagle3", "ngram")}
#: Policies whose steps use both drafters: the engine runs vLLM's n-gram look-up beside EAGLE-3.
MIXED = ("online", "online-at-k", "ngram-eagle", "ngram-eagle-long", "arctic")
REPLAY_COST_MODEL = "h200_replay_engine"
REPLAY_PREDICTOR = REFERENCE_PREDICTOR
#: Replay policies whose plans read those two files (a sweep cell's key hashes them: sdlib.config).
ONLINE_REPLAYS = ("online", "online-at-k", "online-ngram")
#: #24344's settings (n-gram k, EAGLE k) and issue #13's long variant's.
NGRAM_EAGLE_K, NGRAM_EAGLE_LONG_K = (5, 3), (20, 5)


def online_inputs() -> list[str]:
    """Repo-relative files the online replay plans are decided from: the predictor and the cost model."""
    return [REPLAY_PREDICTOR, f"data/costmodels/{REPLAY_COST_MODEL}.json"]


def _online(inp: PolicyInputs, K: int, batch_size: int, at_k: bool = False, variant: str = "online") -> Policy:
    from sdlib.paths import resolve
    from sdlib.sim.policy.features import add_features
    from sdlib.sim.policy.online import OnlinePolicy
    from sdlib.sim.costmodels import load_cost_model
    from sdlib.sim.policy.training import load_predictor

    add_features(inp)
    pred = load_predictor(resolve(REPLAY_PREDICTOR), inp)
    return OnlinePolicy(pred.models, [load_cost_model(REPLAY_COST_MODEL)], [batch_size], variant=variant, kmax=K,
                        model_of_request=pred.model_of_request(), engine_k=K if at_k else None)


def policy_steps(prep: PreparedTraces, method: str, policy: str, K: int, batch_size: int = 1) -> PolicySteps:
    """The steps of ``policy`` on ``prep`` for an engine with ``num_speculative_tokens = K`` on ``method``'s path."""
    if policy not in POLICY_METHODS:
        raise ValueError(f"policy {policy!r} not in {sorted(POLICY_METHODS)}")
    if method not in POLICY_METHODS[policy]:
        raise ValueError(f"policy {policy!r} replays on {POLICY_METHODS[policy]}, not {method!r}")
    inp = PolicyInputs.of(prep)
    if policy == "arctic":
        from sdlib.sim.policy.arctic import ARCTIC_MODEL_K, arctic_steps

        return arctic_steps(inp, min(ARCTIC_MODEL_K, K), K)
    if policy == "sglang-adaptive":
        return sglang_steps(inp, batch_size, K=K)
    if policy == "dynamic-sd":
        k = min(dynamic_sd_k(batch_size), K)
        if k == 0:
            return _plain_decode(inp, "eagle3", "padded")
        return from_step_records(step_records(prep, "eagle3", f"FIXED_{k}", "corrected"), "padded", k, "eagle3")
    if policy in ONLINE_REPLAYS:
        pol: Policy = _online(inp, K, batch_size, at_k=policy == "online-at-k",
                              variant="online-ngram" if policy == "online-ngram" else "online")
    elif policy == "ngram-eagle":
        pol = NgramOrEagle(*NGRAM_EAGLE_K)
    elif policy == "ngram-eagle-long":
        pol = NgramOrEagle(*NGRAM_EAGLE_LONG_K, name="ngram-eagle-long")
    else:
        pol = SpecDecodeAdaptive(method)
    return walk(inp, Capped(pol, K))[0]
