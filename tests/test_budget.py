"""sdlib.run.budget (the GPU-time planner): estimates worked out by hand from a hand-made engine cost model and
calibration, whole blocks under a budget, resume, bad input; and the committed replay's step counts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from sdlib.cli import main
from sdlib.config import ConfigError, parse_sweep
from sdlib.paths import REPO_ROOT, SWEEPS_DIR
from sdlib.run import budget
from sdlib.sim.costmodel import CostModel
from sdlib.sim.engine_costs import EngineCostModel

DEV = "TestGPU"

# a step costs 10 ms without SD, 20 ms on the padded path at k = 2, 30 ms on the ragged path at k = 3, whatever
# the batch size and context; a prefill costs 100 ms
PREFILL = CostModel(name="prefill-100ms", target_kv_s=0.0, target_n_s=0.0, target_fixed_s=0.1, eagle_kv_s=0.0,
                    eagle_n_s=0.0, eagle_fixed_s=0.0, ngram_frac=0.0, overhead_s=0.0)
ECM = EngineCostModel(name="hand", a_kv_s=0.0, a_n_s={"none": 0.0, "padded": 0.0, "ragged": 0.0},
                      ks={"none": [0], "padded": [2], "ragged": [3]}, batch_sizes=[1, 8],
                      alpha_s={"none": [[0.01, 0.01]], "padded": [[0.02, 0.02]], "ragged": [[0.03, 0.03]]},
                      prefill_model=PREFILL)


def calibration() -> budget.Calibration:
    starts = pd.DataFrame([
        {"device": DEV, "vllm_version": "1.0", "model": "m|tp1", "method": "none", "start_class": "first",
         "engine_start_s": 100.0, "sweep": "a"},
        {"device": DEV, "vllm_version": "1.0", "model": "m|tp1", "method": "eagle3", "start_class": "new_kind",
         "engine_start_s": 50.0, "sweep": "a"},
        {"device": DEV, "vllm_version": "1.0", "model": "m|tp1", "method": "eagle3", "start_class": "again",
         "engine_start_s": 20.0, "sweep": "a"},
    ], columns=budget.START_COLUMNS)
    return budget.Calibration(starts=starts, process_overhead_s=10.0, cell_overhead_s=1.0, source="hand")


def sweep_dict(**over) -> dict:
    d = {"name": "plan_test", "models": [{"name": "m", "path": "m"}],
         "methods": [{"name": "none"},
                     {"name": "eagle3", "num_spec_tokens": 2, "model": "head",
                      "options": {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0}},
                     {"name": "ngram", "num_spec_tokens": 3}],
         "workloads": [{"dataset": "gsm8k", "source": "hub", "num_requests": 2, "max_output_tokens": 11,
                        "max_prompt_tokens": 10},
                       {"dataset": "sharegpt", "source": "hub", "num_requests": 2, "max_output_tokens": 11,
                        "max_prompt_tokens": 10}],
         "batch_sizes": [1, 4], "batch_mode": "paper", "warmup_requests": 1, "warmup_scope": "batch_size"}
    d.update(over)
    return d


def planner() -> budget.Planner:
    return budget.Planner(ECM, calibration(), DEV)


def test_cell_estimates_by_hand():
    est = planner().estimate(parse_sweep(sweep_dict()))
    c = est.cells.set_index(["method", "dataset", "batch_size"])
    # paper mode: each of the 2 prompts is one batch: prefill 0.1 + 10 decode steps (11 tokens, tau = 1) x 10 ms
    assert c.loc[("none", "gsm8k", 4), "window_s"] == pytest.approx(2 * (0.1 + 10 * 0.01))
    assert c.loc[("none", "gsm8k", 4), "engine_steps"] == 2 * 11
    # synthetic acceptance 2: ceil(10 / 2) = 5 steps of 20 ms
    assert c.loc[("eagle3", "gsm8k", 4), "window_s"] == pytest.approx(2 * (0.1 + 5 * 0.02))
    assert c.loc[("eagle3", "gsm8k", 4), "tokens_per_step"] == pytest.approx(11 / 6)
    # n-gram, acceptance unknown: DEFAULT_TOKENS_PER_STEP = 1, 10 steps of 30 ms
    assert budget.DEFAULT_TOKENS_PER_STEP == 1.0
    assert c.loc[("ngram", "gsm8k", 4), "window_s"] == pytest.approx(2 * (0.1 + 10 * 0.03))
    # warm-up: 1 request at batch 1, once per (engine, batch size): on the first dataset's cell only
    assert c.loc[("none", "gsm8k", 4), "warmup_s"] == pytest.approx(0.1 + 10 * 0.01)
    assert c.loc[("none", "sharegpt", 4), "warmup_s"] == 0.0
    assert c.loc[("none", "sharegpt", 4), "est_s"] == pytest.approx(0.4 + 1.0)


def test_closed_loop_by_hand():
    d = sweep_dict(batch_mode="closed_loop", batch_sizes=[2], requests_per_slot=2)
    est = planner().estimate(parse_sweep(d))
    r = est.cells[(est.cells["method"] == "none") & (est.cells["dataset"] == "gsm8k")].iloc[0]
    # max(2, 2 x 2) = 4 requests, 2 in flight: each step serves 2 -> 4 x (0.1 + 0.1) / 2
    assert r["requests"] == 4
    assert r["window_s"] == pytest.approx(4 * 0.2 / 2)
    assert r["engine_steps"] == 4 * 11 // 2


def test_group_totals_and_start_classes():
    est = planner().estimate(parse_sweep(sweep_dict()))
    g = est.groups.set_index("engine")
    assert list(est.groups["engine"]) == ["none", "eagle3-k2", "ngram-k3"]
    assert list(g["start_class"]) == ["first", "new_kind", "new_kind"]
    # none: the first start (100 s); eagle3: its new_kind start (50); ngram: no ngram record -> every method's
    # new_kind (50)
    assert list(g["engine_start_s"]) == [100.0, 50.0, 50.0]
    # none: 4 cells of 0.4 s (bs 1 and bs 4 price alike here) + 1 s each, warm-ups at bs 1 and bs 4 (0.2 s each)
    assert g.loc["none", "cells_s"] == pytest.approx(4 * 1.4)
    assert g.loc["none", "warmup_s"] == pytest.approx(2 * 0.2)
    assert g.loc["none", "total_s"] == pytest.approx(100 + 10 + 0.4 + 5.6)
    assert est.total_s == pytest.approx(float(g["total_s"].sum()))


def test_engine_start_fallbacks():
    cal = calibration()
    assert cal.engine_start_s("m|tp1", "eagle3", "again", DEV)[0] == 20.0
    assert cal.engine_start_s("other|tp4", "eagle3", "again", DEV)[0] == 20.0  # model dropped
    assert cal.engine_start_s("m|tp1", "ngram", "first", DEV)[0] == 100.0  # a first start pools the methods
    assert cal.engine_start_s("m|tp1", "none", "again", "UnknownGPU") == (budget.DEFAULT_ENGINE_START_S["again"],
                                                                          "default")


def test_scale_is_matched_by_batch_size_then_nearest_then_pooled():
    """The device scale is the median ratio of committed cells of the same method and batch mode, at the batch
    size where it has MIN_SCALE_CELLS cells, else at the nearest batch size (log scale) that has, else pooled;
    a method never measured takes the no-SD cells the same way. On the H100 the committed bs 1 cells' ratio lay
    far below the bs 32 and 128 ones', so a median pooled over batch sizes over-priced bs 1."""
    assert budget.MIN_SCALE_CELLS == 3
    rows = [("eagle3", "closed_loop", 1, r) for r in (0.5, 0.6, 0.7)] + \
           [("eagle3", "closed_loop", 4, r) for r in (1.4, 1.5, 1.6)] + [("eagle3", "closed_loop", 16, 9.0)] + \
           [("none", "closed_loop", 1, 0.9)] + [("none", "closed_loop", 4, r) for r in (2.0, 2.2, 2.4)] + \
           [("eagle3", "paper", 4, 3.0)]
    ratios = pd.DataFrame([{"model": "m|tp1", "device": DEV, "method": m, "batch_mode": mode, "batch_size": bs,
                            "ratio": r, "sweep": "a"} for m, mode, bs, r in rows], columns=budget.RATIO_COLUMNS)
    cal = budget.Calibration(starts=calibration().starts, process_overhead_s=10.0, cell_overhead_s=1.0,
                             ratios=ratios, source="hand")
    assert cal.scale("m|tp1", "eagle3", "closed_loop", DEV, 1) == (0.6, "eagle3/closed_loop/1 (3 cells)")
    assert cal.scale("m|tp1", "eagle3", "closed_loop", DEV, 4) == (1.5, "eagle3/closed_loop/4 (3 cells)")
    # bs 16 has one cell, too few: the nearest batch size with three (4, not 1); bs 2 lies as near 1 as 4: the smaller
    assert cal.scale("m|tp1", "eagle3", "closed_loop", DEV, 16) == (1.5, "eagle3/closed_loop/4 (3 cells, nearest to bs 16)")
    assert cal.scale("m|tp1", "eagle3", "closed_loop", DEV, 2) == (0.6, "eagle3/closed_loop/1 (3 cells, nearest to bs 2)")
    assert cal.scale("m|tp1", "eagle3", "closed_loop", DEV, 512)[0] == 1.5
    # a batch size as far from two others on the log scale takes the smaller, exactly (as float logs, 32 lies a
    # hair nearer 64 than 16)
    even = pd.DataFrame([{"model": "m|tp1", "device": DEV, "method": "none", "batch_mode": "closed_loop",
                          "batch_size": bs, "ratio": r, "sweep": "a"} for bs, r in ((16, 1.0), (64, 2.0))
                         for _ in range(3)], columns=budget.RATIO_COLUMNS)
    assert budget.Calibration(ratios=even).scale("m|tp1", "none", "closed_loop", DEV, 32)[0] == 1.0
    assert budget.Calibration(ratios=even.assign(batch_size=even["batch_size"] * 4)).scale(
        "m|tp1", "none", "closed_loop", DEV, 128)[0] == 1.0  # 128 between 64 and 256
    # a batch mode the method never ran: its cells of every mode, by batch size the same way
    assert cal.scale("m|tp1", "eagle3", "open_loop", DEV, 4) == (1.55, "eagle3/*/4 (4 cells)")
    # paper mode: one cell, no batch size with three: pooled
    assert cal.scale("m|tp1", "eagle3", "paper", DEV, 1) == (3.0, "eagle3/paper/* (1 cells)")
    # no batch size given: the method and mode pooled, as before batch sizes were recorded
    assert cal.scale("m|tp1", "eagle3", "closed_loop", DEV) == (1.4, "eagle3/closed_loop/* (7 cells)")
    # ngram never measured: the no-SD cells the same way (bs 1 has one no-SD cell: the nearest with three is 4)
    assert cal.scale("m|tp1", "ngram", "closed_loop", DEV, 4) == (2.2, "none/closed_loop/4 (3 cells)")
    assert cal.scale("m|tp1", "ngram", "closed_loop", DEV, 1) == (2.2, "none/closed_loop/4 (3 cells, nearest to bs 1)")
    assert cal.scale("other|tp1", "eagle3", "closed_loop", DEV, 1) == (1.0, "none")
    # ratios recorded without batch sizes (or a frame without the column): pooled, and said so
    bare_cal = budget.Calibration(ratios=ratios.drop(columns="batch_size"))
    assert bare_cal.scale("m|tp1", "eagle3", "closed_loop", DEV, 1) == (1.4, "eagle3/closed_loop/* (7 cells)")
    nan_cal = budget.Calibration(ratios=ratios.assign(batch_size=None))
    assert nan_cal.scale("m|tp1", "eagle3", "closed_loop", DEV, 1) == (1.4, "eagle3/closed_loop/* (7 cells)")
    # the planner prices each cell with its own batch size's scale
    p = budget.Planner(ECM, cal, DEV)
    d = sweep_dict(batch_mode="closed_loop", batch_sizes=[1, 4])
    est = p.estimate(parse_sweep(d))
    c = est.cells.set_index(["method", "dataset", "batch_size"])["window_s"]
    bare = budget.Planner(ECM, calibration(), DEV).estimate(parse_sweep(d)).cells.set_index(
        ["method", "dataset", "batch_size"])["window_s"]
    assert c[("eagle3", "gsm8k", 1)] == pytest.approx(0.6 * bare[("eagle3", "gsm8k", 1)])
    assert c[("eagle3", "gsm8k", 4)] == pytest.approx(1.5 * bare[("eagle3", "gsm8k", 4)])
    assert c[("none", "gsm8k", 1)] == pytest.approx(2.2 * bare[("none", "gsm8k", 1)])


