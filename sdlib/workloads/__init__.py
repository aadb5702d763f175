"""Workloads: datasets and their prompt formats, where rows come from, prompts as token ids.

Usage:
    from sdlib.workloads import load_prompts
    prompts = load_prompts(WorkloadConfig(dataset="code_edit", num_requests=4))
"""

from sdlib.workloads.datasets import (CNN_PREFIX, CODE_SUFFIX, HUMANEVAL_PREFIX, Prompt, WorkloadError,
                                      WorkloadWarning, format_code_prompt, format_row)
from sdlib.workloads.prompts import (load_prompts, load_trace_prompts, load_trace_table, tokenize_prompt,
                                     uses_chat_template)
from sdlib.workloads.sources import available_sources, iter_samples, load_texts, read_json_array_prefix

__all__ = ["CNN_PREFIX", "CODE_SUFFIX", "HUMANEVAL_PREFIX", "Prompt", "WorkloadError", "WorkloadWarning",
           "available_sources", "format_code_prompt", "format_row", "iter_samples", "load_prompts",
           "load_trace_prompts", "load_trace_table", "load_texts", "read_json_array_prefix", "tokenize_prompt", "uses_chat_template"]
