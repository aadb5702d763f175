"""Custom vLLM proposers (``speculative_config={"model": "sdlib.vllm.proposers.<Class>", ...}``, vLLM's
``custom_class`` method): built with the VllmConfig, ``load_model`` once, ``propose`` every step.

:class:`NgramOrDraft` combines vLLM's own n-gram look-up (prompt_lookup_min 3, max 7: the paper's) with a
draft model run inside the proposer, so that its cost is paid for real: per row, the look-up's
continuation (up to k tokens) when it finds a match, else the draft model's k greedy tokens. The choice is
made before drafting, so the draft model runs only for the rows that need it: one batched greedy loop over
them (left-padded; a prefill of each row's last :data:`DRAFT_WINDOW` tokens, then k - 1 one-token steps on
its KV cache). No draft KV cache is kept across engine steps, which makes its drafting dearer than vLLM's
``draft_model`` method's, a conservative handicap. It is vLLM PR #24344's rule
with a draft model in EAGLE's place, and it never proposes nothing (so vLLM's ``drafter always proposes``
step accounting holds).

The draft model: ``$SDLIB_CUSTOM_DRAFT`` or ``@trained/draft`` (the embedded 1.6M-parameter draft; it
shares the target's vocabulary). Interface (vLLM 0.26 and 0.32): ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu, slot_mappings=None)`` returns one list of draft ids per row. On vLLM >= 0.34
(no ``custom_class``) the same classes run behind :class:`sdlib.vllm.speculator.HostProposerSpeculator`, which
pads short rows to K (0.34 verifies K per row); :func:`sdlib.vllm.compat.speculative_config` switches.

Usage (configs/embedded_custom.yaml):
    methods: [{name: custom, num_spec_tokens: 3, model: sdlib.vllm.proposers.NgramOrDraft}]
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from sdlib.extract.ngram import NGRAM_MAX, NGRAM_MIN
from sdlib.paths import resolve
from sdlib.vllm.compat import ngram_lookup

#: Environment variable naming the draft model folder (default ``@trained/draft``).
DRAFT_ENV = "SDLIB_CUSTOM_DRAFT"
DEFAULT_DRAFT = "@trained/draft"
#: Context the draft model sees (the row's last tokens): bounds its per-step recomputation.
DRAFT_WINDOW = 64


class NgramOrDraft:
    """n-gram continuation when the look-up matches, else the draft model's k greedy tokens (module docstring)."""

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.nmin, self.nmax = NGRAM_MIN, NGRAM_MAX
        self.model = None
        self.pad_id = 0
        self.stats = {"steps": 0, "rows_ngram": 0, "rows_draft": 0}

    def load_model(self, *args, **kwargs) -> None:
        """Load the draft model (CPU, float32, eval) and compile vLLM's look-up once."""
        # deferred: torch takes seconds to import, and only this path needs it
        import torch
        from transformers import AutoModelForCausalLM

        path = resolve(os.environ.get(DRAFT_ENV, DEFAULT_DRAFT))
        self.model = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self._lookup(np.arange(16, dtype=np.int32) % 4)  # JIT-compiles vLLM's numba look-up before timing

    def _lookup(self, context: np.ndarray) -> list[int]:
        out = ngram_lookup()(np.asarray(context, dtype=np.int32), self.nmin, self.nmax, self.max_model_len, self.k)
        return [int(x) for x in out]

    def _draft(self, contexts: list[np.ndarray]) -> list[list[int]]:
        """k greedy tokens of the draft model for each context (batched, left-padded)."""
        # deferred: torch takes seconds to import, and only this path needs it
        import torch

        contexts = [np.asarray(c[-DRAFT_WINDOW:], dtype=np.int64) for c in contexts]
        n = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), n), dtype=torch.long)
        for i, c in enumerate(contexts):  # left padding: new tokens append on the right
            ids[i, n - len(c):] = torch.as_tensor(c)
            mask[i, n - len(c):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = []
        with torch.no_grad():
            res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
            for t in range(self.k):
                nxt = res.logits[:, -1].argmax(-1)
                out.append(nxt)
                if t == self.k - 1:
                    break
                mask = torch.cat([mask, torch.ones((len(contexts), 1), dtype=torch.long)], dim=1)
                pos = pos[:, -1:] + 1
                res = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                                 past_key_values=res.past_key_values, use_cache=True)
        return torch.stack(out, dim=1).tolist()

    def propose(self, sampled_token_ids: list, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Optional[Any] = None, **kwargs) -> list[list[int]]:
        """One draft per row: ``[]`` for rows that sampled nothing this step (prefill chunks)."""
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        need, contexts = [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not len(sampled):
                continue
            n = int(num_tokens_no_spec[i])
            room = min(self.k, self.max_model_len - n)
            if room <= 0:
                continue
            ctx = token_ids_cpu[i, :n]
            d = self._lookup(ctx)[:room]
            if d:
                drafts[i] = d
                self.stats["rows_ngram"] += 1
            else:
                need.append((i, room))
                contexts.append(ctx)
        if contexts:
            for (i, room), d in zip(need, self._draft(contexts)):
                drafts[i] = d[:room]
            self.stats["rows_draft"] += len(contexts)
        self.stats["steps"] += 1
        return drafts


class ProposeNothing:
    """Drafts nothing, ever: the fixed cost of vLLM's ``custom_class`` path (synchronous V1 runner) over no SD,
    without any look-up or replay hook (the hook-off control, ``configs/h200_hookoff.yaml``)."""

    def __init__(self, vllm_config: Any):
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: list, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Optional[Any] = None) -> list[list[int]]:
        """An empty draft for every row."""
        return [[] for _ in sampled_token_ids]


class ProposeZeros:
    """Drafts ``n`` zeros every step (``speculator_options={"n": n}`` on vLLM >= 0.34; default K): with the
    pinned target (greedy token always 0) exactly ``n`` are accepted. A calibration of the custom-proposer path,
    and on vLLM 0.34 of ragged drafts through adaptive verification (gpu/smoke_034.py, check custom_adaptive)."""

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        opts = getattr(spec, "speculator_options", None) or {}
        self.n = min(int(opts.get("n", self.k)), self.k)

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: list, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Optional[Any] = None) -> list[list[int]]:
        """``[0] * n`` for every row that sampled a token, ``[]`` for the others."""
        return [[0] * self.n if len(s) else [] for s in sampled_token_ids]
