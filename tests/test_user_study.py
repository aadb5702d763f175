"""A user's own study, round 2 (issue 22), with a fake engine process in place of vLLM: a report shows exactly
the config it is given; results stay out of the repository; nothing is deleted without asking and nothing
committed unless named; a sweep of no-SD cells only; measured concurrency recorded and a capped batch caught;
damaged tables; faults answered in one line. (Real engines: tests/test_faults_user.py.)"""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdlib import cli
from sdlib.paths import CONFIGS_DIR, REPO_ROOT, SWEEPS_DIR, results_base
from sdlib.run.supervise import Outcome
from sdlib.store import SweepStore, empty_table
from sdlib.vllm.options import is_cpu_build


class FakeEngine:
    """Writes every cell of its spec as finished, tok/s = the workload's max_output_tokens (so two configs'
    numbers differ); ``EXIT`` makes it end with that code after writing, ``RAISE`` raise that instead."""

    EXIT = 0
    RAISE = None
    started = 0

    def __init__(self, cmd, log_file, env, cwd=None, env_out=None, echo=False):
        FakeEngine.started += 1
        self.spec = json.loads(Path(cmd[-1]).read_text())
        self.pgid = 10 ** 7 + FakeEngine.started
        self.env = env

    def wait(self, startup_timeout_s=None, on_poll=None, poll_every_s=1.0):
        from sdlib.config import parse_sweep

        if FakeEngine.RAISE is not None:
            raise FakeEngine.RAISE
        sweep = parse_sweep(self.spec["sweep"])
        store = SweepStore(sweep.out_dir)
        for c in sweep.cells():
            if c.run_id in self.spec["run_ids"]:
                runs = empty_table("runs")
                row = {k: None for k in runs.columns} | {
                    "run_id": c.run_id, "method": c.method.name, "method_label": c.method.label, "model": c.model.name,
                    "dataset": c.workload.label, "batch_size": c.batch_size, "batch_mode": c.batch_mode, "repeat": c.repeat,
                    "tok_per_s": float(c.workload.max_output_tokens), "num_spec_tokens": c.method.k,
                    "acceptance_source": "none", "concurrency_mean": float(c.batch_size),
                    "concurrency_max": c.batch_size}
                store.write_cell(c.run_id, {"runs": pd.DataFrame([row]), "requests": empty_table("requests"),
                                            "steps": empty_table("steps"), "engine_steps": empty_table("engine_steps")})
        return Outcome(FakeEngine.EXIT, "" if not FakeEngine.EXIT else "engine process was killed (SIGKILL)")

    def terminate(self):
        pass


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A study folder outside the repository: a model, a JSONL of prompts, a config without results_dir."""
    monkeypatch.setattr("sdlib.run.groups.EngineProcess", FakeEngine)
    FakeEngine.EXIT, FakeEngine.RAISE, FakeEngine.started = 0, None, 0
    model = tmp_path / "mystudy" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "architectures": ["X"]}))
    (tmp_path / "mystudy" / "data.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n"
                                                              for i in range(4)))
    cfg = {"name": "mystudy", "models": [{"path": "model", "name": "m"}],
           "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
           "workloads": [{"dataset": "custom", "name": "mine", "path": "data.jsonl", "num_requests": 4,
                          "max_output_tokens": 32}],
           "batch_sizes": [1, 2]}
    p = tmp_path / "mystudy" / "my.yaml"
    p.write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    return p, cfg


def _write(p: Path, cfg: dict) -> None:
    p.write_text(yaml.safe_dump(cfg))


def _report(capsys, *argv) -> list[dict]:
    capsys.readouterr()
    assert cli.main(["report", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# item 3: results beside the config, outside the repository; committed configs keep data/sweeps -----------------
def test_results_go_beside_a_config_outside_the_repository(study, tmp_path, capsys):
    p, _ = study
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO_ROOT,
                            capture_output=True, text=True).stdout
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    assert len(SweepStore(tmp_path / "mystudy" / "results" / "mystudy").done_ids()) == 4
    assert not (SWEEPS_DIR / "mystudy").exists()
    assert subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO_ROOT,
                          capture_output=True, text=True).stdout == status  # the repository is as it was
    # the one rule: configs/ -> data/sweeps; anywhere else -> beside the config; results_dir / --results-dir win
    assert results_base(CONFIGS_DIR / "embedded_default.yaml") == SWEEPS_DIR
    assert results_base(p) == p.parent / "results"
    assert results_base(p, str(tmp_path / "x")) == tmp_path / "x"
    from sdlib.config import load_sweep

    assert load_sweep(CONFIGS_DIR / "embedded_default.yaml").out_dir == SWEEPS_DIR / "embedded_default"
    assert load_sweep(p).out_dir == tmp_path / "mystudy" / "results" / "mystudy"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    assert "results/ beside the config" in " ".join(capsys.readouterr().out.split())


def test_a_study_named_like_a_committed_sweep_leaves_it_alone(study, tmp_path, capsys):
    p, cfg = study
    committed = {f: f.stat().st_mtime_ns for f in (SWEEPS_DIR / "embedded_default").rglob("*") if f.is_file()}
    _write(p, {**cfg, "name": "embedded_default"})
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    assert cli.main(["clean", str(p), "--stale", "--yes"]) == 0
    assert {f: f.stat().st_mtime_ns for f in (SWEEPS_DIR / "embedded_default").rglob("*") if f.is_file()} \
        == committed
    assert len(SweepStore(tmp_path / "mystudy" / "results" / "embedded_default").done_ids()) == 4


def test_clean_never_deletes_tracked_files_unless_named(study, tmp_path, capsys):
    """Results committed to git (as data/sweeps are): ``clean --stale --yes`` keeps them; ``--cell`` deletes."""
    p, cfg = study
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path / "mystudy", check=True)
    subprocess.run([*git, "add", "-f", "results"], cwd=tmp_path / "mystudy", check=True)
    subprocess.run([*git, "commit", "-qm", "results"], cwd=tmp_path / "mystudy", check=True)
    store = SweepStore(tmp_path / "mystudy" / "results" / "mystudy")
    old = sorted(store.done_ids())
    _write(p, {**cfg, "workloads": [{**cfg["workloads"][0], "max_output_tokens": 24}]})  # the old cells: stale
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    capsys.readouterr()
    assert cli.main(["clean", str(p), "--stale", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "keeping 4 stale cell(s) whose files git tracks" in out and set(old) <= store.all_ids()
    assert cli.main(["clean", str(p), "--cell", old[0]]) == 1  # named, but no terminal and no --yes
    assert "nothing deleted" in capsys.readouterr().out and old[0] in store.all_ids()
    assert cli.main(["clean", str(p), "--cell", old[0], "--yes"]) == 0
    assert old[0] not in store.all_ids() and set(old[1:]) <= store.all_ids()
    assert cli.main(["clean", str(p), "--cell", "no-such-cell", "--yes"]) == 2


# item 2: report shows exactly the cells of the config it is given ------------------------------------------
def test_report_reads_exactly_the_config_it_is_given(study, tmp_path, capsys):
    p, cfg = study
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    assert {r["tok_per_s"] for r in _report(capsys, str(p))} == {32.0}
    edited = {**cfg, "workloads": [{**cfg["workloads"][0], "max_output_tokens": 24}]}
    _write(p, edited)  # status: 0 done, 4 to do, 4 stale; report must not show the old numbers as current
    capsys.readouterr()
    assert cli.main(["status", str(p)]) == 0
    assert "0 done" in capsys.readouterr().out
    assert _report(capsys, str(p)) == []
    assert cli.main(["report", str(p)]) == 0
    assert "no finished cells of" in capsys.readouterr().out
    # a copy with another setting, swept into the same folder, then clean --stale on the original
    _write(p, cfg)
    copy = p.parent / "copy.yaml"
    _write(copy, edited)
    assert cli.main(["sweep", str(copy), "--no-summary"]) == 0  # the folder's current config is now the copy's
    assert {r["tok_per_s"] for r in _report(capsys, str(p))} == {32.0}
    assert {r["tok_per_s"] for r in _report(capsys, str(copy))} == {24.0}
    assert cli.main(["clean", str(p), "--stale", "--yes"]) == 0
    capsys.readouterr()
    assert cli.main(["status", str(p)]) == 0
    assert "4 done" in capsys.readouterr().out
    assert len(_report(capsys, str(p))) == 4


# item 4: a sweep of no-SD cells only --------------------------------------------------------------------------
def test_a_sweep_of_no_sd_cells_only_reports(study, capsys):
    p, _ = study
    assert cli.main(["sweep", str(p), "--methods", "none"]) == 0
    err = capsys.readouterr().err
    assert "speedup [95% CI]" in err and "Traceback" not in err
    rows = _report(capsys, str(p))
    assert len(rows) == 2 and all(r["method_label"] == "none" for r in rows)
    from sdlib.analysis.measures import acceptance_table

    assert acceptance_table(empty_table("steps"), empty_table("runs")).empty


# item 1: measured concurrency -----------------------------------------------------------------------------------
def test_measured_concurrency_is_recorded_and_a_capped_batch_is_a_failure(fake_engine):
    from sdlib.config import parse_sweep
    from sdlib.extract.tables import ConcurrencyShortfall, build_tables, check_concurrency
    from sdlib.run.driver import drive
    from tests.conftest import FakePrompt

    class Capped(fake_engine):  # an engine that runs at most ``cap`` requests per step (max_num_seqs = cap)
        cap = 1

        def step(self):
            keep = dict(list(self.live.items())[self.cap:])
            for k in keep:
                del self.live[k]
            out = super().step()
            self.live.update(keep)
            return out

    sweep = parse_sweep({"name": "c", "models": [{"path": "m", "name": "m"}], "methods": [{"name": "none"}],
                         "workloads": [{"dataset": "code_edit", "num_requests": 8}], "batch_sizes": [4]})
    cell = sweep.cells()[0]
    prompts = [FakePrompt(i, [0] * 1) for i in range(8)]
    for engine, ok in ((fake_engine(scripts={1: [1] * 6}), True), (Capped(scripts={1: [1] * 6}), False)):
        res = drive(engine, prompts, 4, lambda p: None, clock=engine.clock)
        runs = build_tables(cell, res, {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                        "accepted_per_pos": []}, sweep="c", started_at="t",
                            detailed_requested=False)["runs"]
        if ok:
            assert runs["concurrency_max"][0] == 4 and runs["concurrency_mean"][0] == pytest.approx(4.0)
            check_concurrency(cell, runs)
        else:
            assert runs["concurrency_max"][0] == 1
            with pytest.raises(ConcurrencyShortfall, match="at most 1 requests per engine step"):
                check_concurrency(cell, runs)


def test_tables_written_before_the_concurrency_columns_read_as_unknown():
    runs = SweepStore(SWEEPS_DIR / "embedded_default").read("runs")
    assert len(runs) == 45 and runs["concurrency_mean"].isna().all() and runs["concurrency_max"].isna().all()


def test_a_kv_cache_too_small_for_the_batch_fails_the_cell_before_it_runs():
    from types import SimpleNamespace

    from sdlib.run.worker import kv_shortfall

    cell = SimpleNamespace(batch_size=16, method=SimpleNamespace(k=3), workload=SimpleNamespace(max_output_tokens=64))
    pool = [SimpleNamespace(prompt_token_ids=[1] * 61, max_output_tokens=None)] * 4  # 61 + 64 + 3 = 128 tokens
    assert kv_shortfall(cell, pool, 16 * 128) == "" and kv_shortfall(cell, pool, None) == ""
    assert "KV cache too small for the batch: 16 requests of 128 tokens" in kv_shortfall(cell, pool, 1000)


@pytest.mark.skipif(not is_cpu_build(), reason="vLLM reads VLLM_CPU_KVCACHE_SPACE only on the CPU build")
def test_the_kv_shortfall_names_what_sized_the_cache(monkeypatch):
    """The knob to raise, in vLLM's order on the CPU build: a block count set in the config, else the variable,
    else the config's kv_cache_memory_bytes, else gpu_memory_utilization."""
    from types import SimpleNamespace

    from sdlib.run.worker import kv_shortfall

    pool = [SimpleNamespace(prompt_token_ids=[1] * 61, max_output_tokens=None)]
    cell = SimpleNamespace(batch_size=16, method=SimpleNamespace(k=3), workload=SimpleNamespace(max_output_tokens=64),
                           engine=SimpleNamespace(extra={"kv_cache_memory_bytes": 2 ** 20}))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert "(raise engine.extra.kv_cache_memory_bytes or" in kv_shortfall(cell, pool, 1000)
    cell.engine.extra = {}
    assert "(raise engine.gpu_memory_utilization or" in kv_shortfall(cell, pool, 1000)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert "(raise VLLM_CPU_KVCACHE_SPACE or" in kv_shortfall(cell, pool, 1000)
    cell.engine.extra = {"num_gpu_blocks_override": 8}  # replaces the block count, whatever sized the cache
    assert "(raise engine.extra.num_gpu_blocks_override or" in kv_shortfall(cell, pool, 1000)


