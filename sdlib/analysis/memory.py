"""Memory overhead of each SD method: extra weights (static) and extra KV cache per token.

* static bytes: the draft model's or EAGLE head's weights -- summed from the tensors in its
  ``*.safetensors`` files when present (header only, nothing is loaded), else computed from its
  ``config.json`` (:func:`sdlib.models.shapes.param_count` for a draft model, :func:`head_param_count`
  for an EAGLE / EAGLE-3 head) x dtype bytes. n-gram adds none.
* KV bytes per token: ``2 (K, V) x layers x kv heads x head dim x dtype bytes``
  (:func:`sdlib.models.shapes.kv_bytes_per_token`) for the target, plus the draft model's (all its
  layers) or the EAGLE head's (its one layer) -- vLLM gives the drafter's attention layers KV
  blocks for every token the target caches.
* capacity: with the same KV memory budget ``B``, capacity = ``B / kv_bytes_per_token``, so the
  predicted capacity ratio of two methods is the inverse ratio of their per-token KV bytes.
  :func:`capacity_table` sets that against ``kv_cache_capacity_tokens`` recorded per engine in a
  sweep's ``provenance.json``. The budget is *not* the same across methods in practice (vLLM sizes
  it from memory left after weights, activations, and on the CPU build the whole process's RSS),
  so the table also gives the budget each engine implies (capacity x predicted bytes/token).

Checks (hand-computed, bf16): Llama-3.1-8B 2x32x8x128x2 = 131072 B/token; + EAGLE head (one
layer) 4096 B = +3.1%; Qwen3-8B 147456 B/token, + Qwen3-0.6B draft 114688 B -> 1.78x.

Usage:
    from sdlib.analysis.memory import memory_table, paper_setups, capacity_table
    memory_table(paper_setups())                    # static + KV bytes per method, paper shapes
    capacity_table(SweepStore(d).read_provenance())  # measured vs predicted KV capacity
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from sdlib.core.registry import METHODS, method_spec
from sdlib.paths import TRAINED_MODELS_DIR, resolve
from sdlib.models.shapes import SHAPES, kv_bytes_per_token, param_count

DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1}


def dtype_bytes(dtype: Optional[str], cfg: Optional[dict] = None, default: int = 2) -> int:
    """Bytes per element of a vLLM dtype string; ``auto``/None -> the config's ``torch_dtype``/``dtype``."""
    if dtype in (None, "", "auto") and cfg:
        dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    return DTYPE_BYTES.get(str(dtype).lower().replace("torch.", ""), default) if dtype else default


# weights ------------------------------------------------------------------------------------------
_ST_DTYPE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
             "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors_bytes(path: str | os.PathLike[str]) -> Optional[int]:
    """Bytes of all tensors in a ``.safetensors`` file or a folder's ``*.safetensors`` (None if none).

    Reads only each file's JSON header (data offsets), so it costs nothing for large models.
    """
    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else ([p] if p.suffix == ".safetensors" else [])
    files = [f for f in files if f.is_file()]
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            total += int(b) - int(a)
    return total


