"""Sweep configuration: models x methods x workloads x batch sizes, read from YAML.

Everything is validated before any engine starts; a bad value raises
:class:`ConfigError` with one line naming the field and the allowed values.

Usage:
    from sdlib.config import load_sweep
    sweep = load_sweep("configs/embedded_default.yaml")
    for cell in sweep.cells(): print(cell.run_id)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import (BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator,
                      model_validator)
from pydantic.dataclasses import dataclass

import sdlib.sim.policy  # noqa: F401  (registers the policies a config's replay may name)
from sdlib.core.registry import METHODS as METHOD_SPECS
from sdlib.core.registry import POLICIES as POLICY_SPECS
from sdlib.core.registry import SDLIB_OPTIONS, RegistryError, engine_label, method_spec, replay_names, replay_ref
from sdlib.models.shapes import shape_files
from sdlib.paths import SWEEPS_DIR, hub_repo_cache, repo_relative, resolve, results_base
from sdlib.sim import replay as sim_replay

#: SD methods (:data:`sdlib.core.registry.METHODS`); ``custom`` = a user proposer class (``model:
#: pkg.module.Class``, vLLM's custom_class)
METHODS = tuple(METHOD_SPECS)
#: the paper's datasets, ours (code_edit, sharegpt_summary: sdlib.workloads.codeedit, sdlib.workloads.summary), and
#: ``custom``: a user's own JSONL file (sdlib.workloads.custom)
DATASETS = ("cnn_dailymail", "sharegpt", "instructcoder", "gsm8k", "aime", "gpqa", "humaneval", "code_edit",
            "sharegpt_summary", "custom")
BATCH_MODES = ("closed_loop", "paper")
DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
#: How a sweep's engine groups run (:mod:`sdlib.run.ray_executor`): one after another on this machine, or as
#: tasks on a Ray cluster. How a sweep runs is not what it measures: neither field enters a run id.
EXECUTORS = ("local", "ray")
#: The sweep fields that say how it runs, not what it measures: never in a cell's key, and left out of
#: :meth:`SweepConfig.to_dict` while they hold these defaults (so existing sweeps' provenance does not change).
RUN_FIELDS: dict[str, Any] = {"executor": "local", "ray_address": None}

_STRICT = ConfigDict(extra="forbid")


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("a boolean is not a number")
    return v


#: a number field that refuses booleans (YAML's ``true`` is not 1), NaN and infinities
Float = Annotated[float, BeforeValidator(_no_bool), Field(allow_inf_nan=False)]
#: Upper bounds on counts: far above any real sweep, low enough that a typo (1e9) fails here, not in the engine.
MAX_REQUESTS = 100_000
MAX_BATCH_SIZE = 65_536
#: Seeds go to Python's, NumPy's and torch's generators: NumPy takes 0 .. 2**32 - 1.
Seed = Annotated[int, Field(strict=True, ge=0, le=2 ** 32 - 1)]


class ConfigError(ValueError):
    """A configuration value is wrong; the message is one line naming the field."""


@functools.lru_cache(maxsize=64)
def _folder_fingerprint(path: str, mtime_key: float) -> str:
    d = Path(path)
    h = hashlib.sha256()
    for f in sorted(d.glob("*.json")) + sorted(d.glob("*.safetensors")):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))  # configs whole; weights: size + first MiB
        h.update(str(f.stat().st_size).encode())
    return h.hexdigest()[:12]


def _files_fingerprint(files: dict[str, str]) -> str:
    """:func:`_folder_fingerprint` of a folder that would hold exactly ``files`` (json name -> text), computed
    without the folder."""
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].encode()
        h.update(name.encode())
        h.update(data[:1 << 20])
        h.update(str(len(data)).encode())
    return h.hexdigest()[:12]


def file_fingerprint(path: str) -> Optional[str]:
    """sha256[:12] of a file's bytes (cached while its mtime and size stay), None if it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _file_digest(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:  # noqa: ARG001 - the cache key
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:12]


def hub_revision(repo_id: str) -> Optional[str]:
    """The commit the local Hugging Face cache resolved ``repo_id``'s main branch to (``refs/main``), or None
    if it was never fetched here. Reads the cache only (no network)."""

    ref = hub_repo_cache(repo_id) / "refs" / "main"
    try:
        rev = ref.read_text().strip()
    except OSError:
        return None
    return rev or None


