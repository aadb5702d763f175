"""Trace-driven speculative-decoding simulator (fixed k, Oracle Proposal, Oracle Combine) and Leviathan's bound.

A reimplementation, vectorised with numpy, of the authors' simulator
(SpecDecode-Bench/simulator commit 2fdccbd, ``simulator.py``), driven by long-form
acceptance traces (:mod:`sdlib.sim.traces`) and a :class:`~sdlib.sim.costmodel.CostModel`.

Model (the authors' definitions):

* a batch of ``B`` = ``B`` copies of one request; every copy advances by the same
  gain each step. After the prefill (``T(0, B*P)`` + overhead) a request holds 1
  output token; a decode step that starts with ``c`` output tokens costs
  ``draft + T(kv=B*(P+c), n=B*n_i) + overhead`` where ``n_i`` = tokens proposed + 1;
* predict methods: ``FIXED_k`` proposes ``k`` and gains ``min(acc, k+1)``;
  ``ORACLE`` (Oracle Proposal) proposes exactly ``acc - 1`` and gains ``acc``; ``ORACLE_K`` the same
  with at most ``K`` proposed (an engine's ``num_speculative_tokens``);
* proposers: ``eagle3``, ``ngram``, ``combined`` (Oracle Combine: per step the
  larger of the two methods' ``acc``);
* the request ends once it holds ``L`` output tokens (the last step may overshoot);
  throughput = ``B*L / time``; the no-SD baseline is the same cost model with one
  token per copy per step (``L - 1`` decode steps); speedup = mean throughput with
  SD / mean throughput without, over the requests (a ratio of means, B cancels).

Conventions (:data:`CONVENTIONS`), i.e. which of the authors' quirks to follow:

========================  =================================  ==================================
                          ``authors`` (their code)           ``corrected`` (ours)
========================  =================================  ==================================
acc look-up at ``c``      ``acc[c-1]`` (first decode step    ``acc[c]`` (``acc[p]`` is the step
                          reads the prefill entry, always 1) starting with ``p`` output tokens;
                                                             checked: re-running the n-gram
                                                             lookup on the token ids gives
                                                             ``acc_ngram[p]`` exactly)
Combine drafting price    n-gram's (``ngram_frac*T``) even   EAGLE + n-gram: both drafters run
                          when EAGLE wins                    every step, since which one wins is
                                                             not known before verifying
Combine output length     shorter of the two lists           the request's output length
                                                             (``len(output_token_ids)``); max of
                                                             the two only where both lists
                                                             cover the position, n-gram beyond
n-gram FIXED_k, acc 1     no match with prob.                re-run the n-gram lookup (min 3,
                          ``1 - AUTHORS_NGRAM_MATCH_PROB``   max 7) on prompt + output: no
                          (their random rule, taken here in  match -> propose nothing
                          expectation): propose nothing,
                          no drafting cost
n-gram drafting when      free                               charged (the lookup runs anyway)
nothing is proposed
========================  =================================  ==================================

``combined`` with ``FIXED_k`` = oracle choice of the method, ``k`` proposed (their code
allows it; their ``main.py`` only runs ``combined`` with ``ORACLE``). The authors'
method-switching overhead is 0 and is not modelled. ``sample="authors"`` takes
their 300-request subset per dataset (``random.seed(42); random.sample(data, 300)``).

Checked against their code run unchanged (``tests/test_oracle.py``): with
``convention="authors"`` and ``sample="authors"`` the speedups agree to 1e-9 relative,
except EAGLE-3 at bs > 1 (their loop over the copies bumps the KV count copy by copy
inside a step, so later copies' EAGLE drafting sees slightly more KV; ~1e-5 relative,
not modelled) and n-gram ``FIXED_k`` (their random rule vs its expectation; ~1e-4).

Usage:
    from sdlib.sim.traces import load_reference_traces
    from sdlib.sim.oracle import simulate
    table = simulate(load_reference_traces(), batch_sizes=[1, 128], sample="authors")
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.extract.ngram import ngram_lookup_lengths
from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B, CostModel

PROPOSERS = ("eagle3", "ngram", "combined")
PREDICT_METHODS = ("FIXED_1", "FIXED_3", "FIXED_5", "ORACLE")
BATCH_SIZES = (1, 8, 16, 32, 64, 128)
#: columns of the speedup table (figures/05_oracle_bounds.csv)
TABLE_COLUMNS = ["dataset", "proposer", "predict_method", "batch_size", "convention", "cost_model", "speedup"]
#: the authors' "n-gram matched" probability for steps whose acc is 1
#: (simulator.py NGRAM_MATCHING_PROBABILITY, keyed by our dataset names); others: 0.2
AUTHORS_NGRAM_MATCH_PROB = {"sharegpt": 0.2, "cnn_dailymail": 0.4, "gsm8k": 0.2, "instructcoder": 0.8}
AUTHORS_SAMPLE_SIZE = 300
AUTHORS_SEED = 42


@dataclass(frozen=True)
class Convention:
    """Which of the authors' simulator quirks to follow (see the module docstring)."""

    name: str
    index_shift: bool  # a step starting with c output tokens reads acc[c-1] (authors) instead of acc[c]
    combine_draft: str  # drafting charged to Combine: "ngram" (authors), "winner", "both"
    combine_length: str  # Combine's output length: "shorter" (min of the lists) or "output"
    ngram_match: str  # n-gram FIXED_k steps with acc 1: "authors" (their random rule, in expectation), "tokens", "always"
    ngram_idle_draft: bool  # charge n-gram drafting on steps that propose nothing


