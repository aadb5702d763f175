"""Serving sweep configuration: models x methods behind vLLM's OpenAI server, a traffic mix, request rates,
and fleets of servers with a routing rule; read from YAML and validated before any server starts.

A bad value raises :class:`sdlib.config.ConfigError` with one line naming the field (the CLI exits 2).

Cells (one row each in ``serve_runs``):

* method cells: (model, method, rate, repeat): one server of that method, the mix at ``rate`` requests/s;
* fleet cells: (model, fleet, total rate, repeat): one server per entry of ``fleet.servers``; each request of
  the mix goes to one of them by ``fleet.rule`` (:mod:`sdlib.serve.router`). Fleets of one size compare
  methods at the same hardware (one server = one device, or one share of the machine).

Every cell of a given rate and repeat sends the same requests at the same times (same seed), so methods
and fleets are compared on identical traffic.

Usage:
    from sdlib.serve.config import load_serving
    cfg = load_serving("configs/embedded_serving.yaml")
    for cell in cfg.cells(): print(cell.run_id)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

from sdlib.config import (
    SERVING_ADDED_FIELDS,
    WORKLOAD_SELECTIONS,
    ConfigError,
    MethodConfig,
    ModelConfig,
    WorkloadConfig,
    _key_dict,
    _slug,
    check_name,
    model_fingerprint,
    parse_config,
)
from sdlib.paths import DATA_DIR, resolve

#: Where serving sweeps write by default: ``data/serving/<name>/``.
SERVING_DIR: Path = DATA_DIR / "serving"
#: Routing rules (:mod:`sdlib.serve.router`).
RULES = ("round_robin", "random", "task", "overlap")
#: How a fleet's servers run: ``concurrent`` = all up at once, one client in front (one device per server);
#: ``sequential`` = one server at a time, each replaying exactly its share of the stream at the same arrival
#: times (a machine with one device: each server gets the whole device, as it would own one).
EXECUTIONS = ("sequential", "concurrent")

_STRICT = ConfigDict(extra="forbid")


@dataclass(config=_STRICT)
class TaskMix:
    """One task of the traffic mix: its share of requests and the workload its prompts come from."""

    task: str
    workload: WorkloadConfig
    weight: float = Field(1.0, gt=0)  # share of requests, relative to the other tasks' weights

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        return check_name(v, "task")


#: Workload fields added after the embedded serving sweep was committed: left out of a cell's key while they
#: hold their default, so committed cells keep their run ids.
_WORKLOAD_FIELDS_ADDED = {"name": None, "confidences": None, "predictor": None}


def _mix_key(m: TaskMix) -> dict[str, Any]:
    d = dataclasses.asdict(m)
    d["workload"] = {k: v for k, v in d["workload"].items()
                     if not (k in _WORKLOAD_FIELDS_ADDED and v == _WORKLOAD_FIELDS_ADDED[k])
                     and k not in WORKLOAD_SELECTIONS}
    return d


@dataclass(config=_STRICT)
class TrafficConfig:
    """Open-loop arrivals: gamma gaps (``burstiness`` = shape; 1 = Poisson) at each rate, the mix by weight."""

    rates: list[float]  # requests/s sent to one server (method cells)
    num_requests: int = Field(48, ge=1)  # measured requests per cell (at least; see min_duration_s)
    # at least this many seconds of arrivals per cell: requests = max(num_requests, ceil(rate x min_duration_s)),
    # so high rates reach a steady queue instead of a short burst
    min_duration_s: Optional[float] = Field(None, gt=0)
    burstiness: float = Field(1.0, gt=0)
    # rescale the gaps so the realised rate equals the requested one (exact conditioning for gamma gaps,
    # sdlib.serve.arrivals); false: free renewal process, the realised rate scatters by ~1/sqrt(n)
    exact_rate: bool = True
    warmup_requests: int = Field(4, ge=0)  # sent at once after a server starts, dropped
    repeats: int = Field(1, ge=1)
    seed: int = 0
    request_timeout_s: float = Field(600.0, gt=0)  # one request's whole stream; a request past it is an error
    # nice value of the client thread while it sends (e.g. -10; needs root or CAP_SYS_NICE, else a warning):
    # on a machine shared with other jobs they then cannot delay sends and reads; servers keep the default
    client_nice: Optional[int] = Field(None, ge=-20, le=19)

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        if not v or any(not (r > 0) for r in v):
            raise ValueError("rates must be a non-empty list of requests/s > 0")
        return sorted(set(float(r) for r in v))


@dataclass(config=_STRICT)
class FleetConfig:
    """Servers that share the traffic, one per entry of ``servers`` (method labels; repeats = replicas).

    ``rule``: ``round_robin`` / ``random`` (replicas of one method), ``task`` (``routes``: task -> server
    index, others to ``default``), ``overlap`` (prompt-overlap score at admission >= ``threshold`` -> server
    ``routes["high"]``, else ``routes["low"]``; :func:`sdlib.serve.router.prompt_overlap_score`).
    """

    name: str
    servers: list[str]
    rule: Literal[RULES] = "round_robin"
    routes: dict[str, int] = Field(default_factory=dict)
    default: int = Field(0, ge=0)
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    rates: Optional[list[float]] = None  # total requests/s into the fleet (default: the config's fleet_rates)
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> "FleetConfig":
        check_name(self.name)
        n = len(self.servers)
        if n < 1:
            raise ValueError("servers: at least one")
        bad = {k: i for k, i in self.routes.items() if not (0 <= i < n)}
        if bad or self.default >= n:
            raise ValueError(f"routes/default: server indices must be 0..{n - 1} (got {bad or self.default})")
        if self.rule == "overlap" and set(self.routes) != {"high", "low"}:
            raise ValueError("routes: rule 'overlap' needs exactly {high: i, low: j}")
        if self.rule in ("round_robin", "random") and self.routes:
            raise ValueError(f"routes: rule {self.rule!r} takes no routes")
        if self.rates is not None and (not self.rates or any(not (r > 0) for r in self.rates)):
            raise ValueError("rates must be a non-empty list of requests/s > 0")
        return self


@dataclass(config=_STRICT)
class ServerConfig:
    """How each ``vllm.entrypoints.openai.api_server`` is started (see :func:`sdlib.vllm.server.server_command`)."""

    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enforce_eager: bool = False
    max_num_seqs: int = Field(256, ge=1)
    enable_prefix_caching: bool = False  # off, as in the paper and the sweeps
    seed: int = 0
    per_request_metrics: bool = True  # server timing (+ per-step acceptance, vLLM >= 0.29) in each final message
    startup_timeout_s: float = Field(900.0, gt=0)  # /health must answer within this, else the server is ended
    extra_args: list[str] = Field(default_factory=list)  # appended to the command line unchanged
    env: dict[str, str] = Field(default_factory=dict)  # added to every server's environment
    # concurrent fleets: environment per server index (e.g. [{CUDA_VISIBLE_DEVICES: "0"}, {...: "1"}])
    env_per_server: list[dict[str, str]] = Field(default_factory=list)


@dataclass(config=_STRICT)
class ServingCell:
    """One unit of work: a method or a fleet, one model, one rate, one repeat."""

    kind: str  # "method" or "fleet"
    model: ModelConfig
    label: str  # method label or fleet name
    backends: list[MethodConfig]  # one per server (method cells: one)
    rule: str
    routes: dict[str, int]
    default: int
    threshold: float
    rate: float  # requests/s, total
    repeat: int
    traffic: TrafficConfig
    mix: list[TaskMix]

    def key(self) -> dict[str, Any]:
        """Everything that defines the cell's result (hashed into run_id)."""
        d = {
            "kind": self.kind, "model": dataclasses.asdict(self.model),
            "backends": [_key_dict(b, SERVING_ADDED_FIELDS) for b in self.backends], "rule": self.rule,
            "routes": self.routes,
            "default": self.default, "threshold": self.threshold, "rate": self.rate, "repeat": self.repeat,
            "traffic": {k: v for k, v in dataclasses.asdict(self.traffic).items()
                        if k not in ("rates", "client_nice", "min_duration_s")},
            "mix": [_mix_key(m) for m in self.mix],
            "model_fingerprint": model_fingerprint(self.model.path),
            "draft_fingerprints": [model_fingerprint(b.model) for b in self.backends],
        }
        if self.num_requests != self.traffic.num_requests:  # (so cells that min_duration_s leaves alone keep their ids)
            d["num_requests"] = self.num_requests
        return d

    @property
    def num_requests(self) -> int:
        """Requests in this cell: ``traffic.num_requests``, more at high rates with ``traffic.min_duration_s``."""
        n = self.traffic.num_requests
        if self.traffic.min_duration_s:
            n = max(n, math.ceil(self.rate * self.traffic.min_duration_s - 1e-9))
        return n

    @property
    def run_id(self) -> str:
        """``<model>__<method or fleet>__r<rate>__rep<r>__<hash8>``."""
        h = hashlib.sha256(json.dumps(self.key(), sort_keys=True, default=str).encode()).hexdigest()[:8]
        return "__".join([_slug(self.model.name), _slug(self.label), f"r{self.rate:g}", f"rep{self.repeat}", h])

    @property
    def seed(self) -> int:
        """Arrival and mix seed: the same for every method and fleet at this rate and repeat."""
        return self.traffic.seed + 1000 * self.repeat