def model_fingerprint(path: Optional[str]) -> Optional[str]:
    """A short hash of a local model folder (configs, weight sizes and heads), so retrained
    weights get new run ids; for a hub id, ``hub@<commit>`` of the revision the local cache resolved
    (a new revision of the model gets new run ids; ``sdlib sweep`` fetches the model's config first so the
    revision is known); None for missing folders and hub ids never fetched here."""
    if not path:
        return None
    if path.startswith("@shapes/"):  # config-only shapes: their files' hash, so every machine agrees
        try:
            return _files_fingerprint(shape_files(path[len("@shapes/"):]))
        except KeyError:
            return None  # not a shape: validation names it
    p = resolve(path)
    if not p.is_dir():
        if path.startswith(("@", ".", "/", "~")) or path.count("/") != 1:
            return None
        rev = hub_revision(path)
        return f"hub@{rev[:12]}" if rev else None
    return _folder_fingerprint(str(p), max((f.stat().st_mtime for f in p.iterdir()), default=0.0))


#: Fields added after sweeps were committed: left out of a cell's key while they hold their default, so
#: the run ids of existing results do not change.
_ADDED_FIELDS: dict[str, Any] = {"replay": None, "datasets": None, "batch_sizes": None, "full_traces": False,
                                  "pin_target": False, "name": None, "aa_of": None, "confidences": None,
                                  "predictor": None}


#: Workload fields that select cells rather than describe them: never part of a cell's key.
WORKLOAD_SELECTIONS = ("batch_sizes",)


#: The same for serving cells (whose keys were fixed when fewer fields had been added).
SERVING_ADDED_FIELDS: dict[str, Any] = {"aa_of": None}


def _key_dict(obj, added: dict[str, Any] = _ADDED_FIELDS) -> dict[str, Any]:
    d = dataclasses.asdict(obj)
    return {k: v for k, v in d.items() if not (k in added and v == added[k])}


#: What a name that becomes part of a file name may hold (sweep, dataset, task, fleet names).
NAME_CHARS = r"A-Za-z0-9_.-"


def _slug(s: str) -> str:
    return re.sub(rf"[^{NAME_CHARS}]+", "-", s).strip("-")


def check_name(v: str, what: str = "name") -> str:
    """``v`` if it holds only :data:`NAME_CHARS`, else ValueError (the message pydantic shows)."""
    if not re.fullmatch(rf"[{NAME_CHARS}]+", v):
        raise ValueError(f"{what} {v!r}: use only letters, digits, '_', '.', '-'")
    return v


@dataclass(config=_STRICT)
class ModelConfig:
    """A target model: HF id or local path (``@models/...`` = embedded models)."""

    path: str
    name: Optional[str] = None  # short label in tables; default: last path component
    dtype: Literal[DTYPES] = "bfloat16"
    tensor_parallel_size: StrictInt = Field(1, ge=1)
    load_format: Literal[LOAD_FORMATS] = "auto"
    max_model_len: StrictInt = Field(2048, ge=16)
    tokenizer: Optional[str] = None  # default: the model path
    skip_tokenizer_init: StrictBool = False  # prompts as token ids (dummy-weight GPU runs)

    def __post_init__(self) -> None:
        if self.name is None:
            self.name = _slug(Path(self.path.rstrip("/")).name)

    @property
    def resolved_path(self) -> str:
        """Local paths resolved against the repo root; hub ids left as they are."""
        p = resolve(self.path)
        return str(p) if (p.exists() or self.path.startswith(("@", ".", "/"))) else self.path


