"""Engine tests on the CPU build of vLLM: counters, lossless identical draft, resume.

One module-scoped sweep (2 methods x 2 batch sizes x 8 requests), run in two
invocations: first only n-gram (an "interrupted" sweep), then everything.
"""

from __future__ import annotations


import pytest

from sdlib.config import parse_sweep
from sdlib.analysis.measures import acceptance_table
from sdlib.paths import MODELS_DIR
from sdlib.run.sweep import run_sweep

pytestmark = pytest.mark.engine

K = 3


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
