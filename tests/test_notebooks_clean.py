"""Committed notebooks: no outputs, exactly one `parameters` cell, an opening markdown cell."""

import json

import pytest

from sdlib.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean(path):
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown", "open with a markdown cell saying what the notebook answers"
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "strip outputs"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    lines = [ln for ln in "".join(tagged[0]["source"]).splitlines() if ln.strip()]
    for ln in lines:
        name = ln.split("=")[0].strip()
        assert name.isupper(), f"parameter {name!r} should be UPPER_CASE"
        assert "#" in ln, f"parameter line needs a trailing comment: {ln!r}"
