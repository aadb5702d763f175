"""Teacher-forced acceptance traces from OUR models, in the simulator's format (:mod:`sdlib.traces`).

A trace row is one (request, method): the greedy output of the target and
``acc_len[p]`` = tokens a verify step starting at output position ``p`` would
gain (accepted + 1), teacher-forced along that output; ``acc_len[0] = 1`` (the
prefill). Every entry is capped by ``k + 1`` and by the tokens left,
``len(output) - p`` (the output says nothing beyond its end; the authors' n-gram
lists follow the same cap but for a few entries, their EAGLE lists do not).

How each part is made:

1. **Greedy outputs**: the target without SD through vLLM at temperature 0, all
   prompts in one ``llm.generate`` (:func:`greedy_outputs`); or taken from a
   sweep's ``requests`` table, ``method == "none"`` at batch size 1
   (:func:`greedy_from_sweep`).
2. **n-gram, offline and exact** (:func:`ngram_trace`): vLLM 0.32's
   ``NgramProposer`` (``_find_longest_matched_ngram_and_propose_tokens``, read in
   the installed source) looks, in context = prompt + output[:p], for the
   *longest* suffix n-gram with ``prompt_lookup_min <= n <= prompt_lookup_max``
   that occurs earlier (occurrences may overlap the suffix), takes its *earliest*
   occurrence, and proposes the ``min(k, tokens after it, max_model_len - len(context))``
   tokens that follow it. ``acc_len[p] = 1 + ``(leading proposed tokens equal to
   ``output[p:]``). The lookup reuses :func:`sdlib.oracle.ngram_lookup_lengths`
   (hashing; each hit is re-checked token by token, with a brute-force fallback
   :func:`ngram_propose`). Tests compare it with vLLM's own function on random
   sequences and with vLLM's reported per-step acceptance in real n-gram runs
   (:func:`ngram_replay` predicts every step vLLM takes along its output).
3. **Draft model, EAGLE, EAGLE-3: vLLM itself, one request per position**
   (:func:`model_acc_lens`). For request ``i`` and position ``1 <= p <= L-2``
   we submit prompt + output[:p-1]; its prefill samples ``output[p-1]`` (greedy),
   so the request's first verify step starts at position ``p`` with the drafter
   conditioned exactly as in a real run (the draft model sees the same tokens,
   EAGLE heads the target's hidden states of the teacher-forced prefix). All
   positions of all requests are added to the ``LLMEngine`` at once and stepped
   with DELTA outputs (:func:`first_verify_steps`): a request's second output is
   its first verify step, ``accepted + 1`` tokens, so ``acc_len[p] =`` its length
   (``max_tokens = 1 + min(k + 1, L - p)`` cuts it at the tokens left), and the
   request is aborted there, so no later step is paid for. The tokens are
   checked against ``output[p-1:]``; where a request ended by itself in that
   step, vLLM's detailed per-request acceptance (``per_step_accepted[0]``) is
   checked against the gain too. A position whose prefill token or verified
   tokens differ from the recorded output (the target's greedy choice changed
   with batch composition / kernel path) is re-run once in a small batch;
   positions still mismatched keep vLLM's value and are listed in
   ``mismatch_positions`` and counted in the stats. Position ``L-1`` (one token
   left) is 1 without running. Prefix caching is off (see :class:`EngineSettings`:
   with it on, an identical draft model accepted 0 drafts at one position).
   Why this method: it is vLLM's own drafting and acceptance code (draft-model
   KV handling, EAGLE / EAGLE-3 hidden-state plumbing, EAGLE-3's reduced draft
   vocabulary, the rejection sampler), so nothing is re-implemented per
   drafter; it works for any model vLLM loads (it needs only DELTA outputs, so
   it should also run on vLLM 0.26, which has no per-request metrics; not
   tried); and it is cheap for tiny models. An HF re-implementation would be
   exact only for the draft model. Cost: one prefill per position plus one
   verify step, so it scales as requests x output length x (prompt + output)
   length.

Engines run one at a time and are shut down after use. ``k`` (default 8, the
authors used 20) is the same for every method; vLLM's config sets no upper
bound on ``num_speculative_tokens``.

Output: long form with the columns of :data:`sdlib.traces.TRACE_COLUMNS` plus
``k`` and ``mismatch_positions``; :func:`write_traces` writes the authors' JSONL
through :func:`sdlib.traces.write_trace_file` with keys :data:`TRACE_KEYS`
(``acc_ngram``, ``acc_eagle`` = EAGLE-3, ``acc_eagle1``, ``acc_draft_model``)
and a provenance JSON beside it; :func:`read_traces` reads it back.

Usage:
    python -m sdlib.ourtraces --models .cache/models --dataset code_edit --num-requests 32 \\
        --max-output-tokens 64 --k 8 --out data/traces/embedded_code_edit.jsonl.gz
    python -m sdlib.ourtraces --from-sweep data/sweeps/<name> --dataset code_edit --out ...  # reuse greedy outputs

    from sdlib.ourtraces import ngram_trace
    ngram_trace(prompt=[1, 2, 3, 4], output=[1, 2, 3, 4, 9], k=4, nmin=2, nmax=3).acc_len  # -> [1, 1, 3, 2, 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.oracle import ngram_lookup_lengths
from sdlib.paths import MODELS_DIR, REPO_ROOT, resolve
from sdlib.traces import TRACE_COLUMNS, read_trace_file, write_trace_file

log = logging.getLogger(__name__)

#: method name in our tables -> key in the authors' JSON (``acc_eagle`` is EAGLE-3, as in theirs)
TRACE_KEYS = {"ngram": "acc_ngram", "eagle3": "acc_eagle", "eagle": "acc_eagle1", "draft_model": "acc_draft_model"}
#: drafters that need a model folder, and the folder (under ``--models``) each uses by default
MODEL_METHODS = {"draft_model": "draft", "eagle": "eagle", "eagle3": "eagle3"}
METHODS = ("ngram", *MODEL_METHODS)
DEFAULT_K = 8
NGRAM_MIN, NGRAM_MAX = 3, 7  # the paper's prompt_lookup_min / max
OUT_COLUMNS = TRACE_COLUMNS + ["k", "mismatch_positions"]


@dataclass
class Greedy:
    """One request's greedy output (token ids)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: Optional[str] = None