def test_budget_takes_whole_blocks_in_priority_order():
    sw = parse_sweep(sweep_dict())
    p = planner()
    est = p.estimate(sw)
    everything = budget.select_blocks(est, p, sw, None)
    assert everything.blocks["selected"].all() and len(everything.blocks) == 4
    assert everything.total_s == pytest.approx(est.total_s)
    first = everything.blocks.iloc[0]
    assert first["block"] == ("m", "gsm8k", 1)
    # the first block pays the three engine starts and processes (230 s); each later block only its cells
    bp = budget.select_blocks(est, p, sw, (first["alone_s"] + 1.0) / 60)
    assert bp.selected == {("m", "gsm8k", 1)}
    assert set(bp.cells["method"]) == {"none", "eagle3", "ngram"}  # every arm of the block
    assert bp.total_s == pytest.approx(first["alone_s"]) and bp.total_s == pytest.approx(
        230 + sum(bp.cells["est_s"]))
    # batch sizes first: bs 1 of both datasets before bs 4
    bs_first = budget.select_blocks(est, p, sw, None, budget.parse_priority("bs", sw))
    assert [b[1:] for b in bs_first.blocks["block"]] == [("gsm8k", 1), ("sharegpt", 1), ("gsm8k", 4), ("sharegpt", 4)]
    listed = budget.select_blocks(est, p, sw, None, budget.parse_priority("sharegpt:4,1", sw))
    assert [b[1:] for b in listed.blocks["block"]][:3] == [("sharegpt", 4), ("gsm8k", 1), ("sharegpt", 1)]
    assert budget.select_blocks(est, p, sw, 0).selected == set()


