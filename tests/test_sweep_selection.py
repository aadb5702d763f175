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