@dataclass
class EngineSettings:
    """``vllm.LLM`` settings for trace runs (CPU-friendly defaults).

    float32 by default: acceptance depends on argmax ties, and float32 makes the
    target's greedy choice far less sensitive to batch composition than bf16.
    Prefix caching is off by default: with it on (vLLM 0.32, CPU, 2026-11-30) a
    draft model identical to the target accepted 0 of 4 drafts at one position
    (a 257-token prompt whose first 256 tokens other requests had cached), every
    time, and 4 of 4 with it off; so cached prefixes can change what a drafter
    proposes, and the per-position method would record it as the drafter's fault.
    """

    dtype: str = "float32"
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.2  # CPU: fraction of the NUMA node's memory for KV cache
    enforce_eager: bool = True
    enable_prefix_caching: bool = False  # see the docstring: on, it changes draft-model proposals
    max_num_seqs: int = 256
    seed: int = 0
    extra: dict = field(default_factory=dict)


# =========================================================================== n-gram
def ngram_propose(context: Sequence[int], nmin: int = NGRAM_MIN, nmax: int = NGRAM_MAX, k: int = DEFAULT_K,
                  max_model_len: Optional[int] = None) -> list[int]:
    """vLLM's n-gram proposal for ``context`` by brute force (reference implementation, O(len^2)).

    Longest ``n`` in ``[nmin, nmax]`` whose suffix n-gram occurs earlier (start
    before the suffix's start, overlap allowed); its earliest occurrence; the up
    to ``k`` tokens after it (fewer near the end of the context or of
    ``max_model_len``); ``[]`` when nothing matches.
    """
    ctx = list(context)
    N = len(ctx)
    if N < nmin:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - N)
    if k <= 0:
        return []
    for n in range(min(nmax, N - 1), nmin - 1, -1):
        suffix = ctx[N - n:]
        for s in range(0, N - n):
            if ctx[s:s + n] == suffix:
                st = s + n
                return ctx[st:st + min(k, N - st)]
    return []


@dataclass
class NgramTrace:
    """Per output position ``p``: tokens proposed (``drafted``) and ``acc_len`` (see module docstring)."""

    acc_len: np.ndarray  # (L,) int64, entry 0 = 1
    drafted: np.ndarray  # (L,) int64, 0 = no match (entry 0 = 0: the prefill is no verify step)
    start: np.ndarray  # (L,) int64, index into prompt + output where the proposal starts; -1 = none


def _common_suffix(tok: np.ndarray, a: np.ndarray, b: np.ndarray, cap: int) -> np.ndarray:
    """Length (<= cap) of the common suffix of ``tok[:a]`` and ``tok[:b]``, elementwise."""
    out = np.zeros(a.shape, dtype=np.int64)
    live = np.ones(a.shape, dtype=bool)
    for j in range(1, cap + 1):
        ok = live & (a - j >= 0) & (b - j >= 0)
        ok[ok] = tok[a[ok] - j] == tok[b[ok] - j]
        out[ok] = j
        live = ok
    return out


