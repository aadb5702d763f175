"""Cross-fitting the online policy's acceptance predictor: two folds of requests, each decided by the model
fitted on the other, so that no request is ever decided by a model trained on it.

Folds: a request's fold is ``sha256(dataset/request_id)`` mod 2 (stable across runs and machines). Per fold,
the predictor is fitted on the steps a policy visits (its features depend on the trajectory): round 0 walks
the training requests with prior hazards, round 1 with the round-0 model; the rows of both rounds (subsampled
to :data:`MAX_STEPS` steps per drafter) give the final model. Trajectories are walked at the
:data:`TRAIN_CONFIGS` batch sizes with the authors' cost model (the predictor predicts acceptance, not time,
so one cost model serves all).

:func:`save_predictor` writes the folds, features, fitted parameters and fit diagnostics (held-out
log-likelihood on the other fold) to JSON; :func:`load_predictor` reads it back.

Usage:
    from sdlib.sim.policy.training import crossfit, save_predictor
    pred = crossfit(inp)                      # inp: PolicyInputs with sdlib.sim.policy.features.add_features
    save_predictor(pred, "data/predictors/reference.json")
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B
from sdlib.sim.policy.features import add_features
from sdlib.sim.policy.online import OnlinePolicy, models_from_dict, models_to_dict
from sdlib.sim.policy.predictor import DEPTH, FEATURES, HazardModel, fit_hazard, hazard_rows, mean_log_loss
from sdlib.sim.policy.walk import PolicyInputs, walk

#: Batch sizes whose trajectories train the predictor (authors' cost model).
TRAIN_CONFIGS = (1, 32)
#: Steps kept per drafter and round (random subsample, seeded).
MAX_STEPS = 15_000
SEED = 0
N_FOLDS = 2
#: The committed, cross-fitted predictor for the reference traces (``sdlib simulate --save-predictor`` writes one).
REFERENCE_PREDICTOR = "data/predictors/online_reference.json"


def fold_of(dataset: str, request_id: str, n_folds: int = N_FOLDS) -> int:
    """The request's fold: sha256 of ``dataset/request_id``, mod ``n_folds``."""
    return int(hashlib.sha256(f"{dataset}/{request_id}".encode()).hexdigest(), 16) % n_folds


def folds(inp: PolicyInputs) -> np.ndarray:
    return np.array([fold_of(d, r) for d, r in zip(inp.prep.dataset, inp.prep.request_id)], dtype=np.int64)


def prior_models() -> dict:
    """Constant hazards (n-gram 0.6, EAGLE-3 0.7 per token): round 0's trajectory."""
    F1 = len(FEATURES) + 1

    def const(p):
        w = np.zeros(F1)
        w[0] = np.log(p / (1 - p))
        return HazardModel(w, np.zeros(DEPTH), np.zeros(F1), {"prior": p})

    return {"ngram": const(0.6), "eagle3": const(0.7)}


def _rows(inp: PolicyInputs, traj: list, rng) -> dict:
    req = np.concatenate([t[0] for t in traj])
    pos = np.concatenate([t[1] for t in traj])
    X = np.concatenate([t[2] for t in traj])
    out = {}
    av = inp.at("avail", req, pos)
    m = np.flatnonzero(av > 0)
    if m.size > MAX_STEPS:
        m = rng.choice(m, MAX_STEPS, replace=False)
    out["ngram"] = hazard_rows(X[m], inp.at("acc_ng", req[m], pos[m], 1), av[m])
    known = inp.at("eg_known", req, pos, False)
    m = np.flatnonzero(known)
    if m.size > MAX_STEPS:
        m = rng.choice(m, MAX_STEPS, replace=False)
    out["eagle3"] = hazard_rows(X[m], inp.at("acc_eg", req[m], pos[m], 1), np.full(m.size, inp.kmax))
    return out


def _trajectory(inp, models, requests) -> list:
    pol = OnlinePolicy(models, [AUTHORS_H100_LLAMA8B] * len(TRAIN_CONFIGS), list(TRAIN_CONFIGS), record_features=True,
                       kmax=inp.kmax)
    walk(inp, pol, n_configs=len(TRAIN_CONFIGS), requests=requests)
    return pol.trajectory


def fit_on(inp: PolicyInputs, requests: np.ndarray, rounds: int = 2) -> tuple[dict, dict]:
    """Models fitted on ``requests`` (rounds of trajectory + fit) and the rows of the last round."""
    rng = np.random.default_rng(SEED)
    models = prior_models()
    rows = {"ngram": [], "eagle3": []}
    for _ in range(rounds):
        r = _rows(inp, _trajectory(inp, models, requests), rng)
        for d in rows:
            rows[d].append(r[d])
        models = {d: fit_hazard(*(np.concatenate([x[i] for x in rows[d]]) for i in range(3))) for d in rows}
    return models, r


