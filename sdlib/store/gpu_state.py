"""The GPU's state at one moment, from one ``nvidia-smi`` call: SM and memory clocks, temperature, power draw and
limit, and the clock-event (throttle) reasons active then.

A sweep samples it just before and just after each cell's measured requests (:mod:`sdlib.run.worker`), outside
the timed window, and the cell's ``runs`` row records it (``gpu_*`` columns). They are two moments, not the
window: before the requests the card idles after the warm-up, and after them it may already be idling again, so
a slowdown shows (lower clocks, a power or thermal reason: :func:`clock_event_names`) only where it outlasts the
cell's requests.

With each sample, :func:`counters_ms` reads nvidia-smi's cumulative clock-event counters (the time the clocks
have been held down for each power or thermal reason, :data:`HELD_KEYS`, and their sum, :func:`slowdown_ms`), in
one call; their growth between the two samples (:func:`counter_growth`: ``runs.gpu_slowdown_ms`` and, reason by
reason, ``runs.gpu_held_*_ms``) covers the whole window, so it catches a slowdown that a sample at either end
misses, and says which reason held the clocks down.

Never raises: without ``nvidia-smi`` (a CPU machine, CI), or when it fails or hangs, every value is unknown
(NaN, and None for the reasons); a call that hangs is killed and not waited for past :data:`TIMEOUT_S` + 1 s.

Usage:
    from sdlib.store.gpu_state import (SLOWDOWN_KEY, clock_event_names, counter_growth, counters_ms, gpu_state,
                                       sample, slowdown_ms)
    s = gpu_state()  # {"sm_mhz": 1980.0, "mem_mhz": 2619.0, "temp_c": 41.0, "power_w": 117.3,
                     #  "power_limit_w": 700.0, "clock_events": "0x0000000000000004"}
    clock_event_names(s["clock_events"])  # ["sw_power_cap"]
    slowdown_ms()  # 1234.5: ms the clocks have been held down, summed over the reasons (NaN if unknown)
    counters_ms()  # {"held_sw_power_cap_ms": 1234.5, "held_sw_thermal_ms": 0.0, "held_hw_thermal_ms": 0.0,
                   #  "held_hw_power_brake_ms": 0.0, "slowdown_ms": 1234.5}: each reason and the sum, one call
    sample()  # gpu_state() with counters_ms(): what a cell records before and after its requests
    counter_growth(start, end, SLOWDOWN_KEY)  # the sum's growth between two samples, ms (NaN if unknown)
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from typing import Any, Optional

#: ``nvidia-smi --query-gpu`` fields, in the order of :data:`KEYS`; the reasons field comes last. ``power.limit`` is
#: the software power limit; the limit enforced, the lowest of all limiters, is ``enforced.power.limit`` (not read).
FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "power.limit")
#: Keys of :func:`gpu_state`'s numbers (MHz, MHz, degrees C, W, W), one per field of :data:`FIELDS`.
KEYS = ("sm_mhz", "mem_mhz", "temp_c", "power_w", "power_limit_w")
#: The active clock-event reasons: the current name first, then the one drivers before 535 know.
EVENT_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
#: Seconds one ``nvidia-smi`` call may take before the state counts as unknown.
TIMEOUT_S = 5.0
#: Bits of the reasons mask (NVML's ``nvmlClocksEventReason*``).
CLOCK_EVENT_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

#: The reasons whose cumulative clock-event counters :func:`counters_ms` reads (and :func:`slowdown_ms` sums): the
#: power and thermal reasons (not sync boost, which follows another card, nor idle), as :data:`CLOCK_EVENT_BITS`
#: names them.
COUNTER_REASONS = ("sw_power_cap", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
#: The counters' fields, one per reason of :data:`COUNTER_REASONS`. Listed by ``nvidia-smi --help-query-gpu`` on the
#: fifteenth session's H100 (data/gpu/h100_v034_2026-12-06f.json); older drivers reject them, and then they are
#: unknown.
COUNTER_FIELDS = tuple(f"clocks_event_reasons_counters.{r}" for r in COUNTER_REASONS)
#: The keys of :func:`counters_ms` (and :func:`sample`) that hold each counter in ms, one per reason of
#: :data:`COUNTER_REASONS`; a cell's ``runs`` row records their growth as ``gpu_<key>``
#: (:func:`sdlib.extract.tables.gpu_columns`).
HELD_KEYS = ("held_sw_power_cap_ms", "held_sw_thermal_ms", "held_hw_thermal_ms", "held_hw_power_brake_ms")
#: The counters' unit as nvidia-smi's csv names it (``name [us]``, ``212553937 us``), to milliseconds; another
#: leaves the counters and their sum unknown rather than guessed (:func:`parse_counters`).
COUNTER_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
#: The key of :func:`counters_ms` (and :func:`sample`) that holds :func:`slowdown_ms`, the counters' sum.
SLOWDOWN_KEY = "slowdown_ms"

#: The reasons field this machine's nvidia-smi answered last (tried first next time, so a sample is one call).
_working_event_field: Optional[str] = None
#: Set once a call has hung: later samples are unknown at once rather than each waiting out :data:`TIMEOUT_S`.
_hung = False
#: Set once nvidia-smi has rejected the counters' fields (an older driver): later counters are unknown at once.
_no_counters = False


def unknown() -> dict[str, Any]:
    """The state where nothing is known: NaN numbers, no reasons."""
    return {**{k: math.nan for k in KEYS}, "clock_events": None}


def unknown_counters() -> dict[str, float]:
    """The counters where nothing is known: NaN for each reason (:data:`HELD_KEYS`) and for the sum."""
    return {**{k: math.nan for k in HELD_KEYS}, SLOWDOWN_KEY: math.nan}


def _number(text: str) -> float:
    try:
        x = float(text)
    except ValueError:  # "[N/A]", "[Not Supported]", ""
        return math.nan
    return x if math.isfinite(x) else math.nan


def _not_reported(text: str) -> bool:
    """nvidia-smi's answer for a field the card does not report: ``[N/A]``, ``[Not Supported]``."""
    return text.startswith("[") and text.endswith("]")