def ngram_trace(prompt: Sequence[int], output: Sequence[int], k: int = DEFAULT_K, nmin: int = NGRAM_MIN,
                nmax: int = NGRAM_MAX, max_model_len: Optional[int] = None) -> NgramTrace:
    """Teacher-forced n-gram trace of one request, exactly as vLLM's n-gram proposer would draft.

    ``k``: num_speculative_tokens; ``nmin``/``nmax``: prompt_lookup_min/max;
    ``max_model_len``: vLLM's cap on proposals near the model length (None = no cap).
    """
    P, L = len(prompt), len(output)
    tok = np.asarray(list(prompt) + list(output), dtype=np.int64)
    N = len(tok)
    acc = np.ones(L, dtype=np.int64)
    drafted = np.zeros(L, dtype=np.int64)
    start = np.full(L, -1, dtype=np.int64)
    if L == 0:
        return NgramTrace(acc, drafted, start)
    ctx = P + np.arange(L, dtype=np.int64)
    # tokens available after the first occurrence of the longest matching suffix n-gram (uncapped)
    avail = ngram_lookup_lengths(list(prompt), list(output), nmin=nmin, nmax=nmax, max_k=max(N, 1))
    hit = avail > 0
    hit[0] = False  # position 0 is the prefill
    st = np.where(hit, ctx - avail, -1)
    # the lookup hashes n-grams: re-check every hit token by token, fall back to brute force if it fails
    idx = np.flatnonzero(hit)
    if idx.size:
        good = _common_suffix(tok, st[idx], ctx[idx], nmin) >= nmin
        for p in idx[~good]:
            prop = ngram_propose(tok[:ctx[p]].tolist(), nmin, nmax, N)
            st[p] = ctx[p] - len(prop) if prop else -1
    hit = st >= 0
    cap = np.full(L, k, dtype=np.int64)
    if max_model_len is not None:
        cap = np.minimum(cap, max_model_len - ctx)
    d = np.where(hit, np.clip(np.minimum(ctx - st, cap), 0, None), 0)
    d[0] = 0
    # leading proposed tokens equal to output[p:]
    m = np.zeros(L, dtype=np.int64)
    live = d > 0
    for j in range(int(d.max(initial=0))):
        ok = live & (j < d) & (ctx + j < N)
        ok[ok] = tok[st[ok] + j] == tok[ctx[ok] + j]
        m[ok] += 1
        live = ok
    acc = np.minimum(1 + m, L - np.arange(L))
    acc[0] = 1
    return NgramTrace(acc.astype(np.int64), d.astype(np.int64), np.where(d > 0, st, -1))


def ngram_acc_len(prompt: Sequence[int], output: Sequence[int], k: int = DEFAULT_K, nmin: int = NGRAM_MIN,
                  nmax: int = NGRAM_MAX, max_model_len: Optional[int] = None) -> list[int]:
    """``ngram_trace(...).acc_len`` as a list of ints."""
    return ngram_trace(prompt, output, k, nmin, nmax, max_model_len).acc_len.tolist()


def ngram_replay(prompt: Sequence[int], output: Sequence[int], k: int = DEFAULT_K, nmin: int = NGRAM_MIN,
                 nmax: int = NGRAM_MAX, max_model_len: Optional[int] = None) -> dict[str, list[int]]:
    """The steps a vLLM n-gram run that produced ``output`` took, predicted offline.

    Walks 0 -> 1 (prefill) -> ... with gain ``acc_len[p]``. Returns ``positions``
    and ``gains`` of every decode step, and ``drafted``/``accepted`` of the steps
    with a proposal (what vLLM's detailed metrics list; ``accepted`` capped by
    the tokens left, since vLLM counts drafts accepted past ``max_tokens``).
    """
    tr = ngram_trace(prompt, output, k, nmin, nmax, max_model_len)
    L = len(output)
    out: dict[str, list[int]] = {"positions": [], "gains": [], "drafted": [], "accepted": []}
    p = 1
    while p < L:
        g = int(tr.acc_len[p])
        out["positions"].append(p)
        out["gains"].append(g)
        if tr.drafted[p] > 0:
            out["drafted"].append(int(tr.drafted[p]))
            out["accepted"].append(g - 1)
        p += g
    return out


# =========================================================================== engines
def make_engine(target: str | Path, method: str = "none", k: int = DEFAULT_K, drafter: Optional[str | Path] = None,
                settings: Optional[EngineSettings] = None, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX):
    """A ``vllm.LLM`` for ``target`` with ``method`` (none, ngram, draft_model, eagle, eagle3), detailed metrics on."""
    from sdlib import vllm_compat as vc
    from sdlib.config import EngineConfig, MethodConfig, ModelConfig

    s = settings or EngineSettings()
    model = ModelConfig(path=str(resolve(target)), dtype=s.dtype, max_model_len=s.max_model_len)
    opts = {"prompt_lookup_min": ngram_min, "prompt_lookup_max": ngram_max} if method == "ngram" else {}
    meth = MethodConfig(name=method, num_spec_tokens=k, model=str(resolve(drafter)) if drafter else None,
                        options=opts)
    engine = EngineConfig(gpu_memory_utilization=s.gpu_memory_utilization, enforce_eager=s.enforce_eager,
                          max_num_seqs=s.max_num_seqs, enable_prefix_caching=s.enable_prefix_caching,
                          extra=dict(s.extra))
    return vc.make_llm(model, meth, engine, max_batch=s.max_num_seqs, seed=s.seed, detailed=method != "none")


