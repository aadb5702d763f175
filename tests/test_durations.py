"""The committed test durations (tests/durations.json, written by ``make test-durations``) fit each tier's
budget, and name tests that exist. Deterministic: it reads the record, not this run's clock (this run's
times are reported against the budgets at the end of the session, as a warning: tests/durations.py)."""

from __future__ import annotations

import re

from sdlib.paths import REPO_ROOT
from tests.durations import TIERS, read_durations, tier_sums


def test_recorded_durations_fit_the_budgets():
    rec = read_durations()
    assert rec["tests"], "tests/durations.json has no recorded tests (make test-durations)"
    assert {"fast", "engine", "notebooks"} <= set(rec["budget_s"]), rec["budget_s"]
    assert all(r["tier"] in TIERS and r["s"] >= 0 for r in rec["tests"].values())
    sums = tier_sums(rec["tests"])
    over = {t: (round(s, 1), rec["budget_s"][t]) for t, s in sums.items() if s > rec["budget_s"].get(t, float("inf"))}
    assert not over, f"recorded durations over their tier's budget (sum s, budget s): {over}"


def test_recorded_tests_exist():
    """Every recorded node id names a test function still defined in its file (a renamed or removed test
    leaves a stale record)."""
    missing = []
    for nodeid in read_durations()["tests"]:
        path, _, name = nodeid.partition("::")
        func = re.sub(r"\[.*\]$", "", name.split("::")[-1])
        f = REPO_ROOT / path
        if not f.is_file() or not re.search(rf"^\s*(async\s+)?def {re.escape(func)}\(", f.read_text(), re.M):
            missing.append(nodeid)
    assert not missing, f"recorded in tests/durations.json but not defined: {missing[:10]}"
