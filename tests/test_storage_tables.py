import json

import pandas as pd
import pytest

from sdlib.config import parse_sweep
from sdlib.run.driver import drive
from sdlib.analysis.measures import acceptance_table, speedup_table
from sdlib.store.schema import TABLES, columns
from sdlib.store import SweepStore, read_table
from sdlib.extract.tables import build_tables
from tests.conftest import FakePrompt

CFG = {
    "name": "unit",
    "models": [{"path": "@models/target", "name": "tgt"}],
    "methods": [{"name": "none"}, {"name": "draft_model", "model": "@models/draft", "num_spec_tokens": 3}],
    "workloads": [{"dataset": "sharegpt", "num_requests": 2}],
    "batch_sizes": [1],
}


def _cell_tables(fake_engine, method_index, scripts, detailed=None):
    sweep = parse_sweep(CFG)
    cell = [c for c in sweep.cells() if c.method.label == sweep.methods[method_index].label][0]
    eng = fake_engine(scripts=scripts, detailed=detailed or {})
    prompts = [FakePrompt(i, [0] * n) for i, n in enumerate(sorted(scripts))]
    res = drive(eng, prompts, 1, lambda p: None, clock=eng.clock,
                spec_metrics=lambda c: (c.spec_decode_metrics.per_step_drafted, c.spec_decode_metrics.per_step_accepted)
                if c.spec_decode_metrics else None)
    acc = sum(sum(d[1]) for d in (detailed or {}).values())
    drafts = sum(len(d[0]) for d in (detailed or {}).values())
    counters = {"num_drafts": drafts, "num_draft_tokens": 3 * drafts, "num_accepted_tokens": acc,
                "accepted_per_pos": [drafts, 0, 0]}
    return cell, build_tables(cell, res, counters, sweep="unit", started_at="t", detailed_requested=bool(detailed))


def test_build_tables_sd(fake_engine):
    # two requests: gains [1,3,4] and [1,1,2]; k=3; detailed (drafted, accepted)
    cell, t = _cell_tables(fake_engine, 1, {1: [1, 3, 4], 2: [1, 1, 2]},
                           {1: ([3, 3], [2, 3]), 2: ([3, 3], [0, 1])})
    steps = t["steps"]
    assert list(steps["accepted"]) == [2, 3, 0, 1]
    assert list(steps["position"]) == [1, 4, 1, 2]
    assert steps["accepted"].sum() == t["runs"]["counter_num_accepted_tokens"][0] == 6
    # batch size 1: request 0 runs in engine steps 0-2, request 1 in 3-5
    assert list(steps["engine_step"]) == [1, 2, 4, 5]
    # target tokens per engine step: prompt (1, then 2) at prefill, 1 + drafted (3) per verify
    assert list(t["engine_steps"]["num_scheduled_tokens"]) == [1, 4, 4, 2, 4, 4]
    r = t["runs"].iloc[0]
    assert r["acceptance_source"] == "detailed"
    assert r["output_tokens"] == 8 + 4 and r["num_spec_tokens"] == 3
    req = t["requests"]
    assert list(req["num_accepted"]) == [5, 1] and list(req["num_drafted"]) == [6, 6]
    assert json.loads(req["output_token_ids"][0]) == list(range(8))
    for name, df in t.items():
        assert list(df.columns) == columns(name)


def test_store_roundtrip_resume_and_failures(tmp_path, fake_engine):
    cell, t = _cell_tables(fake_engine, 0, {1: [1, 1, 1]})
    store = SweepStore(tmp_path / "s")
    assert store.read("runs").empty and list(store.read("runs").columns) == columns("runs")
    store.write_failure(cell.run_id, {"error": "boom"})
    assert list(store.failures()["run_id"]) == [cell.run_id]
    store.write_cell(cell.run_id, t)
    assert store.is_done(cell.run_id) and store.failures().empty  # success clears the failure
    back = read_table(tmp_path / "s", "requests")
    assert len(back) == 1 and back["output_tokens"][0] == 3
    assert not list((tmp_path / "s").rglob(".*.parquet*"))  # no temp files left
    with pytest.raises(KeyError):
        store.write_cell("x", {"runs": t["runs"]})


