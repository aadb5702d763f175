"""Online per-step policies: choose the drafter and the draft length at every step from what has been seen so
far (the paper's open problem), the published adaptive baselines, and how they are simulated and replayed.

Modules, in the order data flows:
    features      per-step features a policy may see (acceptance so far, n-gram match length, position)
    predictor     the acceptance predictor (hazard models per drafter) a policy uses
    training      cross-fitting the predictor (two folds by request hash), save / load
    online        the project's online policy (expected tokens per unit time under a cost model)
    confidence    EAGLE-3's length stopped token by token on the head's own confidence (needs confidences)
    baselines     published adaptive rules (n-gram/EAGLE switch, SGLang, DynamicSD, SpecDecode-Bench ...)
    arctic        Arctic Inference's suffix-decoding rule
    walk          walking a policy over acceptance traces step by step (PolicyInputs, walk)
    table         every policy at every batch size and cost model -> the policy table and gap table
    views         per-position choices and where policies lose (notebook 07)
    replay_plans  a policy's steps as trace-replay plans for the engine (sdlib.sim.replay, sdlib.run.replay)
    cli           ``sdlib simulate``

They read the simulator (:mod:`sdlib.sim.oracle`, :mod:`sdlib.sim.costmodel`, :mod:`sdlib.sim.engine_costs`);
nothing under ``sdlib.sim`` outside this package imports it except :mod:`sdlib.sim.replay`'s dispatch of
per-step replay policies.
"""