def test_a_block_that_does_not_fit_leaves_room_for_smaller_ones():
    sw = parse_sweep(sweep_dict(workloads=[
        {"dataset": "gsm8k", "source": "hub", "num_requests": 2, "max_output_tokens": 11, "max_prompt_tokens": 10},
        {"dataset": "sharegpt", "source": "hub", "num_requests": 40, "max_output_tokens": 11, "max_prompt_tokens": 10}]))
    p = planner()
    est = p.estimate(sw)
    small = budget.select_blocks(est, p, sw, None, only={"datasets": ["gsm8k"]}).total_s
    # sharegpt's blocks (40 prompts each) come second but do not fit next to gsm8k:1; gsm8k:4 after them does
    bp = budget.select_blocks(est, p, sw, (small + 0.5) / 60, budget.parse_priority("gsm8k:1,sharegpt,gsm8k:4", sw))
    assert bp.selected == {("m", "gsm8k", 1), ("m", "gsm8k", 4)}
    assert list(bp.blocks["selected"]) == [True, False, False, True]


class _Store:
    def __init__(self, done):
        self._done = set(done)

    def done_ids(self):
        return self._done

    def failures(self):
        return pd.DataFrame({"run_id": []})


def test_resume_skips_done_cells():
    sw = parse_sweep(sweep_dict())
    cells = sw.cells()
    none_ids = {c.run_id for c in cells if c.method.name == "none"}
    p = planner()
    est = p.estimate(sw, _Store(none_ids))
    assert est.cells["done"].sum() == len(none_ids)
    assert "none" not in set(est.groups["engine"])  # its engine is not started again
    assert est.groups.iloc[0]["start_class"] == "first"
    bp = budget.select_blocks(est, p, sw, None)
    assert not set(bp.cells["run_id"]) & none_ids
    # everything done: nothing to plan
    done = p.estimate(sw, _Store({c.run_id for c in cells}))
    assert done.groups.empty and budget.select_blocks(done, p, sw, 30).blocks.empty


