"""Malformed configs, table-driven: each fails `sdlib validate` and `sdlib sweep` with exit 2, in under a second,
with one line that names the field, before any engine starts."""

from __future__ import annotations

import copy
import time

import pytest
import yaml

from sdlib import cli
from sdlib.paths import MODELS_DIR

BASE = {
    "name": "bad",
    "models": [{"name": "tiny", "path": "@models/target", "max_model_len": 512}],
    "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3},
                {"name": "draft_model", "num_spec_tokens": 3, "model": "@models/draft"},
                {"name": "eagle3", "num_spec_tokens": 3, "model": "@models/eagle3"}],
    "workloads": [{"dataset": "gsm8k", "source": "local", "path": "prompts.jsonl", "num_requests": 2,
                   "max_output_tokens": 8}],
    "batch_sizes": [1, 2],
    "engine": {"gpu_memory_utilization": 0.1, "enforce_eager": True},
}


def _set(path: str, value):
    """A case that sets ``a.b.0.c`` to ``value`` (``...`` removes the key)."""
    def f(cfg):
        keys = path.split(".")
        d = cfg
        for k in keys[:-1]:
            d = d[int(k)] if isinstance(d, list) else d[k]
        last = keys[-1]
        if value is ...:
            del d[last]
        elif isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
        return cfg
    return f


