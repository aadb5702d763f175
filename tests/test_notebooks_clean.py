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


PARAMETER_FILES = sorted((REPO_ROOT / "configs").glob("*.papermill.yaml"))


@pytest.mark.parametrize("path", PARAMETER_FILES, ids=lambda p: p.name)
def test_papermill_parameter_files_name_only_parameters_the_notebooks_have(path):
    """Each configs/*.papermill.yaml names the notebooks it is for (``papermill notebooks/<nb>.ipynb <out> -f
    configs/<this file>`` in its comments); every key must be a parameter of each of them, and a folder or file it names must exist."""
    import re

    import yaml

    text = path.read_text()
    targets = sorted(set(re.findall(r"papermill (notebooks/[0-9][0-9]_\w+\.ipynb) \S+ -f configs/" + re.escape(path.name),
                                    text)))
    assert targets, f"{path.name}: say in a comment which notebook it is for (papermill notebooks/... -f {path.name})"
    params = yaml.safe_load(text) or {}
    for nb in targets:
        names = {ln.split("=")[0].strip() for c in json.loads((REPO_ROOT / nb).read_text())["cells"]
                 if "parameters" in c.get("metadata", {}).get("tags", []) for ln in "".join(c["source"]).splitlines()
                 if "=" in ln}
        assert set(params) <= names, f"{path.name}: {sorted(set(params) - names)} are not parameters of {nb}"
    for key in ("SWEEP_DIRS", "SWEEP_CONFIG"):
        for p in ([params[key]] if isinstance(params.get(key), str) else params.get(key) or []):
            assert (REPO_ROOT / p).exists(), f"{path.name}: {key} names {p}, which does not exist"
