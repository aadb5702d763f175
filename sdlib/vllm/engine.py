"""Engines for trace runs: build and close a ``vllm.LLM``, greedy outputs, first verify steps per request.

The trace producer (:mod:`sdlib.run.traces`) measures model-based drafters by
submitting one request per output position and stopping each after its first
verify step (:func:`first_verify_steps`); this module holds every call into
vLLM that it needs.

Usage:
    from sdlib.vllm.engine import EngineSettings, make_engine, close_engine
    llm = make_engine("data/models/target", "eagle3", k=8, drafter="data/models/eagle3")
    ...; close_engine(llm)
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from sdlib.extract.ngram import DEFAULT_K, NGRAM_MAX, NGRAM_MIN
from sdlib.paths import resolve
from sdlib.vllm import compat as vc

log = logging.getLogger(__name__)


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


def make_engine(target: str | Path, method: str = "none", k: int = DEFAULT_K, drafter: Optional[str | Path] = None,
                settings: Optional[EngineSettings] = None, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX):
    """A ``vllm.LLM`` for ``target`` with ``method`` (none, ngram, draft_model, eagle, eagle3), detailed metrics on."""
    # deferred: sdlib.config loads pydantic, and only this path needs it
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
    # deferred: vllm takes seconds to import, and only this path needs it
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=int(max_tokens), ignore_eos=ignore_eos, detokenize=False)


def _generate(llm, prompts: list[list[int]], params: list) -> list:
    return llm.generate([vc.token_prompt(p) for p in prompts], params, use_tqdm=False)


def greedy_outputs(llm, prompts: Sequence[Sequence[int]], max_tokens: int,
                   ignore_eos: bool = False) -> list[tuple[list[int], Optional[str]]]:
    """Greedy (temperature 0) outputs of ``llm`` (no SD) for token-id prompts, all in one ``generate``:
    ``(output token ids, finish reason)`` per prompt."""
    outs = _generate(llm, [list(map(int, p)) for p in prompts], [_greedy_params(max_tokens, ignore_eos)] * len(prompts))
    return [([int(t) for t in o.outputs[0].token_ids], getattr(o.outputs[0], "finish_reason", None)) for o in outs]


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


def delta_greedy_params(max_tokens: int):
    return vc.delta_sampling_params(max_tokens, 0.0, 0, ignore_eos=True)
