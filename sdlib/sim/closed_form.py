"""Leviathan et al.'s closed form for speculative decoding with i.i.d. acceptance, and the acceptance rate alpha from traces.

``speedup = (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))``: alpha = per-token acceptance
rate, k = draft length, c = drafting time per drafted token / target forward time.

Usage:
    from sdlib.sim.closed_form import leviathan_speedup, alpha_from_acc_len
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from sdlib.extract.ngram import TRACE_MAX_K
from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B, CostModel
from sdlib.sim.prepared import PreparedTraces


def leviathan_speedup(alpha, k, c):
    """Leviathan et al. (2023) expected walltime improvement ``(1-alpha**(k+1)) / ((1-alpha)*(k*c+1))``.

    ``alpha``: per-token acceptance rate (i.i.d.), ``k``: tokens proposed per step,
    ``c``: drafting time per drafted token / target forward time. Vectorised; the
    ``alpha -> 1`` limit is ``(k+1)/(k*c+1)``.
    """
    alpha, k, c = np.broadcast_arrays(np.asarray(alpha, float), np.asarray(k, float), np.asarray(c, float))
    one = np.isclose(alpha, 1.0)
    safe = np.where(one, 0.5, alpha)
    tokens = np.where(one, k + 1, (1 - safe ** (k + 1)) / (1 - safe))
    out = tokens / (k * c + 1)
    return out if out.ndim else float(out)


def expected_tokens_per_step(alpha, k):
    """``(1-alpha**(k+1))/(1-alpha)``: mean tokens gained per step (accepted + 1) at i.i.d. acceptance ``alpha``."""
    return leviathan_speedup(alpha, k, 0.0)


def alpha_from_mean_acceptance(mean_acc_len, k, tol: float = 1e-10):
    """Invert :func:`expected_tokens_per_step`: ``alpha`` whose mean acceptance length at ``k`` is ``mean_acc_len``.

    ``mean_acc_len`` in [1, k+1] (tokens per step incl. the bonus token); bisection, vectorised.
    """
    m = np.asarray(mean_acc_len, float)
    k = np.asarray(k, float)
    if np.any((m < 1) | (m > k + 1)):
        raise ValueError("mean acceptance length must lie in [1, k+1]")
    lo, hi = np.zeros(np.broadcast(m, k).shape), np.ones(np.broadcast(m, k).shape)
    for _ in range(200):
        mid = (lo + hi) / 2
        f = expected_tokens_per_step(mid, k) < m
        lo, hi = np.where(f, mid, lo), np.where(f, hi, mid)
        if np.all(hi - lo < tol):
            break
    out = (lo + hi) / 2
    return out if out.ndim else float(out)


def alpha_from_acc_len(acc_lens: Iterable[Sequence[int]], k_max: int = TRACE_MAX_K, skip_prefill: bool = True) -> float:
    """Maximum-likelihood i.i.d. ``alpha`` from teacher-forced ``acc_len`` lists (truncated geometric).

    Each position with ``a = acc_len - 1`` accepted out of ``k_max`` drafted is ``a``
    successes plus one failure unless ``a == k_max``; ``alpha = S / (S + F)``.
    Entry 0 (the prefill) is skipped by default.
    """
    arr = np.concatenate([np.asarray(x[1:] if skip_prefill else x, dtype=np.int64) for x in acc_lens])
    a = arr - 1
    s = a.sum()
    f = np.sum(a < k_max)
    return float(s / (s + f)) if s + f else float("nan")


def alpha_from_per_position(accepted_per_pos: Sequence[float], num_drafts: float) -> float:
    """MLE ``alpha`` from vLLM's counters: ``accepted_per_pos[i]`` = drafts whose position ``i`` was accepted.

    Position ``i`` is tried ``accepted_per_pos[i-1]`` times (``num_drafts`` for i=0):
    ``alpha = sum(accepted) / (num_drafts + sum(accepted[:-1]))``.
    """
    a = np.asarray(accepted_per_pos, float)
    trials = num_drafts + a[:-1].sum()
    return float(a.sum() / trials) if trials > 0 else float("nan")


def leviathan_table(prep: PreparedTraces, cm: CostModel = AUTHORS_H100_LLAMA8B, ks: Iterable[int] = range(1, 11),
                    batch_size: int = 1, methods: Sequence[str] = ("eagle3", "ngram")) -> pd.DataFrame:
    """Leviathan's closed form per (dataset, method, k): ``alpha`` from the traces, ``c`` from the cost model.

    ``alpha``: :func:`alpha_from_acc_len` over all positions after the prefill;
    ``c``: :meth:`CostModel.draft_cost_ratio` at ``batch_size`` with the dataset's
    mean context (prompt + half the output). Columns: dataset, method, alpha,
    mean_acc_len_k20, k, c, speedup.
    """
    rows = []
    for ds in dict.fromkeys(prep.dataset):
        idx = np.flatnonzero(prep.dataset == ds)
        kv = float(np.mean(prep.prompt_len[idx] + prep.output_len[idx] / 2))
        for meth in methods:
            lists = [prep.acc[meth][i] for i in idx]
            alpha = alpha_from_acc_len(lists)
            mean_acc = float(np.mean(np.concatenate([x[1:] for x in lists])))
            for k in ks:
                c = cm.draft_cost_ratio(meth, int(k), kv=kv, batch_size=batch_size)
                rows.append({"dataset": ds, "method": meth, "alpha": alpha, "mean_acc_len_k20": mean_acc,
                             "k": int(k), "c": c, "speedup": leviathan_speedup(alpha, k, c)})
    return pd.DataFrame(rows)


def per_position_rates(prep: PreparedTraces, method: str, k: int) -> list[float]:
    """vLLM's ``synthetic_acceptance_rates`` that reproduce the traces on average: for each draft position
    ``i = 1..k``, the share of verify steps (output position >= 1) that accept at least ``i`` drafts
    (non-increasing, as vLLM requires). For ``ngram``, only steps where the look-up proposes count."""
    parts = []
    for i, a in enumerate(prep.acc[method]):
        a = np.asarray(a[1:])
        if method == "ngram" and prep.ngram_avail is not None:
            av = np.asarray(prep.ngram_avail[i][1:])
            n = min(a.size, av.size)
            a = a[:n][av[:n] > 0]
        parts.append(a)
    acc = np.concatenate(parts) if parts else np.zeros(0)
    if acc.size == 0:
        raise ValueError(f"no {method} steps in these traces")
    return [float(np.mean(acc - 1 >= i)) for i in range(1, k + 1)]