@dataclass(config=_STRICT)
class ServingConfig:
    """A serving sweep: every (model, method) at every rate, then every fleet at every fleet rate."""

    name: str
    models: list[ModelConfig]
    methods: list[MethodConfig]
    mix: list[TaskMix]
    traffic: TrafficConfig
    fleets: list[FleetConfig] = Field(default_factory=list)
    fleet_rates: list[float] = Field(default_factory=list)  # total requests/s into each fleet
    execution: Literal[EXECUTIONS] = "sequential"
    server: ServerConfig = Field(default_factory=ServerConfig)
    results_dir: Optional[str] = None  # default: data/serving
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @model_validator(mode="after")
    def _check(self) -> "ServingConfig":
        for what, names in (("models", [m.name for m in self.models]), ("methods", [m.label for m in self.methods]),
                            ("mix", [t.task for t in self.mix]), ("fleets", [f.name for f in self.fleets])):
            if not names and what != "fleets":
                raise ValueError(f"{what}: at least one is needed")
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{what}: duplicate names {dup}")
        for m in self.methods:
            if m.replay:
                raise ValueError(f"methods.{m.label}.replay: trace replay is not served")
            if m.confidence_stop is not None:
                raise ValueError(f"methods.{m.label}.options.confidence_stop: the confidence stop is a hook the "
                                 "sweep worker installs; not served")
        labels = {m.label for m in self.methods}
        tasks = {t.task for t in self.mix}
        for f in self.fleets:
            bad = sorted(set(f.servers) - labels)
            if bad:
                raise ValueError(f"fleets.{f.name}.servers: {bad} are not method labels ({sorted(labels)})")
            if f.rule == "task":
                badt = sorted(set(f.routes) - tasks)
                if badt:
                    raise ValueError(f"fleets.{f.name}.routes: {badt} are not tasks of the mix ({sorted(tasks)})")
            if f.rates is None and not self.fleet_rates:
                raise ValueError(f"fleets.{f.name}.rates: set rates here or fleet_rates for all fleets")
        if self.fleet_rates and any(not (r > 0) for r in self.fleet_rates):
            raise ValueError("fleet_rates: requests/s must be > 0")
        sizes = sorted({len(f.servers) for f in self.fleets})
        if len(sizes) > 1:
            raise ValueError(f"fleets: every fleet needs the same number of servers (same hardware); got {sizes}")
        return self

    @property
    def out_dir(self) -> Path:
        """The sweep's folder: ``<results_dir>/<name>`` (default ``data/serving/<name>``)."""
        base = resolve(self.results_dir) if self.results_dir else SERVING_DIR
        return base / self.name

    def method(self, label: str) -> MethodConfig:
        return next(m for m in self.methods if m.label == label)

    def cells(self) -> list[ServingCell]:
        """All cells: per model, method cells (baseline first, rates ascending), then fleet cells."""
        out = []
        common = dict(traffic=self.traffic, mix=self.mix)
        for model in self.models:
            for m in sorted(self.methods, key=lambda m: m.name != "none"):
                if m.targets and model.name not in m.targets:
                    continue
                for rate in self.traffic.rates:
                    for rep in range(self.traffic.repeats):
                        out.append(ServingCell(kind="method", model=model, label=m.label, backends=[m], rule="single",
                                               routes={}, default=0, threshold=0.0, rate=rate, repeat=rep, **common))
            for f in self.fleets:
                for rate in sorted(set(f.rates or self.fleet_rates)):
                    for rep in range(self.traffic.repeats):
                        out.append(ServingCell(kind="fleet", model=model, label=f.name,
                                               backends=[self.method(s) for s in f.servers], rule=f.rule,
                                               routes=dict(f.routes), default=f.default, threshold=f.threshold,
                                               rate=float(rate), repeat=rep, **common))
        return out

    def run_ids(self) -> set[str]:
        """Every cell's run id (tables are read through these: a row of another config is stale)."""
        return {c.run_id for c in self.cells()}

    def fleet_descriptions(self) -> dict[str, str]:
        """``{fleet name: description}`` (the name where there is none)."""
        return {f.name: f.description or f.name for f in self.fleets}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_serving(data: dict[str, Any]) -> ServingConfig:
    """Build and validate a :class:`ServingConfig` from a plain dict (one-line :class:`ConfigError`)."""
    return parse_config(ServingConfig, data)


def load_serving(path: str | Path, overrides: Optional[dict[str, Any]] = None) -> ServingConfig:
    """Read a serving YAML; ``overrides`` (top-level keys) replace the file's values."""
    p = resolve(path)
    if not p.exists():
        raise ConfigError(f"config: file not found: {p}")
    data = yaml.safe_load(p.read_text()) or {}
    data.update(overrides or {})
    return parse_serving(data)
