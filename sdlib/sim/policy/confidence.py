"""A confidence-stopping EAGLE-3 drafter: the draft length chosen token by token from the head's own top-1
probability (:mod:`sdlib.run.confidences`), priced by the step-cost model.

The head drafts one token at a time. After drafting token ``j`` it knows the confidences ``c_1..c_j`` of its
drafts so far (and nothing about later ones). With ``a_i`` the calibrated probability that draft ``i`` is
accepted given drafts ``1..i-1`` were, ``S_j = a_1 * ... * a_j`` and the expected gain of proposing ``l``
drafts ``E_l = 1 + S_1 + ... + S_l``. The step's rate with ``l`` proposed is ``E_l / t_l`` (``t_l`` the
cost model's price of a step that proposes ``l``, at the configuration's batch size and KV size). It stops at
the first ``j`` whose inclusion would lower the rate (``E_j / t_j <= E_{j-1} / t_{j-1}``: the token's expected
gain per added second is below the step's rate so far), proposes ``j - 1`` and pays for drafting ``j``
(``eagle_n = j + 1``); it proposes ``K`` when no token lowers the rate. So it decides only from what a
drafter has seen when it decides (the one extra token it drafts is charged).

Variants (rows in ``sdlib simulate`` tables):

* ``online-confidence``: ``a_i`` from the raw confidence through a monotone calibration map (pool-adjacent
  violators over confidence bins), cross-fitted: a request is decided by the map fitted on the other fold of
  requests (:func:`sdlib.sim.policy.training.folds`);
* ``online-confidence-raw``: ``a_i = c_i`` (the raw probability taken as the acceptance probability);
* ``online-with-confidence``: the online policy (:mod:`sdlib.sim.policy.online`) chooses the drafter before
  drafting, as it does; when it chooses EAGLE-3 the length is stopped on the calibrated confidence.

Requests need confidences (``sdlib simulate --confidences``): :func:`attach_confidences` lays them on the
per-position grid of :class:`~sdlib.sim.policy.walk.PolicyInputs`.

Usage:
    attach_confidences(inp, {("sharegpt", "sharegpt-0"): conf_rows, ...})
    steps = walk(inp, ConfidencePolicy([cm], [32], inp), n_configs=1)[0]
"""

from __future__ import annotations

import glob
import gzip
import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from sdlib.core.bootstrap import wilson
from sdlib.core.registry import BuildRequest, PolicyRef, PolicySpec, register_policy
from sdlib.paths import resolve
from sdlib.sim.policy.online import OnlinePolicy
from sdlib.sim.policy.walk import EAGLE, Lanes, Policy, PolicyInputs, capped, price_table, walk, wrapped
from sdlib.store.files import sha256_file

CALIBRATED, RAW, WITH_ONLINE = "online-confidence", "online-confidence-raw", "online-with-confidence"
VARIANTS = (CALIBRATED, RAW, WITH_ONLINE)
#: Confidence bins of the calibration map (equal width on [0, 1]) and its prior pseudo-counts per bin.
CAL_BINS = 20
CAL_PRIOR_ACCEPTED, CAL_PRIOR_SEEN = 1.0, 2.0


class ConfidenceError(ValueError):
    """The requests' draft confidences are missing or do not cover their traces (``sdlib simulate`` reports it
    as a ``--confidences`` error)."""


def _bin(c, bins: int) -> np.ndarray:
    """Equal-width bin of each confidence in [0, 1] (1.0 in the last bin)."""
    return np.minimum((np.asarray(c) * bins).astype(np.int64), bins - 1)


