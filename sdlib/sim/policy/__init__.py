"""Per-step policies: choose the drafter and the draft length at every step from what has been seen so far (the
paper's open problem), the published adaptive baselines, the oracles, and how they are simulated and replayed.

Importing this package registers every policy in :mod:`sdlib.core.registry` (each module registers its own
specs; adding a policy to one of these modules is a one-module change).

Modules, in the order data flows:
    walk          walking a policy over acceptance traces step by step (PolicyInputs, walk, position_steps)
    static        fixed k, Oracle Proposal, Oracle Combine, the replay calibration plans
    select        Oracle Select: the clairvoyant per-step choice of drafter and length (an exact dynamic program)
    features      per-step features a policy may see (acceptance so far, n-gram match length, position)
    predictor     the acceptance predictor (hazard models per drafter) a policy uses
    online        the project's online policy (expected tokens per unit time under a cost model)
    training      cross-fitting the predictor (two folds by request hash), save / load
    confidence    EAGLE-3's length stopped token by token on the head's own confidence (needs confidences)
    agreement     the same, with the n-gram's hazards read off its earlier continuations' agreement
    baselines     published adaptive rules (n-gram/EAGLE switch, SGLang, DynamicSD, SpecDecode-Bench ...)
    arctic        Arctic Inference's suffix-decoding rule
    vllm_adaptive vLLM 0.34's adaptive verification (online acceptance estimator, batch verification budget)
    stopping      SpecDec++'s stop threshold (needs confidences) and a Nightjar-style bandit over k
    table         every policy at every batch size and cost model -> the policy table and gap table
    views         per-position choices and where policies lose (notebook 07)
    cli           ``sdlib simulate``

They read the simulator (:mod:`sdlib.sim.oracle`, :mod:`sdlib.sim.costmodel`, :mod:`sdlib.sim.engine_costs`).
"""

from sdlib.sim.policy import static, select, online, confidence, agreement, baselines, arctic, vllm_adaptive, stopping  # noqa: F401  (registers the policies)
