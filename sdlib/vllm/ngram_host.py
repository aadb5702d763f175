"""vLLM 0.26-0.33's host n-gram look-up, kept for vLLM >= 0.34 (which has only a GPU kernel).

sdlib runs vLLM's own host look-up where replay or a custom proposer must pay an n-gram drafter's cost on the
host (:mod:`sdlib.vllm.replay` for Oracle Combine on the V2 runner, :class:`sdlib.vllm.proposers.NgramOrDraft`).
vLLM 0.34 removed ``vllm/v1/spec_decode/ngram_proposer.py`` (its n-gram speculator is the Triton kernel in
``vllm/v1/worker/gpu/spec_decode/ngram/speculator.py``, which also takes the *rightmost* match where this
one takes the earliest), so :mod:`sdlib.vllm.compat` falls back to this copy: the two functions of vLLM 0.32.0
``vllm/v1/spec_decode/ngram_proposer.py`` lines 180-295 (Apache-2.0, the vLLM project), unchanged but for
names. Needs numba (vLLM 0.34 requires it; the H200 image has 0.68).

Usage: through ``sdlib.vllm.compat.ngram_lookup()`` / ``compat.batch_ngram_propose()``.
"""

from __future__ import annotations

import numpy as np
from numba import jit, njit, prange


@njit(parallel=True)
def batch_propose_numba(valid_ngram_requests, num_tokens_no_spec, token_ids_cpu, min_n, max_n, max_model_len, k,
                        valid_ngram_draft, valid_ngram_num_drafts):
    """vLLM 0.32 ``batch_propose_numba``: drafts for the listed rows into ``valid_ngram_draft`` (in place)."""
    for i in prange(len(valid_ngram_requests)):
        idx = valid_ngram_requests[i]
        num_tokens = num_tokens_no_spec[idx]
        context_token_ids = token_ids_cpu[idx, :num_tokens]
        drafter_output = find_longest_matched_ngram_and_propose_tokens(context_token_ids, min_n, max_n,
                                                                       max_model_len, k)
        valid_ngram_num_drafts[idx] = drafter_output.shape[0]
        if len(drafter_output):
            valid_ngram_draft[idx, : drafter_output.shape[0]] = drafter_output


@jit(nopython=True)
def find_longest_matched_ngram_and_propose_tokens(origin_tokens, min_ngram, max_ngram, max_model_len, k):
    """vLLM 0.32 ``_find_longest_matched_ngram_and_propose_tokens``: the longest suffix n-gram in
    [min_ngram, max_ngram] that occurs earlier (earliest occurrence), and up to k tokens after it."""
    total_token = origin_tokens.shape[0]
    if total_token < min_ngram:
        return np.empty((0,), dtype=origin_tokens.dtype)
    k = min(k, max_model_len - total_token)
    if k <= 0:
        return np.empty((0,), dtype=origin_tokens.dtype)
    tokens = origin_tokens[::-1]
    lps = np.zeros(max_ngram, dtype=np.int32)
    longest_ngram = 0
    position = 0
    prev_lps = 0
    i = 1
    while i < total_token:
        if tokens[prev_lps] == tokens[i]:
            prev_lps += 1
            if prev_lps >= longest_ngram:
                longest_ngram = prev_lps
                position = i
            if i < max_ngram:
                lps[i] = prev_lps
            if prev_lps == max_ngram:
                prev_lps = lps[max_ngram - 1]
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]
        else:
            i += 1
    if longest_ngram < min_ngram:
        return np.empty((0,), dtype=origin_tokens.dtype)
    start_position = total_token - 1 - position + longest_ngram
    k = min(k, total_token - start_position)
    return origin_tokens[start_position: start_position + k]
