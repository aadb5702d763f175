"""Self-check of the phase timers: a tiny dummy-weight engine in this process, a few requests timed.

Usage:
    sdlib selfcheck --method eagle     # prints RESULT {json}: the phases seen, their totals, the device
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional

from sdlib.vllm.phase_hooks import RemoteTimers, install_phase_timers

_TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "vocab_size": 4096, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu",
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1}
#: Dummy-weight drafters for the self-check (head_dim 64 runs on the CPU build and FA3).
_DRAFTERS = {
    "draft_model": dict(_TINY, hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1),
    "eagle": dict(_TINY, num_hidden_layers=1, architectures=["EagleLlamaForCausalLM"]),
    "eagle3": dict(_TINY, num_hidden_layers=1, architectures=["LlamaForCausalLMEagle3"],
                   eagle_aux_hidden_state_layer_ids=[1, 2, 3], target_hidden_size=256),
}


def self_check(method: str = "draft_model", k: int = 3, num_prompts: int = 4, max_tokens: int = 24,
               enforce_eager: Optional[bool] = None, remote: bool = False) -> dict[str, Any]:
    """Build a tiny dummy-weight engine *in this process*, time a few requests, return what was seen.

    ``method``: none, ngram, draft_model, eagle or eagle3. On a GPU CUDA graphs stay on (unless
    ``enforce_eager``), so the graph-replay paths are the ones timed. Returns ``{"rows": collect(),
    "describe": describe(), "tokens": output tokens, "device": ...}``.
    """
    if remote:  # the timers go into the engine's worker processes (the tensor-parallel path)
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # deferred: torch takes seconds to import, and only this path needs it
    import torch
    from vllm import LLM, SamplingParams

    gpu = torch.cuda.is_available()
    tmp = tempfile.mkdtemp(prefix="sdlib-breakdown-")
    paths = {}
    for name, cfg in (("target", _TINY), *(_DRAFTERS.items())):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        paths[name] = d
    spec = None
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    elif method in _DRAFTERS:
        spec = {"method": method, "model": paths[method], "num_speculative_tokens": k}
    elif method != "none":
        raise ValueError(f"method: {method!r} is not one of none, ngram, {', '.join(_DRAFTERS)}")
    kw: dict[str, Any] = dict(model=paths["target"], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                              max_model_len=1024, max_num_seqs=max(num_prompts, 1), seed=0,
                              gpu_memory_utilization=0.3 if gpu else 0.2,
                              enforce_eager=(not gpu) if enforce_eager is None else enforce_eager)
    if spec:
        kw["speculative_config"] = spec
    llm = LLM(**kw)
    timers = RemoteTimers(llm) if remote else install_phase_timers(llm)
    prompts = [{"prompt_token_ids": [5 + (i * 7 + j) % 50 for j in range(32 + 8 * i)]} for i in range(num_prompts)]
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], sp, use_tqdm=False)  # warm-up, not timed
    timers.reset()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    return {"rows": timers.collect(), "describe": timers.describe(),
            "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "device": torch.cuda.get_device_name(0) if gpu else "cpu"}