CONVENTIONS = {
    "authors": Convention("authors", index_shift=True, combine_draft="ngram", combine_length="shorter",
                          ngram_match="authors", ngram_idle_draft=False),
    "corrected": Convention("corrected", index_shift=False, combine_draft="both", combine_length="output",
                            ngram_match="tokens", ngram_idle_draft=True),
}


def get_convention(c: str | Convention) -> Convention:
    return c if isinstance(c, Convention) else CONVENTIONS[c]


def parse_predict_method(pm: str) -> Optional[int]:
    """``FIXED_k`` -> k; ``ORACLE`` and ``ORACLE_K`` -> None (see :func:`oracle_cap`)."""
    if pm == "ORACLE" or re.fullmatch(r"ORACLE_[1-9]\d*", pm):
        return None
    m = re.fullmatch(r"FIXED_(\d+)", pm)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"predict method {pm!r}: want FIXED_<k>, ORACLE or ORACLE_<K> (k, K >= 1)")
    return int(m.group(1))


def oracle_cap(pm: str) -> Optional[int]:
    """``ORACLE_K`` -> K: Oracle Proposal with at most K drafts per step (an engine's num_speculative_tokens);
    ``ORACLE`` and ``FIXED_k`` -> None. The traces cap every step at 20 drafts anyway."""
    m = re.fullmatch(r"ORACLE_([1-9]\d*)", pm)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- prepared traces
@dataclass
class PreparedTraces:
    """One entry per request (both methods), arrays ready for the simulator."""

    dataset: np.ndarray  # (R,) object
    request_id: np.ndarray  # (R,) object
    prompt_len: np.ndarray  # (R,) int64
    output_len: np.ndarray  # (R,) int64, len(output_token_ids)
    acc: dict  # method -> list of int64 arrays (acc_len per output position)
    ngram_avail: Optional[list]  # per request, ngram_lookup_lengths (None if not computed)
    prompt_token_ids: Optional[list] = None
    output_token_ids: Optional[list] = None
    _flat: dict = field(default_factory=dict, repr=False, compare=False)  # cache: key -> (flat, offsets, lens)

    def flat(self, key: str):
        """(flat values, offsets, lengths) of ``acc[key]`` or of ``ngram_avail`` (key ``"avail"``), cached."""
        if key not in self._flat:
            arrs = self.ngram_avail if key == "avail" else self.acc[key]
            if arrs is None:
                raise ValueError("needs the n-gram lookup: prepare_traces(..., ngram_lookup=True)")
            lens = np.array([len(a) for a in arrs], dtype=np.int64)
            self._flat[key] = (*_flat(arrs, lens), lens)
        return self._flat[key]

    def __len__(self) -> int:
        return len(self.dataset)

    def take(self, idx: Sequence[int]) -> "PreparedTraces":
        idx = list(idx)
        pick = lambda xs: None if xs is None else [xs[i] for i in idx]  # noqa: E731
        return PreparedTraces(self.dataset[idx], self.request_id[idx], self.prompt_len[idx], self.output_len[idx],
                              {m: pick(v) for m, v in self.acc.items()}, pick(self.ngram_avail),
                              pick(self.prompt_token_ids), pick(self.output_token_ids))