def read_confidences(path: str | Path) -> tuple[str, dict[str, list[list[float]]], dict]:
    """(dataset, {request id: conf rows}, provenance) of a confidence file written by ``sdlib confidences``
    (:func:`sdlib.run.confidences.write_confidences`)."""
    # deferred: sdlib.sim.traces loads pandas, and only this path needs it
    from sdlib.sim.traces import provenance_path

    p = resolve(str(path))
    prov = json.loads(provenance_path(p).read_text())
    with gzip.open(p, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return prov["dataset"], {str(r["id"]): r["conf_eagle"] for r in rows}, prov


def load_confidences(spec: str, k: Optional[int] = None, traces: Optional[str] = None) -> dict:
    """{(dataset, request id): confidence rows} of the files matching ``spec`` (comma-separated globs, from where
    the caller stands). With ``k`` (the traces' k): each file must score at least k drafts; with ``traces`` (the
    trace globs): each file must have been made from one of those files as they are now (sha256). Raises
    :class:`ConfidenceError`."""
    files = sorted({f for pat in spec.split(",") for f in glob.glob(pat)})
    if not files:
        raise ConfidenceError(f"no file matches {spec!r}")
    shas = {Path(f).resolve(): sha256_file(Path(f)) for pat in traces.split(",") for f in glob.glob(pat)} if traces else None
    out = {}
    for f in files:
        try:
            ds, rows, prov = read_confidences(f)
        except (OSError, ValueError, KeyError) as e:
            raise ConfidenceError(f"{f}: {type(e).__name__}: {e}") from None
        if k is not None and int(prov.get("k") or 0) < k:
            raise ConfidenceError(f"{f} scores {prov.get('k')} drafts per position, the traces {k}")
        if shas is not None:
            src = resolve(str(prov.get("traces", ""))).resolve()
            if src not in shas:
                raise ConfidenceError(f"{f} was made from {prov.get('traces')!r}, which is not a --traces file")
            if shas[src] != prov.get("traces_sha256"):
                raise ConfidenceError(f"{f} was made from {prov.get('traces')!r} as it was then, not as it is now "
                                      "(sha256 differs): rerun sdlib confidences")
        out.update({(ds, rid): conf for rid, conf in rows.items()})
    return out


def attach_confidences(inp: PolicyInputs, conf: dict) -> None:
    """Put ``conf`` ({(dataset, request id): rows, ``rows[q][j]`` = top-1 probability of draft ``j`` at
    position ``q``}) on the grid as ``inp.extra["conf_eagle"]`` ((positions, kmax) float32; 0 where the head
    drafted nothing: past the output). Raises ValueError naming a request without confidences."""
    prep, K = inp.prep, inp.kmax
    C = np.zeros((int(inp.off[-1]), K), np.float32)
    missing, short = [], []
    for r, key in enumerate(zip(prep.dataset, map(str, prep.request_id))):
        rows = conf.get(key)
        if rows is None:
            missing.append(key)
            continue
        need = min(int(inp.G[r]), int(inp.L_eagle[r]))
        if len(rows) < need:
            short.append((key, len(rows), need))
        for q, row in enumerate(rows[:int(inp.G[r])]):
            n = min(len(row), K)
            if n:
                C[inp.off[r] + q, :n] = row[:n]
    if missing:
        raise ConfidenceError(f"{len(missing)} of {len(prep)} requests have no draft confidences, e.g. {missing[0]}")
    if short:
        raise ConfidenceError(f"{len(short)} requests have draft confidences for fewer positions than their trace (made "
                         f"from another trace?), e.g. {short[0][0]}: {short[0][1]} < {short[0][2]}")
    inp.extra["conf_eagle"] = C


def _observations(inp: PolicyInputs, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, accepted) of every draft that was reached (its predecessors accepted) and whose outcome
    the trace shows (not cut by the output's end), at every position of ``requests``' EAGLE-3 lists."""
    C, acc = inp.extra["conf_eagle"], inp.acc_eg
    cs, ys = [], []
    for r in requests:
        lo, L = int(inp.off[r]), int(inp.L_eagle[r])
        q = np.arange(1, L)
        a = acc[lo + q]
        left = L - q  # acc is capped at the tokens left: drafts j >= left - 1 are not observed
        for j in range(inp.kmax):
            m = (a >= j + 1) & (j < left - 1)
            cs.append(C[lo + q[m], j])
            ys.append(a[m] >= j + 2)
    return (np.concatenate(cs) if cs else np.zeros(0)), (np.concatenate(ys) if ys else np.zeros(0, bool))


def fit_calibration(c: np.ndarray, y: np.ndarray, bins: int = CAL_BINS) -> np.ndarray:
    """A non-decreasing map (one value per confidence bin) from confidence to acceptance probability: the
    smoothed acceptance rate per bin, made monotone by pool-adjacent violators (weights = draws per bin)."""
    b = _bin(c, bins)
    acc = np.bincount(b, weights=np.asarray(y, float), minlength=bins) + CAL_PRIOR_ACCEPTED
    n = np.bincount(b, minlength=bins) + CAL_PRIOR_SEEN
    blocks = []  # [rate, weight, size] merged left to right
    for v, w in zip(acc / n, n):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, s2 = blocks.pop()
            v1, w1, s1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, s1 + s2])
    return np.concatenate([np.full(s, v) for v, _, s in blocks])


def reliability(inp: PolicyInputs, bins: int = 10):
    """Per dataset and confidence bin: drafts reached (``n``), accepted, the acceptance rate and its Wilson
    95% interval (``rate_lo``, ``rate_hi``), and the mean confidence in the bin (a reliability table: a
    calibrated confidence has ``rate`` = ``conf``)."""
    # deferred: pandas is slow to import, and only this path needs it
    import pandas as pd

    rows = []
    for ds in dict.fromkeys(inp.prep.dataset):
        c, y = _observations(inp, np.flatnonzero(inp.prep.dataset == ds))
        b = _bin(c, bins)
        for i in np.unique(b):
            m = b == i
            rows.append({"dataset": ds, "bin_lo": i / bins, "bin_hi": (i + 1) / bins, "conf": float(c[m].mean()),
                         "n": int(m.sum()), "accepted": int(y[m].sum())})
    out = pd.DataFrame(rows)
    out["rate"] = out["accepted"] / out["n"]
    out["rate_lo"], out["rate_hi"] = wilson(out["accepted"], out["n"])
    return out


def calibrate(table: np.ndarray, c: np.ndarray) -> np.ndarray:
    return table[_bin(c, table.size)]


class Calibration:
    """Per-draft acceptance probability from the head's confidence: through the cross-fitted monotone map
    (``calibrated``; a request of fold k is decided by the map fitted on the other folds' requests), or the
    raw probability itself."""

    def __init__(self, inp: PolicyInputs, calibrated: bool = True):
        if "conf_eagle" not in inp.extra:
            raise ConfidenceError("needs draft confidences (sdlib simulate --confidences; sdlib confidences)")
        self.maps: list[np.ndarray] = []
        self.fold = np.zeros(len(inp.prep), np.int64)
        if calibrated:
            # deferred: sdlib.sim.policy.training loads pandas, and only this path needs it
            from sdlib.sim.policy.training import N_FOLDS, folds

            self.fold = folds(inp)  # the online predictor's folds too
            for k in range(N_FOLDS):
                self.maps.append(fit_calibration(*_observations(inp, np.flatnonzero(self.fold != k))))

    def __call__(self, inp: PolicyInputs, req: np.ndarray, flat: np.ndarray) -> np.ndarray:
        """(lanes, kmax) acceptance probability of each draft given its predecessors were accepted."""
        c = inp.extra["conf_eagle"][flat]
        if not self.maps:
            return c.astype(float)
        out = np.empty(c.shape)
        f = self.fold[req]
        for k, table in enumerate(self.maps):
            m = f == k
            out[m] = calibrate(table, c[m])
        return out


def stop_lengths(a: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(proposed, drafted) per lane of the token-by-token stopping rule (module docstring): ``a`` (lanes, K)
    acceptance probabilities, ``t`` (lanes, K + 1) the price of a step that proposes 0..K."""
    K = a.shape[1]
    E = np.ones((a.shape[0], K + 1))
    E[:, 1:] += np.cumsum(np.cumprod(a, axis=1), axis=1)
    r = E / t
    lower = r[:, 1:] <= r[:, :-1]  # lower[:, j-1]: including draft j lowers the rate
    stop = np.where(lower.any(axis=1), np.argmax(lower, axis=1) + 1, K + 1)  # the first such j
    return (stop - 1).astype(np.int64), np.minimum(stop, K).astype(np.int64)


class ConfidencePolicy(Policy):
    """Token-by-token stopping on the head's confidence (module docstring). ``cost_models`` and
    ``batch_sizes``: one configuration per pair (lanes of :func:`~sdlib.sim.policy.walk.walk`)."""

    lengths = "eagle3"
    path = "padded"

    def __init__(self, cost_models: Sequence, batch_sizes: Sequence[int], inp: PolicyInputs,
                 variant: str = CALIBRATED):
        if variant not in (CALIBRATED, RAW):
            raise ValueError(f"variant {variant!r} not in {[CALIBRATED, RAW]}")
        self.name, self.kmax = variant, inp.kmax
        self.calibration = Calibration(inp, calibrated=variant == CALIBRATED)
        self.B = np.asarray(batch_sizes, dtype=float)
        tabs = [price_table(cm, int(b), self.kmax) for cm, b in zip(cost_models, batch_sizes)]
        self.base = np.stack([t["base"][EAGLE] for t in tabs])
        self.slope = np.array([t["slope"][EAGLE] for t in tabs])

    def decide(self, inp: PolicyInputs, lanes: Lanes):
        req, pos, cfg, flat = lanes.req, lanes.pos, lanes.cfg, lanes.flat
        kv = self.B[cfg] * (inp.prep.prompt_len[req] + pos)
        proposed, drafted = stop_lengths(self.calibration(inp, req, flat),
                                         self.base[cfg] + (self.slope[cfg] * kv)[:, None])
        return np.full(req.size, EAGLE, dtype=np.int8), proposed, proposed, 1.0, 0.0, drafted + 1.0


class OnlineWithConfidence(OnlinePolicy):
    """The online policy's choice of drafter (made before drafting, from its predictor and the cost model);
    when it chooses EAGLE-3, the length comes from token-by-token stopping on the head's calibrated
    confidence instead of the predictor's length (``online-with-confidence``)."""

    def __init__(self, models, cost_models: Sequence, batch_sizes: Sequence[int], inp: PolicyInputs,
                 model_of_request: Optional[np.ndarray] = None, kmax: Optional[int] = None):
        super().__init__(models, cost_models, batch_sizes, variant="online", model_of_request=model_of_request,
                         kmax=inp.kmax if kmax is None else min(int(kmax), inp.kmax))
        self.name = WITH_ONLINE
        self.calibration = Calibration(inp, calibrated=True)

    def decide(self, inp: PolicyInputs, lanes: Lanes):
        drafter, length, _, eagle, ngram, eagle_n = super().decide(inp, lanes)
        m = drafter == EAGLE
        if m.any():
            req, pos, cfg = lanes.req[m], lanes.pos[m], lanes.cfg[m]
            kv = self.B[cfg] * (inp.prep.prompt_len[req] + pos)
            cu = self.cu[cfg] * np.maximum(pos - lanes.state["eg_seen"][m], 0)  # what the online policy charges too
            t = self.base[EAGLE][cfg].astype(float) + (self.slope[EAGLE][cfg] * kv + cu)[:, None]
            proposed, drafted = stop_lengths(self.calibration(inp, req, lanes.flat[m])[:, :self.kmax], t)
            catch_up = eagle_n[m] - length[m] - 1.0  # tokens EAGLE-3 had not seen (it skipped steps)
            length = length.copy()
            eagle_n = eagle_n.copy()
            length[m], eagle_n[m] = proposed, drafted + 1.0 + catch_up
        return drafter, length, length, eagle, ngram, eagle_n

    def first_draft_acceptance(self, inp: PolicyInputs, lanes: Lanes, drafter: np.ndarray) -> np.ndarray:
        """As the online policy's, with EAGLE-3's first draft from the head's calibrated confidence, as its
        length is stopped."""
        out = super().first_draft_acceptance(inp, lanes, drafter)
        m = drafter == EAGLE
        if m.any():
            out[m] = self.calibration(inp, lanes.req[m], lanes.flat[m])[:, 0]
        return out


def confidence_steps(inp: PolicyInputs, name: str, cfg: Sequence[tuple], predictor=None,
                     K: Optional[int] = None, resources: Optional[dict] = None) -> list:
    """Steps of a policy of :data:`VARIANTS` at each (cost model, batch size); ``online-with-confidence``
    needs ``predictor`` (the online policy's, :class:`sdlib.sim.policy.training.Predictor`) and may be capped at an
    engine's ``K`` (a replay: every proposal at most K, EAGLE-3 stopped within its first K drafts).
    ``resources``: the build request's (its :data:`~sdlib.sim.policy.walk.WRAP` is applied to the policy)."""
    cms, bss = [c for c, _ in cfg], [b for _, b in cfg]
    if name == WITH_ONLINE:
        if predictor is None:
            raise ValueError(f"{name} needs the online policy's predictor")
        pol = OnlineWithConfidence(predictor.models, cms, bss, inp, model_of_request=predictor.model_of_request(),
                                   kmax=K)
        return walk(inp, capped(wrapped(resources or {}, pol), K), n_configs=len(cfg))
    if K is not None:
        raise ValueError(f"{name}: no engine replay (simulation only)")
    return walk(inp, wrapped(resources or {}, ConfidencePolicy(cms, bss, inp, variant=name)), n_configs=len(cfg))


def _build(req: BuildRequest, ref: PolicyRef) -> list:
    if "conf_eagle" not in req.inputs.extra:
        raise ConfidenceError(f"{ref.label} needs the requests' draft confidences (attach_confidences)")
    return confidence_steps(req.inputs, ref.name, [tuple(c) for c in req.configs], req.predictor, req.K,
                            req.resources)


_SOURCE = "EAGLE-3's length stopped on the head's own confidence (sdlib.sim.policy.confidence)"
register_policy(PolicySpec(CALIBRATED, "online", _build, _SOURCE + ", calibrated", batch_dependent=True,
                           needs=frozenset({"confidences"})))
register_policy(PolicySpec(RAW, "online", _build, _SOURCE + ", raw", batch_dependent=True,
                           needs=frozenset({"confidences"})))
register_policy(PolicySpec(WITH_ONLINE, "online", _build, _SOURCE + ", inside the online policy's drafter choice",
                           replays_on=("eagle3",), mixes_drafters=True, batch_dependent=True,
                           needs=frozenset({"confidences", "predictor", "engine_files"})))


__all__ = ["VARIANTS", "ConfidenceError", "read_confidences", "load_confidences", "attach_confidences", "fit_calibration", "reliability", "Calibration",
           "stop_lengths", "ConfidencePolicy", "OnlineWithConfidence", "confidence_steps"]