def test_speedup_and_acceptance_measures(fake_engine):
    c0, t0 = _cell_tables(fake_engine, 0, {1: [1, 1, 1, 1]})
    c1, t1 = _cell_tables(fake_engine, 1, {1: [1, 3]}, {1: ([3], [2])})
    runs = pd.concat([t0["runs"], t1["runs"]])
    sp = speedup_table(runs).set_index("method")
    # the steady window starts after the prefill step (1 s each):
    # baseline: 3 tokens in 3 steps -> 1 tok/s; SD: 3 tokens in 1 step -> 3 tok/s
    assert sp.loc["none", "speedup"] == pytest.approx(1.0)
    assert sp.loc["draft_model", "speedup"] == pytest.approx(3.0)
    acc = acceptance_table(t1["steps"], t1["runs"]).iloc[0]
    assert acc["mean_acceptance_length"] == pytest.approx(3.0)
    assert acc["counter_mean_acceptance_length"] == pytest.approx(3.0)
    assert acc["acceptance_rate"] == pytest.approx(2 / 3)


def test_schema_documented_in_data_readme():
    from sdlib.paths import DATA_DIR

    text = (DATA_DIR / "README.md").read_text()
    for table, cols in TABLES.items():
        assert f"`{table}`" in text, table
        for c, _, _ in cols:
            assert f"`{c}`" in text, (table, c)


def test_rerun_of_a_finished_sweep_changes_no_file(tmp_path):
    from sdlib.config import parse_sweep
    from sdlib.run.sweep import run_sweep
    from sdlib.store import SweepStore, empty_table

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    cfg = parse_sweep({"name": "done", "results_dir": str(tmp_path / "sw"), "models": [{"path": str(model)}],
                       "methods": [{"name": "none"}], "workloads": [{"dataset": "code_edit"}], "batch_sizes": [1, 2]})
    store = SweepStore(cfg.out_dir)
    for c in cfg.cells():  # every cell finished, and the config's cells recorded, as a first run leaves them
        store.write_cell(c.run_id, {t: empty_table(t) for t in ("runs", "requests", "steps", "engine_steps")})
    store.set_current(cfg.to_dict(), [c.run_id for c in cfg.cells()])
    def files():  # the results (the lock and run-time bookkeeping are dot-files, ignored by git)
        return {p: p.stat().st_mtime_ns for p in store.dir.rglob("*")
                if not any(part.startswith(".") for part in p.relative_to(store.dir).parts)}

    before = files()
    run_sweep(cfg, quiet=True)
    assert files() == before
    assert "invocations" not in store.read_provenance()  # no invocation recorded: nothing ran


def test_a_custom_proposer_that_drafts_less_than_k_leaves_drafted_unknown(fake_engine):
    """A ``custom`` proposer may draft fewer than k tokens (or none): where vLLM's counters disagree with
    k drafted per verify step, the tables say ``drafted`` is unknown instead of assuming k."""
    cfg = {**CFG, "methods": [{"name": "custom", "model": "sdlib.vllm.proposers.ProposeNothing",
                               "num_spec_tokens": 3}]}
    cell = parse_sweep(cfg).cells()[0]

    def tables(counters):
        eng = fake_engine(scripts={1: [1, 1, 1]}, detailed={})
        res = drive(eng, [FakePrompt(0, [0])], 1, lambda p: None, clock=eng.clock, spec_metrics=lambda c: None)
        return build_tables(cell, res, counters, sweep="unit", started_at="t", detailed_requested=False)

    nothing = tables({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": [0] * 3})
    assert nothing["steps"]["drafted"].isna().all() and nothing["requests"]["num_drafted"].isna().all()
    assert nothing["engine_steps"]["num_scheduled_tokens"].isna().sum() == 2  # the two verify steps
    full = tables({"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 0, "accepted_per_pos": [0] * 3})
    assert list(full["steps"]["drafted"]) == [3, 3] and list(full["requests"]["num_drafted"]) == [6]