def prepare_traces(traces: pd.DataFrame, ngram_lookup: bool = True, keep_tokens: bool = False) -> PreparedTraces:
    """Long-form traces (one row per request and method) -> :class:`PreparedTraces`.

    Requests must have both ``ngram`` and ``eagle3`` rows. ``ngram_lookup``
    re-runs the n-gram lookup on the token ids (needed by the ``corrected``
    convention for n-gram with fixed k; ~1 s for the reference traces).
    """
    need = {"ngram", "eagle3"}
    wide = {}
    order = []
    for row in traces.itertuples(index=False):
        key = (row.dataset, str(row.request_id))
        if key not in wide:
            wide[key] = {"prompt": row.prompt_token_ids, "output": row.output_token_ids}
            order.append(key)
        wide[key][row.method] = np.asarray(row.acc_len, dtype=np.int64)
    missing = [k for k in order if not need <= set(wide[k])]
    if missing:
        raise ValueError(f"{len(missing)} requests lack one of {sorted(need)}, e.g. {missing[0]}")
    ds = np.array([k[0] for k in order], dtype=object)
    rid = np.array([k[1] for k in order], dtype=object)
    P = np.array([len(wide[k]["prompt"]) for k in order], dtype=np.int64)
    O = np.array([len(wide[k]["output"]) for k in order], dtype=np.int64)
    acc = {m: [wide[k][m] for k in order] for m in sorted(need)}
    avail = [ngram_lookup_lengths(wide[k]["prompt"], wide[k]["output"]) for k in order] if ngram_lookup else None
    toks = ([list(wide[k]["prompt"]) for k in order], [list(wide[k]["output"]) for k in order]) if keep_tokens \
        else (None, None)
    return PreparedTraces(ds, rid, P, O, acc, avail, *toks)


def authors_sample_indices(n: int, k: int = AUTHORS_SAMPLE_SIZE, seed: int = AUTHORS_SEED) -> list[int]:
    """The indices ``random.seed(seed); random.sample(data, k)`` picks from ``n`` rows (all if ``n <= k``)."""
    if n <= k:
        return list(range(n))
    rng = random.Random(seed)
    return rng.sample(range(n), k)


def select_requests(prep: PreparedTraces, sample: Optional[str | int] = None,
                    datasets: Optional[Iterable[str]] = None) -> PreparedTraces:
    """Restrict to ``datasets`` and a per-dataset sample: None (all), ``"authors"`` (their 300 of each), or an int."""
    idx = []
    names = list(dict.fromkeys(prep.dataset)) if datasets is None else list(datasets)
    for d in names:
        rows = np.flatnonzero(prep.dataset == d)
        if sample is None:
            pick = range(len(rows))
        elif sample == "authors":
            pick = authors_sample_indices(len(rows))
        else:
            pick = authors_sample_indices(len(rows), int(sample))
        idx.extend(rows[list(pick)].tolist())
    return prep.take(idx)


# --------------------------------------------------------------------------- step records
@dataclass
class StepRecords:
    """Decode steps of every request for one (proposer, predict method, convention); weights for expectations."""

    req: np.ndarray  # request index
    pos: np.ndarray  # output tokens held when the step starts (c)
    n_i: np.ndarray  # tokens per copy fed to the target (proposed + 1)
    eagle: np.ndarray  # charge EAGLE drafting (0/1)
    ngram: np.ndarray  # charge n-gram drafting (0/1)
    weight: np.ndarray  # probability weight (1 unless a step is split into alternatives)
    gain: np.ndarray  # tokens gained
    output_len: np.ndarray  # (R,) L used for this configuration
    num_steps: np.ndarray  # (R,) decode steps


def _flat(arrs: list, lens: np.ndarray):
    off = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    flat = np.concatenate([a[:n] for a, n in zip(arrs, lens)]) if len(arrs) else np.zeros(0, np.int64)
    return flat.astype(np.int64), off


def _lookup(prep: "PreparedTraces", key: str, req: np.ndarray, src: np.ndarray, default: int) -> tuple:
    """``values[req][src]`` of ``prep.flat(key)`` where ``0 <= src < len``, else ``default``; also the validity mask."""
    flat, off, lens = prep.flat(key)
    ok = (src >= 0) & (src < lens[req])
    out = np.full(src.shape, default, dtype=np.int64)
    out[ok] = flat[off[req[ok]] + src[ok]]
    return out, ok


