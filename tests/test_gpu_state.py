"""sdlib.store.gpu_state: the GPU's clocks, temperature, power and clock-event reasons from one nvidia-smi call
(NaN / None where unknown, never an exception), and the ``runs`` columns that record them per cell (unknown on
a CPU and in tables written before they existed)."""

from __future__ import annotations

import math
import subprocess
import types

import pandas as pd
import pytest

from sdlib.store import gpu_state as gs
from sdlib.store.schema import ADDED_COLUMNS, TABLES

GPU_COLS = ["gpu_sm_mhz_start", "gpu_sm_mhz_end", "gpu_mem_mhz_end", "gpu_temp_c_end", "gpu_power_w_end",
            "gpu_slowdown_ms"]
LINE = "1980, 2619, 41, 117.34, 0x0000000000000004"


def _is_unknown(state: dict) -> bool:
    return all(math.isnan(state[k]) for k in gs.KEYS) and state["clock_events"] is None


@pytest.fixture
def smi(monkeypatch):
    """A stand-in for ``gpu_state._run`` of nvidia-smi: ``answers`` maps the last field queried (the reasons field,
    or the last counter) to a CompletedProcess (or an exception to raise), or to a list of them answered in turn;
    every call's argv is in ``calls``."""
    monkeypatch.setattr(gs.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    monkeypatch.setattr(gs, "_working_event_field", None)
    monkeypatch.setattr(gs, "_hung", False)
    monkeypatch.setattr(gs, "_no_counters", False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = types.SimpleNamespace(calls=[], answers={})

    def run(cmd, **kw):
        fake.calls.append(cmd)
        assert kw.get("timeout") and kw["timeout"] <= 10
        query = next(a for a in cmd if a.startswith("--query-gpu="))
        ans = fake.answers[query.rsplit(",", 1)[1]]
        if isinstance(ans, list):
            ans = ans.pop(0)
        if isinstance(ans, BaseException):
            raise ans
        return ans.returncode, ans.stdout

    monkeypatch.setattr(gs, "_run", run)
    return fake


def _done(stdout: str, rc: int = 0) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["nvidia-smi"], rc, stdout=stdout, stderr="")


def test_parse_a_normal_line():
    s = gs.parse(LINE)
    assert s == {"sm_mhz": 1980.0, "mem_mhz": 2619.0, "temp_c": 41.0, "power_w": pytest.approx(117.34),
                 "clock_events": "0x0000000000000004"}


def test_parse_fields_the_card_does_not_report_are_unknown():
    s = gs.parse("1410, [N/A], 35, [N/A], [N/A]")
    assert s["sm_mhz"] == 1410.0 and s["temp_c"] == 35.0
    assert math.isnan(s["mem_mhz"]) and math.isnan(s["power_w"]) and s["clock_events"] is None
    s = gs.parse("[Not Supported], [N/A], [N/A], [N/A], [Not Supported]")
    assert _is_unknown(s)


def test_a_message_with_four_commas_is_not_an_answer():
    assert gs.parse("Unable to determine, for GPU 0, the clocks, power, or state") is None
    assert gs.parse("1980, 2619, 41, watts, 0x0000000000000001") is None  # one field that is no answer
    assert gs.parse("[N/A], [N/A], [N/A], [N/A], 0x0000000000000001") is not None


def test_parse_rejects_what_is_not_an_answer():
    assert gs.parse("No devices were found") is None
    assert gs.parse("1980, 2619, 41") is None  # too few fields
    assert gs.parse("") is None


def test_one_call_for_gpu_0_with_the_current_reasons_field(smi):
    smi.answers["clocks_event_reasons.active"] = _done(LINE + "\n")
    s = gs.gpu_state()
    assert s["sm_mhz"] == 1980.0 and s["power_w"] == pytest.approx(117.34)
    assert s["clock_events"] == "0x0000000000000004"
    assert len(smi.calls) == 1
    cmd = smi.calls[0]
    assert cmd[:3] == ["nvidia-smi", "-i", "0"] and "--format=csv,noheader,nounits" in cmd
    assert ("--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_event_reasons.active" in cmd)


def test_the_first_visible_card_is_asked_about(smi, monkeypatch):
    smi.answers["clocks_event_reasons.active"] = _done(LINE)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    gs.gpu_state()
    assert smi.calls[0][1:3] == ["-i", "3"]


def test_the_engine_card_is_asked_about_by_its_uuid(smi, monkeypatch):
    smi.answers["clocks_event_reasons.active"] = _done(LINE)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")  # CUDA's numbering: not used when the card is named
    gs.gpu_state(gs.card("7983f8c6-4982-3663-b94c-787d585de6f1"))
    assert smi.calls[0][1:3] == ["-i", "GPU-7983f8c6-4982-3663-b94c-787d585de6f1"]
    assert gs.card(None) is None and gs.card("GPU-ab") == "GPU-ab" and gs.card("MIG-cd") == "MIG-cd"


def test_an_answer_counts_whatever_the_exit_status_and_after_a_warning_line(smi):
    smi.answers["clocks_event_reasons.active"] = _done("WARNING: infoROM is corrupted at gpu 0000:01:00.0\n"
                                                       + LINE + "\n", rc=14)
    s = gs.gpu_state()
    assert s["sm_mhz"] == 1980.0 and s["clock_events"] == "0x0000000000000004" and len(smi.calls) == 1


def test_a_hanging_command_is_killed_and_not_waited_for():
    import time

    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        gs._run(["sleep", "30"], timeout=0.2)
    assert time.monotonic() - t0 < 5
    assert gs._run(["echo", "1, 2, 3, 4, 0x0"], timeout=5) == (0, "1, 2, 3, 4, 0x0\n")


def test_an_older_driver_falls_back_to_the_throttle_reasons_field_and_keeps_it(smi):
    smi.answers["clocks_event_reasons.active"] = _done(
        'Field "clocks_event_reasons.active" is not a valid field to query.\n', rc=2)
    smi.answers["clocks_throttle_reasons.active"] = _done("1755, 1593, 60, 300.01, 0x0000000000000020\n")
    s = gs.gpu_state()
    assert s["sm_mhz"] == 1755.0 and s["clock_events"] == "0x0000000000000020"
    assert [c[3].rsplit(",", 1)[1] for c in smi.calls] == ["clocks_event_reasons.active",
                                                           "clocks_throttle_reasons.active"]
    gs.gpu_state()  # the field that worked is asked first: one call per sample from then on
    assert len(smi.calls) == 3 and smi.calls[2][3].endswith("clocks_throttle_reasons.active")


def test_no_nvidia_smi_means_unknown(monkeypatch):
    monkeypatch.setattr(gs.shutil, "which", lambda name: None)

    def never(*a, **k):
        raise AssertionError("nvidia-smi is not there: nothing to run")

    monkeypatch.setattr(gs, "_run", never)
    assert _is_unknown(gs.gpu_state())


@pytest.mark.parametrize("answer", [
    subprocess.TimeoutExpired(["nvidia-smi"], 5),
    OSError("exec format error"),
    _done("", rc=9),
    _done("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", rc=0),
    RuntimeError("anything else"),
])
def test_a_failing_or_hanging_nvidia_smi_means_unknown_never_an_error(smi, answer):
    smi.answers["clocks_event_reasons.active"] = answer
    smi.answers["clocks_throttle_reasons.active"] = answer
    assert _is_unknown(gs.gpu_state())
    if isinstance(answer, subprocess.TimeoutExpired):
        assert len(smi.calls) == 1  # a hung driver is not waited for twice
        smi.answers["clocks_event_reasons.active"] = _done(LINE)
        assert _is_unknown(gs.gpu_state()) and len(smi.calls) == 1  # nor in a later sample


# the clock-event counters ---------------------------------------------------------------------------------------
LAST_COUNTER = gs.COUNTER_FIELDS[-1]


def _counters(unit: str = " [us]", values: str = "1000, 0, 250, 0") -> str:
    """nvidia-smi's csv answer (header kept for the units) to the counters query."""
    return ", ".join(f + unit for f in gs.COUNTER_FIELDS) + "\n" + values + "\n"


#: nvidia-smi's answer as a public capture from an H100 80GB HBM3 (driver 590.48.01) prints it
#: (github.com/utkuozdemir/nvidia_gpu_exporter, internal/captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt:
#: ``--format=csv`` gives ``name [us]`` headers and ``N us`` values), with made-up counts.
REAL = ("clocks_event_reasons_counters.sw_power_cap [us], clocks_event_reasons_counters.sw_thermal_slowdown [us], "
        "clocks_event_reasons_counters.hw_thermal_slowdown [us], clocks_event_reasons_counters.hw_power_brake_slowdown "
        "[us]\r\n212553937 us, 0 us, 1000 us, 0 us\r\n")


def test_counters_are_summed_in_ms_by_the_unit_nvidia_smi_names():
    assert gs.parse_counters(REAL) == pytest.approx(212554.937)
    assert gs.parse_counters(_counters(" [us]")) == pytest.approx(1.25)
    assert gs.parse_counters(_counters(" [ms]")) == pytest.approx(1250.0)
    assert gs.parse_counters(_counters(" [ns]", "2000000, 0, 0, 0")) == pytest.approx(2.0)
    assert gs.parse_counters(_counters("", "1 ms, 2 ms, 0 ms, 0 ms")) == pytest.approx(3.0)  # the values' unit
    # no unit anywhere: microseconds, as nvidia-smi --help-query-gpu documents them
    assert gs.parse_counters(_counters("")) == pytest.approx(1.25)
    assert gs.parse_counters("WARNING: infoROM is corrupted at gpu 0000:01:00.0\n" + REAL) == pytest.approx(212554.937)
    # a unit it does not know, units that disagree, or a counter not reported: unknown, not guessed
    assert math.isnan(gs.parse_counters(_counters(" [ticks]")))
    assert math.isnan(gs.parse_counters(_counters(" [us]", "1 ms, 0, 0, 0")))
    assert math.isnan(gs.parse_counters(_counters(" [us]", "1000, [N/A], 0, 0")))
    assert math.isnan(gs.parse_counters(_counters(" [us]", "1000, [Not Supported], 0, 0")))


#: The answer an H100 80GB HBM3 of the device machine gave, verbatim, on 2026-12-06 (the sixteenth GPU session's
#: first call, docs/gpu_034.md): the same form as the public capture above.
OURS = ("clocks_event_reasons_counters.sw_power_cap [us], clocks_event_reasons_counters.sw_thermal_slowdown [us], "
        "clocks_event_reasons_counters.hw_thermal_slowdown [us], clocks_event_reasons_counters.hw_power_brake_slowdown "
        "[us]\n0 us, 0 us, 0 us, 0 us\n")


def test_the_answer_our_h100_gave_parses_to_zero_not_unknown():
    assert gs.parse_counters(OURS) == 0.0
    grown = OURS.replace("0 us, 0 us, 0 us, 0 us", "1500 us, 0 us, 2 us, 0 us")
    assert gs.parse_counters(grown) == pytest.approx(1.502)


def test_what_is_not_a_counters_answer_is_none():
    assert gs.parse_counters('Field "clocks_event_reasons_counters.sw_power_cap" is not a valid field to query.') is None
    assert gs.parse_counters("") is None
    assert gs.parse_counters(_counters(" [us]", "1000, 0, 250")) is None  # a field short
    assert gs.parse_counters(_counters(" [us]", "1000, 0, lots, 0")) is None
    assert gs.parse_counters(_counters(" [us]").splitlines()[0]) is None  # a header alone


def test_slowdown_ms_asks_for_the_counters_with_their_units(smi):
    smi.answers[LAST_COUNTER] = _done(_counters(" [us]"))
    assert gs.slowdown_ms(gs.card("ab-cd")) == pytest.approx(1.25)
    cmd = smi.calls[0]
    assert cmd[:3] == ["nvidia-smi", "-i", "GPU-ab-cd"] and "--format=csv" in cmd
    assert f"--query-gpu={','.join(gs.COUNTER_FIELDS)}" in cmd


def test_a_driver_without_the_counters_is_asked_once(smi):
    smi.answers[LAST_COUNTER] = _done(f'Field "{gs.COUNTER_FIELDS[0]}" is not a valid field to query.\n', rc=2)
    assert math.isnan(gs.slowdown_ms()) and math.isnan(gs.slowdown_ms())
    assert len(smi.calls) == 1


def test_any_other_failure_is_unknown_this_time_and_asked_again(smi):
    """A driver that knows the fields but fails once (no device, NVML not up yet) is asked again next sample."""
    smi.answers[LAST_COUNTER] = [_done("No devices were found\n"), _done("", rc=9), _done(REAL)]
    assert math.isnan(gs.slowdown_ms()) and math.isnan(gs.slowdown_ms())
    assert gs.slowdown_ms() == pytest.approx(212554.937) and len(smi.calls) == 3


@pytest.mark.parametrize("answer", [subprocess.TimeoutExpired(["nvidia-smi"], 5), OSError("gone"),
                                    RuntimeError("anything else")])
def test_a_failing_or_hanging_counters_query_is_unknown_never_an_error(smi, answer):
    smi.answers[LAST_COUNTER] = answer
    assert math.isnan(gs.slowdown_ms())
    if isinstance(answer, subprocess.TimeoutExpired):  # a hung driver: no later call, for either query
        smi.answers["clocks_event_reasons.active"] = _done(LINE)
        assert _is_unknown(gs.gpu_state()) and math.isnan(gs.slowdown_ms()) and len(smi.calls) == 1


def test_a_sample_is_the_state_with_the_counters_read_before_or_after_it(smi):
    order = []
    smi.answers["clocks_event_reasons.active"] = _done(LINE)
    smi.answers[LAST_COUNTER] = _done(REAL)
    s = gs.sample("0")
    order += [c[3].rsplit(",", 1)[1] for c in smi.calls]
    e = gs.sample("0", counters_first=True)
    order += [c[3].rsplit(",", 1)[1] for c in smi.calls[2:]]
    assert s[gs.SLOWDOWN_KEY] == e[gs.SLOWDOWN_KEY] == pytest.approx(212554.937) and s["sm_mhz"] == 1980.0
    assert order == ["clocks_event_reasons.active", LAST_COUNTER, LAST_COUNTER, "clocks_event_reasons.active"]


def test_the_window_records_the_counters_growth():
    from sdlib.extract.tables import gpu_columns

    assert gpu_columns({"slowdown_ms": 100.0}, {"slowdown_ms": 350.5})["gpu_slowdown_ms"] == pytest.approx(250.5)
    for a, b in ((100.0, 90.0), (math.nan, 5.0), (5.0, math.nan), (None, 5.0)):  # a reload, or unknown
        assert math.isnan(gpu_columns({"slowdown_ms": a}, {"slowdown_ms": b})["gpu_slowdown_ms"])
    assert math.isnan(gpu_columns(None, None)["gpu_slowdown_ms"])


def test_clock_event_names():
    assert gs.clock_event_names("0x0000000000000004") == ["sw_power_cap"]
    assert gs.clock_event_names("0x0000000000000060") == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert gs.clock_event_names("0x0000000000000000") == []
    assert gs.clock_event_names(None) == [] and gs.clock_event_names("[N/A]") == []
    assert gs.clock_event_names("0x1004") == ["sw_power_cap", "0x1000"]


# the runs table ------------------------------------------------------------------------------------------------
def test_the_runs_schema_has_the_gpu_columns_and_older_tables_read_them_as_unknown():
    runs = {c: t for c, t, _ in TABLES["runs"]}
    assert all(runs[c] == "float64" for c in GPU_COLS) and runs["gpu_clock_events_end"] == "string"
    assert set(GPU_COLS + ["gpu_clock_events_end"]) <= set(ADDED_COLUMNS["runs"])


def _cell_tables(fake_engine, **gpu):
    """One no-SD cell's tables from the fake engine (three tokens), built with ``gpu`` (build_tables' samples)."""
    from sdlib.config import parse_sweep
    from sdlib.extract.tables import build_tables
    from sdlib.run.driver import drive
    from tests.conftest import FakePrompt

    cell = parse_sweep({"name": "g", "models": [{"path": "m", "name": "m"}], "methods": [{"name": "none"}],
                        "workloads": [{"dataset": "code_edit", "num_requests": 1}], "batch_sizes": [1]}).cells()[0]
    eng = fake_engine(scripts={1: [1, 1, 1]})
    res = drive(eng, [FakePrompt(0, [0])], 1, lambda p: None, clock=eng.clock)
    counters = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    return cell, build_tables(cell, res, counters, sweep="g", started_at="t", detailed_requested=False, **gpu)


def test_a_cell_without_gpu_samples_records_unknown(fake_engine):
    """A CPU cell (no nvidia-smi: :func:`gs.gpu_state` is unknown) or one built without samples: NaN / null."""
    for gpu in ({}, {"gpu_start": gs.unknown(), "gpu_end": gs.unknown()}):
        _, t = _cell_tables(fake_engine, **gpu)
        r = t["runs"]
        assert all(c in r.columns for c in GPU_COLS + ["gpu_clock_events_end"])
        assert r[GPU_COLS].isna().all().all() and r["gpu_clock_events_end"].isna().all()
        assert str(r["gpu_clock_events_end"].dtype) == "string"


def test_a_cell_records_its_two_samples_and_they_survive_the_store(fake_engine, tmp_path):
    from sdlib.store import SweepStore

    start = {**gs.parse("1980, 2619, 38, 250.0, 0x0000000000000000"), "slowdown_ms": 1000.0}
    end = {**gs.parse("1755, 2619, 71, 699.5, 0x0000000000000004"), "slowdown_ms": 1420.25}
    cell, t = _cell_tables(fake_engine, gpu_start=start, gpu_end=end)
    store = SweepStore(tmp_path / "s")
    store.write_cell(cell.run_id, t)
    r = store.read("runs").iloc[0]
    assert r["gpu_sm_mhz_start"] == 1980.0 and r["gpu_sm_mhz_end"] == 1755.0
    assert r["gpu_mem_mhz_end"] == 2619.0 and r["gpu_temp_c_end"] == 71.0 and r["gpu_power_w_end"] == 699.5
    assert r["gpu_clock_events_end"] == "0x0000000000000004" and r["gpu_slowdown_ms"] == pytest.approx(420.25)


def test_committed_runs_tables_without_the_columns_still_read(tmp_path):
    """Cells written before the columns existed (every committed sweep) read with them unknown, and so does a
    sweep that mixes old and new cells."""
    from sdlib.paths import SWEEPS_DIR
    from sdlib.store import SweepStore

    runs = SweepStore(SWEEPS_DIR / "embedded_default").read("runs")
    assert len(runs) > 0 and runs[GPU_COLS].isna().all().all() and runs["gpu_clock_events_end"].isna().all()

    import shutil

    src = SWEEPS_DIR / "embedded_default" / "runs"
    old = sorted(src.glob("*.parquet"))[0]
    assert "gpu_sm_mhz_end" not in pd.read_parquet(old).columns  # the committed file itself is as it was
    d = tmp_path / "mixed" / "runs"
    d.mkdir(parents=True)
    shutil.copy(old, d / old.name)
    new = pd.read_parquet(old).assign(run_id="new", gpu_sm_mhz_end=1500.0, gpu_clock_events_end="0x4")
    new.to_parquet(d / "new.parquet", index=False)
    mixed = SweepStore(tmp_path / "mixed").read("runs", current_only=False).set_index("run_id")
    assert mixed.loc["new", "gpu_sm_mhz_end"] == 1500.0 and mixed.loc["new", "gpu_clock_events_end"] == "0x4"
    assert pd.isna(mixed.loc[old.stem, "gpu_sm_mhz_end"]) and pd.isna(mixed.loc[old.stem, "gpu_clock_events_end"])
