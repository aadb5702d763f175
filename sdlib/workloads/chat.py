"""One prompt's tokens: whether a workload goes through the chat template, and the token ids of one user message
(through the template or not), whatever the tokenizer returns.

Usage:
    from sdlib.workloads.chat import tokenize_prompt, uses_chat_template
    ids = tokenize_prompt(tokenizer, "Hello", chat=uses_chat_template(wl))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdlib.config import WorkloadConfig
from sdlib.workloads.datasets import WorkloadError
from sdlib.workloads.sources import short_error


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
            raise WorkloadError(f"{short_error(e)}: set `chat_template: false` on the workload") from e
        raise
    return _as_ids(ids)
