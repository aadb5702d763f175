"""A user's own prompts: ``dataset: custom`` with a ``name`` and a ``path`` to a JSONL file (or .json list,
.csv; optionally .gz).

Each line is one request, a JSON object with

* ``prompt`` (text; the model's chat template is applied unless ``chat_template: false``), or
  ``prompt_token_ids`` (a list of token ids, sent as they are), and optionally
* ``id`` (a name for the request; default: its line number),
* ``max_output_tokens`` (this request's output budget, capped by the workload's ``max_output_tokens``),
* ``reference`` (an expected output; kept, not used for timing).

Rows are taken in seeded order (``seed``), as for every dataset; rows without a prompt are skipped and
counted. Example (docs/sweeps.md, "Your own data")::

    {"id": "q1", "prompt": "Rename x to count in: def f(x): return x + 1", "max_output_tokens": 64}
    {"id": "q2", "prompt_token_ids": [128000, 9906, 1917], "max_output_tokens": 32}

Usage:
    workloads: [{dataset: custom, name: my_edits, path: my_edits.jsonl, num_requests: 50, max_output_tokens: 128}]
"""

from __future__ import annotations

import random
import warnings
from typing import Any

from sdlib.config import WorkloadConfig
from sdlib.workloads.chat import tokenize_prompt, uses_chat_template
from sdlib.workloads.datasets import Prompt, WorkloadError, WorkloadWarning

#: the fields a custom row may carry
FIELDS = ("prompt", "prompt_token_ids", "id", "max_output_tokens", "reference")


def _row_ids(row: dict[str, Any], where: str) -> list[int]:
    ids = row["prompt_token_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                       and t >= 0 for t in ids):
        raise WorkloadError(f"{where}: prompt_token_ids must be a non-empty list of token ids (integers >= 0)")
    return ids


def check_custom_rows(wl: WorkloadConfig) -> tuple[list[dict[str, Any]], int]:
    """The file's usable rows and how many were skipped (no prompt); WorkloadError naming file:line on a
    malformed row. Reads the file only (no tokenizer), so it runs before any engine starts."""
    # deferred: sdlib.workloads.sources loads pydantic, and only this path needs it
    from sdlib.workloads.sources import read_file_rows

    p, rows = read_file_rows("custom", wl.path)
    good, skipped = [], 0
    for n, r in enumerate(rows, 1):
        where = f"{p}:{n}"
        unknown = sorted(set(r) - set(FIELDS))
        if unknown:
            raise WorkloadError(f"{where}: unknown field(s) {unknown} (a row may have {', '.join(FIELDS)})")
        if "prompt_token_ids" in r:
            _row_ids(r, where)
        elif not isinstance(r.get("prompt"), str) or not r["prompt"].strip():
            skipped += 1
            continue
        mt = r.get("max_output_tokens")
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            raise WorkloadError(f"{where}: max_output_tokens must be an integer >= 1")
        good.append({**r, "_line": n})
    if not good:
        raise WorkloadError(f"custom: {p}: no row has a non-empty prompt or prompt_token_ids")
    return good, skipped


def load_custom_prompts(wl: WorkloadConfig, tokenizer: Any = None) -> list[Prompt]:
    """``wl.num_requests`` prompts of a custom file, in seeded order, tokenized when a tokenizer is given."""
    # deferred: sdlib.workloads.prompts loads pydantic, and only this path needs it

    rows, skipped = check_custom_rows(wl)
    order = list(range(len(rows)))
    random.Random(wl.seed).shuffle(order)
    chat = uses_chat_template(wl)
    out: list[Prompt] = []
    for i in order[: wl.num_requests]:
        r = rows[i]
        text = r.get("prompt") or ""
        ids = list(r["prompt_token_ids"]) if "prompt_token_ids" in r else (
            tokenize_prompt(tokenizer, text, chat) if tokenizer is not None else None)
        budget = min(int(r.get("max_output_tokens") or wl.max_output_tokens), wl.max_output_tokens)
        out.append(Prompt(index=len(out), dataset=wl.label, source_id=str(r.get("id", r["_line"])), text=text,
                          prompt_token_ids=ids, reference=r.get("reference"), source=f"custom:{wl.path}",
                          max_output_tokens=budget))
    if skipped:
        warnings.warn(f"{wl.label}: {skipped} row(s) without a prompt skipped", WorkloadWarning, stacklevel=2)
    if len(out) < wl.num_requests:
        warnings.warn(f"{wl.label}: asked for {wl.num_requests} prompts, the file has {len(out)}",
                      WorkloadWarning, stacklevel=2)
    return out
