"""Notebook inputs (sdlib.analysis.inputs): a requested folder or glob that is not there is an error naming it."""

from __future__ import annotations

import pytest

from sdlib.analysis.inputs import as_list, matching_files, sweep_dirs


def test_missing_sweep_folder_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        sweep_dirs([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no runs table"):
        sweep_dirs([tmp_path / "empty"])


def test_sweep_folders_resolved_once_in_order(tmp_path):
    for name in ("b", "a"):
        (tmp_path / name / "runs").mkdir(parents=True)
        (tmp_path / name / "runs" / "x.parquet").write_bytes(b"")
    assert sweep_dirs([tmp_path / "b", tmp_path / "a", tmp_path / "b"]) == [tmp_path / "b", tmp_path / "a"]
    assert sweep_dirs(str(tmp_path / "a")) == [tmp_path / "a"]  # one folder, not in a list
    assert sweep_dirs(None) == [] and sweep_dirs([]) == []


def test_globs_must_match(tmp_path):
    (tmp_path / "t1.jsonl.gz").write_bytes(b"")
    assert matching_files([str(tmp_path / "*.jsonl.gz")]) == [tmp_path / "t1.jsonl.gz"]
    with pytest.raises(FileNotFoundError, match="no file matches"):
        matching_files([str(tmp_path / "*.csv")])
    assert matching_files([]) == [] and as_list("x") == ["x"]