# (id, change to BASE or raw YAML text, text the one-line error must contain)
CASES = [
    ("yaml-syntax", "name: x\nmodels: [\n", "not valid YAML at line"),
    ("top-level-list", "- a\n- b\n", "must be a mapping"),
    ("empty-file", "", "is empty"),
    ("not-text", b"\xff\xfe\x00", "config"),
    ("missing-name", _set("name", ...), "name: required"),
    ("bad-name", _set("name", "a b"), "name"),
    ("missing-models", _set("models", ...), "models: required"),
    ("empty-models", _set("models", []), "models"),
    ("model-no-path", _set("models.0.path", ...), "models.0.path"),
    ("model-unknown-key", _set("models.0.pth", "x"), "models.0.pth: unknown key (valid keys here: path"),
    ("model-bad-dtype", _set("models.0.dtype", "int3"), "models.0.dtype"),
    ("model-tp-zero", _set("models.0.tensor_parallel_size", 0), "models.0.tensor_parallel_size"),
    ("model-len-text", _set("models.0.max_model_len", "long"), "models.0.max_model_len"),
    ("model-len-bool", _set("models.0.max_model_len", True), "models.0.max_model_len"),
    ("model-len-too-big", _set("models.0.max_model_len", 10 ** 6), "models.0.max_model_len: 1000000 exceeds"),
    ("model-missing-folder", _set("models.0.path", "./no_such_model"), "models.0.path"),
    ("model-missing-tokenizer", _set("models.0.tokenizer", "./no_such_tokenizer"), "models.0.tokenizer"),
    ("hub-id-offline", _set("models.0.path", "nobody/not-a-model"), "models.0.path: 'nobody/not-a-model'"),
    ("bad-shape", _set("models.0.path", "@shapes/llama-9000"), "unknown shape"),
    ("missing-methods", _set("methods", ...), "methods: required"),
    ("method-unknown", _set("methods.1.name", "medusa"), "methods.1.name"),
    ("k-bool", _set("methods.1.num_spec_tokens", True), "methods.1.num_spec_tokens"),
    ("k-zero", _set("methods.1.num_spec_tokens", 0), "methods.1.num_spec_tokens"),
    ("k-huge", _set("methods.1.num_spec_tokens", 1000), "methods.1.num_spec_tokens"),
    ("eagle-no-model", _set("methods.3.model", ...), "needs 'model'"),
    ("ngram-with-model", _set("methods.1.model", "@models/draft"), "takes no 'model'"),
    ("reserved-option", _set("methods.1.options", {"num_speculative_tokens": 5}), "options may not set"),
    ("eagle3-given-draft-model", _set("methods.3.model", "@models/draft"), "methods.3.model"),
    ("draft-given-eagle-head", _set("methods.2.model", "@models/eagle3"), "methods.2.model"),
    ("method-unknown-key", _set("methods.1.k", 3), "methods.1.k: unknown key"),
    ("duplicate-methods", _set("methods.2", {"name": "ngram", "num_spec_tokens": 3}), "duplicate"),
    ("targets-unknown", _set("methods.1.targets", ["other"]), "targets"),
    ("replay-unknown", _set("methods.1.replay", "sometimes"), "replay"),
    ("replay-not-pinned", _set("methods.1.replay", "fixed"), "pin_target"),
    ("method-dataset-filter", _set("methods.1.datasets", ["aime"]), "methods.ngram-k3.datasets"),
    ("missing-workloads", _set("workloads", ...), "workloads: required"),
    ("dataset-unknown", _set("workloads.0.dataset", "mmlu"), "workloads.0.dataset"),
    ("local-no-path", _set("workloads.0.path", ...), "workloads.0.path"),
    ("local-missing-file", _set("workloads.0.path", "missing.jsonl"), "workloads.0.path"),
    ("requests-zero", _set("workloads.0.num_requests", 0), "workloads.0.num_requests"),
    ("output-text", _set("workloads.0.max_output_tokens", "x"), "workloads.0.max_output_tokens"),
    ("negative-temperature", _set("workloads.0.temperature", -1.0), "workloads.0.temperature"),
    ("reference-wrong-dataset", _set("workloads.0", {"dataset": "humaneval", "source": "reference"}), "reference"),
    ("custom-no-name", _set("workloads.0", {"dataset": "custom", "path": "prompts.jsonl"}), "needs 'name'"),
    ("workload-unknown-key", _set("workloads.0.n", 3), "workloads.0.n: unknown key"),
    ("malformed-jsonl", _set("workloads.0.path", "broken.jsonl"), "broken.jsonl:2"),
    ("all-prompts-empty", _set("workloads.0.path", "empty_prompts.jsonl"), "workloads.0.path"),
    ("missing-batch-sizes", _set("batch_sizes", ...), "batch_sizes: required"),
    ("batch-size-bool", _set("batch_sizes", [True, 4]), "batch_sizes.0"),
    ("batch-sizes-empty", _set("batch_sizes", []), "batch_sizes"),
    ("batch-size-zero", _set("batch_sizes", [0]), "batch_sizes"),
    ("repeats-zero", _set("repeats", 0), "repeats"),
    ("batch-mode", _set("batch_mode", "open"), "batch_mode"),
    ("engine-extra-bogus", _set("engine.extra", {"bogus_arg": 1}), "engine.extra: ['bogus_arg']"),
    ("engine-gpu-mem", _set("engine.gpu_memory_utilization", 1.5), "engine.gpu_memory_utilization"),
    ("engine-unknown-key", _set("engine.timeout", 3), "engine.timeout: unknown key"),
    ("top-unknown-key", _set("modles", []), "modles: unknown key (valid keys here: name, models"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from sdlib.models.tinymodels import build_models

    build_models(MODELS_DIR)
    d = tmp_path_factory.mktemp("configs")
    (d / "prompts.jsonl").write_text('{"question": "1 + 1?"}\n{"question": "2 + 2?"}\n')
    (d / "broken.jsonl").write_text('{"question": "1 + 1?"}\n{"question": \n')
    (d / "empty_prompts.jsonl").write_text('{"prompt": ""}\n{"prompt": "  "}\n')
    return d


@pytest.fixture
def no_engine(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("an engine was started")
    monkeypatch.setattr("sdlib.run.sweep.EngineProcess", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_base_config_is_valid(folder, no_engine, capsys):
    p = folder / "base.yaml"
    p.write_text(yaml.safe_dump(BASE))
    assert cli.main(["validate", str(p)]) == 0


def test_at_least_forty_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case,change,expect", CASES, ids=[c[0] for c in CASES])
def test_malformed_config_fails_fast_in_one_line(folder, no_engine, capsys, case, change, expect):
    p = folder / f"{case}.yaml"
    if isinstance(change, bytes):
        p.write_bytes(change)
    elif isinstance(change, str):
        p.write_text(change)
    else:
        p.write_text(yaml.safe_dump(change(copy.deepcopy(BASE))))
    for cmd in ("validate", "sweep"):
        t0 = time.perf_counter()
        rc = cli.main([cmd, str(p)])
        took = time.perf_counter() - t0
        err = capsys.readouterr().err.strip()
        assert rc == 2, (cmd, err)
        assert took < 1.0, (cmd, took)
        assert len(err.splitlines()) == 1 and err.startswith("error: "), err
        assert expect in err, err
        assert "ArgsKwargs" not in err and len(err) < 400, err
