"""An invocation that runs part of its config (``--blocks``, ``--plan-minutes``, ``--methods``, ``--datasets``,
``--batch-sizes``) records what it selected in provenance.json, so a sweep holding a subset of its config's cells
says why (and tests/test_config.py reads it instead of the command line's options)."""

from __future__ import annotations

import json

from sdlib.config import parse_sweep
from sdlib.run.groups import begin_invocation
from sdlib.run.sweep import selection_record
from sdlib.store import SweepStore


def test_selection_record_is_json_ready_and_none_for_the_whole_config():
    assert selection_record(None, None) is None and selection_record([], {}) is None
    rec = selection_record(["ngram", "none"], {"blocks": {("m", "gsm8k", 32, 1), ("m", "gsm8k", 1)},
                                               "batch_sizes": [32, 1], "datasets": None})
    assert rec == {"methods": ["ngram", "none"], "batch_sizes": [1, 32],
                   "blocks": [["m", "gsm8k", 1], ["m", "gsm8k", 32, 1]]}
    assert json.loads(json.dumps(rec)) == rec


def test_begin_invocation_records_the_selection_and_nothing_without_one(tmp_path):
    sweep = parse_sweep({"name": "sel", "models": [{"name": "m", "path": "m"}], "methods": [{"name": "none"}],
                         "workloads": [{"dataset": "gsm8k", "source": "hub", "num_requests": 2}], "batch_sizes": [1]})
    store = SweepStore(tmp_path / "sel")
    begin_invocation(sweep, store, {}, lambda m: None)
    store.selection = selection_record(None, {"blocks": {("m", "gsm8k", 1)}})
    begin_invocation(sweep, store, {}, lambda m: None)
    first, second = json.loads(store.provenance_path.read_text())["invocations"]
    assert "selection" not in first
    assert second["selection"] == {"blocks": [["m", "gsm8k", 1]]}


def test_cells_already_done_counts_only_the_selected_cells(tmp_path, monkeypatch):
    """A store shared by several blocks (a headline run block by block across GPU sessions): an invocation that
    selects one block counts the done cells of that block, not the other blocks' (it once said 96 for ShareGPT's
    first invocation, which were GSM8K's cells)."""
    from sdlib.run.plan import group_cells
    from sdlib.run.sweep import select_groups

    sweep = parse_sweep({"name": "sel", "models": [{"name": "m", "path": "m"}], "methods": [{"name": "none"}],
                         "workloads": [{"dataset": "gsm8k", "source": "hub", "num_requests": 2}],
                         "batch_sizes": [1, 2]})
    by_bs = {c.batch_size: c.run_id for c in sweep.cells()}
    assert len(by_bs) == 2
    store = SweepStore(tmp_path / "sel")
    monkeypatch.setattr(store, "done_ids", lambda: {by_bs[1]})  # bs 1 done by an earlier invocation
    selected = select_groups(group_cells(sweep.cells()), None, {"batch_sizes": [2]})
    assert [c.batch_size for cs in selected.values() for c in cs] == [2]
    store.selected_ids = {c.run_id for cs in selected.values() for c in cs}
    begin_invocation(sweep, store, selected, lambda m: None)
    store.selected_ids = None  # the whole config
    begin_invocation(sweep, store, selected, lambda m: None)
    one_block, whole = json.loads(store.provenance_path.read_text())["invocations"]
    assert one_block["cells_already_done"] == 0 and whole["cells_already_done"] == 1


def test_run_sweep_records_the_selected_blocks_counts(tmp_path, monkeypatch):
    """The wiring: run_sweep with --blocks on a store that holds another block's done cells records, at the start
    and at the end of the invocation, counts over the selected block only (no engine starts: the groups' runner is
    replaced by one that marks its cells done)."""
    import sdlib.run.sweep as S
    from sdlib.run.groups import begin_invocation as begin, end_invocation as end

    sweep = parse_sweep({"name": "sel", "results_dir": str(tmp_path), "models": [{"name": "m", "path": "m"}],
                         "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
                         "workloads": [{"dataset": "gsm8k", "source": "hub", "num_requests": 2}],
                         "batch_sizes": [1, 2]})
    by_bs = {bs: {c.run_id for c in sweep.cells() if c.batch_size == bs} for bs in (1, 2)}
    done = set(by_bs[1])  # bs 1 done by an earlier invocation
    monkeypatch.setattr(SweepStore, "done_ids", lambda self: set(done))
    monkeypatch.setattr(S, "preflight", lambda sweep: None)
    monkeypatch.setattr(S, "check_inputs", lambda sweep, store: None)
    monkeypatch.setattr(S, "record_inputs", lambda store, inputs: None)
    ran = []

    def fake_run_groups(sweep, store, groups, env, verbose, quiet, say):
        begin(sweep, store, groups, say)
        ran.extend(c.run_id for cs in groups.values() for c in cs)
        done.update(ran)
        end(sweep, store, say)

    monkeypatch.setattr(S, "_run_groups", fake_run_groups)
    store = S.run_sweep(sweep, quiet=True, only={"blocks": {("m", "gsm8k", 2)}})
    assert set(ran) == by_bs[2]
    inv = json.loads(store.provenance_path.read_text())["invocations"][-1]
    assert (inv["cells_planned"], inv["cells_already_done"], inv["cells_done"], inv["cells_failed"]) == \
        (len(by_bs[2]), 0, len(by_bs[2]), 0)
    assert inv["selection"] == {"blocks": [["m", "gsm8k", 2]]}


def test_methods_select_one_policy_of_an_engine_group():
    """--methods names a policy of a replay engine's group: that policy's cells alone (a real run and --dry-run both
    select with select_groups), whichever cell comes first in the group; the engine's label selects them all."""
    from types import SimpleNamespace as NS

    from sdlib.run.sweep import select_groups

    def cell(label, name="eagle3"):
        return NS(method=NS(label=label, name=name), batch_size=1, workload=NS(label="gsm8k"), part_key=("m",))

    g = ("m", "eagle3-k5", 0)
    groups = {g: [cell("eagle3-k5-fixed-eagle3-k5"), cell("eagle3-k5-oracle"), cell("eagle3-k5-online")]}
    assert [c.method.label for c in select_groups(groups, ["eagle3-k5-oracle"])[g]] == ["eagle3-k5-oracle"]
    assert len(select_groups(groups, ["eagle3-k5"])[g]) == 3
    assert select_groups(groups, ["ngram-k3"]) == {}
