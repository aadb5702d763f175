"""gpu/record.py: the measured fields of a session record, drafted from the sweep, equal the hand-written ones.

The twenty-second and twenty-third sessions' records (data/gpu/h100_v034_2026-12-07d.json and -07e.json) were
written by hand from the H100 headline's provenance and runs tables, and re-checked by a helper; the draft of the
same invocations must say the same.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sdlib.paths import REPO_ROOT
from sdlib.store.gpu_state import HELD_KEYS
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
    # recorded later: all null in these cells (the committed files lack them), so left out, not ranges of NaN
    assert not {"power_limit_w_end", *HELD_KEYS} & set(g)


def _runs(**gpu) -> pd.DataFrame:
    """Four cells of two arms, repeats 0 and 1, with the GPU columns ``gpu`` (lists of four)."""
    base = {"model": ["m"] * 4, "dataset": ["d"] * 4, "batch_size": [1] * 4, "engine_start": [0] * 4,
            "method_label": ["a", "a", "b", "b"], "repeat": [0, 1, 0, 1], "tok_per_s": [100.0, 101.0, 50.0, 49.0],
            "gpu_clock_events_end": ["0x0", "0x4", "0x0", "0x4"]}
    return pd.DataFrame({**base, **gpu})


def test_the_ranges_of_the_power_limit_and_each_reasons_held_down_time():
    nan = float("nan")
    g = load("record").gpu_state(_runs(
        gpu_slowdown_ms=[0.0, 1200.4, 10.0, 5.0], gpu_power_limit_w_end=[700.0, 700.0, 650.2, nan],
        gpu_held_sw_power_cap_ms=[0.0, 1200.4, 10.0, 5.0], gpu_held_sw_thermal_ms=[0.0, 0.0, 0.0, 0.0],
        gpu_held_hw_thermal_ms=[nan, nan, nan, nan], gpu_held_hw_power_brake_ms=[nan, 0.0, nan, 0.0]))
    assert g["cells"] == 4 and g["slowdown_ms"] == [0, 1200]
    assert g["power_limit_w_end"] == [650, 700]  # an unknown cell left out of the range
    assert g["held_sw_power_cap_ms"] == [0, 1200] and g["held_sw_thermal_ms"] == [0, 0]
    assert g["held_hw_power_brake_ms"] == [0, 0] and "held_hw_thermal_ms" not in g  # no cell knows it
    keys = list(g)
    assert keys.index("power_limit_w_end") < keys.index("slowdown_ms") < keys.index("held_sw_power_cap_ms")
    assert g["clock_events_end"] == ["0x0", "0x4"] and g["repeat1_over_repeat0"]["median"] == pytest.approx(0.995)


def test_a_sweep_written_before_the_new_columns_drafts_as_before():
    """A runs table without the columns at all (as a caller may pass one not read through the store), or with
    them all null (as the store reads an old file): the same draft, without their keys."""
    mod = load("record")
    nan = float("nan")
    old = _runs(gpu_slowdown_ms=[0.0, 0.0, 3.0, 0.0], gpu_power_w_end=[400.0, 420.0, 410.0, 430.6])
    nulls = old.assign(gpu_power_limit_w_end=nan, **{f"gpu_{k}": nan for k in HELD_KEYS})
    assert mod.gpu_state(old) == mod.gpu_state(nulls)
    assert mod.gpu_state(old)["power_w_end"] == [400, 431] and mod.gpu_state(old)["slowdown_ms"] == [0, 3]
    assert not {"power_limit_w_end", *HELD_KEYS} & set(mod.gpu_state(nulls))


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
    assert d["device"] == [rec["device"]] and d["device_uuid"] == [rec["device_uuid"]]
    assert d["commit"] == rec["commit"]
    (label, inv), = d["invocation"].items()
    assert inv == {k: v for k, v in rec["invocation"][label].items() if k != "job_s"}
    assert list(d["engine_start_s"][label].items()) == list(rec["engine_start_s"][label].items())
    assert d["replay"] == {"cells": 120, "replay_files": 96, "exact": 96} and "the 96 replay/*.json" in rec["replay"]
    assert d["gpu_state"] == rec["gpu_state_ranges"]
    g = d["gpu_state"]
    for text in (f"{g['temp_c_end'][0]}-{g['temp_c_end'][1]} C", f"{g['power_w_end'][0]}-{g['power_w_end'][1]} W",
                 f"{g['slowdown_ms'][0]}-", f"-{g['slowdown_ms'][1]} ms",
                 f"a median {g['repeat1_over_repeat0']['median']:.3f}"):
        assert text in rec["gpu_state"], text
