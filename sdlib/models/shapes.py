"""Config-only model folders of real (paper-scale) shapes, for ``load_format: dummy`` runs.

vLLM builds random weights from ``config.json`` alone, so the timing of
Llama-3.1-8B, a Llama-3.2-1B draft, EAGLE / EAGLE-3 heads, Qwen3-8B and a
Qwen3-0.6B draft can be measured with nothing to download. Timing depends on
shapes, not weight values; acceptance does not (use synthetic acceptance).

Configs follow the public config.json files of those models (as used in
../shared/gpu/vllm_sd_bench.py, checked on vLLM 0.26 on an H200).

Usage:
    python -m sdlib shapes                 # writes .cache/shapes/<name>/config.json
    model path in a sweep: "@shapes/llama-3.1-8b"
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sdlib.paths import CACHE_DIR

SHAPES_DIR = CACHE_DIR / "shapes"

LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 128000, "eos_token_id": 128001,
}
LLAMA_3_2_1B = dict(LLAMA_3_1_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    head_dim=64, tie_word_embeddings=True,
                    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
# EAGLE-1 head for Llama-3.1-8B: one decoder layer (vLLM renames it EagleLlamaForCausalLM)
EAGLE_LLAMA_3_1_8B = dict(LLAMA_3_1_8B, num_hidden_layers=1)
# EAGLE-3 head (draft vocab = full vocab, so the dummy-zero d2t map is the identity)
EAGLE3_LLAMA_3_1_8B = dict(LLAMA_3_1_8B, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1)
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "attention_bias": False, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 151643, "eos_token_id": 151645,
}
QWEN3_0_6B = dict(QWEN3_8B, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, tie_word_embeddings=True)
LLAMA_3_70B = dict(LLAMA_3_1_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                   num_attention_heads=64, rope_scaling=None, max_position_embeddings=8192)
# EAGLE-1 head for Llama-3-70B (yuhuili/EAGLE-LLaMA3-Instruct-70B's shape: one decoder layer of the 70B dims)
EAGLE_LLAMA_3_70B = dict(LLAMA_3_70B, num_hidden_layers=1)

SHAPES: dict[str, dict] = {
    "llama-3.1-8b": LLAMA_3_1_8B,
    "llama-3.2-1b": LLAMA_3_2_1B,
    "eagle-llama-3.1-8b": EAGLE_LLAMA_3_1_8B,
    "eagle3-llama-3.1-8b": EAGLE3_LLAMA_3_1_8B,
    "qwen3-8b": QWEN3_8B,
    "qwen3-0.6b": QWEN3_0_6B,
    "llama-3-70b": LLAMA_3_70B,
    "eagle-llama-3-70b": EAGLE_LLAMA_3_70B,
}


def shape_files(name: str) -> dict[str, str]:
    """The files of shape ``name``'s folder: ``config.json``, ``generation_config.json`` and a model card
    (``sdlib_model.json``), as texts. Run ids hash them (:func:`sdlib.config.model_fingerprint`) without writing
    them."""
    if name not in SHAPES:
        raise KeyError(f"shape: {name!r} is not one of {sorted(SHAPES)}")
    cfg = SHAPES[name]
    return {"config.json": json.dumps(cfg, indent=1),
            "generation_config.json": json.dumps({"bos_token_id": cfg["bos_token_id"],
                                                  "eos_token_id": cfg["eos_token_id"]}),
            "sdlib_model.json": json.dumps({
                "name": name, "kind": "shape", "random_weights": True,
                "note": "config only; load_format=dummy builds random weights of the real shape"}, indent=1)}


def write_shape(name: str, root: Path = SHAPES_DIR) -> Path:
    """Write ``<root>/<name>/`` (:func:`shape_files`) for an engine to load; return the folder.

    A file already holding the same text is left alone, and a new text replaces the old one atomically: the
    sweep's supervisor and its workers may call this concurrently (a plain rewrite let a worker read a
    half-written config: seen on the H200).
    """
    texts = shape_files(name)
    d = Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    for fname, text in texts.items():
        f = d / fname
        try:
            if f.read_text() == text:
                continue
        except OSError:
            pass
        tmp = d / f".{fname}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, f)
    return d


def write_all(root: Path = SHAPES_DIR) -> dict[str, Path]:
    return {n: write_shape(n, root) for n in SHAPES}


def param_count(cfg: dict) -> int:
    """Parameters of a dense Llama/Qwen3-style config (embeddings counted once if tied)."""
    h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = h * cfg["num_attention_heads"] * hd
    kv = 2 * h * cfg["num_key_value_heads"] * hd
    o = cfg["num_attention_heads"] * hd * h
    per_layer = q + kv + o + 3 * h * i + 2 * h
    emb = v * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return L * per_layer + emb + h


def kv_bytes_per_token(cfg: dict, dtype_bytes: int = 2) -> int:
    """KV-cache bytes per token: 2 (K and V) x layers x kv heads x head dim x dtype bytes."""
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return kv_bytes(cfg["num_hidden_layers"], cfg["num_key_value_heads"], hd, dtype_bytes)


def kv_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float, tensor_parallel_size: int = 1) -> float:
    """KV-cache bytes one token takes in one worker: 2 (K and V) x layers x the worker's KV heads x head dim x
    dtype bytes. Under tensor parallelism each worker holds ``max(1, kv_heads // tensor_parallel_size)`` heads
    (vLLM's ``ModelConfig.get_num_kv_heads``)."""
    tp = int(tensor_parallel_size or 1)
    heads_here = kv_heads if tp <= 1 else max(1, kv_heads // tp)
    return 2 * layers * heads_here * head_dim * dtype_bytes