def close_engine(llm) -> None:
    """Shut the engine (and its engine-core process) down now, so the next one can start."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as err:  # noqa: BLE001 - best effort across versions
        log.debug("engine shutdown: %s", err)
    del llm
    gc.collect()


def _greedy_params(max_tokens: int, ignore_eos: bool = False):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=int(max_tokens), ignore_eos=ignore_eos, detokenize=False)


def _generate(llm, prompts: list[list[int]], params: list) -> list:
    from sdlib import vllm_compat as vc

    return llm.generate([vc.token_prompt(p) for p in prompts], params, use_tqdm=False)


# =========================================================================== greedy outputs
def greedy_outputs(llm, prompts: Sequence[Sequence[int]], max_tokens: int, ids: Optional[Sequence[str]] = None,
                   ignore_eos: bool = False) -> list[Greedy]:
    """Greedy (temperature 0) outputs of ``llm`` (no SD) for token-id prompts, all in one ``generate``."""
    ids = list(ids) if ids is not None else [str(i) for i in range(len(prompts))]
    outs = _generate(llm, [list(map(int, p)) for p in prompts], [_greedy_params(max_tokens, ignore_eos)] * len(prompts))
    return [Greedy(rid, list(map(int, p)), [int(t) for t in o.outputs[0].token_ids],
                   getattr(o.outputs[0], "finish_reason", None)) for rid, p, o in zip(ids, prompts, outs)]


def greedy_from_sweep(sweep: str | Path | tuple[pd.DataFrame, pd.DataFrame], dataset: Optional[str] = None,
                      model: Optional[str] = None, batch_size: int = 1) -> list[Greedy]:
    """Greedy outputs recorded by a sweep: its ``requests`` of runs with ``method == "none"`` at ``batch_size``.

    ``sweep``: a sweep folder, or ``(runs, requests)`` DataFrames. One output per
    (dataset, prompt_index) (the first repeat); ids are ``<dataset>-<prompt_index>``.
    Only valid for temperature-0 sweeps.
    """
    if isinstance(sweep, tuple):
        runs, req = sweep
    else:
        from sdlib.storage import read_table

        runs, req = read_table(resolve(sweep), "runs"), read_table(resolve(sweep), "requests")
    sel = runs[(runs["method"] == "none") & (runs["batch_size"] == batch_size)]
    if dataset is not None:
        sel = sel[sel["dataset"] == dataset]
    if model is not None:
        sel = sel[sel["model"] == model]
    if sel.empty:
        raise ValueError(f"no no-SD runs at batch size {batch_size}"
                         + (f" for dataset {dataset!r}" if dataset else "") + (f", model {model!r}" if model else ""))
    if sel["model"].nunique() > 1:
        raise ValueError(f"several models {sorted(sel['model'].unique())}: pick one with model=")
    sel = sel.sort_values(["repeat", "run_id"])
    r = req.merge(sel[["run_id", "dataset", "repeat"]], on="run_id")
    r = r.sort_values(["dataset", "prompt_index", "repeat", "run_id"]).drop_duplicates(["dataset", "prompt_index"])
    return [Greedy(f"{row.dataset}-{int(row.prompt_index)}", [int(t) for t in json.loads(row.prompt_token_ids)],
                   [int(t) for t in json.loads(row.output_token_ids)], row.finish_reason)
            for row in r.itertuples(index=False)]


# =========================================================================== model-based drafters
@dataclass
class ModelTraceStats:
    """What happened while measuring one model-based method."""

    method: str
    k: int
    positions: int = 0  # verify steps measured (requests submitted)
    mismatch_prefill: int = 0  # first pass: prefill token != output[p-1]
    mismatch_verify: int = 0  # first pass: a token of the first verify step != output
    bad_structure: int = 0  # first pass: not (1 prefill token, then a verify step), or detailed metrics disagree
    detailed_checked: int = 0  # requests that finished in their first verify step: gain checked against
    #                            vLLM's detailed per-step acceptance (min(accepted + 1, tokens left))
    retried: int = 0
    unresolved: int = 0  # still mismatched after the retry (value kept from vLLM, position listed)
    wall_s: float = 0.0
    retry_wall_s: float = 0.0
    engine_steps: int = 0

    @property
    def mismatch_rate(self) -> float:
        return (self.mismatch_prefill + self.mismatch_verify) / self.positions if self.positions else 0.0


_STATUS_COUNTER = {"prefill": "mismatch_prefill", "verify": "mismatch_verify", "structure": "bad_structure"}


@dataclass
class FirstVerify:
    """What one per-position request returned: its prefill token(s), its first verify step's tokens."""

    prefill: list[int]
    verify: list[int]
    detailed: Optional[tuple[list[int], list[int]]] = None  # (drafted, accepted) if it finished on its own


