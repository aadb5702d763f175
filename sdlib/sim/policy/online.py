"""The project's online policy: per step, the drafter (n-gram, EAGLE-3 or none) and the draft length that
maximise expected tokens per second, from an acceptance predictor and a step-cost model.

At a step at output position ``p`` the policy knows only what an engine knows before verifying: the n-gram
match (its continuation length, n-gram length and count), the output position, the prompt/output overlap so
far, this request's recent acceptance of each drafter, the batch size and a cost model. For every candidate
(drafter ``d``, length ``l``; ``l <= `` the n-gram's continuation for the n-gram) it predicts the expected
tokens gained ``E[g]`` (:class:`~sdlib.sim.policy.predictor.HazardModel` per drafter) and prices the step
(:func:`~sdlib.sim.policy.walk.price_table`: linear models charge EAGLE-3's drafting only when it drafts, the
look-up every step; the engine model prices the step's k on the EAGLE-3 path), then takes the largest
``E[g] / t``. ``drafters`` restricts the choice (``("eagle3",)``: length only, one drafter).

Variants (policy names in tables start with ``online``): ``online`` (both drafters), ``online-eagle3`` and
``online-ngram`` (one drafter: the share of the gap that choosing the length alone closes); ``online-at-k``
(replay only) prices every option at the engine's K, as vLLM 0.26's EAGLE-3 path charges it (the step time
there depends on K and the batch size, not on what is drafted), so it drafts up to K and chooses the drafter.
Each is registered in :mod:`sdlib.core.registry`; their build needs ``BuildRequest.predictor`` (the caller
cross-fits it once, or loads the committed one for a replay: :func:`sdlib.sim.policy.training.ensure_predictor`).

The predictor is cross-fitted (:mod:`sdlib.sim.policy.training`): each request is decided by a model fitted on
the other fold of requests.

Usage:
    from sdlib.sim.policy.online import OnlinePolicy
    pol = OnlinePolicy(models={"ngram": m_ng, "eagle3": m_eg}, cost_models=[cm], batch_sizes=[8])
    steps = walk(PolicyInputs.of(prep), pol, n_configs=1)[0]
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from sdlib.core.registry import KMAX, BuildRequest, PolicyRef, PolicySpec, register_policy
from sdlib.sim.policy.walk import EAGLE, NGRAM, NONE, Lanes, Policy, PolicyInputs, capped, price_table, walk, wrapped
from sdlib.sim.policy.predictor import FEATURES, HazardModel

#: Decay of the per-request acceptance estimates per observation (fast and slow), and their prior
#: pseudo-counts (accepted, rejected).
EMA_DECAY, EMA_DECAY_SLOW = 0.8, 0.97
PRIOR_ACCEPTED, PRIOR_REJECTED = 1.0, 0.5
#: Variant name -> drafters it may choose between.
VARIANTS = {"online": ("ngram", "eagle3"), "online-eagle3": ("eagle3",), "online-ngram": ("ngram",)}


def _logit(acc: np.ndarray, rej: np.ndarray) -> np.ndarray:
    return np.log((acc + PRIOR_ACCEPTED) / (rej + PRIOR_REJECTED))


def dynamic_features(state: dict) -> np.ndarray:
    """(n, len(DYNAMIC_FEATURES)) per-request and per-deployment state features of the lanes (the pooled
    columns ``pool_*`` are set by :meth:`OnlinePolicy.decide` from :class:`DeploymentPool`)."""
    n = state["ng_acc"].size
    pool = [_logit(state[f"pool_{d}_acc"], state[f"pool_{d}_rej"]) if f"pool_{d}_acc" in state else np.zeros(n)
            for d in ("ng", "eg")]
    return np.column_stack([_logit(state["ng_acc"], state["ng_rej"]), _logit(state["eg_acc"], state["eg_rej"]),
                            _logit(state["ng_acc_s"], state["ng_rej_s"]), _logit(state["eg_acc_s"], state["eg_rej_s"]),
                            state["last_full"], np.log1p(state["last_gain"]), *pool])


def init_state(n: int) -> dict:
    z = np.zeros(n)
    st = {f"{d}_{x}{s}": z.copy() for d in ("ng", "eg") for x in ("acc", "rej") for s in ("", "_s")}
    return {**st, "last_full": z.copy(), "last_gain": z.copy(), "eg_seen": np.ones(n)}


class DeploymentPool:
    """Acceptance counts pooled over every request of a deployment: what an engine has seen of each drafter on
    all the requests it served so far (a workload's level, which one request's first steps cannot show; the
    predictor fitted on a mix of workloads is off by the workload's level otherwise: on GSM8K it overrated the
    n-gram by 16% and underrated EAGLE-3 by 5% at 3 drafted tokens).

    A deployment is a (configuration, dataset) pair of the walk: the requests of one dataset served at one
    batch size and cost model (the paper runs one dataset at a time). Counts add up every step served (the
    deployment's level, not its recent position-dependent swings) and are updated after each step, so a step
    sees only steps that ended before it. The walk runs a deployment's requests in lockstep, as if all were
    served at once: a request's early steps see the other requests' early steps, where a server that admits
    requests over time would show a mix of positions.
    """

    KEYS = ("pool_ng_acc", "pool_ng_rej", "pool_eg_acc", "pool_eg_rej")

    def __init__(self):
        self.counts: Optional[np.ndarray] = None  # (groups, 4) in KEYS order
        self.codes: Optional[np.ndarray] = None

    def groups(self, inp: PolicyInputs, lanes: Lanes) -> np.ndarray:
        """Each lane's deployment; the table is sized at the walk's first step, when every lane is active."""
        if self.counts is None:
            self.codes = np.unique(np.asarray(inp.prep.dataset, dtype=object), return_inverse=True)[1].ravel()
            self.n_ds = int(self.codes.max(initial=0)) + 1
            self.counts = np.zeros(((int(lanes.cfg.max(initial=0)) + 1) * self.n_ds, len(self.KEYS)))
        return lanes.cfg.astype(np.int64) * self.n_ds + self.codes[lanes.req]

    def set_lanes(self, inp: PolicyInputs, lanes: Lanes) -> None:
        g = self.groups(inp, lanes)
        for j, key in enumerate(self.KEYS):
            lanes.state[key] = self.counts[g, j]

    def add(self, inp: PolicyInputs, lanes: Lanes, obs: list) -> None:
        """``obs``: [(seen, acc, rej)] for the n-gram then EAGLE-3, per lane."""
        g = self.groups(inp, lanes)
        for j, (seen, acc, rej) in enumerate(obs):
            for col, v in ((2 * j, acc), (2 * j + 1, rej)):
                self.counts[:, col] += np.bincount(g[seen], weights=np.asarray(v, float)[seen],
                                                   minlength=self.counts.shape[0])


def observe_acceptance(inp: PolicyInputs, lanes: Lanes, drafter, proposed, gain,
                       pool: Optional[DeploymentPool] = None) -> None:
    """Update the per-request acceptance estimates after a step (what the engine learns from it), and the
    deployment's pooled counts (``pool``)."""
    st, pos, flat = lanes.state, lanes.pos, lanes.flat
    av = inp.avail[flat]
    a_ng = inp.acc_ng[flat] - 1
    chk = np.minimum(av, gain)  # n-gram draft tokens checkable against the tokens this step produced
    m = chk > 0
    e = drafter == EAGLE
    a_eg = inp.acc_eg[flat] - 1
    obs = [(m, np.minimum(a_ng, chk), a_ng < chk), (e, np.minimum(a_eg, proposed), a_eg < proposed)]
    for sfx, decay in (("", EMA_DECAY), ("_s", EMA_DECAY_SLOW)):
        for d, (seen, acc, rej) in zip(("ng", "eg"), obs):
            st[f"{d}_acc{sfx}"] = np.where(seen, decay * st[f"{d}_acc{sfx}"] + acc, st[f"{d}_acc{sfx}"])
            st[f"{d}_rej{sfx}"] = np.where(seen, decay * st[f"{d}_rej{sfx}"] + rej, st[f"{d}_rej{sfx}"])
    if pool is not None:
        pool.add(inp, lanes, obs)
    st["eg_seen"] = np.where(e, pos + gain, st["eg_seen"])
    st["last_full"] = ((proposed > 0) & (gain == proposed + 1)).astype(float)
    st["last_gain"] = gain.astype(float)


class OnlinePolicy(Policy):
    """Cost-aware per-step choice of drafter and length (see the module docstring).

    ``models``: ``{"ngram": HazardModel, "eagle3": HazardModel}``, or a list of such dicts with
    ``model_of_request`` (R,) choosing one per request (cross-fitting). ``cost_models`` and ``batch_sizes``:
    one configuration per pair (lanes of :func:`~sdlib.sim.policy.walk.walk`). ``engine_k``: the engine
    verifies this many draft slots at every step whatever the policy drafts (vLLM 0.26's EAGLE-3 path: its
    head drafts K every step and every row verifies K), so every option is priced at K; None: a step costs
    what it drafts (the engine model's per-step k). ``criterion``: ``rate`` (the
    largest ``E[g] / t``) or ``renewal`` (the largest ``E[g] - rho * t``, ``rho`` = the lane's tokens per second
    so far: the long-run optimum when predictions are calibrated).
    """

    path = "padded"

    def __init__(self, models, cost_models: Sequence, batch_sizes: Sequence[int], variant: str = "online",
                 model_of_request: Optional[np.ndarray] = None, kmax: int = KMAX, record_features: bool = False,
                 criterion: str = "rate", engine_k: Optional[int] = None):
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {sorted(VARIANTS)}")
        if criterion not in ("rate", "renewal"):
            raise ValueError(f"criterion {criterion!r}: rate or renewal")
        self.name, self.drafters, self.criterion = variant, VARIANTS[variant], criterion
        self.lengths = "eagle3" if self.drafters == ("eagle3",) else ("ngram" if self.drafters == ("ngram",) else "mixed")
        self.models = models if isinstance(models, list) else [models]
        self.model_of_request = model_of_request
        self.kmax = kmax
        self.B = np.asarray(batch_sizes, dtype=float)
        tabs = [price_table(cm, int(b), kmax) for cm, b in zip(cost_models, batch_sizes)]
        if engine_k is not None:  # every step costs the path's K: no option is cheaper than drafting K
            for t in tabs:
                full = t["base"][EAGLE][min(int(engine_k), kmax)]
                for d in (NONE, NGRAM, EAGLE):
                    t["base"][d], t["slope"][d] = np.full(kmax + 1, full), t["slope"][EAGLE]
                t["cu"] = 0.0
        self.engine_k = engine_k
        self.base = {d: np.stack([t["base"][d] for t in tabs]).astype(np.float32) for d in (NONE, NGRAM, EAGLE)}
        self.slope = {d: np.array([t["slope"][d] for t in tabs]) for d in (NONE, NGRAM, EAGLE)}
        self.cu = np.array([t["cu"] for t in tabs])
        self.record_features = record_features
        self.trajectory: list = []
        self._static: dict = {}

    def init_state(self, cfg, req):
        st = init_state(req.size)
        st["gained"], st["spent"] = np.zeros(req.size), np.zeros(req.size)
        self.pool = DeploymentPool()  # one per walk
        return st

    def _prepare(self, inp: PolicyInputs) -> None:
        """Per position and drafter: the static part of the hazard logits (each request's own model)."""
        if self._static.get("inp") is inp:
            return
        S = inp.extra["static_X"]
        ns = S.shape[1]
        R = len(inp.prep)
        which = np.zeros(R, np.int64) if self.model_of_request is None else np.asarray(self.model_of_request)
        req_of = np.repeat(np.arange(R), inp.G)
        f32 = np.float32  # the per-step arithmetic runs in single precision (twice as fast; ranks unchanged)
        lj = np.log(np.arange(1, self.kmax + 1, dtype=float)).astype(f32)
        out = {"inp": inp, "which": which, "lj": lj}
        for d in ("ngram", "eagle3"):
            zw, zv = np.zeros(S.shape[0]), np.zeros(S.shape[0])
            for i, m in enumerate(self.models):
                sel = which[req_of] == i
                zw[sel] = m[d].w[0] + S[sel] @ m[d].w[1:ns + 1]
                zv[sel] = m[d].v[0] + S[sel] @ m[d].v[1:ns + 1]
            out[d] = (zw.astype(f32), zv.astype(f32), np.stack([m[d].w[ns + 1:] for m in self.models]).astype(f32),
                      np.stack([m[d].v[ns + 1:] for m in self.models]).astype(f32),
                      np.stack([m[d].b[:self.kmax] for m in self.models]).astype(f32))
        self._static = out

    def _expected(self, flat: np.ndarray, which: np.ndarray, dyn: np.ndarray, drafter: str) -> np.ndarray:
        zw, zv, wd, vd, b = self._static[drafter]
        a = zw[flat] + np.einsum("ij,ij->i", dyn, wd[which])
        c = zv[flat] + np.einsum("ij,ij->i", dyn, vd[which])
        z = a[:, None] + b[which] + c[:, None] * self._static["lj"][None, :]
        np.negative(z, out=z)
        np.exp(z, out=z)
        z += 1.0
        np.reciprocal(z, out=z)
        s = np.cumprod(z, axis=1)
        out = np.empty((flat.size, self.kmax + 1), dtype=np.float32)
        out[:, 0] = 1.0
        np.cumsum(s, axis=1, out=out[:, 1:])
        out[:, 1:] += 1.0
        return out

    def decide(self, inp: PolicyInputs, lanes: Lanes):
        self._prepare(inp)
        req, pos, cfg, st, flat = lanes.req, lanes.pos, lanes.cfg, lanes.state, lanes.flat
        which = self._static["which"][req]
        self.pool.set_lanes(inp, lanes)
        dyn = dynamic_features(st).astype(np.float32)
        if self.record_features:
            self.trajectory.append((req.copy(), pos.copy(), np.column_stack([inp.extra["static_X"][flat], dyn])))
        kv = self.B[cfg] * (inp.prep.prompt_len[req] + pos)
        renewal = self.criterion == "renewal"
        t0 = self.base[NONE][cfg, 0] + self.slope[NONE][cfg] * kv
        rho = np.where(st["spent"] > 0, st["gained"] / np.maximum(st["spent"], 1e-12), 1.0 / t0)

        def score(g, t):
            return g - rho[:, None] * t if renewal else g / t

        best = score(np.ones((req.size, 1)), t0[:, None])[:, 0]
        drafter = np.full(req.size, NONE, dtype=np.int8)
        length = np.zeros(req.size, dtype=np.int64)
        ls = np.arange(self.kmax + 1)
        if "ngram" in self.drafters:
            av = inp.avail[flat]
            eg = self._expected(flat, which, dyn, "ngram")
            t = self.base[NGRAM][cfg] + (self.slope[NGRAM][cfg] * kv).astype(np.float32)[:, None]
            r = np.where((ls[None, :] <= av[:, None]) & (ls[None, :] > 0), score(eg, t), -np.inf)
            j = np.argmax(r, axis=1)
            rj = r[np.arange(req.size), j]
            m = rj > best
            best, drafter, length = np.where(m, rj, best), np.where(m, NGRAM, drafter), np.where(m, j, length)
        if "eagle3" in self.drafters:
            eg = self._expected(flat, which, dyn, "eagle3")
            cu = self.cu[cfg] * np.maximum(pos - st["eg_seen"], 0)
            t = self.base[EAGLE][cfg][:, 1:] + (self.slope[EAGLE][cfg] * kv + cu).astype(np.float32)[:, None]
            r = score(eg[:, 1:], t)
            j = np.argmax(r, axis=1) + 1
            rj = r[np.arange(req.size), j - 1]
            m = rj > best
            drafter, length = np.where(m, EAGLE, drafter).astype(np.int8), np.where(m, j, length)
        eagle = (drafter == EAGLE).astype(float)
        eagle_n = length + 1.0 + np.maximum(pos - st["eg_seen"], 0) * eagle
        if renewal:  # remember the step's price for rho
            tb = np.where(drafter == NGRAM, self.base[NGRAM][cfg, length] + self.slope[NGRAM][cfg] * kv,
                          np.where(drafter == EAGLE, self.base[EAGLE][cfg, length] + self.slope[EAGLE][cfg] * kv, t0))
            st["spent"] = st["spent"] + tb
        return drafter, length, length, eagle, 1.0, eagle_n

    def observe(self, inp, lanes, decision, gain):
        observe_acceptance(inp, lanes, decision[0], decision[1], gain, self.pool)
        lanes.state["gained"] = lanes.state["gained"] + gain

    def first_draft_acceptance(self, inp: PolicyInputs, lanes: Lanes, drafter: np.ndarray) -> np.ndarray:
        """Per lane, right after :meth:`decide` (before :meth:`observe`): the predicted probability that the first
        draft of the chosen ``drafter`` is accepted, from the state the decision saw (nan where the drafter is none;
        :mod:`sdlib.sim.policy.regret` reads it)."""
        out = np.full(lanes.req.size, np.nan)
        which = self._static["which"][lanes.req]
        dyn = dynamic_features(lanes.state).astype(np.float32)
        for code, name in ((NGRAM, "ngram"), (EAGLE, "eagle3")):
            m = drafter == code
            if m.any():
                out[m] = self._expected(lanes.flat[m], which[m], dyn[m], name)[:, 1] - 1.0
        return out


def models_to_dict(models: dict) -> dict:
    return {"features": list(FEATURES), **{d: m.to_dict() for d, m in models.items()}}


def models_from_dict(d: dict) -> dict:
    if list(d.get("features", [])) != list(FEATURES):
        raise ValueError(f"predictor features {d.get('features')} differ from this version's {list(FEATURES)}")
    return {k: HazardModel.from_dict(v) for k, v in d.items() if k in ("ngram", "eagle3")}


def _online_build(variant: str, at_k: bool = False):
    def build(req: BuildRequest, ref: PolicyRef) -> list:
        pred = req.predictor
        if pred is None:
            raise ValueError(f"{ref.label} needs the acceptance predictor (sdlib.sim.policy.training.ensure_predictor)")
        inp = req.inputs
        pol = OnlinePolicy(pred.models, [c for c, _ in req.configs], [b for _, b in req.configs], variant=variant,
                           model_of_request=pred.model_of_request(), kmax=inp.kmax if req.K is None else req.K,
                           engine_k=req.K if at_k else None)
        return walk(inp, capped(wrapped(req.resources, pol), req.K), n_configs=len(req.configs))
    return build


_SOURCE = "the project's online policy (sdlib.sim.policy.online)"
register_policy(PolicySpec("online", "online", _online_build("online"), _SOURCE, replays_on=("eagle3",),
                           mixes_drafters=True, batch_dependent=True, needs=frozenset({"predictor", "engine_files"})))
register_policy(PolicySpec("online-eagle3", "online", _online_build("online-eagle3"), _SOURCE + ", EAGLE-3's length only",
                           batch_dependent=True, needs=frozenset({"predictor"}), groups=("online-ablations",)))
register_policy(PolicySpec("online-ngram", "online", _online_build("online-ngram"), _SOURCE + ", the n-gram's length only",
                           replays_on=("ngram",), batch_dependent=True, needs=frozenset({"predictor", "engine_files"})))
register_policy(PolicySpec("online-at-k", "online", _online_build("online", at_k=True),
                           _SOURCE + ", every option priced at the engine's K", replays_on=("eagle3",), mixes_drafters=True,
                           batch_dependent=True, needs=frozenset({"predictor", "engine_files"}), simulate=False))
