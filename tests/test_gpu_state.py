"""sdlib.store.gpu_state: the GPU's clocks, temperature, power draw and limit and clock-event reasons from one
nvidia-smi call, and the clock-event counters reason by reason from another (NaN / None where unknown, never an
exception), and the ``runs`` columns that record them per cell (unknown on a CPU and in tables written before they
existed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types

import pandas as pd
import pytest

from sdlib.store import gpu_state as gs
from sdlib.store.schema import ADDED_COLUMNS, TABLES

#: The per-reason counters' growth and the power limit, recorded since the counters' sum (gpu_slowdown_ms) was.
NEW_COLS = ["gpu_held_sw_power_cap_ms", "gpu_held_sw_thermal_ms", "gpu_held_hw_thermal_ms",
            "gpu_held_hw_power_brake_ms", "gpu_power_limit_w_end"]
GPU_COLS = ["gpu_sm_mhz_start", "gpu_sm_mhz_end", "gpu_mem_mhz_end", "gpu_temp_c_end", "gpu_power_w_end",
            "gpu_slowdown_ms", *NEW_COLS]
LINE = "1980, 2619, 41, 117.34, 700.00, 0x0000000000000004"


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
                 "power_limit_w": 700.0, "clock_events": "0x0000000000000004"}


def test_parse_fields_the_card_does_not_report_are_unknown():
    s = gs.parse("1410, [N/A], 35, [N/A], 400.00, [N/A]")
    assert s["sm_mhz"] == 1410.0 and s["temp_c"] == 35.0 and s["power_limit_w"] == 400.0
    assert math.isnan(s["mem_mhz"]) and math.isnan(s["power_w"]) and s["clock_events"] is None
    s = gs.parse("[Not Supported], [N/A], [N/A], [N/A], [N/A], [Not Supported]")
    assert _is_unknown(s)


def test_a_power_limit_the_card_does_not_report_is_unknown_and_the_rest_still_counts():
    s = gs.parse("1980, 2619, 41, 117.34, [N/A], 0x0000000000000004")
    assert math.isnan(s["power_limit_w"]) and s["power_w"] == pytest.approx(117.34)
    assert s["sm_mhz"] == 1980.0 and s["clock_events"] == "0x0000000000000004"
    assert math.isnan(gs.parse("1980, 2619, 41, 117.34, [Not Supported], 0x0")["power_limit_w"])
    assert gs.parse("1980, 2619, 41, 117.34, 700 W, 0x0") is None  # nounits not honoured: not an answer


def test_a_message_with_five_commas_is_not_an_answer():
    assert gs.parse("Unable to determine, for GPU 0, the clocks, power, limit, or state") is None
    assert gs.parse("1980, 2619, 41, 117.34, watts, 0x0000000000000001") is None  # one field that is no answer
    assert gs.parse("[N/A], [N/A], [N/A], [N/A], [N/A], 0x0000000000000001") is not None


def test_parse_rejects_what_is_not_an_answer():
    assert gs.parse("No devices were found") is None
    assert gs.parse("1980, 2619, 41") is None  # too few fields
    assert gs.parse("1980, 2619, 41, 117.34, 0x0000000000000004") is None  # the answer without power.limit
    assert gs.parse("") is None


def test_one_call_for_gpu_0_with_the_current_reasons_field(smi):
    smi.answers["clocks_event_reasons.active"] = _done(LINE + "\n")
    s = gs.gpu_state()
    assert s["sm_mhz"] == 1980.0 and s["power_w"] == pytest.approx(117.34) and s["power_limit_w"] == 700.0
    assert s["clock_events"] == "0x0000000000000004"
    assert len(smi.calls) == 1
    cmd = smi.calls[0]
    assert cmd[:3] == ["nvidia-smi", "-i", "0"] and "--format=csv,noheader,nounits" in cmd
    assert ("--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,power.limit,clocks_event_reasons.active"
            in cmd)


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
    smi.answers["clocks_throttle_reasons.active"] = _done("1755, 1593, 60, 300.01, 300.00, 0x0000000000000020\n")
    s = gs.gpu_state()
    assert s["sm_mhz"] == 1755.0 and s["clock_events"] == "0x0000000000000020"
    assert [c[3].rsplit(",", 1)[1] for c in smi.calls] == ["clocks_event_reasons.active",
                                                           "clocks_throttle_reasons.active"]
    gs.gpu_state()  # the field that worked is asked first: one call per sample from then on
    assert len(smi.calls) == 3 and smi.calls[2][3].endswith("clocks_throttle_reasons.active")


def test_a_driver_that_does_not_know_a_field_gives_unknowns_not_an_error(smi):
    """A driver that rejects a field of the state query (``power.limit``, say) under either reasons field: every
    value unknown, as nvidia-smi gave no answer; the counters, a call of their own, are not touched."""
    no = _done('Field "power.limit" is not a valid field to query.\n\n', rc=2)
    smi.answers["clocks_event_reasons.active"] = no
    smi.answers["clocks_throttle_reasons.active"] = no
    smi.answers[LAST_COUNTER] = _done(REAL)
    s = gs.sample()
    assert _is_unknown(s) and s[gs.SLOWDOWN_KEY] == pytest.approx(212554.937)
    assert s[gs.HELD_KEYS[0]] == pytest.approx(212553.937)


def test_no_nvidia_smi_means_unknown(monkeypatch):
    monkeypatch.setattr(gs.shutil, "which", lambda name: None)

    def never(*a, **k):
        raise AssertionError("nvidia-smi is not there: nothing to run")

    monkeypatch.setattr(gs, "_run", never)
    assert _is_unknown(gs.gpu_state())
    s = gs.sample(counters_first=True)
    assert _is_unknown(s) and all(math.isnan(s[k]) for k in (*gs.HELD_KEYS, gs.SLOWDOWN_KEY))


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
    for parse in (gs.parse_counters, gs.parse_counters_by_reason):
        assert parse('Field "clocks_event_reasons_counters.sw_power_cap" is not a valid field to query.') is None
        assert parse("") is None
        assert parse("No devices were found\n") is None
        assert parse(_counters(" [us]", "1000, 0, 250")) is None  # a field short
        assert parse(_counters(" [us]", "1000, 0, lots, 0")) is None
        assert parse(_counters(" [us]").splitlines()[0]) is None  # a header alone
        assert parse(_counters(" [us]").replace("sw_thermal", "hw_thermal", 1)) is None  # another field


def test_the_keys_are_one_per_reason_as_the_reasons_mask_names_them():
    assert len(gs.HELD_KEYS) == len(set(gs.HELD_KEYS)) == len(gs.COUNTER_REASONS) == len(gs.COUNTER_FIELDS) == 4
    assert set(gs.COUNTER_REASONS) <= set(gs.CLOCK_EVENT_BITS.values())
    assert gs.COUNTER_FIELDS == tuple(f"clocks_event_reasons_counters.{r}" for r in gs.COUNTER_REASONS)
    assert gs.SLOWDOWN_KEY not in gs.HELD_KEYS and not set(gs.HELD_KEYS) & set(gs.KEYS)
    for key, reason in zip(gs.HELD_KEYS, gs.COUNTER_REASONS):  # the same reason, in the same order
        assert key.startswith("held_") and key.endswith("_ms") and key[5:-3] in reason


def _by_reason(text: str) -> list[float]:
    held = gs.parse_counters_by_reason(text)
    assert list(held) == list(gs.HELD_KEYS)
    return list(held.values())


def test_each_counter_in_ms_by_the_unit_nvidia_smi_names():
    assert _by_reason(REAL) == pytest.approx([212553.937, 0.0, 1.0, 0.0])
    assert _by_reason(OURS) == [0.0, 0.0, 0.0, 0.0]
    assert _by_reason(_counters(" [us]", "1000, 20, 250, 3")) == pytest.approx([1.0, 0.02, 0.25, 0.003])
    assert _by_reason(_counters(" [ms]", "1, 2, 3, 4")) == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert _by_reason(_counters(" [ns]", "2000000, 0, 0, 0")) == pytest.approx([2.0, 0.0, 0.0, 0.0])
    assert _by_reason(_counters("", "1 ms, 2 ms, 0 ms, 5 ms")) == pytest.approx([1.0, 2.0, 0.0, 5.0])  # values' unit
    assert _by_reason(_counters("", "1 s, 0 s, 0 s, 0 s")) == pytest.approx([1000.0, 0.0, 0.0, 0.0])
    assert _by_reason(_counters("", "1000, 0, 0, 7")) == pytest.approx([1.0, 0.0, 0.0, 0.007])  # no unit: us
    # the sum, as parse_counters gives it, is the sum of the four
    for text in (REAL, _counters(" [us]", "1000, 20, 250, 3"), _counters("", "1 ms, 2 ms, 0 ms, 5 ms")):
        assert gs.parse_counters(text) == pytest.approx(sum(_by_reason(text)))


def test_a_counter_not_reported_is_unknown_alone_and_an_unknown_unit_leaves_all_unknown():
    held = _by_reason(_counters(" [us]", "1000, [N/A], 250, [Not Supported]"))
    assert held[0] == pytest.approx(1.0) and held[2] == pytest.approx(0.25)
    assert math.isnan(held[1]) and math.isnan(held[3])
    assert math.isnan(gs.parse_counters(_counters(" [us]", "1000, [N/A], 250, [Not Supported]")))  # the sum: unknown
    held = _by_reason(REAL.replace("1000 us", "[N/A]"))
    assert held[0] == pytest.approx(212553.937) and math.isnan(held[2])
    for text in (_counters(" [ticks]"), _counters(" [us]", "1 ms, 0, 0, 0"), _counters("", "1 ms, 2 us, 0, 0")):
        assert all(math.isnan(x) for x in _by_reason(text)), text  # a unit not known, or units that disagree


def test_the_counters_reason_by_reason_and_their_sum_are_one_call(smi):
    smi.answers[LAST_COUNTER] = _done(REAL)
    held = gs.counters_ms(gs.card("ab-cd"))
    assert len(smi.calls) == 1 and f"--query-gpu={','.join(gs.COUNTER_FIELDS)}" in smi.calls[0]
    assert list(held) == [*gs.HELD_KEYS, gs.SLOWDOWN_KEY]
    assert [held[k] for k in gs.HELD_KEYS] == pytest.approx([212553.937, 0.0, 1.0, 0.0])
    assert held[gs.SLOWDOWN_KEY] == gs.parse_counters(REAL) == pytest.approx(212554.937)
    smi.answers[LAST_COUNTER] = _done(_counters(" [us]", "1000, [N/A], 250, 0"))
    held = gs.counters_ms()
    assert held[gs.HELD_KEYS[0]] == pytest.approx(1.0) and math.isnan(held[gs.HELD_KEYS[1]])
    assert math.isnan(held[gs.SLOWDOWN_KEY]) and len(smi.calls) == 2


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
    assert gs.counters_ms() == pytest.approx(gs.unknown_counters(), nan_ok=True) and len(smi.calls) == 1
    assert all(math.isnan(x) for x in gs.counters_ms().values())


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
    assert s == e and set(s) == {*gs.KEYS, "clock_events", *gs.HELD_KEYS, gs.SLOWDOWN_KEY}
    assert [s[k] for k in gs.HELD_KEYS] == pytest.approx([212553.937, 0.0, 1.0, 0.0])
    assert s["power_limit_w"] == 700.0


def test_the_window_records_the_counters_growth():
    from sdlib.extract.tables import gpu_columns

    assert gpu_columns({"slowdown_ms": 100.0}, {"slowdown_ms": 350.5})["gpu_slowdown_ms"] == pytest.approx(250.5)
    for a, b in ((100.0, 90.0), (math.nan, 5.0), (5.0, math.nan), (None, 5.0)):  # a reload, or unknown
        assert math.isnan(gpu_columns({"slowdown_ms": a}, {"slowdown_ms": b})["gpu_slowdown_ms"])
    assert math.isnan(gpu_columns(None, None)["gpu_slowdown_ms"])


def _counters_sample(sw_power_cap, sw_thermal, hw_thermal, hw_power_brake, total=None) -> dict:
    held = dict(zip(gs.HELD_KEYS, (sw_power_cap, sw_thermal, hw_thermal, hw_power_brake)))
    return {**held, gs.SLOWDOWN_KEY: sum(held.values()) if total is None else total}


def test_the_window_records_each_counters_growth_and_the_power_limit():
    from sdlib.extract.tables import gpu_columns

    start = _counters_sample(100.0, 5.0, 0.0, 2.0)
    end = {**_counters_sample(900.5, 5.0, 40.0, 1.0), "power_limit_w": 700.0}  # the power brake's went back
    c = gpu_columns(start, end)
    assert c["gpu_held_sw_power_cap_ms"] == pytest.approx(800.5) and c["gpu_held_sw_thermal_ms"] == 0.0
    assert c["gpu_held_hw_thermal_ms"] == pytest.approx(40.0) and math.isnan(c["gpu_held_hw_power_brake_ms"])
    assert c["gpu_slowdown_ms"] == pytest.approx(839.5)  # the sum, differenced as before
    assert c["gpu_power_limit_w_end"] == 700.0
    assert {f"gpu_{k}" for k in gs.HELD_KEYS} | {"gpu_power_limit_w_end"} == set(NEW_COLS) <= set(c)
    # a counter unknown at either end, or a sample not taken: NaN for that counter only
    c = gpu_columns(_counters_sample(1.0, math.nan, 0.0, 0.0), _counters_sample(3.0, 4.0, None, 0.0, total=7.0))
    assert c["gpu_held_sw_power_cap_ms"] == 2.0 and c["gpu_held_hw_power_brake_ms"] == 0.0
    assert math.isnan(c["gpu_held_sw_thermal_ms"]) and math.isnan(c["gpu_held_hw_thermal_ms"])
    assert math.isnan(c["gpu_power_limit_w_end"])
    c = gpu_columns({"slowdown_ms": 1.0}, {"slowdown_ms": 3.0})  # samples of before the per-reason keys
    assert c["gpu_slowdown_ms"] == 2.0 and all(math.isnan(c[k]) for k in NEW_COLS)
    assert all(math.isnan(gpu_columns(None, None)[k]) for k in NEW_COLS)


def test_counter_growth():
    k = gs.HELD_KEYS[2]
    assert gs.counter_growth({k: 1.5}, {k: 4.0}, k) == 2.5 and gs.counter_growth({k: 4.0}, {k: 4.0}, k) == 0.0
    for a, b in ((4.0, 1.5), (math.nan, 1.0), (1.0, math.nan), (None, 1.0), (1.0, None), (pd.NA, 1.0)):
        assert math.isnan(gs.counter_growth({k: a}, {k: b}, k)), (a, b)
    assert math.isnan(gs.counter_growth({}, {k: 1.0}, k)) and math.isnan(gs.counter_growth(None, None, k))


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
    assert all(ADDED_COLUMNS["runs"][c] is None for c in NEW_COLS)  # null in older files, not a guessed value


def test_the_new_gpu_columns_follow_the_others_and_say_what_they_record():
    names = [c for c, _, _ in TABLES["runs"]]
    i = names.index("gpu_slowdown_ms")
    assert names[i + 1:i + 1 + len(NEW_COLS)] == NEW_COLS
    assert names[i - 6:i] == ["gpu_sm_mhz_start", "gpu_sm_mhz_end", "gpu_mem_mhz_end", "gpu_temp_c_end",
                              "gpu_power_w_end", "gpu_clock_events_end"]
    meaning = {c: m for c, _, m in TABLES["runs"]}
    for col, field in zip(NEW_COLS, gs.COUNTER_FIELDS):
        assert field in meaning[col] and "differenced" in meaning[col], col
    first = meaning[NEW_COLS[0]]
    for text in ("NaN without nvidia-smi", "drivers without the counters", "went back", "written before"):
        assert text in first
    assert all(meaning[c].endswith("differenced (same)") for c in NEW_COLS[1:4])
    assert "power.limit" in meaning["gpu_power_limit_w_end"] and "[N/A]" in meaning["gpu_power_limit_w_end"]
    assert "written before it was recorded" in meaning["gpu_power_limit_w_end"]


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

    start = {**gs.parse("1980, 2619, 38, 250.0, 700.0, 0x0000000000000000"), **_counters_sample(1000.0, 0, 0, 0)}
    end = {**gs.parse("1755, 2619, 71, 699.5, 700.0, 0x0000000000000004"),
           **_counters_sample(1400.0, 0.0, 20.25, 0.0)}
    cell, t = _cell_tables(fake_engine, gpu_start=start, gpu_end=end)
    store = SweepStore(tmp_path / "s")
    store.write_cell(cell.run_id, t)
    r = store.read("runs").iloc[0]
    assert r["gpu_sm_mhz_start"] == 1980.0 and r["gpu_sm_mhz_end"] == 1755.0
    assert r["gpu_mem_mhz_end"] == 2619.0 and r["gpu_temp_c_end"] == 71.0 and r["gpu_power_w_end"] == 699.5
    assert r["gpu_clock_events_end"] == "0x0000000000000004" and r["gpu_slowdown_ms"] == pytest.approx(420.25)
    assert r["gpu_held_sw_power_cap_ms"] == pytest.approx(400.0) and r["gpu_held_hw_thermal_ms"] == pytest.approx(20.25)
    assert r["gpu_held_sw_thermal_ms"] == 0.0 and r["gpu_held_hw_power_brake_ms"] == 0.0
    assert r["gpu_power_limit_w_end"] == 700.0


def test_committed_runs_tables_without_the_columns_still_read(tmp_path):
    """Cells written before the columns existed (every committed sweep) read with them unknown, and so does a
    sweep that mixes old and new cells."""
    from sdlib.paths import SWEEPS_DIR
    from sdlib.store import SweepStore

    runs = SweepStore(SWEEPS_DIR / "embedded_default").read("runs")
    assert len(runs) > 0 and runs[GPU_COLS].isna().all().all() and runs["gpu_clock_events_end"].isna().all()
    assert all(str(runs[c].dtype) == "float64" for c in NEW_COLS)

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


def test_a_sweep_that_recorded_the_sum_alone_reads_the_new_columns_as_unknown(tmp_path):
    """The H100 headline's n-gram FULL-graph cells recorded gpu_slowdown_ms (the sum) but not the reasons nor the
    power limit: they read as null beside its numbers, and a cell that has them keeps them."""
    from sdlib.paths import SWEEPS_DIR
    from sdlib.store import SweepStore

    src = SWEEPS_DIR / "h100_v034_headline_ngram_full" / "runs"
    old = sorted(src.glob("*.parquet"))[0]
    raw = pd.read_parquet(old)
    assert "gpu_slowdown_ms" in raw.columns and not set(NEW_COLS) & set(raw.columns)  # as committed
    d = tmp_path / "s" / "runs"
    d.mkdir(parents=True)
    raw.to_parquet(d / old.name, index=False)
    new = raw.assign(run_id="new", gpu_held_sw_power_cap_ms=12.5, gpu_held_sw_thermal_ms=0.0,
                     gpu_held_hw_thermal_ms=0.0, gpu_held_hw_power_brake_ms=0.0, gpu_power_limit_w_end=700.0)
    new.to_parquet(d / "new.parquet", index=False)
    runs = SweepStore(tmp_path / "s").read("runs", current_only=False).set_index("run_id")
    assert runs.loc[old.stem, "gpu_slowdown_ms"] == raw["gpu_slowdown_ms"].iloc[0]
    assert runs.loc[old.stem, NEW_COLS].isna().all()
    assert runs.loc["new", NEW_COLS].tolist() == [12.5, 0.0, 0.0, 0.0, 700.0]


# the check script of gpu/ ---------------------------------------------------------------------------------------
#: A stand-in nvidia-smi for the check script (a Python file run by its shebang): the state line, and the counters
#: growing each call (n = the how-many-th counters call) by 1000 us of SW power cap and 250 us of HW thermal.
FAKE_SMI = """#!{python}
import sys
from pathlib import Path