def _walk(gain: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Visit ``start, start+gain[start], ...`` while ``< end`` for every request at once; visited mask."""
    visited = np.zeros(gain.size, dtype=bool)
    m = start < end
    cur, e = start[m], end[m]
    while cur.size:
        visited[cur] = True
        cur = cur + gain[cur]
        m = cur < e
        if not m.all():
            cur, e = cur[m], e[m]
    return visited


def step_records(prep: PreparedTraces, proposer: str, predict_method: str,
                 convention: str | Convention = "corrected") -> StepRecords:
    """The decode steps of every request in ``prep`` (independent of batch size and cost model)."""
    conv = get_convention(convention)
    k = parse_predict_method(predict_method)
    cap = oracle_cap(predict_method)
    if proposer not in PROPOSERS:
        raise ValueError(f"proposer {proposer!r} not in {PROPOSERS}")
    R = len(prep)
    ln = np.array([len(a) for a in prep.acc["ngram"]], dtype=np.int64)
    le = np.array([len(a) for a in prep.acc["eagle3"]], dtype=np.int64)
    if proposer == "ngram":
        L = ln
    elif proposer == "eagle3":
        L = le
    else:
        L = np.minimum(ln, le) if conv.combine_length == "shorter" else prep.output_len.astype(np.int64)
    # flat position grid p = 0..L-1 per request
    off = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(L, out=off[1:])
    req = np.repeat(np.arange(R), L)
    p = np.arange(off[-1], dtype=np.int64) - off[req]
    src = p - 1 if conv.index_shift else p
    a_ng, ok_ng = _lookup(prep, "ngram", req, src, 1)
    a_eg, ok_eg = _lookup(prep, "eagle3", req, src, 1)
    if proposer == "ngram":
        a = a_ng
    elif proposer == "eagle3":
        a = a_eg
    else:  # max where both lists cover the position, else whichever covers it
        a = np.where(ok_ng & ok_eg, np.maximum(a_ng, a_eg), np.where(ok_ng, a_ng, a_eg))
    a = np.maximum(a, 1)

    if k is None:
        n_i = a.copy() if cap is None else np.minimum(a, cap + 1)
    else:
        n_i = np.full(a.shape, k + 1, dtype=np.int64)
        if proposer == "ngram" and conv.ngram_match == "tokens":
            av, _ = _lookup(prep, "avail", req, src, 0)
            n_i = np.minimum(k, av) + 1
    gain = np.minimum(a, n_i)

    visited = _walk(gain, off[:-1] + 1, off[1:])
    idx = np.flatnonzero(visited)
    r, c, ni, g, av_ = req[idx], p[idx], n_i[idx], gain[idx], a[idx]
    ones = np.ones(idx.size)
    w = ones
    if proposer == "eagle3":
        eagle, ngram = ones, np.zeros(idx.size)
    elif proposer == "ngram":
        eagle = np.zeros(idx.size)
        ngram = ones if conv.ngram_idle_draft else (ni > 1).astype(float)
        if k is not None and conv.ngram_match == "authors":
            # their rule: a step with acc 1 finds no n-gram with prob q -> propose nothing, draft free.
            q = 1.0 - np.array([AUTHORS_NGRAM_MATCH_PROB.get(d, 0.2) for d in prep.dataset])[r]
            split = av_ == 1
            s = np.flatnonzero(split)
            r = np.concatenate([r, r[s]])
            c = np.concatenate([c, c[s]])
            g = np.concatenate([g, g[s]])
            w = np.concatenate([np.where(split, 1.0 - q, 1.0), q[s]])
            ni = np.concatenate([ni, np.ones(s.size, dtype=np.int64)])
            eagle = np.zeros(r.size)
            ngram = np.concatenate([ngram, np.full(s.size, 1.0 if conv.ngram_idle_draft else 0.0)])
    else:
        if conv.combine_draft == "ngram":
            eagle, ngram = np.zeros(idx.size), ones
        elif conv.combine_draft == "both":
            eagle, ngram = ones, ones
        elif conv.combine_draft == "winner":  # ties go to n-gram, as in their _get_winning_method
            ew = (a_eg[idx] > a_ng[idx]) & ok_eg[idx]
            eagle, ngram = ew.astype(float), (~ew).astype(float)
        else:
            raise ValueError(f"combine_draft {conv.combine_draft!r}")
    num_steps = np.bincount(req[idx], minlength=R)
    return StepRecords(r, c, ni, eagle, ngram, w, g, L, num_steps)


# --------------------------------------------------------------------------- times
def sd_times(prep: PreparedTraces, rec: StepRecords, cm: CostModel, batch_size: int) -> np.ndarray:
    """Per-request wall time with SD at ``batch_size`` copies, s (prefill included)."""
    B = float(batch_size)
    kv = B * (prep.prompt_len[rec.req] + rec.pos)
    v = cm.verify_time(kv, B * rec.n_i)
    t = v + cm.overhead_s
    if rec.eagle.any():
        t = t + rec.eagle * cm.draft_time("eagle3", kv, rec.n_i)
    if rec.ngram.any():
        t = t + rec.ngram * cm.draft_time("ngram", kv, rec.n_i, verify_s=v)
    total = np.bincount(rec.req, weights=rec.weight * t, minlength=len(prep))
    return total + cm.prefill_time(B * prep.prompt_len) + cm.overhead_s


def baseline_times(prep: PreparedTraces, output_len: np.ndarray, cm: CostModel, batch_size: int) -> np.ndarray:
    """Per-request wall time without SD (prefill + ``L-1`` one-token decode steps per copy), s."""
    B = float(batch_size)
    steps = np.maximum(output_len - 1, 0)
    req = np.repeat(np.arange(len(prep)), steps)
    off = np.zeros(len(prep) + 1, dtype=np.int64)
    np.cumsum(steps, out=off[1:])
    c = np.arange(off[-1]) - off[req] + 1
    t = cm.verify_time(B * (prep.prompt_len[req] + c), B) + cm.overhead_s
    total = np.bincount(req, weights=t, minlength=len(prep))
    return total + cm.prefill_time(B * prep.prompt_len) + cm.overhead_s


def simulate_requests(traces: pd.DataFrame | PreparedTraces,
                      cost_models: Sequence[CostModel] = (AUTHORS_H100_LLAMA8B,),
                      batch_sizes: Sequence[int] = BATCH_SIZES, proposers: Sequence[str] = PROPOSERS,
                      predict_methods: Sequence[str] = PREDICT_METHODS,
                      conventions: Sequence[str | Convention] = ("authors", "corrected"),
                      sample: Optional[str | int] = None) -> pd.DataFrame:
    """One row per (request, proposer, predict method, convention, cost model, batch size).

    Columns: dataset, request_id, proposer, predict_method, convention, cost_model,
    batch_size, output_len, num_steps, mean_acc_len (tokens per decode step),
    sd_time_s, base_time_s, sd_tok_per_s, base_tok_per_s (per batch: B*L/time).
    """
    if isinstance(cost_models, CostModel):
        cost_models = [cost_models]
    prep = traces if isinstance(traces, PreparedTraces) else prepare_traces(traces)
    if sample is not None:
        prep = select_requests(prep, sample)
    frames = []
    base_cache: dict = {}
    for conv in map(get_convention, conventions):
        for prop in proposers:
            for pm in predict_methods:
                rec = step_records(prep, prop, pm, conv)
                L = rec.output_len
                gained = np.maximum(L - 1, 0)
                for cm in cost_models:
                    for B in batch_sizes:
                        key = (cm.name, B, L.tobytes())
                        if key not in base_cache:
                            base_cache[key] = baseline_times(prep, L, cm, B)
                        tb = base_cache[key]
                        ts = sd_times(prep, rec, cm, B)
                        frames.append(pd.DataFrame({
                            "dataset": prep.dataset, "request_id": prep.request_id, "proposer": prop,
                            "predict_method": pm, "convention": conv.name, "cost_model": cm.name,
                            "batch_size": int(B), "output_len": L, "num_steps": rec.num_steps,
                            "mean_acc_len": np.divide(gained, rec.num_steps, out=np.full(len(L), np.nan),
                                                      where=rec.num_steps > 0),
                            "sd_time_s": ts, "base_time_s": tb,
                            "sd_tok_per_s": B * L / ts, "base_tok_per_s": B * L / tb}))
    return pd.concat(frames, ignore_index=True)


def speedup_table(per_request: pd.DataFrame) -> pd.DataFrame:
    """Aggregate :func:`simulate_requests`: speedup = mean SD throughput / mean no-SD throughput per cell.

    Columns :data:`TABLE_COLUMNS` + num_requests, sd_tok_per_s, base_tok_per_s (means).
    """
    keys = [c for c in TABLE_COLUMNS if c != "speedup"]
    g = per_request.groupby(keys, sort=False)
    out = g.agg(num_requests=("request_id", "size"), sd_tok_per_s=("sd_tok_per_s", "mean"),
                base_tok_per_s=("base_tok_per_s", "mean")).reset_index()
    out["speedup"] = out["sd_tok_per_s"] / out["base_tok_per_s"]
    return out[TABLE_COLUMNS + ["num_requests", "sd_tok_per_s", "base_tok_per_s"]]


def simulate(traces: pd.DataFrame | PreparedTraces, **kw) -> pd.DataFrame:
    """:func:`simulate_requests` then :func:`speedup_table` (same keyword arguments)."""
    return speedup_table(simulate_requests(traces, **kw))


