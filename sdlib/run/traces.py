"""Teacher-forced acceptance traces from OUR models, in the simulator's format (:mod:`sdlib.sim.traces`).

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
2. **n-gram, offline and exact**: :func:`sdlib.extract.ngram.ngram_acc_len`, vLLM's look-up
   rule re-run on the token ids.
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
4. **EAGLE-3 offline** (``eagle3_engine="offline"``, ``sdlib traces --eagle3-engine offline``): the
   trained head's free-running draft chain in torch float32 along the same output, one pass per request
   (:func:`sdlib.run.confidences.chain_confidences`, the chain ``sdlib confidences`` reads its confidences
   from), instead of vLLM. About a thousand times cheaper on a CPU (0.2 s against minutes per 256-token
   request); it agreed with vLLM's bfloat16 acceptance on 97.8% of the embedded ShareGPT positions (the
   rest are near-ties), and its drafts are exactly those the confidences belong to. The provenance says
   which engine made ``acc_eagle`` (``eagle3_engine``).

Engines run one at a time and are shut down after use. ``k`` (default 8, the
authors used 20) is the same for every method; vLLM's config sets no upper
bound on ``num_speculative_tokens``.

Output: long form with the columns of :data:`sdlib.sim.traces.TRACE_COLUMNS` plus
``k`` and ``mismatch_positions``; :func:`sdlib.sim.traces.write_traces` writes the authors' JSONL
through :func:`sdlib.sim.traces.write_trace_file` with keys :data:`sdlib.sim.traces.TRACE_KEYS`
(``acc_ngram``, ``acc_eagle`` = EAGLE-3, ``acc_eagle1``, ``acc_draft_model``)
and a provenance JSON beside it; :func:`sdlib.sim.traces.read_traces` reads it back.

Usage:
    sdlib traces --models .cache/models --dataset code_edit --num-requests 32 \\
        --max-output-tokens 64 --k 8 --out data/traces/embedded_code_edit.jsonl.gz
    sdlib traces --from-sweep data/sweeps/<name> --dataset code_edit --out ...  # reuse greedy outputs
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.core.registry import METHODS as METHOD_SPECS
from sdlib.extract.ngram import DEFAULT_K, NGRAM_MAX, NGRAM_MIN, ngram_acc_len
from sdlib.paths import MODELS_DIR, repo_relative, resolve
from sdlib.sim.traces import TRACE_COLUMNS, mean_acc_len
from sdlib.store import read_table
from sdlib.vllm import compat as vc
from sdlib.vllm.engine import (
    EngineSettings,
    FirstVerify,
    close_engine,
    delta_greedy_params,
    first_verify_steps,
    greedy_outputs,
    make_engine,
)

log = logging.getLogger(__name__)

#: drafters that need a model folder, and the folder (under ``--models``) each uses by default
MODEL_METHODS = {m.name: m.trained for m in METHOD_SPECS.values() if m.trained}
#: the methods a trace can be made for: the look-up and every drafter with a trained model of ours
METHODS = tuple(m.name for m in METHOD_SPECS.values() if m.trace and (m.trained or not m.takes_model))
OUT_COLUMNS = TRACE_COLUMNS + ["k", "mismatch_positions"]
#: how a trace's EAGLE-3 acceptance can be made (``make_traces(eagle3_engine=...)``), as the provenance says it
EAGLE3_ENGINES = {
    "vllm": "vllm: one request per output position, vLLM's own drafting and rejection sampler (module part 3)",
    "offline": "offline: the head's free-running chain in torch float32 along the output, one pass per request "
               "(sdlib.run.confidences.chain_confidences; module part 4)",
}


@dataclass
class Greedy:
    """One request's greedy output (token ids)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: Optional[str] = None


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


def model_acc_lens(llm, greedy: Sequence[Greedy], k: int, method: str = "model", retry_batch: Optional[int] = 16,
                   make_params=None) -> tuple[list[np.ndarray], list[list[int]], ModelTraceStats]:
    """``acc_len`` per request measured with ``llm`` (an SD ``vllm.LLM`` or its ``llm_engine``, k drafts per step).

    See the module docstring (part 3). ``retry_batch``: mismatched positions are
    re-run in batches of this size (None: no retry). Returns (acc_len arrays,
    unresolved mismatch positions per request, stats). ``make_params(max_tokens)``:
    the SamplingParams (default: greedy, DELTA outputs, ignore_eos; tests pass a fake).
    """
    engine = getattr(llm, "llm_engine", llm)
    params = make_params or delta_greedy_params
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


def eagle3_offline_acc_lens(head_dir: Path, target_dir: Path, greedy: Sequence[Greedy], k: int,
                            device: str = "cpu") -> list[np.ndarray]:
    """``acc_len`` per request from the EAGLE-3 head's offline draft chain (module part 4): the target and head
    folders as vLLM loads them, float32 on ``device``."""
    # deferred: sdlib.run.confidences loads torch and transformers, and only this path needs them
    from sdlib.run.confidences import chain_confidences, load_eagle3

    if head_dir.parent != target_dir.parent:
        raise ValueError(f"offline EAGLE-3: the head {head_dir} must sit beside the target {target_dir}")
    m = load_eagle3(target_dir.parent, target=target_dir.name, head=head_dir.name, device=device)
    return [np.asarray(chain_confidences(m, g.prompt_token_ids, g.output_token_ids, k)[1], dtype=np.int64)
            for g in greedy]


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