# item 5: provenance counts rows without a prompt -----------------------------------------------------------------
def test_skipped_empty_rows_are_counted(tmp_path):
    from types import SimpleNamespace

    from sdlib.config import WorkloadConfig
    from sdlib.run.worker import fit_prompts, skipped_rows

    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "hi"}\n{"prompt": ""}\n{"prompt": "  "}\n{"prompt_token_ids": [1, 2]}\n')
    wl = WorkloadConfig(dataset="custom", name="d", path=str(f), num_requests=4, max_output_tokens=4)
    assert skipped_rows(wl) == 2
    ps = [SimpleNamespace(prompt_token_ids=[1, 2], max_output_tokens=None)]
    assert fit_prompts(ps, wl, 64, skipped_rows(wl))[1] == {"kept": 1, "skipped_empty": 2, "skipped_too_long": 0}


# item 6: damage, faults, one line each --------------------------------------------------------------------------
def test_interrupt_says_what_is_kept_in_one_line(study, capsys):
    p, _ = study
    FakeEngine.RAISE = KeyboardInterrupt()
    assert cli.main(["sweep", str(p), "--no-summary"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mystudy: interrupted; 0 cell(s) kept, 4 to do") and "Traceback" not in "".join(err)
    FakeEngine.RAISE = KeyboardInterrupt("SIGTERM")
    assert cli.main(["sweep", str(p), "--no-summary"]) == 130
    assert "interrupted (SIGTERM); 0 cell(s) kept, 4 to do" in capsys.readouterr().err


def test_a_full_disk_is_one_line(study, monkeypatch, capsys):
    p, _ = study

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "results/mystudy/runs/x.parquet")
    monkeypatch.setattr("sdlib.store.sweep_store.write_parquet_atomic", full)
    assert cli.main(["sweep", str(p), "--no-summary"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: results/mystudy/runs/x.parquet: No space left on device (ENOSPC)"


def test_a_worker_that_cannot_write_says_so(tmp_path, monkeypatch, capsys):
    from sdlib.run import worker
    from sdlib.run.supervise import exit_reason

    def full(spec):
        raise OSError(errno.ENOSPC, "No space left on device", "/r/steps/x.parquet")
    monkeypatch.setattr(worker, "run_group", full)
    monkeypatch.setattr(worker, "_die_with_parent", lambda: None)
    spec = tmp_path / "s.json"
    spec.write_text("{}")
    assert worker.main([str(spec)]) == worker.EXIT_CANNOT_WRITE
    assert capsys.readouterr().err.strip() == \
        "worker: cannot write results: /r/steps/x.parquet: No space left on device (ENOSPC)"
    assert "could not write its results (a full disk or a read-only folder)" in exit_reason(6)
    assert exit_reason(-9) == "engine process was killed (SIGKILL)"


def test_a_killed_worker_that_had_finished_records_no_failure(study, tmp_path, capsys):
    p, _ = study
    FakeEngine.EXIT = -9  # killed after writing every cell
    assert cli.main(["sweep", str(p), "--no-summary"]) == 0
    err = capsys.readouterr().err
    assert "already finished, nothing to record" in err and "failure(s) recorded" not in err
    assert SweepStore(tmp_path / "mystudy" / "results" / "mystudy").failures().empty


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_a_results_folder_that_cannot_be_written_is_one_line(study, tmp_path, monkeypatch, capsys, kind):
    p, cfg = study
    if kind == "file":
        (tmp_path / "afile").write_text("x")
        _write(p, {**cfg, "results_dir": str(tmp_path / "afile")})
        expect = "is a file, not a folder"
    else:  # a read-only file system (EROFS), as os.access reports it
        real = __import__("os").access
        monkeypatch.setattr("sdlib.run.preflight.os.access",
                            lambda path, mode: False if Path(path) == tmp_path / "mystudy" else real(path, mode))
        monkeypatch.setattr("sdlib.run.preflight.os.statvfs",
                            lambda path: type("V", (), {"f_flag": __import__("os").ST_RDONLY})())
        expect = "read-only file system"
    for cmd in ("validate", "sweep"):
        assert cli.main([cmd, str(p)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expect in err, err
    assert FakeEngine.started == 0


def test_engine_logs_keep_no_progress_redraws_or_escapes():
    from sdlib.run.supervise import LogCleaner

    c = LogCleaner()
    out = c.feed(b"INFO up\n\x1b[32mgreen\x1b[0m\n") + c.feed(b"\rcells:  10%|#") + c.feed(b"\rcells: 100%|##\n") \
        + c.feed(b"\x1b[Anext") + c.flush()
    assert out == b"INFO up\ngreen\ncells: 100%|##\nnext\n"


def test_engines_run_offline_and_without_telemetry(tmp_path):
    from sdlib.config import parse_sweep
    from sdlib.run.groups import _child_env

    (tmp_path / "m").mkdir()
    local = parse_sweep({"name": "o", "models": [{"path": str(tmp_path / "m")}], "methods": [{"name": "none"}],
                         "workloads": [{"dataset": "code_edit"}], "batch_sizes": [1]})
    env = _child_env(None, local)
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1" and env["HF_HUB_OFFLINE"] == "1"


# item 7: newcomer frictions -----------------------------------------------------------------------------------------
def test_newcomer_frictions():
    make = (REPO_ROOT / "Makefile").read_text()
    assert "lab: $(VENV)/.lab-installed" in make  # extras installed once, not at every `make lab`
    assert ".venv/bin/sdlib" in make.replace("$(VENV)", ".venv")
    assert 'license = "Apache-2.0"' in (REPO_ROOT / "pyproject.toml").read_text()  # no deprecation banner
    from sdlib.plots.notebooks import ipc_kernel_manager

    assert ipc_kernel_manager()().transport == "ipc"  # no "Kernel is running over TCP" warning per notebook
    doc = (REPO_ROOT / "docs" / "_readme_additions_user.md").read_text()
    assert ".venv/bin/sdlib" in doc and "@trained/" in doc and "results/" in doc


def test_run_ids_with_dots_are_not_cut_at_the_first_dot(tmp_path):
    """``llama-3.1-8b__...`` is one cell, not a stale ``llama-3`` (status used to advise cleaning a phantom)."""
    store = SweepStore(tmp_path / "s")
    store.write_failure("llama-3.1-8b__eagle3-k3-L2.5__gsm8k__bs1__r0__abc", {"error": "x"})
    assert store.all_ids() == {"llama-3.1-8b__eagle3-k3-L2.5__gsm8k__bs1__r0__abc"}
    assert SweepStore(SWEEPS_DIR / "h200_llama8b").stale_ids() == set()