def head_param_count(cfg: dict, kind: str = "eagle", share_embeddings: bool = True) -> int:
    """Parameters of an EAGLE (``kind="eagle"``) or EAGLE-3 (``"eagle3"``) head as vLLM builds it.

    EAGLE-1 (``llama_eagle.py``): per layer q, k, v, o, MLP and the post-attention norm (the first
    layer has no input norm), plus ``fc``: 2h -> h; no final norm; the target's lm_head is used.
    EAGLE-3 (``llama_eagle3.py``): the layer's q/k/v read 2h (embedding + hidden), input, hidden
    and post-attention norms; ``fc``: (3 x target hidden) -> h; final norm; its own lm_head of
    ``draft_vocab_size`` rows. The d2t/t2d maps are buffers (not counted; a few hundred KB).
    ``share_embeddings``: vLLM shares the target's token embedding with the head (counted 0);
    False adds ``vocab x h`` for a checkpoint whose embedding is kept separately.
    """
    h, i, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    if kind == "eagle3":
        qkv_in = 2 * h
        n_aux = len(cfg.get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
        th = cfg.get("target_hidden_size") or h
        layer = qkv_in * nh * hd + 2 * qkv_in * nkv * hd + nh * hd * h + 3 * h * i + 3 * h
        n = L * layer + n_aux * th * h + h + cfg.get("draft_vocab_size", cfg["vocab_size"]) * h
    elif kind == "eagle":
        layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * i + h
        n = L * layer + 2 * h * h
    else:
        raise ValueError(f"kind: {kind!r} is not eagle or eagle3")
    return n + (0 if share_embeddings else cfg["vocab_size"] * h)


def head_kind(method: str, cfg: Optional[dict] = None) -> Optional[str]:
    """``eagle`` / ``eagle3`` for an EAGLE method (from the method's registry entry, else the architecture)."""
    if method in METHODS and METHODS[method].head_kind:
        return METHODS[method].head_kind
    archs = " ".join((cfg or {}).get("architectures") or [])
    if "Eagle3" in archs:
        return "eagle3"
    if "Eagle" in archs:
        return "eagle"
    return None


def load_config(path: str | os.PathLike[str] | None) -> Optional[dict]:
    """A model folder's ``config.json`` (``@models/...``, ``@shapes/...`` or a path); a shape name
    from :data:`sdlib.models.shapes.SHAPES` also works. None when not found (e.g. a hub id)."""
    if not path:
        return None
    s = str(path)
    name = s.split("/", 1)[1] if s.startswith("@shapes/") else s
    p = resolve(s)
    f = p / "config.json" if p.is_dir() else p
    if f.is_file() and f.name.endswith(".json"):
        return json.loads(f.read_text())
    return dict(SHAPES[name]) if name in SHAPES else None


# per method ---------------------------------------------------------------------------------------
@dataclass
class Setup:
    """One (target, method, draft) to tabulate. ``*_dir``: a folder whose safetensors give the bytes."""

    target: str
    method: str  # none, ngram, draft_model, eagle, eagle3
    target_cfg: dict
    draft: str = ""
    draft_cfg: Optional[dict] = None
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    target_dir: Optional[str] = None
    draft_dir: Optional[str] = None
    note: str = ""
    share_embeddings: bool = True


def weight_bytes(cfg: dict, role: str, dtype_b: int, folder: Optional[str] = None,
                 share_embeddings: bool = True) -> tuple[int, str]:
    """(bytes, source) of a model's weights: safetensors in ``folder`` if any, else from the config."""
    if folder:
        b = safetensors_bytes(resolve(folder))
        if b is not None:
            return b, "safetensors"
    kind = head_kind(role, cfg)
    n = head_param_count(cfg, kind, share_embeddings) if kind else param_count(cfg)
    return n * dtype_b, "config"


def method_memory(s: Setup) -> dict[str, Any]:
    """Static and per-token KV bytes of one setup (one table row; see the module docstring)."""
    wb = dtype_bytes(s.dtype, s.target_cfg)
    kvb = dtype_bytes(s.kv_cache_dtype, None, wb) if s.kv_cache_dtype not in ("auto", None) else wb
    tw, tsrc = weight_bytes(s.target_cfg, "target", wb, s.target_dir)
    kv_t = kv_bytes_per_token(s.target_cfg, kvb)
    static, src, kv_d = 0, "none", 0
    spec = method_spec(s.method)
    if spec.model_drafter:
        if s.draft_cfg is None:
            static, src, kv_d = np.nan, "unknown", np.nan
        else:
            role = head_kind(s.method, s.draft_cfg) or "draft_model"
            static, src = weight_bytes(s.draft_cfg, role, wb, s.draft_dir, s.share_embeddings)
            kv_d = kv_bytes_per_token(s.draft_cfg, kvb)
    elif spec.takes_model:  # a drafter whose size the config does not say (MTP layers, a user's class)
        static, src, kv_d = np.nan, "unknown", np.nan
    kv = kv_t + kv_d
    return {
        "target": s.target, "method": s.method, "draft": s.draft, "note": s.note,
        "dtype_bytes": wb, "kv_dtype_bytes": kvb,
        "target_weight_bytes": tw, "target_weight_source": tsrc,
        "static_bytes": static, "static_source": src, "static_frac_of_target": static / tw,
        "kv_bytes_per_token_target": kv_t, "kv_bytes_per_token_draft": kv_d, "kv_bytes_per_token": kv,
        "kv_ratio": kv / kv_t, "kv_overhead_frac": kv_d / kv_t,
        "predicted_capacity_ratio": kv_t / kv,
    }


def memory_table(setups: list[Setup]) -> pd.DataFrame:
    """One row per setup: static bytes, KV bytes per token, their ratios to the target alone."""
    return pd.DataFrame([method_memory(s) for s in setups])


# 70B's EAGLE head (yuhuili/EAGLE-LLaMA3-Instruct-70B): one layer of the 70B shape
_EAGLE_LLAMA_3_70B = dict(SHAPES["llama-3-70b"], num_hidden_layers=1, architectures=["EagleLlamaForCausalLM"])
#: The public EAGLE-3 head for Llama-3.1-8B keeps a 32000-token draft vocabulary
#: (its config.json: ``draft_vocab_size: 32000``); the timing shape uses the full vocabulary.
_EAGLE3_PUBLIC_8B = dict(SHAPES["eagle3-llama-3.1-8b"], draft_vocab_size=32000)


def paper_setups() -> list[Setup]:
    """The paper's targets and drafters as config-only shapes (:mod:`sdlib.models.shapes`)."""
    S = SHAPES
    l8, q8, l70 = "llama-3.1-8b", "qwen3-8b", "llama-3-70b"
    return [
        Setup(l8, "none", S[l8]),
        Setup(l8, "ngram", S[l8]),
        Setup(l8, "draft_model", S[l8], "llama-3.2-1b", S["llama-3.2-1b"]),
        Setup(l8, "eagle", S[l8], "eagle-llama-3.1-8b", S["eagle-llama-3.1-8b"]),
        Setup(l8, "eagle3", S[l8], "eagle3-llama-3.1-8b", S["eagle3-llama-3.1-8b"],
              note="lm_head 128k vocab (timing shape)"),
        Setup(l8, "eagle3", S[l8], "eagle3-llama-3.1-8b", _EAGLE3_PUBLIC_8B, note="lm_head 32k vocab (public head)"),
        Setup(q8, "none", S[q8]),
        Setup(q8, "ngram", S[q8]),
        Setup(q8, "draft_model", S[q8], "qwen3-0.6b", S["qwen3-0.6b"]),
        Setup(l70, "none", S[l70]),
        Setup(l70, "eagle", S[l70], "eagle-llama-3-70b", _EAGLE_LLAMA_3_70B),
    ]


def embedded_setups(models_dir: str | os.PathLike[str] = TRAINED_MODELS_DIR) -> list[Setup]:
    """The embedded models (default: the trained ones in data/models), if there; [] otherwise."""
    d = Path(models_dir)
    tcfg = load_config(d / "target")
    if tcfg is None:
        return []
    out = [Setup("tiny-target", "none", tcfg, target_dir=str(d / "target")),
           Setup("tiny-target", "ngram", tcfg, target_dir=str(d / "target"))]
    for method, sub in (("draft_model", "draft"), ("eagle", "eagle"), ("eagle3", "eagle3")):
        cfg = load_config(d / sub)
        if cfg is not None:
            out.append(Setup("tiny-target", method, tcfg, f"tiny-{sub}", cfg, target_dir=str(d / "target"),
                             draft_dir=str(d / sub)))
    return out


# measured capacity --------------------------------------------------------------------------------
#: What each memory table of :func:`memory_tables` holds (figure titles quote it).
MEMORY_TABLES = {"paper_shapes": "paper model shapes (sdlib.models.shapes), bf16, from configs",
                 "embedded": "embedded trained models (data/models), bf16"}


def memory_tables(paper_shapes: bool = True, embedded: bool = True,
                  models_dir: str | os.PathLike[str] = TRAINED_MODELS_DIR) -> dict[str, tuple[pd.DataFrame, str]]:
    """``{"paper_shapes": (table, what), "embedded": (table, what)}``: :func:`memory_table` of the paper's
    shapes and of the embedded trained models (left out, with a note, when there are none)."""
    out = {}
    if paper_shapes:
        out["paper_shapes"] = (memory_table(paper_setups()), MEMORY_TABLES["paper_shapes"])
    if embedded:
        emb = embedded_setups(models_dir)
        if emb:
            out["embedded"] = (memory_table(emb), MEMORY_TABLES["embedded"])
        else:
            print("note: no embedded models in data/models: skipped")
    return out


def _engines(prov: dict) -> list[dict]:
    """Engine entries of every invocation, the latest per (model, method) that has a capacity."""
    seen: dict[tuple, dict] = {}
    for inv in prov.get("invocations", []):
        for e in inv.get("engines", []):
            key = (e.get("model"), e.get("method"))
            if e.get("kv_cache_capacity_tokens") is not None or key not in seen:
                seen[key] = e
    return list(seen.values())


def setup_for_engine(prov: dict, model_name: str, method_label: str) -> Optional[Setup]:
    """Rebuild the (target, method, draft) of a recorded engine from the sweep config in provenance."""
    cfg = prov.get("config", {})
    m = next((m for m in cfg.get("models", []) if m.get("name") == model_name), None)
    meth = next((x for x in cfg.get("methods", []) if (x.get("label") or x.get("name")) == method_label), None)
    if m is None or meth is None:
        return None
    tcfg = load_config(m.get("path"))
    if tcfg is None:
        return None
    extra = (cfg.get("engine") or {}).get("extra") or {}
    dcfg = load_config(meth.get("model")) if meth.get("model") else None
    return Setup(model_name, meth["name"], tcfg, str(meth.get("model") or ""), dcfg, dtype=m.get("dtype", "auto"),
                 kv_cache_dtype=str(extra.get("kv_cache_dtype", "auto")), target_dir=m.get("path"),
                 draft_dir=meth.get("model"))


def capacity_table(prov: dict, sweep: str = "") -> pd.DataFrame:
    """Measured ``kv_cache_capacity_tokens`` per engine vs the capacity predicted from KV bytes.

    Columns: sweep, model, method_label, method, device, vllm_version, capacity_tokens,
    kv_bytes_per_token (predicted; NaN when a config is not readable here),
    implied_kv_budget_bytes (capacity x predicted bytes/token; the whole model's bytes per token, so under
    tensor parallelism the sum over the workers' caches, not one worker's), measured_ratio (capacity / the
    no-SD engine's, same model), predicted_ratio (no-SD bytes/token / this method's: equal
    budgets), ratio_error (measured / predicted - 1), budget_vs_none_bytes (implied budget minus
    the no-SD engine's: ~0 when budgets match; about minus the draft weights on a GPU).
    """
    rows = []
    for e in _engines(prov):
        s = setup_for_engine(prov, e.get("model"), e.get("method"))
        mm = method_memory(s) if s is not None else {}
        cap = e.get("kv_cache_capacity_tokens")
        kv = mm.get("kv_bytes_per_token", np.nan)
        rows.append({
            "sweep": sweep or prov.get("sweep", ""), "model": e.get("model"), "method_label": e.get("method"),
            "method": s.method if s else None, "device": e.get("device"), "vllm_version": e.get("vllm_version"),
            "capacity_tokens": float(cap) if cap is not None else np.nan, "kv_bytes_per_token": kv,
            "static_bytes": mm.get("static_bytes", np.nan),
        })
    cols = ["sweep", "model", "method_label", "method", "device", "vllm_version", "capacity_tokens",
            "kv_bytes_per_token", "static_bytes", "implied_kv_budget_bytes", "measured_ratio", "predicted_ratio",
            "ratio_error", "budget_vs_none_bytes"]
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)
    df["implied_kv_budget_bytes"] = df["capacity_tokens"] * df["kv_bytes_per_token"]
    base = df[df["method"] == "none"].drop_duplicates("model").set_index("model")
    df["measured_ratio"] = df["capacity_tokens"] / df["model"].map(base["capacity_tokens"])
    df["predicted_ratio"] = df["model"].map(base["kv_bytes_per_token"]) / df["kv_bytes_per_token"]
    df["ratio_error"] = df["measured_ratio"] / df["predicted_ratio"] - 1
    df["budget_vs_none_bytes"] = df["implied_kv_budget_bytes"] - df["model"].map(base["implied_kv_budget_bytes"])
    return df[cols]


