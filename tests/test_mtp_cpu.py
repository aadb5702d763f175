"""MTP (multi-token prediction) through sdlib on the CPU build of vLLM.

No embedded model has MTP layers (the trained target is a Llama). vLLM loads MTP from the
target's own checkpoint, so the check uses a tiny MiMo-architecture target (Qwen2 layers + one
MTP layer, ``MiMoForCausalLM`` -> ``MiMoMTPModel``) with dummy weights: the method runs, and the
per-step sums equal vLLM's counters. Acceptance of random weights means nothing.
"""

from __future__ import annotations

import json
import shutil

import pytest

from sdlib.config import parse_sweep
from sdlib.paths import MODELS_DIR
from sdlib.run.sweep import run_sweep

pytestmark = pytest.mark.engine

TINY_MIMO = {
    "architectures": ["MiMoForCausalLM"], "model_type": "qwen2", "hidden_size": 128, "intermediate_size": 384,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1,
    "use_sliding_window": False,
}


def test_mtp_runs_on_cpu_and_sums_equal_counters(tmp_path):
    from sdlib.models.tinymodels import build_models, read_manifest

    paths = build_models(MODELS_DIR)  # for the tokenizer
    man = read_manifest(MODELS_DIR)
    d = tmp_path / "tiny-mimo"
    shutil.copytree(paths["tokenizer"], d)
    ids = man["special_token_ids"]
    (d / "config.json").write_text(json.dumps({**TINY_MIMO, "vocab_size": man["vocab_size"],
                                               "bos_token_id": ids["bos"], "eos_token_id": ids["eos"]}))
    cfg = parse_sweep({
        "name": "mtp_test", "results_dir": str(tmp_path / "sweeps"),
        "models": [{"path": str(d), "name": "tiny-mimo", "load_format": "dummy", "max_model_len": 512}],
        "methods": [{"name": "mtp", "num_spec_tokens": 1}],
        "workloads": [{"dataset": "humaneval", "source": "package", "num_requests": 4, "max_output_tokens": 16,
                       "max_prompt_tokens": 256, "ignore_eos": True}],
        "batch_sizes": [2], "warmup_requests": 1,
        "engine": {"gpu_memory_utilization": 0.1, "enforce_eager": True},
    })
    store = run_sweep(cfg, quiet=True)
    assert store.failures().empty, store.failures().to_dict("records")
    runs, steps = store.read("runs"), store.read("steps")
    assert len(runs) == 1
    r = runs.iloc[0]
    assert r.counter_num_drafts > 0
    assert int(steps.accepted.sum()) == r.counter_num_accepted_tokens
    assert int(steps.drafted.sum()) == r.counter_num_draft_tokens
