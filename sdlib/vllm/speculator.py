"""sdlib's host-side proposers on vLLM >= 0.34, which removed the ``custom_class`` method.

vLLM 0.26-0.33 built a user proposer from ``speculative_config={"method": "custom_class", "model":
"pkg.mod.Class"}`` (``vllm/v1/spec_decode/custom_class_proposer.py``) and called its host-side
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)`` from the V1 model
runner. vLLM 0.34 runs speculative decoding only in the V2 model runner (``vllm/v1/worker/gpu/``) and takes
out-of-tree speculators through ``register_speculative_method(name, SpeculatorConfig subclass)``
(``vllm/v1/worker/gpu/spec_decode/speculator_config.py``) whose ``speculator_class`` is a ``BaseSpeculator``
(``.../spec_decode/speculator.py``: ``propose(input_batch, ...) -> [num_reqs, K]`` draft tokens on the GPU).

This module is that adapter: method :data:`METHOD` (``sdlib_custom``), options ``speculator_options={"proposer":
"pkg.mod.Class", "pad": "last" | int}``. Every step it copies the batch's token history to the host (one
synchronisation, as the old synchronous path had), calls the proposer with the old arguments, and writes the
drafts to the GPU. vLLM 0.34 verifies K tokens for every row (the V2 runner has no ragged drafts), so a row
that drafts fewer is padded with ``pad``: the row's last token (vLLM 0.34's own n-gram speculator pads that
way, ``ngram/speculator.py``) or a fixed token id (a replay with the pinned target, whose greedy token is always
0, pads with 1: always rejected). With ``enable_adaptive_verification`` the padded slots get confidence 0 and
real drafts 1 (``draft_token_confidence_probs``, read by ``adaptive_verification.py:record_confidences``), so
vLLM's budget can leave the padding unverified. vLLM chooses a step's budget (how many slots) from the
confidences of the step before, so a proposer whose lengths change from step to step gets the previous step's
count (a replay corrects for it: :func:`sdlib.vllm.replay.av_confidences`).

The method is registered by :func:`sdlib.vllm.plugin.register`, a vLLM general plugin (entry point
``vllm.general_plugins``), so that the engine-core and worker processes know it too; :mod:`sdlib.vllm.compat`
turns sdlib's ``custom_class`` configs into this method on vLLM >= 0.34.

Usage (vLLM >= 0.34):
    LLM(..., speculative_config={"method": "sdlib_custom", "num_speculative_tokens": 3,
                                 "speculator_options": {"proposer": "sdlib.vllm.proposers.ProposeNothing"}})
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import numpy as np
import torch

from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

#: The registered method name (sdlib.vllm.plugin registers it).
METHOD = "sdlib_custom"


class SdlibCustomSpeculatorConfig(SpeculatorConfig):
    """No draft checkpoint (the base class's ``configure`` points the draft config at the target's)."""

    base_method = None
    speculator_class = "sdlib.vllm.speculator.HostProposerSpeculator"
    supported_options = frozenset({"speculator_options"})
    # the host copy reads rows of all_token_ids; dense GPU history makes that one gather (as vLLM's n-gram)
    prefer_dense_token_history = True
    # confidences come from the proposer (1 = drafted, 0 = padding), not from draft logits
    adaptive_verification_uses_draft_logits = False


def _load_class(qualname: str):
    mod, _, name = qualname.rpartition(".")
    if not mod:
        raise ValueError(f"speculator_options.proposer must be 'pkg.module.Class', got {qualname!r}")
    return getattr(importlib.import_module(mod), name)


class HostProposerSpeculator(BaseSpeculator):
    """Calls a host-side sdlib proposer each step (module docstring)."""

    def __init__(self, vllm_config: Any, device: torch.device, req_states: Any):
        spec = vllm_config.speculative_config
        opts = dict(spec.speculator_options or {})
        if "proposer" not in opts:
            raise ValueError("method sdlib_custom needs speculator_options={'proposer': 'pkg.module.Class'}")
        self.vllm_config = vllm_config
        self.device = device
        self.req_states = req_states
        self.k = int(spec.num_speculative_tokens)
        self.pad = opts.get("pad", "last")
        self.proposer = _load_class(opts["proposer"])(vllm_config)
        load = getattr(self.proposer, "load_model", None)
        if callable(load):
            load()
        self.max_num_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.drafts = torch.zeros((self.max_num_reqs, self.k), dtype=torch.int64, device=device)
        self.enable_adaptive_verification = bool(getattr(spec, "enable_adaptive_verification", False))
        self.draft_token_confidence_probs = torch.ones((self.max_num_reqs, self.k), dtype=torch.float32,
                                                       device=device)
        self.stats = {"steps": 0, "rows": 0, "drafted": 0, "padded": 0}

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        del cudagraph_mode  # host-side: nothing to capture

    def capture(self) -> None:
        return None

    @torch.inference_mode()
    def propose(self, input_batch: Any, attn_metadata: Any, slot_mappings: Any, last_hidden_states: Any,
                aux_hidden_states: Any, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                last_sampled: torch.Tensor, next_prefill_tokens: Any, temperature: Any, seeds: Any,
                dp_sync_state: Any = None, dummy_run: bool = False, skip_attn_for_dummy_run: bool = False,
                mm_inputs: Any = None, is_profile: bool = False,
                num_speculative_tokens: Optional[int] = None) -> torch.Tensor:
        n = int(input_batch.num_reqs)
        if dummy_run or n == 0:
            return self.drafts[:n]
        rs = self.req_states
        idx = input_batch.idx_mapping[:n]
        total = rs.total_len.gpu[idx].to("cpu", non_blocking=False).numpy().astype(np.int64)
        width = int(total.max()) if n else 0
        tokens = rs.all_token_ids.gpu[idx, :max(width, 1)].to("cpu").numpy()
        sampled = num_sampled[:n].to("cpu").numpy()
        last = last_sampled.view(-1)[idx].to("cpu").numpy()
        # the old interface: one list per row, empty for rows that sampled nothing (prefill chunks)
        sampled_ids = [[int(last[i])] * int(sampled[i]) if sampled[i] > 0 else [] for i in range(n)]
        out = self.proposer.propose(sampled_ids, total, tokens)
        k = self.k if num_speculative_tokens is None else int(num_speculative_tokens)
        host = np.empty((n, self.k), dtype=np.int64)
        conf = np.zeros((n, self.k), dtype=np.float32)
        padded = 0
        for i in range(n):
            d = [int(t) for t in (out[i] if i < len(out) else [])][:k]
            fill = int(last[i]) if self.pad == "last" else int(self.pad)
            host[i, :len(d)] = d
            host[i, len(d):] = fill
            conf[i, :len(d)] = 1.0
            padded += self.k - len(d)
            self.stats["drafted"] += len(d)
        self.stats["steps"] += 1
        self.stats["rows"] += n
        self.stats["padded"] += padded
        self.drafts[:n].copy_(torch.from_numpy(host), non_blocking=False)
        self.draft_token_confidence_probs[:n].copy_(torch.from_numpy(conf), non_blocking=False)
        return self.drafts[:n]
