"""Everything checked before any engine starts: model folders and their limits, drafters of the right kind,
tokenizers, engine arguments vLLM knows, and the workloads' data. Each problem is a :class:`ConfigError`
of one line naming the field (``sdlib validate`` and ``sdlib sweep`` exit 2 on it).

Usage:
    from sdlib.run.preflight import preflight
    preflight(sweep)      # raises ConfigError("models.0.max_model_len: ...") on the first problem
"""

from __future__ import annotations

import json
import os
import socket
from typing import Optional

from sdlib.config import ConfigError, SweepConfig, hub_revision
from sdlib.paths import hub_repo_cache, resolve

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
        from sdlib.models.shapes import SHAPES, write_shape

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
    import importlib
    import sys

    from sdlib.paths import REPO_ROOT

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
    from sdlib.vllm.compat import engine_arg_names

    for i, m in enumerate(sweep.models):
        cfg = _check_model(f"models.{i}.path", m.path)
        if cfg is not None:
            limit = _max_len(cfg)
            if limit is not None and m.max_model_len > limit:
                raise ConfigError(f"models.{i}.max_model_len: {m.max_model_len} exceeds the model's "
                                  f"{limit} (config.json max_position_embeddings)")
        if m.tokenizer and _is_local(m.tokenizer) and not resolve(m.tokenizer).exists():
            raise ConfigError(f"models.{i}.tokenizer: {resolve(m.tokenizer)} does not exist")
    for i, me in enumerate(sweep.methods):
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
    for j, wl in enumerate(sweep.workloads):
        _check_workload(f"workloads.{j}", wl)


def _check_workload(field: str, wl) -> None:
    """Local files are read now (format, emptiness); package and hub sources load at run time."""
    from sdlib.workloads import WorkloadError, load_texts

    if wl.dataset == "custom":
        from sdlib.workloads.custom import check_custom_rows

        try:
            check_custom_rows(wl)
        except (WorkloadError, FileNotFoundError) as err:
            raise ConfigError(f"{field}.path: {str(err).splitlines()[0]}") from None
        return
    if wl.source in ("reference", "traces"):
        from sdlib.workloads import load_trace_prompts

        if wl.source == "traces" and not resolve(wl.path).exists():
            raise ConfigError(f"{field}.path: {resolve(wl.path)} does not exist")
        try:
            load_trace_prompts(wl)
        except WorkloadError as err:
            raise ConfigError(f"{field}: {str(err).splitlines()[0]}") from None
        return
    if wl.source == "local" or (wl.source == "auto" and wl.path and resolve(wl.path).exists()):
        if not wl.path:
            raise ConfigError(f"{field}.path: source local needs a path")
        if not resolve(wl.path).exists():
            raise ConfigError(f"{field}.path: {resolve(wl.path)} does not exist")
        try:
            if not load_texts(wl):
                raise ConfigError(f"{field}.path: no usable prompts in {resolve(wl.path)}")
        except WorkloadError as err:
            raise ConfigError(f"{field}.path: {str(err).splitlines()[0]}") from None