def first_verify_steps(engine, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], make_params,
                       tag: str = "pos") -> tuple[list[FirstVerify], int]:
    """Run requests on a vLLM ``LLMEngine`` (DELTA outputs) and stop each after its first verify step.

    A request's first non-empty output is its prefill token; the second is the
    first verify step, ``accepted + 1`` tokens (cut by ``max_tokens``); the
    request is then aborted, so no later step is paid for. Works without
    vLLM's detailed metrics (vLLM 0.26); where a request finishes by itself in
    that step its detailed metrics are kept. Returns (one :class:`FirstVerify`
    per prompt, engine steps taken).
    """
    from sdlib import vllm_compat as vc

    index: dict[str, int] = {}
    chunks: list[list[list[int]]] = [[] for _ in prompts]
    res: list[Optional[FirstVerify]] = [None] * len(prompts)
    for j, (pr, mt) in enumerate(zip(prompts, max_tokens)):
        rid = f"{tag}-{j}"
        index[rid] = j
        engine.add_request(rid, vc.token_prompt(pr), make_params(int(mt)))
    steps = 0
    while engine.has_unfinished_requests():
        abort = []
        for o in engine.step():
            j = index.get(o.request_id)
            if j is None or res[j] is not None:
                continue
            c = o.outputs[0]
            toks = [int(t) for t in c.token_ids]
            if toks:
                chunks[j].append(toks)
            if len(chunks[j]) >= 2 or o.finished:
                ch = chunks[j]
                res[j] = FirstVerify(ch[0] if ch else [], ch[1] if len(ch) > 1 else [],
                                     vc.request_spec_metrics(c) if o.finished else None)
                if not o.finished:
                    abort.append(o.request_id)
        if abort:
            engine.abort_request(abort)
        steps += 1
    return [r if r is not None else FirstVerify([], []) for r in res], steps


def _check(fv: FirstVerify, g: Greedy, p: int, k: int) -> tuple[int, str]:
    """(acc_len at p, status) from one per-position request; status: ok, prefill, verify, structure."""
    o = g.output_token_ids
    L = len(o)
    if len(fv.prefill) != 1 or not fv.verify or len(fv.verify) > min(k + 1, L - p):
        return 1, "structure"
    acc = len(fv.verify)  # accepted + 1, cut at the tokens left by max_tokens
    if fv.detailed is not None:
        drafted, accepted = fv.detailed
        if not accepted or drafted[0] != k or min(int(accepted[0]) + 1, L - p) != acc:
            return acc, "structure"
    if fv.prefill[0] != o[p - 1]:
        return acc, "prefill"
    if fv.verify != o[p:p + acc]:
        return acc, "verify"
    return acc, "ok"


def position_prompts(greedy: Sequence[Greedy], k: int) -> list[tuple[int, int, list[int], int]]:
    """``(request index, p, prompt ids, max_tokens)`` for every position ``1 <= p <= L-2`` of every request.

    ``max_tokens = 1 + min(k + 1, L - p)``: the prefill token plus a full verify
    step, never past the recorded output.
    """
    out = []
    for i, g in enumerate(greedy):
        L = len(g.output_token_ids)
        for p in range(1, L - 1):
            out.append((i, p, g.prompt_token_ids + g.output_token_ids[:p - 1], 1 + min(k + 1, L - p)))
    return out


def _delta_greedy_params(max_tokens: int):
    from sdlib import vllm_compat as vc

    return vc.delta_sampling_params(max_tokens, 0.0, 0, ignore_eos=True)


