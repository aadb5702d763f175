"""Engine tests on the CPU build of vLLM: counters, lossless identical draft, resume, the GPU state per cell.

One module-scoped sweep (2 methods x 2 batch sizes x 8 requests), run in two
invocations: first only n-gram (an "interrupted" sweep), then everything. The second runs with a stand-in
``nvidia-smi`` on PATH (it answers only the worker's GPU-state query), so its cells record a GPU state.
"""

from __future__ import annotations

import os
import shutil

import pytest

from sdlib.config import parse_sweep
from sdlib.analysis.measures import acceptance_table
from sdlib.paths import MODELS_DIR
from sdlib.run.sweep import run_sweep

pytestmark = pytest.mark.engine

K = 3
#: What the stand-in nvidia-smi prints for the GPU-state query (n = the how-many-th call): SM clock, memory clock,
#: temperature, power draw, power limit, clock-event reasons (SW power cap); for the clock-event counters query
#: (m = the how-many-th such call), a header with the unit, SW power cap's counter at 1500 us a call and HW
#: thermal's at 500 us.
FAKE_SMI = """#!/bin/sh
case "$*" in
  *clocks_event_reasons_counters.sw_power_cap*)
    echo "$*" >> "{log}.counters"
    m=$(wc -l < "{log}.counters")
    echo "clocks_event_reasons_counters.sw_power_cap [us], clocks_event_reasons_counters.sw_thermal_slowdown [us], \
clocks_event_reasons_counters.hw_thermal_slowdown [us], clocks_event_reasons_counters.hw_power_brake_slowdown [us]"
    echo "$((1500 * m)), 0, $((500 * m)), 0"
    exit 0 ;;
  *clocks.sm*) ;;
  *) exit 9 ;;
esac
echo "$*" >> "{log}"
n=$(wc -l < "{log}")
echo "$((1000 + n)), 2619, 41, 117.30, 700.00, 0x0000000000000004"
"""


@pytest.fixture(scope="module")
def sweep_result(tmp_path_factory):
    from sdlib.models.tinymodels import build_models

    paths = build_models(MODELS_DIR)
    out = tmp_path_factory.mktemp("sweeps")
    cfg = parse_sweep({
        "name": "engine_test",
        "results_dir": str(out),
        "models": [{"path": str(paths["target"]), "name": "tiny", "dtype": "float32", "max_model_len": 512}],
        "methods": [
            {"name": "ngram", "num_spec_tokens": K, "options": {"prompt_lookup_min": 2, "prompt_lookup_max": 4}},
            {"name": "draft_model", "num_spec_tokens": K, "model": str(paths["target"]), "label": "self-draft"},
        ],
        "workloads": [{"dataset": "humaneval", "source": "package", "num_requests": 8, "max_output_tokens": 32,
                       "max_prompt_tokens": 256}],
        "batch_sizes": [1, 4],
        "warmup_requests": 1,
        "engine": {"gpu_memory_utilization": 0.2, "enforce_eager": True},
    })
    first = run_sweep(cfg, only_methods=["ngram-k3"], quiet=True)
    files_after_first = {p: p.stat().st_mtime_ns for p in first.dir.rglob("*.parquet")}
    bindir = tmp_path_factory.mktemp("smi")
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(log=bindir / "calls.log"))
    smi.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        store = run_sweep(cfg, quiet=True)
    return cfg, store, files_after_first


def test_all_cells_done_no_failures(sweep_result):
    cfg, store, _ = sweep_result
    assert store.failures().empty, store.failures().to_dict("records")
    assert store.done_ids() == {c.run_id for c in cfg.cells()}


def test_step_sums_equal_vllm_counters(sweep_result):
    _, store, _ = sweep_result
    runs, steps = store.read("runs"), store.read("steps")
    assert len(runs) == 4
    for r in runs.itertuples():
        s = steps[steps.run_id == r.run_id]
        assert r.acceptance_source == "detailed"
        assert int(s.accepted.sum()) == r.counter_num_accepted_tokens
        assert int(s.drafted.sum()) == r.counter_num_draft_tokens
        assert int((s.drafted > 0).sum()) == r.counter_num_drafts
        assert r.counter_num_drafts > 0