def _mask(text: str) -> Optional[str]:
    """The reasons bitmask as nvidia-smi prints it (``0x...``), None if it is not one (``[N/A]``)."""
    try:
        int(text, 16)
    except ValueError:
        return None
    return text if text.lower().startswith("0x") else None


def parse(line: str) -> Optional[dict[str, Any]]:
    """One line of ``nvidia-smi --query-gpu=<FIELDS>,<reasons> --format=csv,noheader,nounits``; None if it is not
    such a line (an error message, a wrong number of fields). Fields the card does not report are NaN / None."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS) + 1:
        return None

    nums = [_number(p) for p in parts[:-1]]
    events = _mask(parts[-1])
    known = [not math.isnan(x) for x in nums] + [events is not None]
    if not all(k or _not_reported(p) for k, p in zip(known, parts)):  # "[N/A]" is an answer
        return None  # a message with commas in it, not an answer
    return {**dict(zip(KEYS, nums)), "clock_events": events}


def card(uuid: Optional[str]) -> Optional[str]:
    """How ``nvidia-smi -i`` names the card of a CUDA device UUID (:func:`sdlib.store.provenance.device_uuid`,
    which drops the ``GPU-`` prefix): ``GPU-<uuid>``; None without one."""
    if not uuid:
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _device() -> str:
    """The card to ask about when the caller does not name it: the first of ``CUDA_VISIBLE_DEVICES`` where it is
    set, else GPU 0. CUDA may number cards otherwise than nvidia-smi does (fastest first), so the engine's own
    card, by UUID (:func:`card`), is the better name where it is known."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


