"""Acceptance predictor: a discrete-time hazard model per drafter, logistic, fitted with numpy (IRLS).

For drafter ``d`` at a step with features ``x`` the probability that draft token ``j`` is accepted given
that tokens ``1..j-1`` were is ``h_d(j | x) = sigmoid(x.w + b[j] + (x.v) * log j)``; the expected tokens
gained by drafting ``l`` tokens are ``1 + sum_{j<=l} prod_{i<=j} h_d(i | x)``. The features are what an
engine knows before verifying (:data:`FEATURES`): the n-gram match (:mod:`sdlib.sim.policy.features`), the output
position, the prompt/output overlap so far, and this request's recent acceptance of each drafter
(``logit_ngram``, ``logit_eagle3``: pseudo-count estimates of the per-token acceptance, decayed per
observation; the n-gram's is observed every step by checking its proposal against the tokens the step
produced, EAGLE-3's only where it drafted).

Training rows come from teacher-forced traces at the steps a policy visited: for drafter ``d`` at position
``p`` with ``a = acc_d[p] - 1`` matching draft tokens, rows ``j = 1..a`` are accepted and row ``a+1`` (where
the draft could go on: below 20, and for the n-gram within its continuation) is rejected.

Usage:
    from sdlib.sim.policy.predictor import HazardModel, fit_hazard
    model = fit_hazard(X, depth, label)          # rows of one drafter
    eg = model.expected_gains(X_lanes, lmax=20)  # (lanes, 21): expected tokens gained for l = 0..20
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sdlib.sim.policy.features import STATIC_FEATURES

#: Per-request state the policy updates as it goes (sdlib.sim.policy.online.observe_acceptance).
DYNAMIC_FEATURES = ("logit_ngram", "logit_eagle3", "logit_ngram_slow", "logit_eagle3_slow", "last_full",
                    "log_last_gain", "logit_ngram_pool", "logit_eagle3_pool")
#: Feature names, in column order (column 0, the bias, is implicit): per-position, then per-request state.
FEATURES = STATIC_FEATURES + DYNAMIC_FEATURES
#: Deepest draft token modelled (the traces score 20 drafts).
DEPTH = 20
#: L2 penalty (per row) of the IRLS fit.
L2 = 1e-4


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))


@dataclass
class HazardModel:
    """``h(j | x) = sigmoid(x.w + b[j-1] + (x.v) * log j)``; ``w`` and ``v`` include a leading bias."""

    w: np.ndarray  # (F+1,)
    b: np.ndarray  # (DEPTH,)
    v: np.ndarray  # (F+1,)
    meta: dict = field(default_factory=dict)

    def logits(self, X: np.ndarray, depth: int = DEPTH) -> np.ndarray:
        """(n, depth) hazard logits for depths 1..depth; ``X``: (n, F) without the bias column."""
        Xb = np.column_stack([np.ones(len(X)), X])
        lj = np.log(np.arange(1, depth + 1, dtype=float))
        return (Xb @ self.w)[:, None] + self.b[None, :depth] + (Xb @ self.v)[:, None] * lj[None, :]

    def survival(self, X: np.ndarray, depth: int = DEPTH) -> np.ndarray:
        """(n, depth): P(first j draft tokens all accepted), j = 1..depth."""
        return np.cumprod(sigmoid(self.logits(X, depth)), axis=1)

    def expected_gains(self, X: np.ndarray, lmax: int = DEPTH) -> np.ndarray:
        """(n, lmax+1): expected tokens gained by drafting l = 0..lmax tokens."""
        s = self.survival(X, lmax)
        return np.concatenate([np.ones((len(X), 1)), 1.0 + np.cumsum(s, axis=1)], axis=1)

    def to_dict(self) -> dict:
        return {"w": self.w.tolist(), "b": self.b.tolist(), "v": self.v.tolist(), "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "HazardModel":
        return cls(np.asarray(d["w"], float), np.asarray(d["b"], float), np.asarray(d["v"], float), d.get("meta", {}))


def design(X: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Rows of the hazard regression: [1, x, onehot(j) (j >= 2), log j, x log j]."""
    n = len(X)
    lj = np.log(depth.astype(float))
    oh = np.zeros((n, DEPTH - 1))
    m = depth >= 2
    oh[np.flatnonzero(m), depth[m] - 2] = 1.0
    Xb = np.column_stack([np.ones(n), X])
    return np.column_stack([Xb, oh, Xb * lj[:, None]])


def irls(A: np.ndarray, y: np.ndarray, l2: float = L2, iters: int = 15, tol: float = 1e-6) -> np.ndarray:
    """L2-penalised logistic regression by Newton steps (IRLS); returns the coefficients."""
    n, k = A.shape
    beta = np.zeros(k)
    lam = l2 * n
    for _ in range(iters):
        p = sigmoid(A @ beta)
        W = p * (1 - p)
        H = A.T @ (A * W[:, None]) + lam * np.eye(k)
        g = A.T @ (y - p) - lam * beta
        step = np.linalg.solve(H, g)
        beta = beta + step
        if np.max(np.abs(step)) < tol:
            break
    return beta


def fit_hazard(X: np.ndarray, depth: np.ndarray, label: np.ndarray, l2: float = L2) -> HazardModel:
    """Fit :class:`HazardModel` to rows (features ``X`` (n, F), depth j >= 1, accepted 0/1)."""
    A = design(X, depth)
    beta = irls(A, label.astype(float), l2)
    F1 = X.shape[1] + 1
    w, oh, v = beta[:F1], beta[F1:F1 + DEPTH - 1], beta[F1 + DEPTH - 1:]
    b = np.concatenate([[0.0], oh])  # depth 1 carries no one-hot (its intercept is w[0])
    p = sigmoid(A @ beta)
    ll = float(np.mean(label * np.log(p + 1e-12) + (1 - label) * np.log(1 - p + 1e-12)))
    return HazardModel(w, b, v, {"rows": int(len(label)), "accept_rate": float(label.mean()), "mean_loglik": ll})


def hazard_rows(X: np.ndarray, acc: np.ndarray, cap: np.ndarray) -> tuple:
    """Training rows of one drafter: at each step (features ``X``), ``acc - 1`` accepted draft tokens out of a
    possible ``cap``; rows j = 1..min(acc-1, cap) accepted, and j = acc if acc - 1 < cap rejected."""
    a = np.minimum(acc - 1, cap)
    n_rows = a + (a < cap)
    idx = np.repeat(np.arange(len(a)), n_rows)
    start = np.repeat(np.cumsum(n_rows) - n_rows, n_rows)
    j = np.arange(idx.size) - start + 1
    label = (j <= a[idx]).astype(float)
    return X[idx], j, label


def mean_log_loss(model: HazardModel, X: np.ndarray, depth: np.ndarray, label: np.ndarray) -> float:
    """Mean log-likelihood of rows under ``model`` (held-out check)."""
    z = model.logits(X, DEPTH)[np.arange(len(depth)), depth - 1]
    p = sigmoid(z)
    return float(np.mean(label * np.log(p + 1e-12) + (1 - label) * np.log(1 - p + 1e-12)))
