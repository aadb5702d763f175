"""vLLM 0.34's adaptive verification on the H200: the step-time A/B of ``gpu/adaptive_ab_034.py`` and the cost
table the engine profiled at start-up, read from a session record (``data/gpu/<session>.json``, key
``adaptive_ab``).

The A/B's three arms gain the same 3 tokens per row and step (2 drafted, both accepted, + the bonus token), so
their step times differ only in what is verified: ``k5n2-fixed`` verifies 1 + 5 tokens per row (3 padded
slots), ``k2n2-fixed`` 1 + 2 (no padding), ``k5n2-adaptive`` is K = 5 with ``enable_adaptive_verification``
(it may drop the padded slots: sdlib's speculator gives them confidence 0). Each arm is one engine start with a
few timed ``generate`` calls, so an interval here holds call-to-call variation only, not engine-start drift.

With 3 calls an arm a percentile bootstrap is the min and max of a handful of values; the interval of a ratio
of mean step times is therefore Welch's t on the log scale (delta method: ``se^2 = s_a^2 / (n_a m_a^2) +
s_b^2 / (n_b m_b^2)``, Welch-Satterthwaite degrees of freedom), which widens honestly with few calls.

Usage:
    from sdlib.analysis.adaptive_ab import ab_calls, ab_ratios, cost_table
    rec = read_ab_record("data/gpu/h200_v034_2026-12-04d.json")
    calls, ratios, table = ab_calls(rec), ab_ratios(ab_calls(rec)), cost_table(rec)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from sdlib.core.bootstrap import LEVEL, t_quantile
from sdlib.paths import resolve

#: the comparisons (arm, reference): trimmed-by-adaptive against no padding, against untrimmed padding, and
#: the price of the padding itself
PAIRS = (("k5n2-adaptive", "k2n2-fixed"), ("k5n2-adaptive", "k5n2-fixed"), ("k5n2-fixed", "k2n2-fixed"))
CALL_COLUMNS = ["arm", "k", "drafted", "adaptive", "bs", "rep", "step_ms", "tokens_per_row_step",
                "engine_start_s"]


def read_ab_record(path: str | Path) -> dict:
    """The ``adaptive_ab`` part of a session record (or the A/B's own JSON, which is that part)."""
    d = json.loads(resolve(str(path)).read_text())
    ab = d.get("adaptive_ab", d)
    if "arms" not in ab:
        raise ValueError(f"{path}: no adaptive-verification A/B in it (no 'arms')")
    return {**ab, "record": str(path)}


def ab_calls(rec: dict) -> pd.DataFrame:
    """One row per timed call of every arm that ran (:data:`CALL_COLUMNS`)."""
    rows = [{"arm": a["arm"], "k": int(a["k"]), "drafted": int(a["drafted"]), "adaptive": bool(a["adaptive"]),
             "bs": int(r["bs"]), "rep": int(r.get("rep", i)), "step_ms": float(r["step_ms"]),
             "tokens_per_row_step": float(r["tokens_per_row_step"]),
             "engine_start_s": float(a.get("engine_start_s", np.nan))}
            for a in rec["arms"] if a.get("ok") for i, r in enumerate(a.get("rows", [])) if r.get("step_ms")]
    return pd.DataFrame(rows, columns=CALL_COLUMNS)


def log_ratio_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean(a) / mean(b), lo, hi)``: Welch's t interval on the log of the ratio of means (independent
    samples); NaN bounds with fewer than 2 values in either sample."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ma, mb = a.mean(), b.mean()
    r = float(ma / mb)
    if len(a) < 2 or len(b) < 2:
        return r, float("nan"), float("nan")
    va, vb = a.var(ddof=1) / (len(a) * ma ** 2), b.var(ddof=1) / (len(b) * mb ** 2)
    se = np.sqrt(va + vb)
    if se == 0:
        return r, r, r
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(1 - (1 - level) / 2, df) * se
    return r, float(r * np.exp(-half)), float(r * np.exp(half))


def ab_ratios(calls: pd.DataFrame, pairs: Sequence[tuple[str, str]] = PAIRS, level: float = LEVEL) -> pd.DataFrame:
    """Per pair and batch size: the mean step times, their ratio with :func:`log_ratio_interval`, the calls
    behind each arm and ``established`` (the interval excludes 1)."""
    out = []
    for a, b in pairs:
        for bs in sorted(set(calls.loc[calls.arm == a, "bs"]) & set(calls.loc[calls.arm == b, "bs"])):
            xa = calls.loc[(calls.arm == a) & (calls.bs == bs), "step_ms"].to_numpy()
            xb = calls.loc[(calls.arm == b) & (calls.bs == bs), "step_ms"].to_numpy()
            r, lo, hi = log_ratio_interval(xa, xb, level)
            out.append({"arm": a, "reference": b, "bs": bs, "step_ms_arm": xa.mean(), "step_ms_reference": xb.mean(),
                        "ratio": r, "ratio_lo": lo, "ratio_hi": hi, "n_arm": len(xa), "n_reference": len(xb),
                        "established": bool(lo > 1 or hi < 1)})
    return pd.DataFrame(out)


def cost_table(rec: dict) -> pd.DataFrame:
    """The adaptive engine's start-up cost table: verify ms by tokens verified in a step (``what`` = verify)
    and draft ms by requests (``what`` = draft), with its CUDA-graph token limit (``graph_limit``)."""
    arm = next((a for a in rec["arms"] if a.get("cost_tables")), None)
    if arm is None:
        return pd.DataFrame(columns=["what", "n", "ms", "graph_limit"])
    ct = arm["cost_tables"]
    rows = [{"what": "verify", "n": int(n), "ms": float(ms)} for n, ms in ct.get("verify_ms_by_tokens", [])]
    rows += [{"what": "draft", "n": int(n), "ms": float(ms)} for n, ms in ct.get("draft_ms_by_reqs", [])]
    t = pd.DataFrame(rows)
    t["graph_limit"] = ct.get("cudagraph_limit")
    return t


def verify_tokens(calls: pd.DataFrame) -> pd.DataFrame:
    """Per arm and batch size, the tokens a step verifies untrimmed (bs x (1 + K)) and with only the drafted
    slots (bs x (1 + drafted)): where the A/B's steps sit on the cost table."""
    g = calls.groupby(["arm", "bs"], as_index=False).first()
    return g.assign(tokens_untrimmed=g.bs * (1 + g.k), tokens_drafted=g.bs * (1 + g.drafted))[
        ["arm", "bs", "k", "drafted", "adaptive", "tokens_untrimmed", "tokens_drafted"]]


def ab_title(rec: dict, what: str = "") -> str:
    """What produced the A/B: the record, vLLM version, device, the target and what the arms draft."""
    s = rec.get("settings", {})
    line = (f"{Path(rec['record']).name}: llama-3.1-8b shape (dummy weights, pinned target), sdlib's proposer drafting "
            f"2 accepted tokens a step padded to K with rejected ones;\n{rec.get('device', '?')}, vLLM {rec.get('vllm', '?')}; "
            f"{s.get('reps', '?')} timed calls of {s.get('max_tokens', '?')} tokens per arm, one engine start per arm")
    return f"{what}\n{line}" if what else line
