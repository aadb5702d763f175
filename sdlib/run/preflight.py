"""Everything checked before any engine starts: model folders and their limits, drafters of the right kind,
tokenizers, engine arguments vLLM knows, and the workloads' data. Each problem is a :class:`ConfigError`
of one line naming the field (``sdlib validate`` and ``sdlib sweep`` exit 2 on it).

Usage:
    from sdlib.run.preflight import preflight
    preflight(sweep)      # raises ConfigError("models.0.max_model_len: ...") on the first problem
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import socket
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Optional

from sdlib.config import ConfigError, SweepConfig, hub_revision
from sdlib.models.shapes import SHAPES, write_shape
from sdlib.paths import REPO_ROOT, hf_hub_cache, hub_repo_cache, resolve
from sdlib.vllm.compat import engine_arg_names
from sdlib.vllm.options import (check_options, cpu_kv_budget_bytes, cpu_kv_env_error, cpu_kv_explicit_bytes,
                                 cpu_kv_setting, engine_fields, is_cpu_build, kv_bytes_per_token, node_memory_bytes,
                                 speculative_fields, tp_split_error)
from sdlib.workloads.datasets import HUB_SOURCES, PACKAGE_SOURCES, SHAREGPT_DATASETS, SHAREGPT_HUB

#: seconds to wait for the Hugging Face Hub when a model is a hub id not in the local cache
HUB_TIMEOUT_S = 0.5


def _is_local(path: str) -> bool:
    return path.startswith(("@", ".", "/", "~")) or resolve(path).exists()


def _config(path: str) -> Optional[dict]:
    p = resolve(path) / "config.json"
    try:
        return json.loads(p.read_text()) if p.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _in_hf_cache(repo_id: str) -> bool:
    return hub_repo_cache(repo_id).is_dir()


def _resolve_hub_revision(field: str, repo_id: str) -> None:
    """Fetch ``repo_id``'s config.json into the Hub cache, which records the commit its main branch is at, so
    the cells' run ids carry the revision (:func:`sdlib.config.model_fingerprint`) before anything runs."""
    try:
        # deferred: huggingface_hub is slow to import, and only this path needs it
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id, allow_patterns=["config.json"])
    except Exception as err:  # noqa: BLE001 - gated, missing, network: one line
        raise ConfigError(f"{field}: {repo_id!r} could not be fetched from the Hugging Face Hub "
                          f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None


def hub_reachable() -> bool:
    """False when offline mode is set or huggingface.co cannot be reached within :data:`HUB_TIMEOUT_S`."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=HUB_TIMEOUT_S):
            return True
    except OSError:
        return False


def _check_model(field: str, path: str) -> Optional[dict]:
    if path.startswith("@shapes/"):
        name = path[len("@shapes/"):]
        if name not in SHAPES:
            raise ConfigError(f"{field}: unknown shape {name!r} (known: {', '.join(sorted(SHAPES))})")
        write_shape(name)
    if _is_local(path):
        p = resolve(path)
        if not p.exists():
            hint = " (build them: sdlib models)" if path.startswith("@models/") else ""
            raise ConfigError(f"{field}: {p} does not exist{hint}")
        cfg = _config(path)
        if cfg is None:
            raise ConfigError(f"{field}: {p} has no readable config.json")
        return cfg
    if hub_revision(path) is None:
        if not hub_reachable():
            if not _in_hf_cache(path):
                raise ConfigError(f"{field}: {path!r} is neither a local folder nor in the Hugging Face cache, and "
                                  "the Hub is unreachable (offline)")
        else:
            _resolve_hub_revision(field, path)
    return None


def _check_proposer_class(field: str, dotted: str) -> None:

    module, _, name = dotted.rpartition(".")
    if str(REPO_ROOT) not in sys.path:  # the engine's worker has the repo root on its path (sdlib.run.sweep)
        sys.path.append(str(REPO_ROOT))
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import-time failure of a user's module is a config error here
        raise ConfigError(f"{field}: cannot import {module!r} for the proposer class {dotted!r} "
                          f"({type(e).__name__}: {e})") from None
    if not isinstance(getattr(mod, name, None), type):
        raise ConfigError(f"{field}: {module!r} has no class {name!r}")


def _max_len(cfg: dict) -> Optional[int]:
    n = cfg.get("max_position_embeddings")
    if not isinstance(n, int):
        return None
    rope = cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind in ("linear", "dynamic", "yarn") and isinstance(rope.get("factor"), (int, float)):
        n = int(n * rope["factor"])
    return n


def _is_eagle_head(cfg: dict) -> bool:
    arch = " ".join(cfg.get("architectures") or [])
    return "Eagle" in arch or "eagle_aux_hidden_state_layer_ids" in cfg or \
        (cfg.get("num_hidden_layers") == 1 and cfg.get("model_type") in ("llama", "eagle"))


def preflight(sweep: SweepConfig) -> None:
    """Check what can be checked without an engine; raise ConfigError on the first problem."""

    _check_results_folder(sweep.out_dir)
    model_cfgs: dict[int, dict] = {}
    for i, m in enumerate(sweep.models):
        cfg = _check_model(f"models.{i}.path", m.path)
        if cfg is not None:
            model_cfgs[i] = cfg
            limit = _max_len(cfg)
            if limit is not None and m.max_model_len > limit:
                raise ConfigError(f"models.{i}.max_model_len: {m.max_model_len} exceeds the model's "
                                  f"{limit} (config.json max_position_embeddings)")
            split = tp_split_error(cfg, m.tensor_parallel_size)
            if split:
                raise ConfigError(f"models.{i}.tensor_parallel_size: {m.tensor_parallel_size} cannot shard this "
                                  f"model: {split} (vLLM refuses it); choose a size that does")
        if m.tokenizer and _is_local(m.tokenizer) and not resolve(m.tokenizer).exists():
            raise ConfigError(f"models.{i}.tokenizer: {resolve(m.tokenizer)} does not exist")
    for i, me in enumerate(sweep.methods):
        _check_spec_options(f"methods.{i}", me)
        if not me.model:
            continue
        if me.spec.model == "class":  # a proposer class, not a model: it must import here as in the engine's worker
            _check_proposer_class(f"methods.{i}.model", me.model)
            continue
        cfg = _check_model(f"methods.{i}.model", me.model)
        if cfg is None:
            continue
        head = _is_eagle_head(cfg)
        if me.spec.is_head and not head:
            raise ConfigError(f"methods.{i}.model: {me.model} is a full model "
                              f"({cfg.get('num_hidden_layers')} layers, {cfg.get('architectures')}), not an "
                              f"{me.name.upper()} head (use name: draft_model for a draft model)")
        if me.spec.model == "eagle3_head" and "Eagle3" not in " ".join(cfg.get("architectures") or []) and \
                "eagle_aux_hidden_state_layer_ids" not in cfg:
            raise ConfigError(f"methods.{i}.model: {me.model} is not an EAGLE-3 head (architectures "
                              f"{cfg.get('architectures')}; an EAGLE-1 head needs name: eagle)")
        if me.spec.model == "draft" and head:
            raise ConfigError(f"methods.{i}.model: {me.model} is an EAGLE head, not a draft model "
                              "(use name: eagle or eagle3)")
    known = engine_arg_names()
    if known is not None:
        bad = sorted(set(sweep.engine.extra) - known)
        if bad:
            raise ConfigError(f"engine.extra: {bad} are not vLLM engine arguments (see vllm.engine.arg_utils."
                              "EngineArgs)")
    _check_engine_extra(sweep)
    for j, wl in enumerate(sweep.workloads):
        for i, m in enumerate(sweep.models):
            if wl.max_output_tokens >= m.max_model_len:
                raise ConfigError(f"workloads.{j}.max_output_tokens: {wl.max_output_tokens} leaves no room for a "
                                  f"prompt in models.{i}.max_model_len {m.max_model_len}")
        _check_workload(f"workloads.{j}", wl, sweep, model_cfgs)
    _check_batch_capacity(sweep, model_cfgs)


#: ``vllm.LLM`` arguments sdlib sets from its own fields (``engine.extra`` may not set them): where to set each.
SET_BY_SDLIB = {"model": "models.N.path", "tokenizer": "models.N.tokenizer", "dtype": "models.N.dtype",
                "tensor_parallel_size": "models.N.tensor_parallel_size", "load_format": "models.N.load_format",
                "max_model_len": "models.N.max_model_len", "skip_tokenizer_init": "models.N.skip_tokenizer_init",
                "gpu_memory_utilization": "engine.gpu_memory_utilization", "enforce_eager": "engine.enforce_eager",
                "max_num_seqs": "engine.max_num_seqs", "enable_prefix_caching": "engine.enable_prefix_caching",
                "speculative_config": "methods", "seed": "seed",
                "disable_log_stats": "nothing: sdlib needs vLLM's statistics for its counters"}


def _check_engine_extra(sweep: SweepConfig) -> None:
    """``engine.extra``: no argument sdlib sets itself, and every value one vLLM's EngineArgs would take."""

    for k in sweep.engine.extra:
        if k in SET_BY_SDLIB:
            raise ConfigError(f"engine.extra.{k}: sdlib sets it; set {SET_BY_SDLIB[k]} instead")
    problem = check_options(sweep.engine.extra, engine_fields(), "engine argument")
    if problem:
        raise ConfigError(f"engine.extra.{problem}" if not problem.startswith("'") else f"engine.extra: {problem}")


def _check_spec_options(field: str, me) -> None:
    """A method's ``options``: names and values the installed vLLM's SpeculativeConfig takes (no engine)."""

    if me.vllm_options:  # those sdlib acts on itself (confidence_stop) are checked by the config
        problem = check_options(me.vllm_options, speculative_fields(), "speculative option")
        if problem:
            raise ConfigError(f"{field}.options: {problem}")
    if me.name == "ngram":
        spec = me.speculative_config() or {}
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            raise ConfigError(f"{field}.options: prompt_lookup_min {lo} is above prompt_lookup_max {hi}")


def _check_results_folder(out: "os.PathLike[str]") -> None:
    """The results folder can be made and written: its nearest existing folder is a folder, writable."""

    out = Path(out)
    q = next((p for p in [out, *out.parents] if p.exists() or p.is_symlink()), None)
    if q is None:
        return
    if not q.is_dir():
        raise ConfigError(f"results_dir: {q} is a file, not a folder (results would go to {out}); set results_dir "
                          "or --results-dir to a folder")
    if not os.access(q, os.W_OK | os.X_OK):
        try:
            ro = bool(os.statvfs(q).f_flag & os.ST_RDONLY)
        except OSError:
            ro = False
        raise ConfigError(f"results_dir: cannot write in {q} ({'read-only file system' if ro else 'permission denied'}); "
                          "set results_dir or --results-dir to a writable folder")


def _longest_batch(sweep: SweepConfig) -> list[tuple[int, object, int, int]]:
    """Per (model, engine): (model index, method, largest batch size) of its cells."""
    out: dict[tuple, list] = {}
    for c in sweep.cells():
        i = next(j for j, m in enumerate(sweep.models) if m.name == c.model.name)
        rec = out.setdefault(c.group, [i, c.method, 0])
        rec[2] = max(rec[2], c.batch_size)
    return [tuple(v) for v in out.values()]


def _check_batch_capacity(sweep: SweepConfig, model_cfgs: dict[int, dict]) -> None:
    """Every engine can run each of its cells' B requests in one step: max_num_seqs and
    max_num_batched_tokens at least B and B x (1 + k), and (CPU build, where the KV cache is a known share of
    memory) room for B requests of at least their output length. A setting that caps the batch below B would
    label a smaller batch as B."""

    e = sweep.engine
    for c in sweep.cells():
        if c.batch_mode == "closed_loop" and c.num_requests < c.batch_size:
            j = next(j for j, w in enumerate(sweep.workloads) if w.label == c.workload.label)
            raise ConfigError(f"workloads.{j}.num_requests: {c.num_requests} request(s) cannot keep batch size "
                              f"{c.batch_size} in flight (closed_loop); measure at least {c.batch_size} (or set "
                              "requests_per_slot)")
    if is_cpu_build() and cpu_kv_env_error():
        raise ConfigError(cpu_kv_env_error())
    budget = cpu_kv_budget_bytes(e.gpu_memory_utilization, e.extra)
    explicit = cpu_kv_explicit_bytes(e.extra)
    node = node_memory_bytes() if explicit is not None else None
    if node:
        tp = max(m.tensor_parallel_size for m in sweep.models)  # each worker takes a cache of that size
        if explicit * tp > node:
            each = f" for each of {tp} tensor-parallel workers" if tp > 1 else ""
            raise ConfigError(f"{cpu_kv_setting(e.gpu_memory_utilization, e.extra)} asks for a KV cache of "
                              f"{explicit / 2 ** 30:.1f} GiB{each}, more than this machine's {node / 2 ** 30:.1f} GiB of "
                              "memory (vLLM's CPU build would refuse it or run out of memory filling it); lower it")
    for i, method, B in _longest_batch(sweep):
        if e.max_num_seqs is not None and e.max_num_seqs < B:
            raise ConfigError(f"engine.max_num_seqs: {e.max_num_seqs} is below batch size {B} "
                              f"({method.label}): no engine step could run {B} requests; raise it or leave it unset "
                              "(default: the largest batch size)")
        mbt = e.extra.get("max_num_batched_tokens")
        need = B * (1 + method.k)
        if isinstance(mbt, int) and mbt < need:
            raise ConfigError(f"engine.extra.max_num_batched_tokens: {mbt} is below the {need} tokens one step of "
                              f"batch size {B} verifies with {method.label} (B x (1 + k)); raise it")
        cfg, tp = model_cfgs.get(i), sweep.models[i].tensor_parallel_size
        per_token = kv_bytes_per_token(cfg, sweep.models[i].dtype, str(e.extra.get("kv_cache_dtype", "auto")), tp) \
            if cfg is not None and budget is not None else None
        if per_token:
            shortest = min(1 + w.max_output_tokens for w in sweep.workloads)  # a prompt of >= 1 token + its output
            capacity = budget // per_token
            if B * shortest > capacity:
                raise ConfigError(
                    f"{cpu_kv_setting(e.gpu_memory_utilization, e.extra)} gives the CPU build's KV cache at "
                    f"most {capacity} tokens ({per_token} bytes each for models.{i}"
                    f"{f' in each of its {tp} workers' if tp > 1 else ''}), fewer than the {B * shortest} "
                    f"that {B} requests of {shortest}+ tokens need ({method.label}); raise it or lower the batch size")


def _check_workload(field: str, wl, sweep: Optional[SweepConfig] = None,
                    model_cfgs: Optional[dict[int, dict]] = None) -> None:
    """Local files are read now (format, emptiness, encoding; token ids against each model's vocabulary;
    whether any prompt fits the context), package and hub sources must exist here (they load at run time)."""
    # deferred: sdlib.workloads loads pydantic, and only this path needs it
    from sdlib.workloads import WorkloadError, load_texts

    models = list(enumerate(sweep.models)) if sweep is not None else []
    cfgs = model_cfgs or {}
    if wl.dataset == "custom":
        # deferred: sdlib.workloads.custom loads pydantic, and only this path needs it
        from sdlib.workloads.custom import check_custom_rows

        try:
            rows, _ = check_custom_rows(wl)
        except (WorkloadError, FileNotFoundError) as err:
            raise ConfigError(f"{field}.path: {str(err).splitlines()[0]}") from None
        ids = [r["prompt_token_ids"] for r in rows if "prompt_token_ids" in r]
        texts = [r["prompt"] for r in rows if "prompt_token_ids" not in r]
        budgets = [min(int(r.get("max_output_tokens") or wl.max_output_tokens), wl.max_output_tokens) for r in rows
                   if "prompt_token_ids" in r] + [wl.max_output_tokens] * len(texts)
        _check_prompts(field, wl, models, cfgs, ids, texts, budgets)
        return
    if wl.source in ("reference", "traces"):
        # deferred: sdlib.workloads loads pydantic, and only this path needs it
        from sdlib.workloads import load_trace_prompts

        if wl.source == "traces" and not resolve(wl.path).exists():
            raise ConfigError(f"{field}.path: {resolve(wl.path)} does not exist")
        try:
            prompts = load_trace_prompts(wl)
        except WorkloadError as err:
            raise ConfigError(f"{field}: {str(err).splitlines()[0]}") from None
        _check_prompts(field, wl, models, cfgs, [p.prompt_token_ids for p in prompts], [],
                       [p.max_output_tokens or wl.max_output_tokens for p in prompts])
        return
    if wl.source == "local" or (wl.source == "auto" and wl.path and resolve(wl.path).exists()):
        if not wl.path:
            raise ConfigError(f"{field}.path: source local needs a path")
        if not resolve(wl.path).exists():
            raise ConfigError(f"{field}.path: {resolve(wl.path)} does not exist")
        try:
            texts = load_texts(wl)
            if not texts:
                raise ConfigError(f"{field}.path: no usable prompts in {resolve(wl.path)}")
        except WorkloadError as err:
            raise ConfigError(f"{field}.path: {str(err).splitlines()[0]}") from None
        _check_prompts(field, wl, models, cfgs, [], [t for _, t, _ in texts], [wl.max_output_tokens] * len(texts))
        return
    _check_remote_source(field, wl)


def _check_remote_source(field: str, wl) -> None:
    """A package or hub source that cannot load here fails now, not after an engine started."""

    pkg = PACKAGE_SOURCES.get(wl.dataset)
    pkg_ok = pkg is not None and find_spec(pkg.split(".")[0]) is not None
    if wl.source == "package":
        if pkg is None:
            raise ConfigError(f"{field}.source: no package ships {wl.dataset!r} (packages exist for "
                              f"{sorted(PACKAGE_SOURCES)}); give a local file with path")
        if not pkg_ok:
            raise ConfigError(f"{field}.source: the package for {wl.dataset!r} ({pkg}) is not installed")
        return
    if wl.source == "auto" and pkg_ok:
        return
    hub = wl.dataset in HUB_SOURCES or wl.dataset in SHAREGPT_DATASETS
    if wl.source == "hub" and not hub:
        raise ConfigError(f"{field}.source: {wl.dataset!r} has no Hub source")
    if hub and not hub_reachable() and not _hub_dataset_cached(wl.dataset):
        raise ConfigError(f"{field}: {wl.dataset!r} would come from the Hugging Face Hub, which is unreachable "
                          "(offline) and has no copy cached here; give a local file with path")
    if not hub:
        raise ConfigError(f"{field}: {wl.dataset!r} has no source here; give a local file with path")


def _hub_dataset_cached(dataset: str) -> bool:

    repo = SHAREGPT_HUB["repo_id"] if dataset in SHAREGPT_DATASETS else HUB_SOURCES[dataset]["path"]
    hub = hf_hub_cache()
    ds_cache = Path(os.environ.get("HF_DATASETS_CACHE", hub.parent / "datasets"))
    return (hub / ("datasets--" + repo.replace("/", "--"))).is_dir() or \
        any(ds_cache.glob(repo.replace("/", "___") + "*"))


def _check_prompts(field: str, wl, models, cfgs: dict[int, dict], ids: list[list[int]], texts: list[str],
                   budgets: list[int]) -> None:
    """Token ids inside every model's vocabulary; at least one prompt that fits each model's context (token-id
    prompts exactly; text prompts by a lower bound on their length, their text tokenized without the chat
    template), and within ``max_prompt_tokens``."""
    for i, m in models:
        vocab = (cfgs.get(i) or {}).get("vocab_size")
        if isinstance(vocab, int) and ids:
            top = max(max(x) for x in ids)
            if top >= vocab:
                raise ConfigError(f"{field}.path: token id {top} is outside models.{i}'s vocabulary "
                                  f"(vocab_size {vocab}, config.json)")
        lengths = [len(x) for x in ids] + _text_lengths(m, texts)
        if not lengths:
            continue
        limit = wl.max_prompt_tokens
        fits = [n + b <= m.max_model_len and (limit is None or n <= limit) for n, b in zip(lengths, budgets)]
        if not any(fits):
            shortest = min(lengths)
            why = f"max_prompt_tokens {limit}" if limit is not None and shortest > limit else \
                f"models.{i}.max_model_len {m.max_model_len} with max_output_tokens {wl.max_output_tokens}"
            raise ConfigError(f"{field}: none of the {len(lengths)} prompts fits {why} (the shortest has "
                              f"{'at least ' if texts else ''}{shortest} tokens)")


def _text_lengths(model, texts: list[str]) -> list[int]:
    """A lower bound on each text prompt's length in tokens (the model's tokenizer.json, no chat template; a
    margin of 2 for merges at the template's edges); empty when the tokenizer is not a local file."""
    if not texts:
        return []
    tok = resolve(model.tokenizer or model.path) / "tokenizer.json"
    if not tok.is_file():
        return []
    try:
        t = _tokenizer(str(tok))
        return [max(0, len(e.ids) - 2) for e in t.encode_batch(texts, add_special_tokens=False)]
    except Exception:  # noqa: BLE001 - a tokenizer this cannot read: leave it to the engine
        return []


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    # deferred: tokenizers is slow to import, and only this path needs it
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)