def _run(cmd: list[str], timeout: float) -> tuple[int, str]:
    """``cmd``'s exit status and standard output; :class:`subprocess.TimeoutExpired` after ``timeout`` s, once
    the process is killed, without waiting for it more than 1 s more (a process stuck in the driver cannot be
    killed, and :func:`subprocess.run` would wait for it for ever)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        raise
    return proc.returncode, out or ""


def _query(device: Optional[str], fields: tuple[str, ...], fmt: str) -> Optional[str]:
    """nvidia-smi's standard output for ``fields`` of the card (``device``, default :func:`_device`) in ``fmt``;
    None without nvidia-smi or once a call has hung (this one or an earlier: later calls get None at once)."""
    global _hung
    if _hung or not shutil.which("nvidia-smi"):
        return None
    cmd = ["nvidia-smi", "-i", device or _device(), f"--query-gpu={','.join(fields)}", f"--format={fmt}"]
    try:
        return _run(cmd, timeout=TIMEOUT_S)[1]
    except subprocess.TimeoutExpired:
        _hung = True  # a hung driver: no second wait, now or in later samples of this process
        return None


def gpu_state(device: Optional[str] = None) -> dict[str, Any]:
    """The GPU's clocks (MHz), temperature (C), power draw and power limit (W) and active clock-event reasons (a hex
    bitmask string, :func:`clock_event_names`), keys :data:`KEYS` and ``clock_events``; NaN / None for what is not
    known (a field the card answers ``[N/A]`` for; all of them where the driver rejects a field of :data:`FIELDS`).
    ``device``: the card as ``nvidia-smi -i`` takes it (:func:`card`); default :func:`_device`.

    One ``nvidia-smi`` call (a second, with the older reasons field name, only where a driver rejects the newer
    one); the first line of its output that is an answer counts, whatever its exit status (nvidia-smi exits
    non-zero on some warnings that come with a valid answer). All unknown without nvidia-smi or when it fails or
    takes over :data:`TIMEOUT_S` (then every later sample in this process is unknown at once). Never raises."""
    global _working_event_field
    try:
        order = [f for f in (_working_event_field, *EVENT_FIELDS) if f]
        for field in dict.fromkeys(order):
            out = _query(device, (*FIELDS, field), "csv,noheader,nounits")
            if out is None:
                return unknown()
            state = next((s for s in map(parse, out.strip().splitlines()) if s is not None), None)
            if state is not None:
                _working_event_field = field
                return state
        return unknown()
    except Exception:  # noqa: BLE001 - a measurement aid must never fail a cell
        return unknown()


def _counter_value(text: str) -> tuple[float, Optional[str]]:
    """One counter field: its number and the unit written after it (``212553937 us``), or (NaN, None) for
    nvidia-smi's ``[N/A]``; ValueError if it is neither."""
    if _not_reported(text):
        return math.nan, None
    num, _, unit = text.partition(" ")
    x = float(num)  # ValueError: not a counter
    return x, (unit.strip() or None)


