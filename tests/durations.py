"""Test durations and a time budget per tier (a pytest plugin, loaded by ``tests/conftest.py``).

``tests/durations.json`` holds each test's recorded duration (setup + call + teardown, seconds, on the 2-core
development machine) and a budget per tier. At the end of every run the terminal summary gives, per tier, the
summed durations of this run beside the budget and the record, and names a tier over its budget in capitals.
It warns and does not fail: the machines are shared and their load varies, so a timing assertion would flake;
``tests/test_durations.py`` checks, deterministically, that the *recorded* durations fit the budgets.

Tiers: ``notebooks`` (notebook runs), ``engine`` (a CPU vLLM engine), ``gpu``, else ``fast``. The sums are of
test durations: a session fixture counts in the first test that uses it.

Usage:
    pytest tests --record-durations     # rewrite tests/durations.json's entries for the tests that ran
    pytest tests                        # the summary: "durations per tier (budget ...)"
"""

from __future__ import annotations

import json
import platform
import re
import time
from collections import defaultdict
from pathlib import Path


DURATIONS_FILE = Path(__file__).with_name("durations.json")
TIERS = ("fast", "engine", "notebooks", "gpu")


#: The suffix pytest-xdist adds to a node id under ``--dist loadgroup`` (``<nodeid>@<group>``): the groups
#: ``tests/conftest.py`` gives are a test file (module or notebook) or ``notebook_runs``.
_GROUP_SUFFIX = re.compile(r"@(?:notebook_runs|[^@:\[\]]+\.(?:py|ipynb))$")


def base_nodeid(nodeid: str) -> str:
    """``nodeid`` without the xdist group suffix, so a test has one record whether it ran grouped or not."""
    return _GROUP_SUFFIX.sub("", nodeid)


def tier_of(keywords) -> str:
    """The tier of a test from its keywords (``item.keywords`` or a report's; ``tests/conftest.py`` marks the
    notebook items at collection)."""
    kw = keywords
    if "notebooks" in kw:
        return "notebooks"
    if "gpu" in kw:
        return "gpu"
    if "engine" in kw:
        return "engine"
    return "fast"


def read_durations(path: Path = DURATIONS_FILE) -> dict:
    """``{"budget_s": {tier: s}, "tests": {nodeid: {"tier": ..., "s": ...}}, ...}`` (empty parts if absent)."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        d = {}
    d.setdefault("budget_s", {})
    d.setdefault("tests", {})
    return d


def tier_sums(tests: dict) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for rec in tests.values():
        out[rec["tier"]] += float(rec["s"])
    return dict(out)


def longest_groups_first(items: list) -> list:
    """``items`` with their ``xdist_group`` groups ordered by recorded duration, longest first (a test with
    no record counts 1 s), each group's items in their own order: a greedy longest-first schedule."""
    rec = read_durations()["tests"]
    groups: dict[str, list] = {}
    for item in items:
        m = item.get_closest_marker("xdist_group")
        groups.setdefault(m.args[0] if m and m.args else item.nodeid, []).append(item)
    cost = {g: sum(float(rec.get(base_nodeid(i.nodeid), {}).get("s", 1.0)) for i in its) for g, its in groups.items()}
    return [i for g in sorted(groups, key=lambda g: -cost[g]) for i in groups[g]]


def addoption(parser):
    parser.addoption("--record-durations", action="store_true", default=False,
                     help="write the durations of the tests that ran into tests/durations.json (others kept)")


class _Durations:
    def __init__(self, config):
        self.config = config
        self.tier: dict[str, str] = {}
        self.seconds: dict[str, float] = defaultdict(float)
        self.outcome: dict[str, str] = {}
        self.t0 = time.monotonic()

    def pytest_runtest_logreport(self, report):  # in the controller too under xdist: tiers from the keywords
        n = base_nodeid(report.nodeid)
        self.tier[n] = tier_of(report.keywords)
        self.seconds[n] += report.duration
        if report.when == "call" or report.outcome != "passed":
            self.outcome[n] = report.outcome if not hasattr(report, "wasxfail") else "xfail"

    def pytest_terminal_summary(self, terminalreporter):
        ran = {n: s for n, s in self.seconds.items() if n in self.tier and self.outcome.get(n) != "skipped"}
        if not ran:
            return
        rec = read_durations()
        budget = rec["budget_s"]
        now: dict[str, float] = defaultdict(float)
        was: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        unrecorded: dict[str, int] = defaultdict(int)
        for n, s in ran.items():
            t = self.tier[n]
            now[t] += s
            count[t] += 1
            if n in rec["tests"]:
                was[t] += float(rec["tests"][n]["s"])
            else:
                unrecorded[t] += 1
        tr = terminalreporter
        tr.write_sep("=", "durations per tier (tests/durations.json; a warning, never a failure)")
        over = []
        for t in TIERS:
            if not count[t]:
                continue
            b = budget.get(t)
            line = (f"{t:<9} {count[t]:4d} tests  {now[t]:7.1f} s this run  {was[t]:7.1f} s recorded"
                    + (f"  budget {b:6.0f} s" if b is not None else "  no budget")
                    + (f"  ({unrecorded[t]} without a record)" if unrecorded[t] else ""))
            if b is not None and now[t] > b:
                over.append(t)
                line += f"  OVER BUDGET by {now[t] - b:.0f} s"
            tr.write_line(line, red=t in over, bold=t in over)
        tr.write_line(f"session wall time {time.monotonic() - self.t0:.1f} s")
        slow = sorted(((s - float(rec["tests"][n]["s"]), n, s) for n, s in ran.items() if n in rec["tests"]),
                      reverse=True)[:3]
        for d, n, s in slow:
            if d > max(10.0, float(rec["tests"][n]["s"])):  # more than twice its record and 10 s
                tr.write_line(f"  slower than recorded: {n} {s:.1f} s (recorded {s - d:.1f} s)", yellow=True)
        if over:
            tr.write_line(f"WARNING: tier(s) {', '.join(over)} OVER their time budget in tests/durations.json: "
                          "a test got slower, or the machine was loaded (compare with the record above)",
                          red=True, bold=True)
        if self.config.getoption("--record-durations"):
            tests = dict(rec["tests"])
            for n, s in ran.items():
                if self.outcome.get(n) in ("passed", "xfail"):
                    tests[n] = {"tier": self.tier[n], "s": round(s, 2)}
            out = {"about": rec.get("about", "written by `pytest tests --record-durations` (tests/durations.py); "
                                             "seconds per test (setup + call + teardown)"),
                   "budget_s": budget,
                   "recorded_on": {"machine": f"{platform.machine()}, {_cores()} cores", "date": time.strftime("%Y-%m-%d")},
                   "tests": dict(sorted(tests.items()))}
            DURATIONS_FILE.write_text(json.dumps(out, indent=1) + "\n")
            tr.write_line(f"recorded {len(ran)} durations in {DURATIONS_FILE}")


def _cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def configure(config):
    """Register the plugin (``tests/conftest.py``'s ``pytest_configure``); not in xdist workers."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Durations(config), "sdlib-durations")