@dataclass(config=_STRICT)
class MethodConfig:
    """A speculative-decoding method; ``options`` pass through to vLLM's speculative_config."""

    name: Literal[METHODS]
    num_spec_tokens: StrictInt = Field(3, ge=1, le=64)
    model: Optional[str] = None  # draft / EAGLE head path (eagle, eagle3, draft_model)
    options: dict[str, Any] = Field(default_factory=dict)
    label: Optional[str] = None  # default: "<name>-k<k>" ("none" for no SD), "<name>-k<k>-<replay>" with replay
    targets: Optional[list[str]] = None  # model names this method applies to (default: all)
    # trace replay (sdlib.core.registry.replay_names()): acceptance pinned to the workload's traces; the method's
    # engine path and k run for real. Methods that differ only in replay share one engine.
    replay: Optional[str] = None
    datasets: Optional[list[str]] = None  # workload labels this method runs on (default: all)
    batch_sizes: Optional[list[StrictInt]] = None  # batch sizes this method runs at (default: the sweep's)
    # an A/A control: this method is the same arm as the method labelled ``aa_of`` (same name, k, model, options,
    # replay) under another label, run on that method's engine, so the pair measures the drift of the measurement
    aa_of: Optional[str] = None

    @model_validator(mode="after")
    def _check(self) -> "MethodConfig":
        spec = method_spec(self.name)
        if self.replay is not None:
            if self.replay not in replay_names():
                specs = [n for n in replay_names() if n in POLICY_SPECS]
                raise ValueError(f"replay: {self.replay!r} is not one of {specs}, online-ngram, or "
                                 "fixed-<ngram|eagle3>-k<k>")
            if spec.trace is None:
                raise ValueError(f"replay: method {self.name!r} cannot replay "
                                 f"(one of {[m.name for m in METHOD_SPECS.values() if m.trace]})")
            try:
                replay_ref(self.replay, self.name, self.num_spec_tokens)
            except RegistryError as err:
                raise ValueError(str(err)) from None
        if spec.model == "class":
            if not (self.model and re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", self.model)):
                raise ValueError(f"method {self.name!r} needs 'model': a proposer class as pkg.module.Class "
                                 "(vLLM custom_class)")
        elif spec.needs_model and not self.model:
            raise ValueError(f"method {self.name!r} needs 'model' (the draft or head path)")
        if not spec.takes_model and self.model:
            raise ValueError(f"method {self.name!r} takes no 'model'")
        reserved = {"method", "model", "num_speculative_tokens"} & set(self.options)
        if reserved:
            raise ValueError(f"options may not set {sorted(reserved)}: use name/model/num_spec_tokens")
        self._check_sdlib_options(spec)
        if self.label is None:
            self.label = self.engine_label
            if self.replay:
                self.label += f"-{self.replay}"
            if self.confidence_stop is not None:
                self.label += f"-conf{self.confidence_stop:g}"
        return self

    def _check_sdlib_options(self, spec) -> None:
        """The options sdlib acts on itself (:data:`sdlib.core.registry.SDLIB_OPTIONS`): only on methods that take
        them, with a valid value."""
        for k in set(self.options) & set(SDLIB_OPTIONS):
            if k not in spec.sdlib_options:
                takers = [m.name for m in METHOD_SPECS.values() if k in m.sdlib_options]
                raise ValueError(f"options.{k}: only for method {' or '.join(takers)} (not {self.name!r})")
        h = self.options.get("confidence_stop")
        if h is None:
            return
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0.0 < h <= 1.0:
            raise ValueError(f"options.confidence_stop: {h!r} is not a threshold 0 < h <= 1 (stop after draft j "
                             "when 1 - p_1...p_j > h; 1 never stops)")
        if self.replay is not None:
            raise ValueError("options.confidence_stop: not with replay (a replay's plan decides the drafts)")

    @property
    def confidence_stop(self) -> Optional[float]:
        """SpecDec++'s stop threshold h on vLLM's own drafter (``options.confidence_stop``), or None."""
        h = self.options.get("confidence_stop")
        return None if h is None else float(h)

    @property
    def vllm_options(self) -> dict[str, Any]:
        """``options`` less those sdlib acts on itself: what goes to vLLM's ``speculative_config``."""
        return {k: v for k, v in self.options.items() if k not in SDLIB_OPTIONS}

    def engine_key(self) -> str:
        """What the engine is built from (replay and sdlib's own options excluded): methods with one key share
        one engine."""
        d = {"name": self.name, "k": self.k, "model": self.model, "options": self.vllm_options}
        return json.dumps(d, sort_keys=True, default=str)

    @property
    def shares_engine(self) -> bool:
        """Runs on the engine named by its engine label, beside the other methods of that engine: a replay
        (plans set per cell) or a confidence stop (threshold set per cell)."""
        return bool(self.replay) or self.confidence_stop is not None

    @property
    def spec(self):
        """The method's :class:`sdlib.core.registry.MethodSpec`."""
        return method_spec(self.name)

    @property
    def engine_label(self) -> str:
        """A name for the engine: ``<name>-k<k>`` (``none``)."""
        return engine_label(self.name, self.num_spec_tokens)

    @property
    def k(self) -> int:
        """Tokens proposed per step (0 without SD)."""
        return self.num_spec_tokens if self.spec.is_sd else 0

    def speculative_config(self) -> Optional[dict[str, Any]]:
        """The dict for ``vllm.LLM(speculative_config=...)``; None without SD."""
        spec = self.spec
        if not spec.is_sd:
            return None
        cfg: dict[str, Any] = {"method": spec.vllm_method, "num_speculative_tokens": self.num_spec_tokens}
        if self.model and spec.model == "class":  # vLLM's custom_class: imported in the engine's worker
            cfg["model"] = self.model
        elif self.model:
            p = resolve(self.model)
            cfg["model"] = str(p) if p.exists() or self.model.startswith(("@", ".", "/")) else self.model
        cfg.update(dict(spec.defaults))  # e.g. the paper's n-gram look-up settings
        cfg.update(self.vllm_options)
        return cfg


@dataclass(config=_STRICT)
class WorkloadConfig:
    """A dataset and how to sample it (temperature 0 = greedy)."""

    dataset: Literal[DATASETS]
    num_requests: StrictInt = Field(32, ge=1, le=MAX_REQUESTS)
    max_output_tokens: StrictInt = Field(256, ge=1)
    temperature: Float = Field(0.0, ge=0.0, le=100.0)
    seed: Seed = 42
    # reference: the authors' traces' token ids; traces: one of our trace files (path), sdlib.sim.traces
    source: Literal["auto", "local", "package", "hub", "reference", "traces"] = "auto"
    path: Optional[str] = None  # local JSONL (source "local", tried first by "auto"); a trace file (source "traces")
    max_prompt_tokens: Optional[StrictInt] = Field(None, ge=1)  # drop longer prompts
    chat_template: Optional[StrictBool] = None  # default: on, except AIME (the paper's setting)
    ignore_eos: StrictBool = False
    # trace sources: keep only requests whose n-gram and EAGLE-3 acceptance lists cover the output up to
    # max_output_tokens, so every method replays the same output length (needed by trace replay)
    full_traces: StrictBool = False
    # the workload's name in tables (default: the dataset); needed for dataset "custom" and to tell apart two
    # workloads of one dataset
    name: Optional[str] = None
    # the batch sizes this workload runs at (default: the sweep's). A selection, not a property of its cells: it
    # never enters a cell's key, so widening it later adds cells and keeps the ids of those already run
    batch_sizes: Optional[list[StrictInt]] = None
    # trace sources: what a replayed policy decides from besides the traces (sdlib.sim.replay.replay_inputs): the
    # draft confidences along the trace file (sdlib confidences), and the online policies' cross-fitted predictor
    # (sdlib simulate --save-predictor; default: the reference traces' committed one)
    confidences: Optional[str] = None
    predictor: Optional[str] = None

    @model_validator(mode="after")
    def _check(self) -> "WorkloadConfig":
        if self.source == "reference" and self.dataset not in ("cnn_dailymail", "gsm8k", "instructcoder", "sharegpt"):
            raise ValueError("source 'reference' has only cnn_dailymail, gsm8k, instructcoder, sharegpt")
        if self.source == "traces" and not self.path:
            raise ValueError("source 'traces' needs 'path' (a trace file written by sdlib traces)")
        if self.full_traces and self.source not in ("reference", "traces"):
            raise ValueError("full_traces needs source 'reference' or 'traces'")
        if self.confidences and self.source != "traces":
            raise ValueError("confidences needs source 'traces' (the draft confidences along that trace file)")
        if self.predictor and self.source not in ("reference", "traces"):
            raise ValueError("predictor needs source 'reference' or 'traces' (it decides replayed online policies)")
        if self.dataset == "custom":
            if not self.name:
                raise ValueError("dataset 'custom' needs 'name' (what tables and figures call it)")
            if not self.path or self.source not in ("auto", "local"):
                raise ValueError("dataset 'custom' needs 'path' (a JSONL file; see docs/sweeps.md, 'Your own data')")
        if self.name is not None:
            check_name(self.name)
        return self

    @property
    def label(self) -> str:
        """The workload's name in tables and figures: ``name``, else the dataset."""
        return self.name or self.dataset


@dataclass(config=_STRICT)
class EngineConfig:
    """Engine-wide settings passed to ``vllm.LLM``; ``extra`` passes through unchanged."""

    gpu_memory_utilization: Float = Field(0.9, gt=0.0, le=1.0)
    enforce_eager: StrictBool = False
    max_num_seqs: Optional[StrictInt] = Field(None, ge=1, le=MAX_BATCH_SIZE)  # default: the largest batch size
    enable_prefix_caching: StrictBool = False  # the paper turned it off
    # time drafting / verification / sampling per cell (sdlib.vllm.phase_hooks); runs the engine core
    # in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the hooks reach the model runner
    phase_timers: StrictBool = False
    extra: dict[str, Any] = Field(default_factory=dict)
    # an engine not up within this many seconds is ended and its cells recorded as failed (sdlib.run.supervise)
    startup_timeout_s: Float = Field(1800.0, gt=0, le=7 * 86400.0)
    # zero the target's final norm after load, so its greedy token is always 0 (trace replay, sdlib.vllm.replay)
    pin_target: StrictBool = False


@dataclass(config=_STRICT)
class Cell:
    """One unit of work: (model, method, workload, batch size, repeat)."""

    model: ModelConfig
    method: MethodConfig
    workload: WorkloadConfig
    batch_size: StrictInt
    repeat: StrictInt
    batch_mode: str
    warmup_requests: StrictInt
    num_requests: StrictInt  # requests measured in this cell (closed loop may scale it with batch size)
    warmup_scope: str = "cell"
    engine: Optional[EngineConfig] = None  # the sweep's engine settings (part of the cell's identity)
    seed: StrictInt = 0  # the sweep's engine seed
    start: StrictInt = 0  # which start of its engine runs the cell (sweep engine_starts)
    warmup_tokens: Optional[StrictInt] = None  # warm-up requests' output length (None: the workload's)
    engine_name: Optional[str] = None  # the engine the cell runs on (default: the method's; A/A twins share)

    @property
    def part_key(self) -> tuple:
        """(model, dataset, batch size, engine start, repeat): which comparison block the cell belongs to (its
        first three) and which part of it (:func:`in_blocks`)."""
        return (self.model.name, self.workload.label, self.batch_size, self.start, self.repeat)

    def key(self) -> dict[str, Any]:
        """Everything that defines the cell's result (hashed into run_id)."""
        key = {
            "model": _key_dict(self.model),
            "method": _key_dict(self.method),
            "workload": {k: v for k, v in _key_dict(self.workload).items() if k not in WORKLOAD_SELECTIONS},
            "batch_size": self.batch_size,
            "repeat": self.repeat,
            "batch_mode": self.batch_mode,
            "warmup_requests": self.warmup_requests,
            "num_requests": self.num_requests,
            "model_fingerprint": model_fingerprint(self.model.path),
            "draft_fingerprint": model_fingerprint(self.method.model),
        }
        if self.warmup_scope != "cell":
            key["warmup_scope"] = self.warmup_scope
        if self.start:
            key["engine_start"] = self.start
        if self.warmup_tokens is not None:
            key["warmup_tokens"] = self.warmup_tokens
        # everything else that can change a measurement: the engine's settings and seed
        engine = dataclasses.asdict(self.engine) if self.engine is not None else {}
        engine.pop("startup_timeout_s", None)
        key["engine"] = {k: v for k, v in engine.items() if not (k in _ADDED_FIELDS and v == _ADDED_FIELDS[k])}
        key["seed"] = self.seed
        inputs = sim_replay.replay_inputs(self.method.replay, self.workload) if self.method.replay else []
        if inputs:  # plans decided by committed files
            key["replay_inputs"] = {f: file_fingerprint(str(resolve(f))) for f in inputs}
        return key

    @property
    def coordinates(self) -> tuple:
        """Where the cell sits in its sweep: (model, method label, dataset, batch size, repeat, batch mode)."""
        return (self.model.name, self.method.label, self.workload.label, self.batch_size, self.repeat,
                self.batch_mode)

    @property
    def run_id(self) -> str:
        """Readable and unique: ``<model>__<method>__<dataset>__bs<B>__r<rep>__<hash8>``."""
        h = hashlib.sha256(json.dumps(self.key(), sort_keys=True, default=str).encode()).hexdigest()[:8]
        return "__".join(
            [_slug(self.model.name), _slug(self.method.label), _slug(self.workload.label),
             f"bs{self.batch_size}", f"r{self.repeat}" + (f"s{self.start}" if self.start else ""), h]
        )

    @property
    def group(self) -> tuple[str, str, int]:
        """Cells of one group share one engine start: (model name, engine name, start); methods that differ
        only in ``replay`` share their engine, an A/A twin shares its method's."""
        name = self.engine_name or (self.method.engine_label if self.method.shares_engine else self.method.label)
        return (self.model.name, name, self.start)


def in_blocks(key: tuple, blocks) -> bool:
    """Whether a cell's :attr:`Cell.part_key` lies in one of ``blocks``: whole comparison blocks (model, dataset,
    batch size) or parts of one (the same followed by the engine start, then the repeat: ``sdlib.run.budget``
    takes a block too large for a budget in such parts)."""
    return any(tuple(key[:n]) in blocks for n in (3, 4, 5))


@dataclass(config=_STRICT)
class SweepConfig:
    """The product models x methods x workloads x batch sizes x repeats."""

    name: str
    models: list[ModelConfig]
    methods: list[MethodConfig]
    workloads: list[WorkloadConfig]
    batch_sizes: list[StrictInt]
    repeats: StrictInt = Field(1, ge=1, le=1000)
    batch_mode: Literal[BATCH_MODES] = "closed_loop"
    warmup_requests: StrictInt = Field(2, ge=0, le=MAX_REQUESTS)  # requests run (and dropped) before each cell's window
    # "cell": warm up before every cell; "batch_size": once per (engine, batch size), with the cell's prompts
    # (cheaper on a GPU; graph capture and JIT depend on shapes, not prompts)
    warmup_scope: Literal["cell", "batch_size"] = "cell"
    # warm-up a full batch: max(warmup_requests, B) requests of this many output tokens each, so the batch shape B
    # (its CUDA graphs, JIT kernels) is warm before the window, at little cost (None: warmup_requests requests of
    # the workload's output length, at min(B, warmup_requests) in flight)
    warmup_tokens: Optional[StrictInt] = Field(None, ge=1)
    # closed loop: measure max(num_requests, requests_per_slot x B) requests per cell, so large
    # batches get a steady window; prompts are reused (cycled) when the workload has fewer
    requests_per_slot: Optional[StrictInt] = Field(None, ge=1, le=1000)
    # every engine is started this many times (a fresh process each), its cells run on each start; with order
    # "abba" the starts alternate the engines' order and, within an engine, each (dataset, batch size) block runs
    # its arms forward and backward in turn (over repeats and starts: A B | B A), so drift hits every arm alike
    engine_starts: StrictInt = Field(1, ge=1, le=100)
    order: Literal["config", "abba"] = "config"
    results_dir: Optional[str] = None  # default: sdlib.paths.results_base (data/sweeps for configs/, else beside the config)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    seed: Seed = 0
    description: str = ""
    executor: Literal[EXECUTORS] = "local"  # local | ray (sdlib.run.ray_executor)
    # executor ray: the cluster (auto: the one `ray start` or RAY_ADDRESS names; HOST:PORT; none: start Ray here)
    ray_address: Optional[str] = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("batch_sizes")
    @classmethod
    def _bs(cls, v: list[int]) -> list[int]:
        if not v or any(b < 1 for b in v):
            raise ValueError("batch sizes must be a non-empty list of integers >= 1")
        if max(v) > MAX_BATCH_SIZE:
            raise ValueError(f"batch size {max(v)} is above {MAX_BATCH_SIZE}")
        return sorted(set(v))

    @model_validator(mode="after")
    def _unique(self) -> "SweepConfig":
        for what, names in (
            ("models", [m.name for m in self.models]),
            ("methods", [m.label for m in self.methods]),
            ("workloads", [w.label for w in self.workloads]),
        ):
            if not names:
                raise ValueError(f"{what}: at least one is needed")
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{what}: duplicate names {dup} (set 'name'/'label' to tell them apart)")
            for i, n in enumerate(names):  # names become parts of file names (run ids, logs, engine specs)
                try:
                    check_name(n, "name" if what != "methods" else "label")
                except ValueError as err:
                    raise ValueError(f"{what}.{i}: {err}") from None
        model_names = {m.name for m in self.models}
        for m in self.methods:
            for t in m.targets or []:
                if t not in model_names:
                    raise ValueError(f"methods.{m.label}.targets: {t!r} is not one of {sorted(model_names)}")
        wl_names = {w.label for w in self.workloads}
        for m in self.methods:
            bad = sorted(set(m.datasets or []) - wl_names)
            if bad:
                raise ValueError(f"methods.{m.label}.datasets: {bad} are not workloads of this sweep ({sorted(wl_names)})")
            bad_bs = sorted(set(m.batch_sizes or []) - set(self.batch_sizes))
            if bad_bs:
                raise ValueError(f"methods.{m.label}.batch_sizes: {bad_bs} are not in batch_sizes {self.batch_sizes}")
        for w in self.workloads:
            bad_bs = sorted(set(w.batch_sizes or []) - set(self.batch_sizes))
            if bad_bs:
                raise ValueError(f"workloads.{w.label}.batch_sizes: {bad_bs} are not in batch_sizes {self.batch_sizes}")
        by_label = {m.label: m for m in self.methods}
        for m in self.methods:
            if m.aa_of is None:
                continue
            twin = by_label.get(m.aa_of)
            if twin is None or twin is m:
                raise ValueError(f"methods.{m.label}.aa_of: {m.aa_of!r} is not another method's label "
                                 f"({sorted(set(by_label) - {m.label})})")
            if twin.aa_of is not None:
                raise ValueError(f"methods.{m.label}.aa_of: {m.aa_of!r} is itself an A/A twin (point at the arm)")
            same = ("name", "num_spec_tokens", "model", "options", "replay", "targets", "datasets", "batch_sizes")
            diff = [f for f in same if getattr(m, f) != getattr(twin, f)]
            if diff:
                raise ValueError(f"methods.{m.label}.aa_of: an A/A twin must equal {m.aa_of!r} but for its label "
                                 f"(differs in {diff})")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError(f"ray_address: only with executor: ray (executor is {self.executor!r})")
        if self.order == "abba" and self.repeats * self.engine_starts % 2:
            raise ValueError("order: 'abba' runs each block's arms forward, then backward: it needs an even number of "
                             f"runs per arm (repeats x engine_starts, got {self.repeats} x {self.engine_starts})")
        engines: dict[str, str] = {}
        for m in self.methods:
            key = self.engine_name(m)
            if engines.setdefault(key, m.engine_key()) != m.engine_key():
                raise ValueError(f"methods.{m.label}: engine {key!r} is configured twice differently "
                                 "(give one of them another label)")
        if any(m.replay for m in self.methods):
            if not self.engine.pin_target:
                raise ValueError("engine.pin_target: trace replay (methods.*.replay) needs pin_target: true")
            for w in self.workloads:
                if w.source not in ("reference", "traces") or not w.full_traces:
                    raise ValueError(f"workloads.{w.label}: trace replay needs source reference or traces "
                                     "with full_traces: true")
                for m in self.methods:
                    if m.replay and sim_replay.needs_confidences(m.replay) and not w.confidences:
                        raise ValueError(f"workloads.{w.label}: methods.{m.label} replays {m.replay!r}, which decides "
                                         "from draft confidences: give the workload 'confidences' (the file sdlib "
                                         "confidences wrote along its trace file)")
        return self

    @property
    def out_dir(self) -> Path:
        """The sweep's folder: ``<results_dir>/<name>`` (``results_dir`` is filled by :func:`load_sweep` from the
        rule of :func:`sdlib.paths.results_base`; a config built in code without one writes to data/sweeps)."""
        return results_base(None, self.results_dir) / self.name

    def engine_name(self, method: MethodConfig) -> str:
        """The engine a method's cells run on: its engine label for a replay or a confidence stop (they share the
        engine of their name, k, model and vLLM options), else its label; an A/A twin runs on its method's."""
        if method.aa_of is not None:
            method = next(m for m in self.methods if m.label == method.aa_of)
        return method.engine_label if method.shares_engine else method.label

    def cells(self) -> list[Cell]:
        """All cells in run order: per engine start, grouped by engine, baseline first (order ``abba``: see
        :func:`abba_order`)."""
        out = []
        for start in range(self.engine_starts):
            out += self._cells_of_start(start)
        return abba_order(out, self) if self.order == "abba" else out

    def _cells_of_start(self, start: int) -> list[Cell]:
        out = []
        methods = sorted(self.methods, key=lambda m: m.spec.is_sd)
        for model in self.models:
            for method in methods:
                if method.targets and model.name not in method.targets:
                    continue
                for wl in self.workloads:
                    if method.datasets and wl.label not in method.datasets:
                        continue
                    for bs in self.batch_sizes:
                        if (method.batch_sizes and bs not in method.batch_sizes) or \
                                (wl.batch_sizes and bs not in wl.batch_sizes):
                            continue
                        n = wl.num_requests
                        if self.requests_per_slot and self.batch_mode == "closed_loop":
                            n = max(n, self.requests_per_slot * bs)
                        for rep in range(self.repeats):
                            out.append(Cell(model=model, method=method, workload=wl, batch_size=bs,
                                            repeat=rep, batch_mode=self.batch_mode,
                                            warmup_requests=self.warmup_requests, num_requests=n,
                                            warmup_scope=self.warmup_scope, engine=self.engine,
                                            seed=self.seed, start=start, engine_name=self.engine_name(method),
                                            warmup_tokens=self.warmup_tokens))
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for w in d.get("workloads", []):  # a workload's selections at their default: as configs written before them
            for k in WORKLOAD_SELECTIONS:
                if w.get(k) is None:
                    w.pop(k, None)
        return {k: v for k, v in d.items() if not (k in RUN_FIELDS and v == RUN_FIELDS[k])}


def abba_order(cells: list[Cell], sweep: SweepConfig) -> list[Cell]:
    """``cells`` in interleaved order: engine starts one after another; within a start the engines in config
    order (baseline first) at even starts and reversed at odd ones; within an engine, (model, dataset, batch size)
    blocks in config order, and in each block the arms sharing the engine forward when repeat + start is even and
    backward when it is odd (A B | B A). So an arm's runs straddle the others', and each engine start's no-SD
    baseline runs first or last alike."""
    groups = list(dict.fromkeys((c.model.name, c.group[1]) for c in cells))
    labels = [m.label for m in sorted(sweep.methods, key=lambda m: m.spec.is_sd)]
    wl_index = {w.label: i for i, w in enumerate(sweep.workloads)}

    def key(c: Cell):
        g = groups.index((c.model.name, c.group[1]))
        arm = labels.index(c.method.label)
        return (c.start, g if c.start % 2 == 0 else -g, wl_index[c.workload.label], c.batch_size, c.repeat,
                arm if (c.repeat + c.start) % 2 == 0 else -arm)

    return sorted(cells, key=key)


_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")


def _section_class(loc: tuple) -> type:
    """The config dataclass that holds the field at ``loc`` (for listing its valid keys)."""
    head = [x for x in loc if not isinstance(x, int)]
    return {"models": ModelConfig, "methods": MethodConfig, "workloads": WorkloadConfig,
            "engine": EngineConfig}.get(head[0] if len(head) > 1 else "", SweepConfig)


def _one_line(err: ValidationError) -> str:
    """The most telling problem of a validation error, in one line naming the field (unknown keys first,
    with the valid ones listed); never the whole config."""
    errors = sorted(err.errors(), key=lambda e: e["type"] not in _UNKNOWN)
    e = errors[0]
    loc = tuple(e["loc"])
    where = ".".join(str(x) for x in loc) or "config"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    if e["type"] in _UNKNOWN:
        cls = _section_class(loc)
        valid = ", ".join(f.name for f in dataclasses.fields(cls))
        return f"{where}: unknown key (valid keys here: {valid}){more}"
    if e["type"] == "missing":
        return f"{where}: required field missing{more}"
    msg = e["msg"].replace("Value error, ", "")
    if not loc:  # a rule across fields: its message names the fields itself
        return f"{msg}{more}"
    got = e.get("input")
    show = not isinstance(got, (dict, list, tuple)) and got is not None and len(repr(got)) <= 60 \
        and type(got).__name__ != "ArgsKwargs"
    return f"{where}: {msg}{f' (got {got!r})' if show else ''}{more}"


def parse_sweep(data: dict[str, Any]) -> SweepConfig:
    """Build and validate a :class:`SweepConfig` from a plain dict."""
    return parse_config(SweepConfig, data)


def parse_config(cls, data: dict[str, Any]):
    """Build and validate the config dataclass ``cls`` (a sweep's, a serving sweep's) from a plain dict; any
    error is one :class:`ConfigError` line naming the field."""
    if not isinstance(data, dict):
        raise ConfigError("config: expected a mapping at the top level")
    try:
        return cls(**data)
    except ValidationError as err:
        raise ConfigError(_one_line(err)) from None
    except TypeError as err:  # unexpected keyword at the top level
        raise ConfigError(f"config: {err}") from None
    except ConfigError:
        raise
    except ValueError as err:  # a rule outside pydantic's wrapping
        raise ConfigError(str(err).splitlines()[0]) from None


class _DuplicateKey(ValueError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hashable = key in seen
            except TypeError:
                continue
            if hashable:
                raise _DuplicateKey(f"key {key!r} is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_sweep(path: str | Path, overrides: Optional[dict[str, Any]] = None) -> SweepConfig:
    """Read a sweep YAML; ``overrides`` (top-level keys) replace the file's values. A file may start from
    another: ``extends: OTHER.yaml`` (relative to its own folder) takes every top-level key of OTHER (itself
    read the same way) and replaces those the file gives, e.g. a twin for another kind of GPU that differs only in
    ``name`` and ``description``."""
    p = resolve(path)
    data = _read_config(p, ())
    data.update(overrides or {})
    if not data.get("results_dir"):  # the rule (sdlib.paths.results_base): beside the config unless in configs/
        base = results_base(p)
        if base != SWEEPS_DIR:
            data["results_dir"] = repo_relative(base)
    return parse_sweep(data)


def _read_config(p: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """One config file's keys, its relative paths resolved against its folder, on top of what it ``extends``
    (``chain``: the files that extend it, for the one-line error on a cycle)."""
    if not p.is_file():
        raise ConfigError(f"config: file not found: {p}" + (f" (extended by {chain[-1].name})" if chain else ""))
    try:
        data = yaml.load(p.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as err:
        raise ConfigError(f"config: {p.name}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config: {p.name} is not valid YAML{at}: {getattr(err, 'problem', None) or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config: {p.name} is not a text file") from None
    if data is None:
        raise ConfigError(f"config: {p.name} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"config: {p.name} must be a mapping of keys (name, models, methods, ...), "
                          f"not a {type(data).__name__}")
    data = _paths_from(data, p.parent)
    if "extends" not in data:
        return data
    parent = data.pop("extends")
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"config: {p.name}: extends must name another config file, not {parent!r}")
    q = (p.parent / parent).resolve()
    if q in (*chain, p.resolve()):
        raise ConfigError(f"config: {p.name}: extends {parent} forms a cycle: "
                          + " -> ".join(x.name for x in (*chain, p.resolve(), q)))
    return {**_read_config(q, (*chain, p.resolve())), **data}


def _inside_config_dir(value: Any, base: Path, always_path: bool = False) -> Any:
    """A relative path inside a config resolves against the config file's folder: stored repo-relative when
    it lies in the repository (so run ids do not depend on where the repository is), absolute otherwise.
    ``@trained/``, ``@models/``, ``@shapes/``, absolute paths and hub ids (``org/name`` that is no folder
    there) are left as they are."""
    if not isinstance(value, str) or not value or value.startswith(("@", "/", "~")):
        return value
    cand = (base / value).resolve()
    if not (always_path or cand.exists() or value.startswith(("./", "../"))):
        return value  # a hub id, or a name
    return repo_relative(cand)


def _paths_from(data: dict[str, Any], base: Path) -> dict[str, Any]:
    data = dict(data)
    for key, fields in (("models", ("path", "tokenizer")), ("methods", ("model",)),
                        ("workloads", ("path", "confidences", "predictor"))):
        if isinstance(data.get(key), list):
            data[key] = [{**d, **{f: _inside_config_dir(d[f], base, always_path=key == "workloads")
                                  for f in fields if f in d}}
                         if isinstance(d, dict) else d for d in data[key]]
    if "results_dir" in data:
        data["results_dir"] = _inside_config_dir(data["results_dir"], base, always_path=True)
    return data