def model_acc_lens(llm, greedy: Sequence[Greedy], k: int, method: str = "model", retry_batch: Optional[int] = 16,
                   make_params=None) -> tuple[list[np.ndarray], list[list[int]], ModelTraceStats]:
    """``acc_len`` per request measured with ``llm`` (an SD ``vllm.LLM`` or its ``llm_engine``, k drafts per step).

    See the module docstring (part 3). ``retry_batch``: mismatched positions are
    re-run in batches of this size (None: no retry). Returns (acc_len arrays,
    unresolved mismatch positions per request, stats). ``make_params(max_tokens)``:
    the SamplingParams (default: greedy, DELTA outputs, ignore_eos; tests pass a fake).
    """
    engine = getattr(llm, "llm_engine", llm)
    params = make_params or _delta_greedy_params
    stats = ModelTraceStats(method=method, k=k)
    accs = [np.ones(len(g.output_token_ids), dtype=np.int64) for g in greedy]
    items = position_prompts(greedy, k)
    stats.positions = len(items)
    unresolved: list[list[int]] = [[] for _ in greedy]
    if not items:
        return accs, unresolved, stats
    t0 = time.perf_counter()
    res, stats.engine_steps = first_verify_steps(engine, [it[2] for it in items], [it[3] for it in items], params,
                                                 tag=f"{method}-0")
    stats.wall_s = time.perf_counter() - t0
    bad = []
    for it, fv in zip(items, res):
        i, p = it[0], it[1]
        acc, status = _check(fv, greedy[i], p, k)
        accs[i][p] = acc
        stats.detailed_checked += fv.detailed is not None and status != "structure"
        if status != "ok":
            counter = _STATUS_COUNTER[status]
            setattr(stats, counter, getattr(stats, counter) + 1)
            bad.append(it)
    if bad and retry_batch:
        stats.retried = len(bad)
        t0 = time.perf_counter()
        for b in range(0, len(bad), retry_batch):
            chunk = bad[b:b + retry_batch]
            res, n = first_verify_steps(engine, [it[2] for it in chunk], [it[3] for it in chunk], params,
                                        tag=f"{method}-retry{b}")
            stats.engine_steps += n
            for it, fv in zip(chunk, res):
                acc, status = _check(fv, greedy[it[0]], it[1], k)
                accs[it[0]][it[1]] = acc
                if status != "ok":
                    unresolved[it[0]].append(it[1])
        stats.retry_wall_s = time.perf_counter() - t0
    else:
        for it in bad:
            unresolved[it[0]].append(it[1])
    stats.unresolved = sum(map(len, unresolved))
    return accs, unresolved, stats


# =========================================================================== putting it together
def _rows(dataset: str, greedy: Sequence[Greedy], method: str, accs: Sequence[Sequence[int]], k: int,
          mismatches: Optional[Sequence[list[int]]] = None) -> list[dict]:
    return [{"dataset": dataset, "request_id": g.request_id, "prompt_token_ids": list(g.prompt_token_ids),
             "output_token_ids": list(g.output_token_ids), "method": method, "acc_len": [int(x) for x in a],
             "k": int(k), "mismatch_positions": list(mismatches[j]) if mismatches else []}
            for j, (g, a) in enumerate(zip(greedy, accs))]


@dataclass
class TraceRun:
    """Result of :func:`make_traces`: long-form traces and what it took."""

    traces: pd.DataFrame
    info: dict[str, Any]


def make_traces(models_dir: str | Path = MODELS_DIR, dataset: str = "code_edit", num_requests: int = 32,
                max_output_tokens: int = 64, k: int = DEFAULT_K, methods: Iterable[str] = METHODS,
                ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX,
                settings: Optional[EngineSettings] = None, greedy: Optional[Sequence[Greedy]] = None,
                drafters: Optional[dict[str, str | Path]] = None, seed: int = 42, source: str = "auto",
                max_prompt_tokens: Optional[int] = None, ignore_eos: bool = False,
                retry_batch: Optional[int] = 16, greedy_source: str = "given") -> TraceRun:
    """Greedy outputs (or ``greedy``), then a trace per method; engines one at a time.

    ``models_dir`` holds ``target`` and the drafter folders :data:`MODEL_METHODS`
    (``drafters`` overrides a method's folder). Prompts: :func:`sdlib.workloads.load_prompts`
    with ``dataset``, ``num_requests``, ``seed``, ``source``; prompts longer than
    ``max_prompt_tokens`` (default: what fits ``max_model_len``) are skipped.
    ``greedy_source``: recorded in the info when ``greedy`` is given.
    """
    from sdlib import vllm_compat as vc

    s = settings or EngineSettings()
    methods = list(dict.fromkeys(methods))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"methods {bad}: choose from {list(METHODS)}")
    models_dir = resolve(models_dir)
    target = models_dir / "target"
    drafter_paths = {m: resolve((drafters or {}).get(m, models_dir / MODEL_METHODS[m]))
                     for m in methods if m in MODEL_METHODS}
    info: dict[str, Any] = {"dataset": dataset, "k": k, "methods": methods, "ngram_min": ngram_min,
                            "ngram_max": ngram_max, "target": _rel(target),
                            "drafters": {m: _rel(p) for m, p in drafter_paths.items()},
                            "engine": asdict(s), "timings_s": {}, "engine_start_s": {}, "model_stats": {}}
    t_all = time.perf_counter()
    if greedy is None:
        from transformers import AutoTokenizer

        from sdlib.config import WorkloadConfig
        from sdlib.workloads import load_prompts

        limit = max_prompt_tokens or (s.max_model_len - max_output_tokens - k - 4)
        tok = AutoTokenizer.from_pretrained(str(target))
        wl = WorkloadConfig(dataset=dataset, num_requests=num_requests, max_output_tokens=max_output_tokens,
                            seed=seed, source=source, max_prompt_tokens=limit)
        prompts = load_prompts(wl, tok)
        t0 = time.perf_counter()
        llm = make_engine(target, "none", k, settings=s)
        info["engine_start_s"]["none"] = time.perf_counter() - t0
        info["vllm_version"] = vc.vllm_version()
        try:
            t0 = time.perf_counter()
            greedy = greedy_outputs(llm, [p.prompt_token_ids for p in prompts], max_output_tokens,
                                    ids=[f"{dataset}-{p.index}" for p in prompts], ignore_eos=ignore_eos)
            info["timings_s"]["greedy"] = time.perf_counter() - t0
        finally:
            close_engine(llm)
        info["greedy_source"] = "vllm"
    else:
        info["greedy_source"] = greedy_source
    greedy = list(greedy)
    info["num_requests"] = len(greedy)
    info["output_tokens"] = int(sum(len(g.output_token_ids) for g in greedy))
    rows: list[dict] = []
    for m in methods:
        if m == "ngram":
            t0 = time.perf_counter()
            accs = [ngram_acc_len(g.prompt_token_ids, g.output_token_ids, k, ngram_min, ngram_max, s.max_model_len)
                    for g in greedy]
            info["timings_s"]["ngram"] = time.perf_counter() - t0
            rows += _rows(dataset, greedy, m, accs, k)
            continue
        t0 = time.perf_counter()
        llm = make_engine(target, m, k, drafter_paths[m], settings=s)
        info["engine_start_s"][m] = time.perf_counter() - t0
        info.setdefault("vllm_version", vc.vllm_version())
        try:
            t0 = time.perf_counter()
            accs, mism, st = model_acc_lens(llm.llm_engine, greedy, k, method=m, retry_batch=retry_batch)
            info["timings_s"][m] = time.perf_counter() - t0
        finally:
            close_engine(llm)
        info["model_stats"][m] = {**asdict(st), "mismatch_rate": st.mismatch_rate}
        rows += _rows(dataset, greedy, m, accs, k, mism)
    info["timings_s"]["total"] = time.perf_counter() - t_all
    df = pd.DataFrame(rows, columns=OUT_COLUMNS)
    info["mean_acc_len"] = mean_acc_len(df).to_dict()
    return TraceRun(df, info)


