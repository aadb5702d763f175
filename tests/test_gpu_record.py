"""gpu/record.py: the measured fields of a session record, drafted from the sweep, equal the hand-written ones.

The twenty-second and twenty-third sessions' records (data/gpu/h100_v034_2026-12-07d.json and -07e.json) were
written by hand from the H100 headline's provenance and runs tables, and re-checked by a helper; the draft of the
same invocations must say the same.
"""

from __future__ import annotations

import json

import pytest

from sdlib.paths import REPO_ROOT
from tests.gpu_scripts import load

SWEEP = REPO_ROOT / "data" / "sweeps" / "h100_v034_headline"


@pytest.mark.parametrize("index, record", [(19, "h100_v034_2026-12-07d.json"), (20, "h100_v034_2026-12-07e.json")])
def test_the_draft_of_an_invocation_is_what_its_record_says(index, record):
    rec = json.loads((REPO_ROOT / "data" / "gpu" / record).read_text())
    d = load("record").draft(SWEEP, index)
    assert d["device"] == [rec["device"]] and d["device_uuid"] == [rec["device_uuid"]]
    (label, inv), = d["invocation"].items()
    assert label in rec["invocation"]
    assert inv == {k: v for k, v in rec["invocation"][label].items() if k != "job_s"}
    (starts,) = d["engine_start_s"].values()
    (want,) = rec["engine_start_s"].values()
    assert starts == want and list(starts) == list(want)  # run order too
    assert d["replay"] == {"cells": 24, "replay_files": 22, "exact": 22}
    assert "the 22 replay/*.json" in rec["replay"]
    g = d["gpu_state"]
    assert g["cells"] == 24 and g["sm_mhz_start"] == g["sm_mhz_end"] == [1980, 1980]
    t, w, r = g["temp_c_end"], g["power_w_end"], g["repeat1_over_repeat0"]
    for text in (f"{t[0]}-{t[1]} C", f"{w[0]}-{w[1]} W", f"a median {r['median']:.3f} "
                 f"({r['by_arm'][0]:.3f} to {r['by_arm'][1]:.3f} by arm)", "gpu_slowdown_ms 0"):
        assert text in rec["gpu_state"], text
    assert g["clock_events_end"] == ["0x0000000000000000"] and g["slowdown_ms"] == [0, 0]


def test_a_cut_invocation_has_no_cells_and_a_bad_index_is_one_line(capsys):
    mod = load("record")
    prov = json.loads((SWEEP / "provenance.json").read_text())
    cut = next(i for i, inv in enumerate(prov["invocations"]) if "finished_at" not in inv)
    assert mod.draft(SWEEP, cut)["gpu_state"] == {"cells": 0}
    with pytest.raises(SystemExit, match="invocation"):
        mod.main([str(SWEEP), "--invocation", "99"])


def test_an_invocation_that_runs_both_engine_starts_keeps_every_start_in_run_order():
    """The twenty-fourth session ran both starts of every engine in one invocation (A-B-B-A): six starts of three
    methods, none of them overwritten by the method's second start."""
    prov = json.loads((REPO_ROOT / "data" / "sweeps" / "h100_v034_headline_ngram_full" / "provenance.json").read_text())
    engines = prov["invocations"][0]["engines"]
    starts = load("record").engine_starts(engines)
    assert list(starts) == ["none", "ngram-k3", "ngram-k5", "ngram-k5 #2", "ngram-k3 #2", "none #2"]
    assert list(starts.values()) == [round(e["engine_start_s"], 1) for e in engines]


def test_the_twenty_fifth_sessions_record_is_the_draft_of_its_invocation():
    """data/gpu/h100_v034_2026-12-08.json (six FULL-graph blocks in one invocation) says what record.py drafts from
    the sweep: device, invocation, engine starts in run order, replay counts and every GPU-state range."""
    sweep = REPO_ROOT / "data" / "sweeps" / "h100_v034_headline_ngram_full"
    rec = json.loads((REPO_ROOT / "data" / "gpu" / "h100_v034_2026-12-08.json").read_text())
    d = load("record").draft(sweep, 1)
    assert d["device"] == [rec["device"]] and d["device_uuid"] == [rec["device_uuid"]] and d["commit"] == rec["commit"]
    (label, inv), = d["invocation"].items()
    assert inv == {k: v for k, v in rec["invocation"][label].items() if k != "job_s"}
    assert list(d["engine_start_s"][label].items()) == list(rec["engine_start_s"][label].items())
    assert d["replay"] == {"cells": 120, "replay_files": 96, "exact": 96} and "the 96 replay/*.json" in rec["replay"]
    assert d["gpu_state"] == rec["gpu_state_ranges"]
    g = d["gpu_state"]
    for text in (f"{g['temp_c_end'][0]}-{g['temp_c_end'][1]} C", f"{g['power_w_end'][0]}-{g['power_w_end'][1]} W",
                 f"{g['slowdown_ms'][0]}-", f"-{g['slowdown_ms'][1]} ms", f"a median {g['repeat1_over_repeat0']['median']:.3f}"):
        assert text in rec["gpu_state"], text
