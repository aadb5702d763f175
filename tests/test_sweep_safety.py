"""A user's own study, safely (issue 10): edited configs never mix old cells into results, stale cells are
reported and removed, corrupt files are not 'done', one sweep per results folder, paths relative to the config
and to the current folder, custom datasets, a dry run, a sweep whose every cell failed exits non-zero, and
files readable by others. A fake engine process stands in for vLLM (the fault test uses real engines)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdlib import cli
from sdlib.run.supervise import Outcome
from sdlib.store import FolderLock, SweepStore, empty_table


class FakeEngine:
    """Writes every cell of its spec as finished (or fails them all when ``FAIL`` is set)."""

    FAIL = False
    started = 0

    def __init__(self, cmd, log_file, env, cwd=None, env_out=None, echo=False):
        FakeEngine.started += 1
        self.spec = json.loads(Path(cmd[-1]).read_text())
        self.pgid = 10 ** 7 + FakeEngine.started

    def wait(self, startup_timeout_s=None, on_poll=None, poll_every_s=1.0):
        from sdlib.config import parse_sweep

        if FakeEngine.FAIL:
            return Outcome(3, "engine process exited with code 3")
        sweep = parse_sweep(self.spec["sweep"])
        store = SweepStore(sweep.out_dir)
        for c in sweep.cells():
            if c.run_id in self.spec["run_ids"]:
                runs = empty_table("runs")
                row = {k: None for k in runs.columns} | {"run_id": c.run_id, "method_label": c.method.label,
                                                          "dataset": c.workload.label, "batch_size": c.batch_size,
                                                          "tok_per_s": 100.0, "model": c.model.name}
                store.write_cell(c.run_id, {"runs": pd.DataFrame([row]), "requests": empty_table("requests"),
                                            "steps": empty_table("steps"), "engine_steps": empty_table("engine_steps")})
        if on_poll:
            on_poll()
        return Outcome(0)

    def terminate(self):
        pass


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.setattr("sdlib.run.groups.EngineProcess", FakeEngine)
    FakeEngine.FAIL, FakeEngine.started = False, 0
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "architectures": ["X"]}))
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "id": f"r{i}"}) + "\n"
                                                 for i in range(4)))
    cfg = {"name": "study", "results_dir": "out", "models": [{"path": "models/m", "name": "m"}],
           "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
           "workloads": [{"dataset": "custom", "name": "mine", "path": "data.jsonl", "num_requests": 4,
                          "max_output_tokens": 32}],
           "batch_sizes": [1, 2]}
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    return p, cfg


def _write(p: Path, cfg: dict) -> None:
    p.write_text(yaml.safe_dump(cfg))


def test_paths_resolve_from_the_config_folder_and_the_current_folder(study, tmp_path, monkeypatch, capsys):
    p, _ = study
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["validate", "../study.yaml"]) == 0  # the config from the current folder ...
    assert cli.main(["sweep", "../study.yaml", "--no-summary"]) == 0  # ... its paths from its own folder
    assert len(SweepStore(tmp_path / "out" / "study").done_ids()) == 4
    assert not (elsewhere / "out").exists()


def test_edited_config_never_mixes_old_cells(study, tmp_path, capsys):
    p, cfg = study
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    store = SweepStore(tmp_path / "out" / "study")
    assert len(store.read("runs")) == 4
    cfg["workloads"][0]["max_output_tokens"] = 24  # a new config: new cells
    _write(p, cfg)
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    assert len(store.read("runs")) == 4 and len(store.read("runs", current_only=False)) == 8
    capsys.readouterr()
    assert cli.main(["status", str(p)]) == 0
    out = capsys.readouterr().out
    assert "4 done" in out and "4 stale cell(s)" in out and "sdlib clean --stale" in out
    assert cli.main(["clean", str(p), "--stale"]) == 1  # no terminal to ask, no --yes: it lists and keeps
    out = capsys.readouterr().out
    assert "would delete 4 cell(s), 20 file(s)" in out and "nothing deleted" in out and "--yes" in out
    assert len(store.read("runs", current_only=False)) == 8
    assert cli.main(["clean", str(p), "--stale", "--yes"]) == 0
    assert len(store.read("runs", current_only=False)) == 4 and not store.stale_ids()


def test_status_takes_the_results_dir(study, tmp_path, capsys):
    p, _ = study
    assert cli.main(["sweep", str(p), "--results-dir", str(tmp_path / "other"), "--no-summary"]) == 0
    capsys.readouterr()
    assert cli.main(["status", str(p), "--results-dir", str(tmp_path / "other")]) == 0
    assert "4 done" in capsys.readouterr().out


def test_corrupt_files_are_not_done_and_never_a_traceback(study, tmp_path, capsys):
    p, _ = study
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    store = SweepStore(tmp_path / "out" / "study")
    f = sorted((store.dir / "runs").glob("*.parquet"))[0]
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # a cell cut short
    (store.dir / "requests" / sorted((store.dir / "requests").glob("*.parquet"))[1].name).write_bytes(b"")
    assert len(store.done_ids()) == 2 and len(store.corrupt_ids()) == 2
    with pytest.warns(UserWarning, match="unreadable"):
        assert len(store.read("runs")) == 2  # neither damaged cell is read, not even its intact runs row
    capsys.readouterr()
    assert cli.main(["status", str(p)]) == 0
    assert "2 damaged (rerun)" in capsys.readouterr().out
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0  # the two are rerun
    assert len(store.done_ids()) == 4


def test_one_sweep_per_results_folder(study, tmp_path, capsys):
    p, _ = study
    with FolderLock(tmp_path / "out" / "study"):
        assert cli.main(["sweep", str(p), "--no-summary"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"pid {os.getpid()}" in err
    assert FakeEngine.started == 0


def test_every_cell_failed_exits_nonzero_and_failures_are_recorded(study, tmp_path, capsys):
    p, _ = study
    FakeEngine.FAIL = True
    assert cli.main(["sweep", str(p), "--no-summary"]) == 1
    assert "every one of the 4 cell(s) failed" in capsys.readouterr().err
    assert len(SweepStore(tmp_path / "out" / "study").failures()) == 4


def test_dry_run_starts_nothing_and_filters(study, capsys):
    p, _ = study
    assert cli.main(["sweep", str(p), "--dry-run", "--batch-sizes", "2", "--methods", "ngram"]) == 0
    out = capsys.readouterr().out
    assert FakeEngine.started == 0 and "would run 1 cell(s)" in out and "ngram-k3__mine__bs2" in out
    assert cli.main(["sweep", str(p), "--batch-sizes", "3"]) == 2
    assert "--batch-sizes: [3]" in capsys.readouterr().err


def test_result_files_are_readable_by_others(study, tmp_path):
    p, _ = study
    old = os.umask(0o022)
    try:
        assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    finally:
        os.umask(old)
    for f in (tmp_path / "out" / "study").rglob("*.parquet"):
        assert f.stat().st_mode & stat.S_IROTH, f
    assert not list((tmp_path / "out" / "study" / ".run").glob("*")), "spec files left behind"


def test_custom_dataset_rows_and_budgets(tmp_path):
    from sdlib.config import WorkloadConfig
    from sdlib.workloads import WorkloadError
    from sdlib.workloads.custom import check_custom_rows, load_custom_prompts

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"id": "a", "prompt": "hi", "max_output_tokens": 8}) + "\n"
                 + json.dumps({"prompt_token_ids": [5, 6, 7]}) + "\n" + json.dumps({"prompt": ""}) + "\n")
    wl = WorkloadConfig(dataset="custom", name="d", path=str(f), num_requests=5, max_output_tokens=16)
    rows, skipped = check_custom_rows(wl)
    assert len(rows) == 2 and skipped == 1
    with pytest.warns(UserWarning):
        ps = load_custom_prompts(wl)
    by_id = {p.source_id: p for p in ps}
    assert by_id["a"].max_output_tokens == 8 and by_id["2"].prompt_token_ids == [5, 6, 7]
    assert by_id["2"].max_output_tokens == 16 and {p.dataset for p in ps} == {"d"}
    f.write_text(json.dumps({"prompt": "x", "colour": 1}) + "\n")
    with pytest.raises(WorkloadError, match=r"d.jsonl:1: unknown field"):
        check_custom_rows(wl)


def test_prompts_that_cannot_fit_are_skipped_not_the_cell():
    from types import SimpleNamespace

    from sdlib.run.worker import fit_prompts

    wl = SimpleNamespace(max_output_tokens=10)
    ps = [SimpleNamespace(prompt_token_ids=ids, max_output_tokens=None) for ids in ([1] * 5, [], [1] * 20, [1] * 6)]
    keep, counts = fit_prompts(ps, wl, max_model_len=20)
    assert len(keep) == 2 and counts == {"kept": 2, "skipped_empty": 1, "skipped_too_long": 1}


def test_report_on_the_committed_sweep(capsys):
    from sdlib.analysis.measures import speedup_table
    from sdlib.paths import CONFIGS_DIR, SWEEPS_DIR
    from sdlib.run.report import print_report, report_table

    assert cli.main(["report", str(CONFIGS_DIR / "embedded_default.yaml"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 45 and all(r["speedup"] == pytest.approx(1.0) for r in rows if r["method_label"] == "none")
    sp = speedup_table(SweepStore(SWEEPS_DIR / "embedded_default").read("runs")).set_index(
        ["dataset", "method_label", "batch_size"])["speedup"]
    for r in rows:
        assert r["speedup"] == pytest.approx(sp[(r["dataset"], r["method_label"], r["batch_size"])])
        if r["method_label"] != "none":
            assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"] and r["mean_acceptance_length"] > 1
    store = SweepStore(SWEEPS_DIR / "embedded_default")
    some = sorted(store.done_ids())[:3]
    t = report_table(store, run_ids=some)
    assert len(t) == 3  # only the cells a sweep ran, with their baselines used for the speedup
    print_report(store, run_ids=some)
    assert "speedup [95% CI]" in capsys.readouterr().err
    assert cli.main(["report", "nope.yaml"]) == 2