def mean_acc_len(traces: pd.DataFrame) -> pd.Series:
    """Mean ``acc_len`` per method over decode positions (entry 0, the prefill, left out)."""
    def one(lists) -> float:
        vals = np.concatenate([np.asarray(a[1:], float) for a in lists] + [np.zeros(0)])
        return float(vals.mean()) if vals.size else float("nan")

    return traces.groupby("method", sort=False)["acc_len"].apply(one)


def _rel(path: str | Path) -> str:
    """``path`` relative to the repo root when it lies inside it (provenance carries no absolute paths)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def _provenance_path(path: Path) -> Path:
    name = path.name
    for suf in (".jsonl.gz", ".jsonl", ".gz"):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    return path.with_name(name + ".provenance.json")


def write_traces(traces: pd.DataFrame, path: str | Path, info: Optional[dict] = None) -> Path:
    """Write long-form traces in the authors' JSONL (keys :data:`TRACE_KEYS`) and a provenance JSON beside it.

    :func:`sdlib.traces.write_trace_file` names unknown methods ``acc_<method>``,
    so EAGLE-1 rows are renamed ``eagle1`` first (``acc_eagle`` is EAGLE-3's key).
    """
    from sdlib.storage import git_commit, utc_now

    path = resolve(path)
    rename = {m: key[len("acc_"):] for m, key in TRACE_KEYS.items() if m not in ("ngram", "eagle3")}
    out = traces.assign(method=traces["method"].map(lambda m: rename.get(m, m)))
    write_trace_file(out, path)
    prov = {"written_at": utc_now(), "git_commit": git_commit(), "python": platform.python_version(),
            "keys": {m: TRACE_KEYS[m] for m in traces["method"].unique() if m in TRACE_KEYS},
            "cap": "acc_len[p] <= min(k + 1, len(output) - p); acc_len[0] = 1",
            "mismatch_positions": {f"{r.method}/{r.request_id}": list(r.mismatch_positions)
                                   for r in traces.itertuples() if "mismatch_positions" in traces.columns
                                   and len(r.mismatch_positions)},
            **(info or {})}
    from sdlib.vllm_compat import device_name

    prov.setdefault("device", device_name())
    _provenance_path(path).write_text(json.dumps(prov, indent=2, default=str) + "\n")
    return path


def read_traces(path: str | Path, dataset: str) -> pd.DataFrame:
    """Read a file written by :func:`write_traces` back into long form (methods named as in our tables)."""
    return read_trace_file(resolve(path), dataset, methods=TRACE_KEYS)


def load_our_traces(patterns: str | Sequence[str]) -> pd.DataFrame:
    """Every trace file matching ``patterns`` (repo-relative globs of :func:`write_traces` output), long form.

    The dataset and ``k`` of each file come from the provenance JSON beside it. Columns:
    :data:`sdlib.traces.TRACE_COLUMNS` + ``k`` + ``file`` (repo-relative). Empty (same columns) when
    nothing matches.
    """
    import glob

    pats = [patterns] if isinstance(patterns, str) else list(patterns)
    files = sorted({Path(f) for pat in pats for f in glob.glob(str(resolve(pat)))})
    frames = []
    for f in files:
        prov_path = _provenance_path(f)
        if not prov_path.exists():
            raise FileNotFoundError(f"{f}: no provenance file {prov_path.name} beside it (written by write_traces)")
        prov = json.loads(prov_path.read_text())
        frames.append(read_traces(f, prov["dataset"]).assign(k=int(prov["k"]), file=_rel(f)))
    if not frames:
        return pd.DataFrame(columns=[*TRACE_COLUMNS, "k", "file"])
    return pd.concat(frames, ignore_index=True)


def traces_title(traces: pd.DataFrame) -> str:
    """``our traces of <target folder> (<what its card says>); <device>, vLLM <version>`` for titles,
    from the provenance files of :func:`load_our_traces` output (its ``file`` column)."""
    from sdlib.plots import model_note

    provs = [json.loads(_provenance_path(resolve(f)).read_text()) for f in sorted(set(traces["file"]))]
    targets = sorted({p["target"] for p in provs if p.get("target")})
    parts = []
    for t in targets:
        card_path = resolve(t) / "sdlib_model.json"
        note = model_note(json.loads(card_path.read_text())) if card_path.exists() else ""
        parts.append(f"{t} ({note})" if note else t)
    where = sorted({f"{p.get('device', '?')}, vLLM {p.get('vllm_version', '?')}" for p in provs})
    return "our traces of " + ", ".join(parts) + "; " + "; ".join(where)


# =========================================================================== CLI
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdlib.ourtraces", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=str(MODELS_DIR),
                    help="folder with target/ and the drafters (default: %(default)s)")
    ap.add_argument("--dataset", default="code_edit", help="workload name (sdlib.config.DATASETS)")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-output-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=DEFAULT_K, help="num_speculative_tokens for every method (authors: 20)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of %(default)s")
    ap.add_argument("--ngram-min", type=int, default=NGRAM_MIN)
    ap.add_argument("--ngram-max", type=int, default=NGRAM_MAX)
    ap.add_argument("--seed", type=int, default=42, help="prompt sampling seed")
    ap.add_argument("--source", default="auto", help="workload source: auto, local, package, hub")
    ap.add_argument("--max-prompt-tokens", type=int, default=None)
    ap.add_argument("--ignore-eos", action="store_true", help="greedy outputs run to max-output-tokens")
    ap.add_argument("--from-sweep", default=None, help="take greedy outputs from this sweep folder (no-SD, bs 1)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--prefix-caching", action="store_true",
                    help="faster, but changes draft-model proposals on vLLM 0.32 CPU (see EngineSettings)")
    ap.add_argument("--no-retry", action="store_true", help="do not re-run mismatched positions")
    ap.add_argument("--out", required=True, help="output .jsonl or .jsonl.gz (provenance JSON written beside it)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    s = EngineSettings(dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                       enable_prefix_caching=args.prefix_caching)
    greedy = None
    if args.from_sweep:
        greedy = greedy_from_sweep(args.from_sweep, dataset=args.dataset)[: args.num_requests]
    run = make_traces(args.models, args.dataset, args.num_requests, args.max_output_tokens, args.k,
                      [m.strip() for m in args.methods.split(",") if m.strip()], args.ngram_min, args.ngram_max,
                      s, greedy=greedy, seed=args.seed, source=args.source, max_prompt_tokens=args.max_prompt_tokens,
                      ignore_eos=args.ignore_eos, retry_batch=None if args.no_retry else 16,
                      greedy_source=f"sweep:{_rel(resolve(args.from_sweep))}" if args.from_sweep else "given")
    path = write_traces(run.traces, args.out, {**run.info, "argv": sys.argv})
    print(f"wrote {path} ({run.info['num_requests']} requests, {run.info['output_tokens']} output tokens)")
    for m, v in run.info["mean_acc_len"].items():
        st = run.info["model_stats"].get(m)
        extra = (f"; {st['positions']} positions, mismatches prefill {st['mismatch_prefill']} / verify "
                 f"{st['mismatch_verify']}, unresolved {st['unresolved']}") if st else ""
        print(f"  {m:12s} mean acc_len {v:.3f}  ({run.info['timings_s'].get(m, float('nan')):.1f} s{extra})")
    print("  timings (s): " + ", ".join(f"{a} {b:.1f}" for a, b in run.info["timings_s"].items())
          + "; engine start: " + ", ".join(f"{a} {b:.1f}" for a, b in run.info["engine_start_s"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
