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