def test_whole_parts_counts_a_done_cell_only_in_a_whole_part():
    """`sdlib plan --whole-parts` plans what a GPU session re-runs: the cells of a part left half done (here every
    part has only its no-SD cell done) run again; a whole part's cells are skipped."""
    sw = parse_sweep(sweep_dict())
    cells = sw.cells()
    none_ids = {c.run_id for c in cells if c.method.name == "none"}
    p = planner()
    assert p.estimate(sw, _Store(none_ids), whole_parts=True).cells["done"].sum() == 0
    part = cells[0].part_key
    whole = {c.run_id for c in cells if c.part_key == part}
    assert 1 < len(whole) < len(cells)
    est = p.estimate(sw, _Store(whole | none_ids), whole_parts=True)
    assert set(est.cells.loc[est.cells["done"], "run_id"]) == whole
    assert set(est.cells.loc[est.cells["half_done"], "run_id"]) == none_ids - whole
    text = budget.format_plan(budget.select_blocks(est, p, sw, None), sw)
    assert f"--whole-parts: {len(none_ids - whole)} done cell(s) in parts left half done are planned again" in text
    # only the planned blocks' half-done cells are counted (one dataset's plan says nothing of another's)
    other = next(c for c in cells if c.workload.label != cells[0].workload.label)
    only = budget.select_blocks(est, p, sw, None, only={"datasets": [other.workload.label]})
    n_other = len({c.run_id for c in cells if c.workload.label == other.workload.label} & (none_ids - whole))
    assert int(only.cells["half_done"].sum()) == n_other
    assert not p.estimate(sw, _Store(whole), whole_parts=True, from_scratch=True).cells["done"].any()