def memory_summary(mt: pd.DataFrame) -> pd.DataFrame:
    """A readable view of :func:`memory_table`: MiB, percentages, bytes/token, ratios."""
    mib = 2.0 ** 20
    return pd.DataFrame({
        "target": mt["target"], "method": mt["method"], "draft / head": mt["draft"], "note": mt["note"],
        "target weights (MiB)": (mt["target_weight_bytes"] / mib).round(1),
        "extra weights (MiB)": (mt["static_bytes"].astype(float) / mib).round(1),
        "extra weights (% of target)": (100 * mt["static_frac_of_target"].astype(float)).round(2),
        "weights from": mt["static_source"],
        "KV B/token, target": mt["kv_bytes_per_token_target"],
        "KV B/token, total": mt["kv_bytes_per_token"],
        "KV per token (x target)": mt["kv_ratio"].astype(float).round(4),
        "predicted capacity (x no SD)": mt["predicted_capacity_ratio"].astype(float).round(4),
    })


def setup_label(row: pd.Series) -> str:
    """``target · method`` and, on a second line, ``draft/head, note`` for a memory-table row."""
    second = ", ".join(str(x) for x in (row.get("draft"), row.get("note")) if x)
    return f"{row['target']} · {row['method']}" + (f"\n{second}" if second else "")
