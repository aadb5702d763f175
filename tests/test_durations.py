"""The committed test durations (tests/durations.json, written by ``make test-durations``) fit each tier's
budget, and name tests that exist. Deterministic: it reads the record, not this run's clock (this run's
times are reported against the budgets at the end of the session, as a warning: tests/durations.py)."""

from __future__ import annotations

import re

import pytest

from sdlib.paths import REPO_ROOT
from tests.durations import TIERS, base_nodeid, read_durations, tier_sums


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


def test_base_nodeid_drops_only_the_xdist_group_suffix():
    assert base_nodeid("tests/test_a.py::test_x@tests/test_a.py") == "tests/test_a.py::test_x"
    assert base_nodeid("tests/test_a.py::test_x[1]@notebook_runs") == "tests/test_a.py::test_x[1]"
    assert base_nodeid("notebooks/01_a.ipynb::notebooks/01_a.ipynb@notebooks/01_a.ipynb") == \
        "notebooks/01_a.ipynb::notebooks/01_a.ipynb"
    assert base_nodeid("tests/test_a.py::test_x[gsm8k:1@0]") == "tests/test_a.py::test_x[gsm8k:1@0]"
    assert base_nodeid("tests/test_a.py::test_x[gsm8k:1@0]@tests/test_a.py") == "tests/test_a.py::test_x[gsm8k:1@0]"


def test_under_loadgroup_a_test_is_scheduled_with_its_module(request):
    """``make test`` groups each module's tests into one worker: pytest-xdist then suffixes every node id with
    the group (``tests/conftest.py`` adds the markers before xdist's hook reads them). Without the suffix each
    test is scheduled alone and a module fixture is made in every worker that runs one of its tests."""
    if not getattr(request.config.option, "loadgroup", False):  # set in an xdist worker under --dist loadgroup
        pytest.skip("only under pytest -n N --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@tests/test_durations.py"), request.node.nodeid