def test_blocks_and_priority_parse_errors():
    sw = parse_sweep(sweep_dict())
    assert budget.parse_blocks("gsm8k:4, m/sharegpt:1", sw) == {("m", "gsm8k", 4), ("m", "sharegpt", 1)}
    for text in ("nope:1", "gsm8k:3", "gsm8k", "x/gsm8k:1", "gsm8k:4@1", "gsm8k:4@x", "gsm8k:4@0.0.0"):
        with pytest.raises(ConfigError):
            budget.parse_blocks(text, sw)
    two = parse_sweep(sweep_dict(engine_starts=2, order="abba", repeats=2))
    assert budget.parse_blocks("gsm8k:4@1, m/sharegpt:1@0.1", two) == {("m", "gsm8k", 4, 1), ("m", "sharegpt", 1, 0, 1)}
    with pytest.raises(ConfigError, match="repeat 2"):
        budget.parse_blocks("gsm8k:4@0.2", two)
    for text in ("nope", "gsm8k:3", "7"):
        with pytest.raises(ConfigError):
            budget.parse_priority(text, sw)


@pytest.mark.parametrize("args, says", [
    (["--gpu-minutes", "-5"], "--gpu-minutes"),
    (["--gpu-minutes", "lots"], "--gpu-minutes"),
    (["--priority", "nowhere"], "--priority: 'nowhere' is not a workload"),
    (["--priority", "gsm8k:3"], "batch size 3"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, args, says):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(sweep_dict(results_dir=str(tmp_path / "out"))))
    assert main(["plan", str(cfg), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err


def test_sweep_plan_minutes_bad_input(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(sweep_dict(results_dir=str(tmp_path / "out"))))
    assert main(["sweep", str(cfg), "--plan-minutes", "-1", "--dry-run"]) == 2
    assert main(["sweep", str(cfg), "--blocks", "gsm8k:1", "--methods", "none", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--plan-minutes" in err[0] and "not with --methods" in err[1]


def test_full_graphs_lint():
    base = sweep_dict(methods=[{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3, "replay": "fixed"},
                               {"name": "ngram", "num_spec_tokens": 10, "replay": "oracle"}],
                      workloads=[{"dataset": "gsm8k", "source": "reference", "full_traces": True, "num_requests": 2}],
                      engine={"pin_target": True})
    assert budget.config_notes(parse_sweep(base)) == []
    full = dict(base, engine={"pin_target": True, "extra": {"compilation_config": {"cudagraph_mode": "FULL"}}})
    notes = budget.config_notes(parse_sweep(full))
    assert len(notes) == 1 and "one ngram-k10 engine" in notes[0] and "1 engine start(s) fewer" in notes[0]


def test_paper_matrix_counts(monkeypatch):
    monkeypatch.setattr(budget, "reference_tokens_per_step",
                        lambda ks: {(d, k): 2.0 for d in ("ngram", "eagle3") for k in ks})
    mx = budget.PaperMatrix(datasets=("aime", "gpqa"), ks=(1, 2), batch_sizes=(1, 8), repeats=3,
                            shapes=(("s8", "m", 1), ("s70", "big", 2)))
    est = budget.paper_matrix(planner(), mx)
    # per shape: 5 methods x 2 k + no SD = 11 engines; cells: 2 datasets x 11 x 2 batch sizes x 3 repeats
    assert len(est.groups) == 2 * 11 and len(est.cells) == 2 * 2 * 11 * 2 * 3
    assert set(est.groups.loc[est.groups["model"] == "s70", "gpus"]) == {2}
    text = budget.format_paper_matrix(est, mx)
    gpu_h = float(est.groups.eval("total_s * gpus").sum()) / 3600
    assert f"total: {gpu_h:.1f} GPU-hours" in text


# ------------------------------------------------------------------- the committed H200 replay
REPLAY = SWEEPS_DIR / "h200_replay"


@pytest.mark.skipif(not (REPLAY / "engine_steps").is_dir(), reason="h200_replay sweep not present")
def test_replay_cells_steps_equal_the_measured_ones():
    """At bs 1 a replay cell's planned engine steps are exactly the steps that gave tokens in the committed run
    (the engine also records idle steps before each batch; at larger B, admissions spread over a few steps)."""
    from sdlib.config import load_sweep

    sw = load_sweep(REPO_ROOT / "configs/h200_replay.yaml")
    cells = [c for c in sw.cells() if c.batch_size == 1 and c.workload.label == "gsm8k"
             and c.method.label in ("none", "eagle3-k3-fixed", "ngram-k5-oracle", "eagle3-k10-combine")]
    assert len(cells) == 4
    p = budget.Planner(calibration=budget.Calibration())
    for c in cells:
        steps = pd.read_parquet(REPLAY / "engine_steps" / f"{c.run_id}.parquet")
        assert p.cell_row(c)["engine_steps"] == int((steps["num_new_tokens"] > 0).sum()), c.method.label
        assert math.isfinite(p.cell_row(c)["window_s"])


def test_sweep_blocks_dry_run_runs_only_those_blocks(tmp_path, capsys):
    rc = main(["sweep", str(REPO_ROOT / "configs/embedded_default.yaml"), "--results-dir", str(tmp_path), "--blocks", "code_edit:1",
               "--dry-run"])
    assert rc == 0
    out = capsys.readouterr().out
    ids = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert ids and all("__code_edit__bs1__" in i for i in ids)
    assert len({i.split("__")[1] for i in ids}) == 5  # every arm: no SD and the four SD methods


def test_engine_starts_and_aa_twins_share_blocks():
    d = sweep_dict(engine_starts=2, order="abba", repeats=2)
    d["methods"].append({**d["methods"][1], "label": "eagle3-aa", "aa_of": "eagle3-k2"})
    sw = parse_sweep(d)
    p = planner()
    est = p.estimate(sw)
    # 3 engines x 2 starts; the A/A twin runs on its arm's engine
    assert len(est.groups) == 6 and set(est.groups["start"]) == {0, 1}
    assert list(est.groups["start_class"]).count("again") == 3
    bp = budget.select_blocks(est, p, sw, None)
    block = bp.cells[bp.cells["block"] == ("m", "gsm8k", 1)]
    # every arm (4 labels) x 2 repeats x 2 engine starts
    assert len(block) == 4 * 2 * 2 and set(block["method_label"]) >= {"eagle3-aa", "eagle3-k2"}


def test_a_block_too_large_for_the_budget_is_taken_in_parts():
    """A block that alone exceeds the budget is split by engine start, then by (start, repeat); every part holds
    every arm at its start (and repeat); a block that fits alone is never split."""
    from sdlib.config import in_blocks

    d = sweep_dict(engine_starts=2, order="abba", repeats=2)
    d["methods"].append({**d["methods"][1], "label": "eagle3-aa", "aa_of": "eagle3-k2"})
    sw = parse_sweep(d)
    p = planner()
    est = p.estimate(sw)
    whole = budget.select_blocks(est, p, sw, None)
    first = whole.blocks.iloc[0]
    assert first["block"] == ("m", "gsm8k", 1) and first["part"] == ""
    block_only = budget.select_blocks(est, p, sw, None, only={"datasets": ["gsm8k"], "batch_sizes": [1]})
    # a budget below the block alone but above one start's part: the block's two starts are its units
    cells = est.cells[est.cells["block"] == ("m", "gsm8k", 1)]
    assert set(cells["start"]) == {0, 1}
    start0 = float(p.group_table(budget._assign_warmups(cells[cells["start"] == 0]))["total_s"].sum())
    assert start0 < first["alone_s"] == pytest.approx(block_only.total_s)
    bp = budget.select_blocks(est, p, sw, (start0 + 0.5) / 60)
    rows = bp.blocks[bp.blocks["dataset"] == "gsm8k"]
    assert list(rows[rows["batch_size"] == 1]["block"]) == [("m", "gsm8k", 1, 0), ("m", "gsm8k", 1, 1)]
    assert ("m", "gsm8k", 1, 0) in bp.selected
    part = bp.cells[bp.cells["block"] == ("m", "gsm8k", 1)]
    assert set(part["start"]) == {0} and set(part["repeat"]) == {0, 1}
    assert set(part["method_label"]) == set(cells["method_label"])  # every arm, the A/A twin and no SD included
    assert bp.total_s <= start0 + 0.5 + 1e-9
    # tighter: one (start, repeat) cluster per part
    r0 = cells[(cells["start"] == 0) & (cells["repeat"] == 0)]
    cluster = float(p.group_table(budget._assign_warmups(r0))["total_s"].sum())
    tight = budget.select_blocks(est, p, sw, (cluster + 0.1) / 60)
    assert tight.blocks.iloc[0]["block"] == ("m", "gsm8k", 1, 0, 0) and tight.blocks.iloc[0]["part"] == "start 0 repeat 0"
    got = tight.cells[tight.cells["block"] == ("m", "gsm8k", 1)]
    assert set(zip(got["start"], got["repeat"])) == {(0, 0)} and set(got["method_label"]) == set(cells["method_label"])
    # a block that fits alone is not split, even where it no longer fits next to the blocks already taken
    roomy = budget.select_blocks(est, p, sw, (first["alone_s"] + 0.5) / 60)
    assert all(len(b) == 3 for b in roomy.blocks["block"])
    # the runner's filter: whole blocks and parts
    keys = {("m", "gsm8k", 1, 0), ("m", "sharegpt", 4)}
    assert in_blocks(("m", "gsm8k", 1, 0, 1), keys) and not in_blocks(("m", "gsm8k", 1, 1, 0), keys)
    assert in_blocks(("m", "sharegpt", 4, 1, 1), keys) and not in_blocks(("m", "sharegpt", 1, 0, 0), keys)
    c = next(c for c in sw.cells() if c.start == 1)
    assert c.part_key == ("m", c.workload.label, c.batch_size, 1, c.repeat)
    assert "parts" in budget.format_plan(bp, sw)


@pytest.mark.parametrize("starts, repeats, want", [(1, 2, [("m", "gsm8k", 1, 0, 0), ("m", "gsm8k", 1, 0, 1)]),
                                                   (2, 1, [("m", "gsm8k", 1, 0), ("m", "gsm8k", 1, 1)])])
def test_parts_split_only_what_can_be_split(starts, repeats, want):
    """One engine start: the parts are its repeats; one repeat: its engine starts."""
    sw = parse_sweep(sweep_dict(engine_starts=starts, repeats=repeats, **({"order": "abba"} if starts > 1 else {})))
    p = planner()
    est = p.estimate(sw)
    cells = est.cells[est.cells["block"] == ("m", "gsm8k", 1)]
    one = cells[(cells["start"] == 0) & (cells["repeat"] == 0)]
    budget_min = (float(p.group_table(budget._assign_warmups(one))["total_s"].sum()) + 0.1) / 60
    bp = budget.select_blocks(est, p, sw, budget_min, only={"datasets": ["gsm8k"], "batch_sizes": [1]})
    assert list(bp.blocks["block"]) == want


def test_a_retried_cell_does_not_crowd_out_the_next_start():
    """A split block whose start 0 is done but for one failed cell (retried): its start 1, the larger part, comes
    first, so the leftover cell does not take the room start 1 needs (review of 2026-12-05)."""
    d = sweep_dict(engine_starts=2, order="abba", repeats=2)
    sw = parse_sweep(d)
    p = planner()
    cells = sw.cells()
    block = [c for c in cells if (c.workload.label, c.batch_size) == ("gsm8k", 1)]
    left = next(c for c in block if c.start == 0 and c.method.name == "eagle3")
    done = {c.run_id for c in cells if c not in block} | {c.run_id for c in block if c.start == 0 and c is not left}
    est = p.estimate(sw, _Store(done))
    todo = est.cells[~est.cells["done"]]
    start1 = float(p.group_table(budget._assign_warmups(todo[todo["start"] == 1]))["total_s"].sum())
    whole = float(p.group_table(budget._assign_warmups(todo))["total_s"].sum())
    assert start1 < whole
    bp = budget.select_blocks(est, p, sw, (start1 + (whole - start1) / 2) / 60)
    assert list(bp.blocks["block"]) == [("m", "gsm8k", 1, 1), ("m", "gsm8k", 1, 0)]
    assert bp.selected == {("m", "gsm8k", 1, 1)}


def test_every_selection_pays_its_warm_ups():
    """A block priced alone pays the warm-ups of its (engine, batch size) keys even where another block's cells come
    first in the sweep (warmup_scope: batch_size; review of 2026-12-05)."""
    sw = parse_sweep(sweep_dict())
    p = planner()
    est = p.estimate(sw)
    for b in [("m", "gsm8k", 1), ("m", "sharegpt", 1)]:
        sel = budget._assign_warmups(est.cells[est.cells["block"] == b])
        first = sel.drop_duplicates("warm_key")
        assert (first["warmup_s"] > 0).all() and first["warmup_s"].tolist() == first["warmup_each_s"].tolist()


def test_sweep_blocks_dry_run_runs_only_that_part(tmp_path, capsys):
    rc = main(["sweep", str(REPO_ROOT / "configs/embedded_powered.yaml"), "--results-dir", str(tmp_path), "--blocks",
               "code_edit:1@1", "--dry-run"])
    assert rc == 0
    ids = [line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert ids and all("__code_edit__bs1__" in i and "s1__" in i for i in ids)
    assert len({i.split("__")[1] for i in ids}) == 4  # every arm at that start: no SD, fixed k, its A/A twin, Oracle


def test_sweep_plan_minutes_plans_for_the_gpu_it_runs_on(tmp_path, capsys, monkeypatch):
    """`sdlib sweep --plan-minutes` calibrates with the engine starts of the card it runs on (an H100's are not an
    H200's); `--plan-device` names another; without a GPU, the H200's as before."""
    from sdlib.store import provenance

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(sweep_dict(results_dir=str(tmp_path / "out"))))
    for here, args, want in [("NVIDIA H100 80GB HBM3", [], "NVIDIA H100 80GB HBM3"),
                             ("CPU: some cpu", [], budget.DEFAULT_DEVICE),
                             ("NVIDIA H100 80GB HBM3", ["--plan-device", "NVIDIA H200"], "NVIDIA H200")]:
        monkeypatch.setattr(provenance, "device_name", lambda h=here: h)
        main(["sweep", str(cfg), "--plan-minutes", "1000", "--dry-run", *args])  # the plan comes before the models
        plan_lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("plan (")]
        assert plan_lines and plan_lines[0].startswith(f"plan ({want}):"), plan_lines