def _read_counters(text: str) -> Optional[tuple[list[float], Optional[float]]]:
    """The counters of :func:`parse_counters`' answer as nvidia-smi wrote them (NaN for one not reported), one per
    field of :data:`COUNTER_FIELDS`, and the factor that turns them into ms (None for a unit not known); None if
    the text is not such an answer."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = next((i for i, ln in enumerate(lines) if ln.startswith(COUNTER_FIELDS[0])), None)
    if head is None or head + 1 >= len(lines):
        return None
    names = [p.strip() for p in lines[head].split(",")]
    values = [p.strip() for p in lines[head + 1].split(",")]
    if len(names) != len(COUNTER_FIELDS) or len(values) != len(COUNTER_FIELDS):
        return None
    if not all(n.startswith(f) for n, f in zip(names, COUNTER_FIELDS)):
        return None
    try:
        parsed = [_counter_value(v) for v in values]
    except ValueError:
        return None  # a field that is neither a number nor nvidia-smi's "[N/A]": not an answer
    units = {n[len(f):].strip().strip("[]").strip() for n, f in zip(names, COUNTER_FIELDS)} - {""}
    units |= {u for _, u in parsed if u}
    unit = units.pop() if len(units) == 1 else ("us" if not units else None)
    scale = COUNTER_UNITS_MS.get(unit) if unit else None
    return [x for x, _ in parsed], scale


def parse_counters_by_reason(text: str) -> Optional[dict[str, float]]:
    """``nvidia-smi --query-gpu=<COUNTER_FIELDS> --format=csv`` (a header, then one line per card; the first
    counts) -> each counter in ms, keys :data:`HELD_KEYS`; NaN for a counter not reported (the others still count),
    and for all of them where the unit is one :data:`COUNTER_UNITS_MS` does not know; None if the text is not such
    an answer (an error message, no header). The unit as :func:`parse_counters` reads it."""
    read = _read_counters(text)
    if read is None:
        return None
    nums, scale = read
    return {k: (x * scale if scale is not None else math.nan) for k, x in zip(HELD_KEYS, nums)}


def parse_counters(text: str) -> Optional[float]:
    """``nvidia-smi --query-gpu=<COUNTER_FIELDS> --format=csv`` (a header, then one line per card; the first
    counts) -> the four counters' sum in ms; NaN where a counter is not reported or the unit is one
    :data:`COUNTER_UNITS_MS` does not know; None if the text is not such an answer (an error message, no header).
    The unit is the one the header names (``name [us]``) or the values carry (``212553937 us``); where neither
    names one, microseconds, the unit ``nvidia-smi --help-query-gpu`` gives them ("Retrieves counters in
    microseconds"). Each counter alone: :func:`parse_counters_by_reason`."""
    read = _read_counters(text)
    if read is None:
        return None
    nums, scale = read
    if scale is None or any(math.isnan(x) for x in nums):
        return math.nan
    return sum(nums) * scale  # the raw counts summed, then scaled: the sum runs.gpu_slowdown_ms has always had


def counters_ms(device: Optional[str] = None) -> dict[str, float]:
    """The times, in ms, the card's clocks have been held down for each of the power and thermal reasons of
    :data:`COUNTER_REASONS` since the counters started (the driver's load, we take it), keys :data:`HELD_KEYS`,
    and their sum under :data:`SLOWDOWN_KEY` (:func:`slowdown_ms`). One ``nvidia-smi`` call. NaN where unknown:
    every value without nvidia-smi, on a failure or a hang (as :func:`gpu_state`) or an unknown unit; a counter not
    reported, and then the sum too. A driver that rejects the fields (``is not a valid field``) is not asked again
    in this process. The difference of two readings is the held-down time between them (:func:`counter_growth`).
    Never raises."""
    global _no_counters
    try:
        out = None if _no_counters else _query(device, COUNTER_FIELDS, "csv")
        if out is None:
            return unknown_counters()
        held = parse_counters_by_reason(out)
        if held is None:
            if "is not a valid field" in out:
                _no_counters = True  # this driver does not know the fields: do not ask again
            return unknown_counters()
        total = parse_counters(out)
        return {**held, SLOWDOWN_KEY: math.nan if total is None else total}
    except Exception:  # noqa: BLE001 - a measurement aid must never fail a cell
        return unknown_counters()


def slowdown_ms(device: Optional[str] = None) -> float:
    """The sum, in ms, of the times the card's clocks have been held down for each of the power and thermal
    reasons of :data:`COUNTER_FIELDS` since the counters started (the driver's load, we take it); a moment when
    two reasons held at once counts once for each, so the sum can exceed the time that passed. One
    ``nvidia-smi`` call (:func:`counters_ms`, which gives each reason's too). NaN when unknown: no nvidia-smi, a
    failure or a hang (as :func:`gpu_state`), a counter not reported, an unknown unit; a driver that rejects the
    fields (``is not a valid field``) is not asked again in this process. The difference of two readings is the
    held-down time between them. Never raises."""
    return counters_ms(device)[SLOWDOWN_KEY]


def sample(device: Optional[str] = None, counters_first: bool = False) -> dict[str, Any]:
    """:func:`gpu_state` with :func:`counters_ms` (each reason's counter under :data:`HELD_KEYS`, their sum under
    :data:`SLOWDOWN_KEY`): what a cell records just before its requests and (``counters_first``, so that the
    counters' span is the requests' alone) just after them. One ``nvidia-smi`` call for the state, one for the
    counters. Never raises."""
    if counters_first:
        held = counters_ms(device)
        return {**gpu_state(device), **held}
    state = gpu_state(device)
    return {**state, **counters_ms(device)}


def counter_growth(start: Optional[dict[str, Any]], end: Optional[dict[str, Any]], key: str) -> float:
    """How much the counter ``key`` (:data:`SLOWDOWN_KEY` or one of :data:`HELD_KEYS`) of two :func:`sample`
    readings grew from ``start`` to ``end``, ms; NaN when either is unknown (no sample, no value, NaN) or the
    counter went back (a driver reload)."""
    a, b = (start or {}).get(key), (end or {}).get(key)
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return math.nan
    if math.isnan(a) or math.isnan(b) or b < a:
        return math.nan
    return b - a


def clock_event_names(mask: Optional[str]) -> list[str]:
    """The reasons a clock-event bitmask (``0x...``, as :func:`gpu_state` gives it) names, e.g.
    ``["sw_power_cap"]``; unknown bits as ``0x...``; empty for no reason, None or an unreadable mask."""
    try:
        bits = int(mask, 16) if mask else 0
    except (TypeError, ValueError):
        return []
    names = [name for bit, name in CLOCK_EVENT_BITS.items() if bits & bit]
    rest = bits & ~sum(CLOCK_EVENT_BITS)
    return names + ([hex(rest)] if rest else [])
