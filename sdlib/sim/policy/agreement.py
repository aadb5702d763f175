"""The online policy with the draft's confidence, and the n-gram's acceptance read off its continuation's
agreement: ``online-with-agreement``.

Where the online policies lose most at large batches is the n-gram's length. On our traces (trained tiny models,
four workloads) the look-up matches at most positions, its tokens are accepted one by one with a hazard near
0.95, and most proposals are accepted whole: knowing which would be worth more than anything else a policy could
learn there. The predictor's features (the match, the request's recent hits, the position) see little of it.

One thing an engine can see before it verifies does: the matched n-gram's earlier occurrences. vLLM proposes
what followed its *first* occurrence; where the n-gram occurred twice or more, what followed its *latest* one is
a second copy of the text (:func:`sdlib.sim.policy.features.continuation_agreement`). Where the two copies
agree, the target tends to follow them; at the token where they part, it often does not (on our traces a
first token where the copies part is rejected far more often than one where they agree: :func:`class_table`,
``figures/07_online_policy__agreement_classes.csv``). So each n-gram draft token ``j`` gets a class:

* ``solo``: the n-gram occurred once before (nothing to compare);
* ``agreed``: ``j`` within the copies' agreement;
* ``parting``: ``j`` is the first token where they differ;
* ``past``: beyond it.

and the predictor's hazard for that token is shifted by the class's log-odds offset at depth ``j``:
``logit h'(j) = logit h(j | x) + delta[class, j]``, ``delta[c, j] = logit(rate[c, j]) - logit(rate[j])`` with
``rate[c, j]`` the acceptance of draft ``j`` (reached: tokens ``1..j-1`` accepted, within the continuation) at
positions of class ``c`` and ``rate[j]`` that of all classes (pseudo-counts :data:`PRIOR_ACCEPTED`,
:data:`PRIOR_SEEN`). The offsets are cross-fitted as the predictor is: a request of fold ``k`` is decided by the
offsets counted on the other fold's requests (:func:`sdlib.sim.policy.training.folds`), over every matched position
(not a policy's trajectory: the class is a property of the text). EAGLE-3's length is stopped on its calibrated
confidence as in ``online-with-confidence``; the drafter choice compares the n-gram's shifted expected gains with
EAGLE-3's predicted ones, as the online policy does. Needs the requests' token ids and draft confidences.

Usage:
    from sdlib.sim.policy.agreement import AgreementOffsets, agreement_classes
    off = AgreementOffsets(inp)                 # inp: PolicyInputs with token ids
    delta = off(req, flat)                      # (lanes, kmax) log-odds shifts of the n-gram's hazards
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from sdlib.core.bootstrap import wilson
from sdlib.core.registry import BuildRequest, PolicyRef, PolicySpec, register_policy
from sdlib.sim.policy.confidence import ConfidenceError, OnlineWithConfidence
from sdlib.sim.policy.features import continuation_agreement
from sdlib.sim.policy.walk import PolicyInputs, capped, walk, wrapped

NAME = "online-with-agreement"
#: Classes of an n-gram draft token (see the module docstring), in the offsets' row order.
CLASSES = ("solo", "agreed", "parting", "past")
#: Pseudo-counts (accepted, seen) per class and depth.
PRIOR_ACCEPTED, PRIOR_SEEN = 1.0, 2.0


def add_agreement(inp: PolicyInputs) -> np.ndarray:
    """``inp.extra["ng_agree"]``: :func:`~sdlib.sim.policy.features.continuation_agreement` on the flat grid
    (capped at the traces' k; -1 past the output), computed once."""
    if "ng_agree" not in inp.extra:
        prep = inp.prep
        if prep.prompt_token_ids is None:
            raise ValueError("the continuation agreement needs the token ids: prepare_traces(..., keep_tokens=True)")
        out = np.full(int(inp.off[-1]), -1, dtype=np.int64)
        for r in range(len(prep)):
            a = continuation_agreement(prep.prompt_token_ids[r], prep.output_token_ids[r], cap=inp.kmax)
            n = min(a.size, int(inp.G[r]))
            out[inp.off[r]:inp.off[r] + n] = a[:n]
        inp.extra["ng_agree"] = out
    return inp.extra["ng_agree"]


def agreement_classes(agree: np.ndarray, kmax: int) -> np.ndarray:
    """(n, kmax) class index (:data:`CLASSES`) of draft tokens ``j = 1..kmax`` at positions whose copies agree
    over ``agree`` tokens (-1: solo)."""
    a = np.asarray(agree)[:, None]
    j = np.arange(1, kmax + 1)[None, :]
    return np.where(a < 0, 0, np.where(j <= a, 1, np.where(j == a + 1, 2, 3))).astype(np.int64)


def _logit(p):
    return np.log(p / (1.0 - p))


def class_rates(inp: PolicyInputs, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, seen) per class and depth (4, kmax) over every matched position of ``requests``: draft ``j``
    is seen where tokens ``1..j-1`` were accepted and the continuation reaches ``j``."""
    K = inp.kmax
    agree = add_agreement(inp)
    pos = np.concatenate([np.arange(inp.off[r], inp.off[r] + inp.G[r]) for r in requests] + [np.zeros(0, np.int64)])
    av = inp.avail[pos]
    pos, av = pos[av > 0], av[av > 0]
    a = np.minimum(inp.acc_ng[pos] - 1, av)
    C = agreement_classes(agree[pos], K)
    acc, seen = np.zeros((len(CLASSES), K)), np.zeros((len(CLASSES), K))
    for j in range(K):
        reached = (a >= j) & (av > j)
        np.add.at(seen[:, j], C[reached, j], 1.0)
        np.add.at(acc[:, j], C[reached, j], (a[reached] >= j + 1).astype(float))
    return acc, seen


def class_table(inp: PolicyInputs):
    """Per dataset, class and depth: n-gram draft tokens reached (``seen``), ``accepted``, the acceptance rate and
    its Wilson 95% interval (``rate_lo``, ``rate_hi``) over every matched position (:func:`class_rates`)."""
    # deferred: pandas is slow to import, and only this path needs it
    import pandas as pd

    rows = []
    for ds in dict.fromkeys(inp.prep.dataset):
        acc, seen = class_rates(inp, np.flatnonzero(inp.prep.dataset == ds))
        for c, name in enumerate(CLASSES):
            for j in range(inp.kmax):
                if seen[c, j]:
                    rows.append({"dataset": ds, "agreement": name, "depth": j + 1, "seen": int(seen[c, j]),
                                 "accepted": int(acc[c, j])})
    out = pd.DataFrame(rows)
    out["rate"] = out["accepted"] / out["seen"]
    out["rate_lo"], out["rate_hi"] = wilson(out["accepted"], out["seen"])
    return out


def offsets_from(acc: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """(4, kmax) log-odds offsets: each class's smoothed rate against all classes' at the same depth."""
    rate = (acc + PRIOR_ACCEPTED) / (seen + PRIOR_SEEN)
    pooled = (acc.sum(0) + PRIOR_ACCEPTED) / (seen.sum(0) + PRIOR_SEEN)
    return _logit(rate) - _logit(pooled)[None, :]


class AgreementOffsets:
    """The cross-fitted offsets (module docstring): ``self(req, flat)`` -> (lanes, kmax) shifts, each request's
    from the other fold's counts."""

    def __init__(self, inp: PolicyInputs):
        # deferred: sdlib.sim.policy.training loads pandas, and only this path needs it
        from sdlib.sim.policy.training import N_FOLDS, folds

        add_agreement(inp)
        self.fold = folds(inp)
        self.tables = [offsets_from(*class_rates(inp, np.flatnonzero(self.fold != k))) for k in range(N_FOLDS)]
        self.agree, self.kmax = inp.extra["ng_agree"], inp.kmax

    def __call__(self, req: np.ndarray, flat: np.ndarray) -> np.ndarray:
        C = agreement_classes(self.agree[flat], self.kmax)
        cols = np.arange(self.kmax)[None, :]
        out = np.empty(C.shape)
        f = self.fold[req]
        for k, table in enumerate(self.tables):
            m = f == k
            out[m] = table[C[m], cols]
        return out


def shift_gains(e: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Expected gains (lanes, K+1) for l = 0..K with every token's hazard shifted by ``delta`` (lanes, K) in
    log-odds (``e[:, l] = 1 + S_1 + ... + S_l``, ``S`` the survival)."""
    S = np.diff(e.astype(float), axis=1)  # S_1..S_K
    h = np.empty_like(S)
    h[:, 0] = S[:, 0]
    h[:, 1:] = S[:, 1:] / np.maximum(S[:, :-1], 1e-300)
    h = np.clip(h, 1e-9, 1.0 - 1e-9)
    h2 = 1.0 / (1.0 + np.exp(-(_logit(h) + delta)))
    out = np.ones(e.shape, dtype=e.dtype)
    out[:, 1:] = 1.0 + np.cumsum(np.cumprod(h2, axis=1), axis=1)
    return out


class OnlineWithAgreement(OnlineWithConfidence):
    """``online-with-confidence`` whose n-gram expected gains come from the predictor's hazards shifted by the
    continuation agreement's cross-fitted offsets (module docstring)."""

    def __init__(self, models, cost_models: Sequence, batch_sizes: Sequence[int], inp: PolicyInputs,
                 model_of_request: Optional[np.ndarray] = None, kmax: Optional[int] = None):
        super().__init__(models, cost_models, batch_sizes, inp, model_of_request=model_of_request, kmax=kmax)
        self.name = NAME
        self.offsets = AgreementOffsets(inp)
        self._req_of_flat = np.repeat(np.arange(len(inp.prep)), inp.G)

    def _expected(self, flat, which, dyn, drafter):
        e = super()._expected(flat, which, dyn, drafter)
        if drafter != "ngram":
            return e
        delta = self.offsets(self._req_of_flat[flat], flat)[:, :self.kmax]
        return shift_gains(e, delta).astype(e.dtype)


def _build(req: BuildRequest, ref: PolicyRef) -> list:
    if "conf_eagle" not in req.inputs.extra:
        raise ConfidenceError(f"{ref.label} needs the requests' draft confidences (attach_confidences)")
    if req.predictor is None:
        raise ValueError(f"{ref.label} needs the online policy's predictor")
    cms, bss = [c for c, _ in req.configs], [b for _, b in req.configs]
    pol = OnlineWithAgreement(req.predictor.models, cms, bss, req.inputs,
                              model_of_request=req.predictor.model_of_request(), kmax=req.K)
    return walk(req.inputs, capped(wrapped(req.resources, pol), req.K), n_configs=len(req.configs))


register_policy(PolicySpec(NAME, "online", _build,
                           "online-with-confidence with the n-gram's hazards shifted by the agreement of the matched "
                           "n-gram's earlier continuations (sdlib.sim.policy.agreement)", replays_on=("eagle3",),
                           mixes_drafters=True, batch_dependent=True,
                           needs=frozenset({"confidences", "predictor", "engine_files"})))


__all__ = ["NAME", "CLASSES", "add_agreement", "agreement_classes", "class_rates", "class_table", "offsets_from",
           "AgreementOffsets", "shift_gains", "OnlineWithAgreement"]
