"""The policies whose steps depend on the position alone: fixed k, Oracle Proposal, Oracle Combine, and the
replay calibration plans. Each is registered in :mod:`sdlib.core.registry`.

==================  ======================================================================================
``fixed``           the drafter (``eagle3`` or ``ngram``) with k drafts a step (the n-gram's at most what its
                    look-up continues); in a replay the method's trace list with k = the engine's K
``oracle``          Oracle Proposal: propose exactly ``acc - 1`` (at most K in a replay)
``combine``         Oracle Combine: per step the better of n-gram and EAGLE-3, both drafters charged (the
                    corrected convention of :mod:`sdlib.sim.oracle`)
``accept_all``      calibration: K drafted, all accepted (equals synthetic acceptance L = K + 1)
``accept_none``     calibration: K drafted, none accepted (equals synthetic acceptance L = 1)
``propose_nothing`` calibration: nothing drafted (the path's fixed cost over no SD)
==================  ======================================================================================

Usage:
    from sdlib.core.registry import BuildRequest, PolicyRef
    steps = PolicyRef("fixed", "eagle3", 3).spec.build(BuildRequest(inp, [(cm, 8)]), PolicyRef("fixed", "eagle3", 3))
"""

from __future__ import annotations

from sdlib.core.registry import KMAX, BuildRequest, PolicyRef, PolicySpec, method_names, register_policy
from sdlib.sim.policy.walk import constant_steps, position_steps

#: Draft lengths the ``fixed`` group expands to (per drafter).
FIXED_KS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20)
#: Engine methods a trace policy can be replayed on: those whose path reads a trace list.
TRACE_METHODS = method_names(lambda m: m.trace is not None)
#: The calibration plans (acceptance fixed by the plan, not by the traces).
CALIBRATION = ("accept_all", "accept_none", "propose_nothing")


def _same_for_every_config(steps, req: BuildRequest) -> list:
    return [steps] * len(req.configs)


def _fixed(req: BuildRequest, ref: PolicyRef) -> list:
    return _same_for_every_config(position_steps(req.inputs, "fixed", ref.drafter, ref.k, cap=req.K), req)


def _oracle(req: BuildRequest, ref: PolicyRef) -> list:
    return _same_for_every_config(position_steps(req.inputs, "oracle", ref.drafter, cap=req.K), req)


def _combine(req: BuildRequest, ref: PolicyRef) -> list:
    return _same_for_every_config(position_steps(req.inputs, "combine", k=ref.k, cap=req.K), req)


def _calibration(proposed_of_k, accepted_of_k):
    def build(req: BuildRequest, ref: PolicyRef) -> list:
        if req.K is None:
            raise ValueError(f"{ref.label} is a replay calibration plan: it needs the engine's K")
        return _same_for_every_config(constant_steps(req.inputs, proposed_of_k(req.K), accepted_of_k(req.K)), req)
    return build


register_policy(PolicySpec(
    "fixed", "fixed", _fixed, "a fixed draft length (the paper's FIXED_k)", drafters=("eagle3", "ngram"),
    ks=tuple(range(1, KMAX + 1)), family_ks=FIXED_KS, replays_on=TRACE_METHODS, replay_drafter=True,
    replay_k=True, groups=("fixed",)))
register_policy(PolicySpec(
    "oracle", "oracle", _oracle, "Oracle Proposal (the paper's ORACLE: propose exactly what is accepted)",
    drafters=("eagle3", "ngram"), replays_on=TRACE_METHODS, replay_drafter=True, groups=("oracle",)))
register_policy(PolicySpec(
    "combine", "combine", _combine, "Oracle Combine (the paper's per-step best of n-gram and EAGLE-3; with a k, "
    "the better drafter with k proposed, as the authors' simulator allows)", ks=(None, *range(1, KMAX + 1)),
    replays_on=TRACE_METHODS, mixes_drafters=True))
for _name, _prop, _acc in (("accept_all", lambda K: K, lambda K: K), ("accept_none", lambda K: K, lambda K: 0),
                           ("propose_nothing", lambda K: 0, lambda K: 0)):
    register_policy(PolicySpec(_name, "calibration", _calibration(_prop, _acc),
                               "replay calibration (sdlib.vllm.replay)", replays_on=TRACE_METHODS, simulate=False))