args = " ".join(sys.argv[1:])
log = Path(__file__).with_name("counters.log")
if "clocks_event_reasons_counters.sw_power_cap" in args:
    with log.open("a") as f:
        f.write(args + "\\n")
    n = len(log.read_text().splitlines())
    print(", ".join(f + " [us]" for f in {fields!r}))
    print(f"{{1000 * n}} us, 0 us, {{250 * n}} us, 0 us")
elif "clocks.sm" in args:
    print("1980, 2619, 41, 117.34, [N/A], 0x0000000000000004")
else:
    sys.exit(9)
"""


def _check_script(path: str, *args: str) -> dict:
    """``gpu/check_gpu_state.py`` run as on a bare machine (``python -I -S``: no site-packages, so no pandas) with
    ``PATH`` = ``path`` alone; its output as JSON (a NaN in it fails: unknowns must be null)."""
    from sdlib.paths import REPO_ROOT

    def no_nan(x):
        raise AssertionError(f"{x} in the output: not JSON")

    out = subprocess.run([sys.executable, "-I", "-S", str(REPO_ROOT / "gpu" / "check_gpu_state.py"), *args],
                         env={"PATH": path}, capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout, parse_constant=no_nan)


def test_the_check_script_without_nvidia_smi_prints_unknowns(tmp_path):
    d = _check_script(str(tmp_path), "--seconds", "0.2")
    assert d["nvidia_smi"] is None and d["device"] == "0" and d["seconds"] >= 0.2
    for s in (d["start"], d["end"]):
        assert set(s) == {*gs.KEYS, "clock_events", "clock_event_names", *gs.HELD_KEYS, gs.SLOWDOWN_KEY}
        assert all(v is None for k, v in s.items() if k != "clock_event_names") and s["clock_event_names"] == []
    assert d["growth_ms"] == {k: None for k in (*gs.HELD_KEYS, gs.SLOWDOWN_KEY)}
    assert d["nvidia_smi_calls"] == {"start": 0, "end": 0} and d["raw"] == {"state": None, "counters": None}


def test_the_check_script_prints_each_counters_growth_between_its_two_samples(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, fields=gs.COUNTER_FIELDS))
    smi.chmod(0o755)
    d = _check_script(str(tmp_path), "--seconds", "0.1", "--device", "GPU-ab")
    assert d["nvidia_smi"] == str(smi) and d["device"] == "GPU-ab"
    s, e = d["start"], d["end"]
    assert s["sm_mhz"] == e["sm_mhz"] == 1980.0 and s["power_limit_w"] is None and e["clock_event_names"] == [
        "sw_power_cap"]
    assert [s[k] for k in gs.HELD_KEYS] == pytest.approx([1.0, 0.0, 0.25, 0.0]) and s[gs.SLOWDOWN_KEY] == 1.25
    assert [e[k] for k in gs.HELD_KEYS] == pytest.approx([2.0, 0.0, 0.5, 0.0]) and e[gs.SLOWDOWN_KEY] == 2.5
    assert d["growth_ms"] == pytest.approx(dict(zip((*gs.HELD_KEYS, gs.SLOWDOWN_KEY), (1.0, 0.0, 0.25, 0.0, 1.25))))
    assert d["nvidia_smi_calls"] == {"start": 2, "end": 2}  # the state, and the four counters in one call
    assert d["raw"]["state"].startswith("1980, 2619") and "750 us" in d["raw"]["counters"]