def test_identical_draft_accepts_everything(sweep_result):
    _, store, _ = sweep_result
    acc = acceptance_table(store.read("steps"), store.read("runs"))
    selfd = acc[acc.method_label == "self-draft"]
    assert len(selfd) == 2
    assert (selfd.mean_acceptance_length == K + 1).all(), selfd[["batch_size", "mean_acceptance_length"]]
    assert (selfd.counter_mean_acceptance_length == K + 1).all()


def test_requests_and_positions_consistent(sweep_result):
    _, store, _ = sweep_result
    req, steps = store.read("requests"), store.read("steps")
    assert (req.groupby("run_id").size() == 8).all()
    assert (req.output_tokens > 0).all() and (req.latency_s >= req.ttft_s).all()
    # positions: each step starts where the previous one ended; never beyond the output
    m = steps.merge(req[["run_id", "request_id", "output_tokens"]], on=["run_id", "request_id"])
    assert (m.position < m.output_tokens).all()
    assert (m.position >= 1).all()


def test_resume_computes_only_the_rest(sweep_result):
    _, store, before = sweep_result
    assert before, "the first (interrupted) invocation wrote nothing"
    for p, mtime in before.items():
        assert p.exists() and p.stat().st_mtime_ns == mtime, f"{p} was rewritten"
    prov = store.read_provenance()
    assert [i["cells_planned"] for i in prov["invocations"]] == [2, 2]
    assert prov["invocations"][1]["cells_already_done"] == 2
    eng = prov["invocations"][1]["engines"][0]
    assert eng["vllm_version"] and eng["device"]


def test_the_invocation_that_ran_part_of_the_config_records_its_selection(sweep_result):
    """The first run took `only_methods` (as `--methods`): its provenance entry says so; the full rerun's does not."""
    _, store, _ = sweep_result
    invs = store.read_provenance()["invocations"]
    assert len(invs) == 2
    assert invs[0]["selection"] == {"methods": ["ngram-k3"]} and "selection" not in invs[1]


def test_each_cell_records_the_gpu_state_before_and_after_its_requests(sweep_result):
    """Without nvidia-smi (the first invocation's n-gram cells, on a machine without one) the ``gpu_*`` columns
    are unknown; with it (the stand-in of the second invocation) each cell records one sample before its
    requests and one after (the stand-in's SM clock counts its calls up: end = start + 1 within a cell), and the
    clock-event counters' growth between them, reason by reason and summed (the stand-in's grow 1500 us and 500 us
    a call: 1.5 ms of SW power cap and 0.5 ms of HW thermal a cell, 2 ms in all)."""
    _, store, _ = sweep_result
    runs = store.read("runs").set_index("method_label")
    gpu = ["gpu_sm_mhz_start", "gpu_sm_mhz_end", "gpu_mem_mhz_end", "gpu_temp_c_end", "gpu_power_w_end",
           "gpu_power_limit_w_end"]
    held = ["gpu_held_sw_power_cap_ms", "gpu_held_sw_thermal_ms", "gpu_held_hw_thermal_ms",
            "gpu_held_hw_power_brake_ms"]
    if shutil.which("nvidia-smi") is None:  # a real one would answer for the first invocation's cells
        ngram = runs.loc["ngram-k3"]
        assert len(ngram) == 2 and ngram[gpu].isna().all().all() and ngram["gpu_clock_events_end"].isna().all()
        assert ngram["gpu_slowdown_ms"].isna().all() and ngram[held].isna().all().all()
    selfd = runs.loc["self-draft"]
    assert len(selfd) == 2
    assert (selfd["gpu_sm_mhz_end"] == selfd["gpu_sm_mhz_start"] + 1).all(), selfd[gpu]
    assert sorted(selfd["gpu_sm_mhz_start"]) == [1001.0, 1003.0]  # two calls per cell, none elsewhere
    assert (selfd["gpu_mem_mhz_end"] == 2619).all() and (selfd["gpu_temp_c_end"] == 41).all()
    assert selfd["gpu_power_w_end"].tolist() == pytest.approx([117.3, 117.3])
    assert (selfd["gpu_clock_events_end"] == "0x0000000000000004").all()
    assert (selfd["gpu_power_limit_w_end"] == 700).all()
    assert selfd["gpu_slowdown_ms"].tolist() == pytest.approx([2.0, 2.0])
    assert selfd[held].values.ravel().tolist() == pytest.approx([1.5, 0.0, 0.5, 0.0] * 2)