def prompt_limit(settings: EngineSettings, max_output_tokens: int, k: int,
                 max_prompt_tokens: Optional[int] = None) -> int:
    """The longest prompt (tokens) a trace run keeps: ``max_prompt_tokens``, or what leaves room in
    ``max_model_len`` for the output and a verify step (``max_model_len - max_output_tokens - k - 4``)."""
    return max_prompt_tokens or (settings.max_model_len - max_output_tokens - k - 4)


def trace_prompts(target: str | Path, dataset: str, num_requests: int, limit: int, seed: int = 42,
                  source: str = "auto") -> list:
    """The tokenized prompts (:class:`sdlib.workloads.Prompt`) of a trace run: the first ``num_requests`` of the
    workload's seeded order within ``limit`` tokens, through the tokenizer (and chat template) of ``target``."""
    # deferred: transformers takes seconds to import, and only this path needs it
    from transformers import AutoTokenizer

    # deferred: sdlib.config loads pydantic, and only this path needs it
    from sdlib.config import WorkloadConfig
    from sdlib.workloads import load_prompts

    tok = AutoTokenizer.from_pretrained(str(resolve(target)))
    wl = WorkloadConfig(dataset=dataset, num_requests=num_requests, seed=seed, source=source,
                        max_prompt_tokens=limit)
    return load_prompts(wl, tok)


def make_traces(models_dir: str | Path = MODELS_DIR, dataset: str = "code_edit", num_requests: int = 32,
                max_output_tokens: int = 64, k: int = DEFAULT_K, methods: Iterable[str] = METHODS,
                ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX,
                settings: Optional[EngineSettings] = None, greedy: Optional[Sequence[Greedy]] = None,
                drafters: Optional[dict[str, str | Path]] = None, seed: int = 42, source: str = "auto",
                max_prompt_tokens: Optional[int] = None, ignore_eos: bool = False,
                retry_batch: Optional[int] = 16, greedy_source: str = "given",
                prompts: Optional[Sequence[Any]] = None, prompts_info: Optional[dict] = None,
                eagle3_engine: str = "vllm") -> TraceRun:
    """Greedy outputs (or ``greedy``), then a trace per method; engines one at a time.

    ``models_dir`` holds ``target`` and the drafter folders :data:`MODEL_METHODS`
    (``drafters`` overrides a method's folder). Prompts: :func:`trace_prompts` (``dataset``,
    ``num_requests``, ``seed``, ``source``; prompts longer than ``max_prompt_tokens``, default what fits
    ``max_model_len``, are skipped), or ``prompts`` (tokenized :class:`sdlib.workloads.Prompt`, e.g. from a
    prompt file, :mod:`sdlib.workloads.promptfile`, whose ``prompts_info`` is recorded): the first
    ``num_requests`` of them within the limit. ``greedy_source``: recorded in the info when ``greedy`` is given.
    ``eagle3_engine``: ``vllm`` (part 3 of the module docstring) or ``offline`` (part 4).
    """

    s = settings or EngineSettings()
    methods = list(dict.fromkeys(methods))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"methods {bad}: choose from {list(METHODS)}")
    if eagle3_engine not in EAGLE3_ENGINES:
        raise ValueError(f"eagle3_engine {eagle3_engine!r}: choose from {list(EAGLE3_ENGINES)}")
    models_dir = resolve(models_dir)
    target = models_dir / "target"
    drafter_paths = {m: resolve((drafters or {}).get(m, models_dir / MODEL_METHODS[m]))
                     for m in methods if m in MODEL_METHODS}
    info: dict[str, Any] = {"dataset": dataset, "k": k, "methods": methods, "ngram_min": ngram_min,
                            "ngram_max": ngram_max, "target": repo_relative(target),
                            "drafters": {m: repo_relative(p) for m, p in drafter_paths.items()},
                            "engine": asdict(s), "timings_s": {}, "engine_start_s": {}, "model_stats": {}}
    if "eagle3" in methods:
        info["eagle3_engine"] = EAGLE3_ENGINES[eagle3_engine]
    t_all = time.perf_counter()
    if greedy is None:
        limit = prompt_limit(s, max_output_tokens, k, max_prompt_tokens)
        if prompts is None:
            prompts = trace_prompts(target, dataset, num_requests, limit, seed, source)
        else:
            given = len(prompts)
            prompts = [p for p in prompts if len(p.prompt_token_ids) <= limit][:num_requests]
            info["prompts"] = {**(prompts_info or {}), "given": given, "used": len(prompts), "limit": limit}
            if len(prompts) < num_requests:
                log.warning("asked for %d prompts, the %d given have %d within %d tokens", num_requests, given,
                            len(prompts), limit)
            if not prompts:
                raise ValueError(f"no given prompt fits {limit} tokens")
        t0 = time.perf_counter()
        llm = make_engine(target, "none", k, settings=s)
        info["engine_start_s"]["none"] = time.perf_counter() - t0
        info["vllm_version"] = vc.vllm_version()
        try:
            t0 = time.perf_counter()
            outs = greedy_outputs(llm, [p.prompt_token_ids for p in prompts], max_output_tokens, ignore_eos=ignore_eos)
            greedy = [Greedy(f"{dataset}-{p.index}", list(map(int, p.prompt_token_ids)), o, fin)
                      for p, (o, fin) in zip(prompts, outs)]
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
        if m == "eagle3" and eagle3_engine == "offline":
            t0 = time.perf_counter()
            accs = eagle3_offline_acc_lens(drafter_paths[m], target, greedy, k)
            info["timings_s"][m] = time.perf_counter() - t0
            info["model_stats"][m] = {"method": m, "k": k, "engine": "offline", "positions":
                                      int(sum(max(len(g.output_token_ids) - 2, 0) for g in greedy))}
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