@dataclass
class Predictor:
    """Cross-fitted models: ``models[f]`` was fitted on fold ``f``; request in fold ``f`` uses ``models[1-f]``."""

    models: list
    fold: np.ndarray  # (R,) fold of each request of the traces it was made for
    info: dict

    def model_of_request(self) -> np.ndarray:
        return (self.fold + 1) % N_FOLDS


def crossfit(inp: PolicyInputs, rounds: int = 2) -> Predictor:
    """Fit one model per fold and score each on the other fold's rows (held-out log-likelihood)."""
    add_features(inp)
    f = folds(inp)
    models, rows = [], []
    for k in range(N_FOLDS):
        m, r = fit_on(inp, np.flatnonzero(f == k), rounds)
        models.append(m)
        rows.append(r)
    info = {"folds": "sha256(dataset/request_id) mod 2", "n_requests": [int((f == k).sum()) for k in range(N_FOLDS)],
            "train_configs": {"cost_model": AUTHORS_H100_LLAMA8B.name, "batch_sizes": list(TRAIN_CONFIGS)},
            "rounds": rounds, "max_steps": MAX_STEPS, "seed": SEED, "held_out_mean_loglik": {}}
    for k in range(N_FOLDS):
        other = (k + 1) % N_FOLDS
        for d in ("ngram", "eagle3"):
            X, j, y = rows[other][d]
            info["held_out_mean_loglik"][f"fold{k}->fold{other}/{d}"] = mean_log_loss(models[k][d], X, j, y)
    return Predictor(models, f, info)


def save_predictor(pred: Predictor, path: str | Path, requests=None, producer: Optional[str] = None) -> Path:
    """JSON with the folds (request keys per fold), features, parameters and diagnostics; ``info.producer``:
    the command that wrote it (``sdlib simulate ... --save-predictor PATH``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # deferred: sdlib.store loads pandas, and only this path needs it
    from sdlib.store import git_commit, utc_now

    info = {**pred.info, "written_at": utc_now(), "git_commit": git_commit()}
    if producer:
        info["producer"] = producer
    obj = {"info": info,
           "models": [models_to_dict(m) for m in pred.models]}
    if requests is not None:
        obj["fold_of_request"] = {f"{d}/{r}": int(k) for (d, r), k in zip(requests, pred.fold)}
    if path.exists():  # the same fit again: keep the file (and its date), so a rerun leaves git clean
        try:
            if _same_fit(_unstamped(json.loads(path.read_text())), _unstamped(obj)):
                return path
        except (OSError, ValueError):
            pass
    path.write_text(json.dumps(obj, indent=1) + "\n")
    return path


#: Relative difference under which two fitted numbers are the same fit (a BLAS or summation-order change moves
#: the last digit; the online policies' run ids hash the committed file, so rewriting it for that would orphan
#: every committed online cell).
SAME_FIT_RTOL = 1e-9


def _same_fit(a, b) -> bool:
    """``a`` and ``b`` (JSON values) equal, numbers within :data:`SAME_FIT_RTOL` of each other."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_fit(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_fit(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=SAME_FIT_RTOL, abs_tol=1e-12))
    return a == b


def _unstamped(obj: dict) -> dict:
    """``obj`` as JSON would read it back, without when and at which commit it was written."""
    obj = json.loads(json.dumps(obj))
    for k in ("written_at", "git_commit"):
        obj.get("info", {}).pop(k, None)
    return obj


def load_predictor(path: str | Path, inp: PolicyInputs) -> Predictor:
    """A saved predictor, with the folds of ``inp``'s requests (the hash rule; saved folds must agree)."""
    obj = json.loads(Path(path).read_text())
    f = folds(inp)
    saved = obj.get("fold_of_request", {})
    for (d, r), k in zip(zip(inp.prep.dataset, inp.prep.request_id), f):
        if saved and f"{d}/{r}" in saved and saved[f"{d}/{r}"] != k:
            raise ValueError(f"{path}: request {d}/{r} is in fold {saved[f'{d}/{r}']} there, {k} here")
    return Predictor([models_from_dict(m) for m in obj["models"]], f, obj["info"])


def ensure_predictor(inp: PolicyInputs, refs, predictor: Optional[Predictor] = None) -> Optional[Predictor]:
    """The predictor the policies ``refs`` (:class:`sdlib.core.registry.PolicyRef`) need: ``predictor`` when
    given, else cross-fitted once on ``inp``'s requests; None when none of them needs one. The features are
    added to ``inp`` either way (the online policies read them)."""
    if not any("predictor" in r.spec.needs for r in refs):
        return predictor
    add_features(inp)
    return predictor if predictor is not None else crossfit(inp)
