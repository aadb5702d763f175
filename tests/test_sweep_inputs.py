"""A trace or prompt file changed in place under done cells stops a sweep before anything runs (sdlib.run.inputs):
its run ids hash the file's path, not its content, so the old cells would otherwise look done and be mixed with
new ones."""

from __future__ import annotations

import json

import pytest
import yaml

from sdlib import cli
from sdlib.config import ConfigError, load_sweep
from sdlib.paths import MODELS_DIR
from sdlib.run.inputs import INPUTS_KEY, check_inputs, input_fingerprints, record_inputs, workload_files
from sdlib.store import SweepStore


@pytest.fixture
def sweep_files(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "1 + 1?"}\n{"question": "2 + 2?"}\n')
    cfg = {"name": "inputs", "results_dir": str(tmp_path / "res"),
           "models": [{"name": "tiny", "path": "@models/target", "max_model_len": 512}],
           "methods": [{"name": "none"}],
           "workloads": [{"dataset": "gsm8k", "source": "local", "path": str(prompts), "num_requests": 2,
                          "max_output_tokens": 8},
                         {"dataset": "sharegpt", "source": "reference", "num_requests": 2, "max_output_tokens": 8}],
           "batch_sizes": [1], "engine": {"enforce_eager": True}}
    path = tmp_path / "inputs.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, prompts


def test_workload_files_are_the_prompt_file_and_the_reference_trace(sweep_files):
    path, prompts = sweep_files
    sweep = load_sweep(path)
    local, ref = sweep.workloads
    assert workload_files(local) == [str(prompts)]
    assert workload_files(ref) == ["data/reference/specdecode-bench-llama3.1-8b/combined_sharegpt.jsonl.gz"]
    fps = input_fingerprints(sweep)
    assert set(fps) == {str(prompts), workload_files(ref)[0]} and all(len(v) == 12 for v in fps.values())


def test_a_changed_file_under_done_cells_is_an_error_and_only_then(sweep_files, monkeypatch):
    path, prompts = sweep_files
    sweep = load_sweep(path)
    store = SweepStore(sweep.out_dir)
    record_inputs(store, input_fingerprints(sweep))
    recorded = store.read_provenance()[INPUTS_KEY]
    assert recorded == input_fingerprints(sweep)
    cells = sweep.cells()
    local_cell = next(c for c in cells if c.workload.source == "local")
    ref_cell = next(c for c in cells if c.workload.source == "reference")

    prompts.write_text('{"question": "3 + 3?"}\n{"question": "2 + 2?"}\n')
    monkeypatch.setattr(SweepStore, "done_ids", lambda self: set())
    check_inputs(sweep, store)  # nothing done: nothing to mix
    monkeypatch.setattr(SweepStore, "done_ids", lambda self: {ref_cell.run_id})
    check_inputs(sweep, store)  # the done cell does not read the changed file
    monkeypatch.setattr(SweepStore, "done_ids", lambda self: {local_cell.run_id, ref_cell.run_id})
    with pytest.raises(ConfigError) as e:
        check_inputs(sweep, store)
    msg = str(e.value)
    assert "\n" not in msg and str(prompts) in msg and "1 done cell(s)" in msg
    assert f"sha256 {recorded[str(prompts)]} -> " in msg

    prompts.write_text('{"question": "1 + 1?"}\n{"question": "2 + 2?"}\n')  # restored: fine again
    check_inputs(sweep, store)


def test_sdlib_sweep_stops_in_one_line_and_writes_no_file(sweep_files, monkeypatch, capsys):
    from sdlib.models.tinymodels import build_models

    build_models(MODELS_DIR)
    path, prompts = sweep_files
    cfg = yaml.safe_load(path.read_text())
    cfg["workloads"] = cfg["workloads"][:1]  # the tiny models' vocabulary does not hold the reference ids
    path.write_text(yaml.safe_dump(cfg))
    sweep = load_sweep(path)
    store = SweepStore(sweep.out_dir)
    record_inputs(store, input_fingerprints(sweep))
    before = store.provenance_path.read_text()
    local_cell = next(c for c in sweep.cells() if c.workload.source == "local")
    monkeypatch.setattr(SweepStore, "done_ids", lambda self: {local_cell.run_id})

    def refuse(*a, **k):
        raise AssertionError("an engine was started")

    monkeypatch.setattr("sdlib.run.groups.EngineProcess", refuse)
    prompts.write_text('{"question": "changed"}\n{"question": "2 + 2?"}\n')
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "changed since 1 done cell(s)" in err
    assert store.provenance_path.read_text() == before
    assert json.loads(before)[INPUTS_KEY][str(prompts)] != input_fingerprints(sweep)[str(prompts)]
