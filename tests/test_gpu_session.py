"""gpu/session.sh: the detached job queue of an H200 session. `stop` must leave nothing behind.

On the H200 (2026-12-05) `stop` killed the runner's process group only; `timeout` leads a group of its own, so the
running sweep and its worker were still alive after it (data/gpu/h200_v034_2026-12-05.json). Here a queue's job
leaves three kinds of process: one in the job's group, one in a session of its own working in the copied checkout
(as a sweep's workers do), and one that ignores SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sdlib.paths import REPO_ROOT

SESSION = REPO_ROOT / "gpu" / "session.sh"

pytestmark = pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("timeout") is None,
                                reason="needs setsid and timeout (util-linux, coreutils)")


def _alive(marker: str) -> list[str]:
    """The test's sleepers still alive (their last argument is ``marker-<kind>``), as ``pid args`` lines."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines()
            if len(line.split()) > 2 and line.split()[-1].startswith(marker) and "python" in line.split()[1]]


def _session(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "SDLIB_SESSION_ROOT": str(tmp_path / "root"), "SDLIB_GPU_STACK": "test",
            "SDLIB_GIT_COMMIT": "0" * 40, **env}
    return subprocess.run(["bash", str(SESSION), *args], cwd=tmp_path / "checkout", env=full,
                          capture_output=True, text=True, timeout=120)


def _sleeper(marker: str, what: str) -> str:
    return f"python3 -c 'import time; time.sleep(300)' {marker}-{what}"


def test_stop_ends_the_running_job_its_own_session_children_and_what_ignores_sigterm(tmp_path):
    marker = f"sdsess-{uuid.uuid4().hex[:10]}"
    checkout = tmp_path / "checkout"
    (checkout / "gpu").mkdir(parents=True)
    shutil.copy(SESSION, checkout / "gpu" / "session.sh")
    job = (f"{_sleeper(marker, 'group')} & "
           f"setsid {_sleeper(marker, 'session')} & "
           f"(trap '' TERM; exec python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           f"time.sleep(300)' {marker}-deaf) & wait")
    (checkout / "queue.txt").write_text(f"# a test queue\nfirst\t300\t{job}\nsecond\t300\techo {marker}-second\n")
    try:
        started = _session(tmp_path, "start", "queue.txt")
        assert started.returncode == 0, started.stdout + started.stderr
        deadline = time.time() + 30
        while len(_alive(marker)) < 3 and time.time() < deadline:
            time.sleep(0.2)
        kinds = sorted(line.split()[-1] for line in _alive(marker))
        assert kinds == [f"{marker}-{k}" for k in ("deaf", "group", "session")], kinds

        stopped = _session(tmp_path, "stop", STOP_GRACE_S="3")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "session: stopped" in stopped.stdout
        assert f"{marker}-deaf" in stopped.stdout  # it says what it had to SIGKILL
        time.sleep(0.5)
        assert _alive(marker) == []
        # the runner started no next job
        assert not (tmp_path / "root" / "sdsess" / "second").exists()
    finally:
        for line in _alive(marker):
            subprocess.run(["kill", "-9", line.split()[0]], capture_output=True)


def test_a_queue_runs_its_jobs_in_order_and_records_each_status(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "gpu").mkdir(parents=True)
    shutil.copy(SESSION, checkout / "gpu" / "session.sh")
    (checkout / "queue.txt").write_text("ok\t30\ttrue\nfails\t30\texit 3\nslow\t1\tsleep 30\n")
    assert _session(tmp_path, "start", "queue.txt").returncode == 0
    waited = _session(tmp_path, "wait", "60")
    assert "session: ended" in waited.stdout, waited.stdout + waited.stderr
    status = (tmp_path / "root" / "sdsess" / "status").read_text().split("\n")
    assert [line.split()[:2] for line in status if line] == [["ok", "0"], ["fails", "3"], ["slow", "124"]]


def test_wait_for_a_job_returns_when_that_job_ends_not_when_the_queue_does(tmp_path):
    """`wait SECONDS JOB` returns once JOB's status line is written, with the next job running (a session whose
    budget cannot hold the next part gives the machine back then); a name not in the queue is a one-line error."""
    checkout = tmp_path / "checkout"
    (checkout / "gpu").mkdir(parents=True)
    shutil.copy(SESSION, checkout / "gpu" / "session.sh")
    (checkout / "queue.txt").write_text("# two parts\nfirst part\t30\tsleep 1\nfirst part 2\t120\tsleep 100\n")
    try:
        assert _session(tmp_path, "start", "queue.txt").returncode == 0
        queue = tmp_path / "root" / "sdsess" / "queue.txt"
        for name in ("third", "first", "# two parts"):  # not a job, a prefix of two, a comment line
            bad = _session(tmp_path, "wait", "5", name)
            assert bad.returncode == 2 and bad.stdout.splitlines() == [
                f"session: no job '{name}' in the running queue ({queue})"], bad.stdout
        soon = _session(tmp_path, "wait", "soon", "first part")
        assert soon.returncode == 2 and soon.stdout.splitlines() == ["session: wait takes whole seconds, not 'soon'"]
        t0 = time.time()
        waited = _session(tmp_path, "wait", "90", "first part")
        assert time.time() - t0 < 30, waited.stdout  # not the 90 s, and not the second job's 100 s
        lines = waited.stdout.splitlines()
        assert lines[0] == "session: job first part ended" and "first part 0 " in waited.stdout, waited.stdout
        # the second job, whose name the first one's begins, has not ended: waiting for it runs to the limit
        t0 = time.time()
        second = _session(tmp_path, "wait", "6", "first part 2")
        assert time.time() - t0 >= 5 and second.stdout.splitlines()[0] == "session: job first part 2 not ended"
    finally:
        _session(tmp_path, "stop", STOP_GRACE_S="2")


CARD_SWEEP = REPO_ROOT / "gpu" / "card_sweep.sh"


@pytest.mark.parametrize("gpu,card", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100")])
def test_card_sweep_runs_the_cards_config_and_resumes_its_folder(tmp_path, gpu, card):
    """gpu/card_sweep.sh (the queues' jobs): configs/<card>_STEM.yaml by the card nvidia-smi names, the sweep
    folder of that name in data/sweeps copied into $RES first (done cells skipped), the options passed on."""
    bin_dir, checkout, res = tmp_path / "bin", tmp_path / "checkout", tmp_path / "res"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{gpu}'\n")
    (bin_dir / "python3").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'argv'}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    (checkout / "data" / "sweeps" / f"{card}_v034_x").mkdir(parents=True)
    (checkout / "data" / "sweeps" / f"{card}_v034_x" / "provenance.json").write_text("{}")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RES": str(res)}
    r = subprocess.run(["bash", str(CARD_SWEEP), "v034_x", "--plan-minutes", "6"], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "argv").read_text().split() == [
        "-m", "sdlib", "sweep", f"configs/{card}_v034_x.yaml", "--results-dir", str(res), "--plan-minutes", "6"]
    assert (res / f"{card}_v034_x" / "provenance.json").is_file()
    r = subprocess.run(["bash", str(CARD_SWEEP), "v034_y"], cwd=checkout, env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and not (res / f"{card}_v034_y").exists()
    # a second job on the same sweep in the session keeps what the first one wrote in $RES
    (res / f"{card}_v034_x" / "provenance.json").write_text('{"invocations": ["first job"]}')
    r = subprocess.run(["bash", str(CARD_SWEEP), "v034_x", "--blocks", "gsm8k:32"], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (res / f"{card}_v034_x" / "provenance.json").read_text() == '{"invocations": ["first job"]}'


def test_queue_jobs_name_configs_that_exist():
    """Every `bash gpu/card_sweep.sh STEM` in a queue names a config that exists for both cards."""
    import re

    stems = {m for q in (REPO_ROOT / "gpu").glob("queue_*.txt")
             for m in re.findall(r"card_sweep\.sh (\S+)", q.read_text())}
    assert stems
    for stem in stems:
        for card in ("h100", "h200"):
            assert (REPO_ROOT / "configs" / f"{card}_{stem}.yaml").is_file(), (card, stem)


@pytest.mark.parametrize("tar_rc", [1, 2])
def test_wait_packs_the_results_when_tar_says_a_file_changed_and_says_so_when_tar_fails(tmp_path, tar_rc):
    """The twenty-first session's last `wait` came back without results: a running job added a cell while tar read
    the results folder, GNU tar said "file changed as we read it" and exited 1, and `_pack` dropped the archive.
    Exit 1 leaves the archive whole (result files are renamed into place; their temporary names are left out), so
    it is packed; a fatal error (2) is said in one line."""
    import tarfile
    checkout, bin_dir, out = tmp_path / "checkout", tmp_path / "bin", tmp_path / "out"
    (checkout / "gpu").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(SESSION, checkout / "gpu" / "session.sh")
    real_tar = shutil.which("tar")
    # a tar that archives as asked, then (for the results archive) reports a changed file with exit 1, or fails
    (bin_dir / "tar").write_text(
        f"#!/bin/sh\n{real_tar} \"$@\" || exit $?\n"
        f"case \"$*\" in *res.tgz*) echo 'tar: ./s/runs: file changed as we read it' >&2; exit {tar_rc};; esac\n")
    (bin_dir / "tar").chmod(0o755)
    job = ("mkdir -p $RES/s/runs && echo cell > $RES/s/runs/a.parquet && echo half > $RES/s/runs/.b.parquet.k2x9q1z4"
           " && echo kept > $RES/s/notes.json.gz")
    (checkout / "queue.txt").write_text(f"cells\t30\t{job}\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out)}
    assert _session(tmp_path, "start", "queue.txt").returncode == 0
    waited = _session(tmp_path, "wait", "60", **env)
    assert "cells 0 " in waited.stdout, waited.stdout + waited.stderr
    parts = sorted(out.glob("res.tgz.part*"))
    if tar_rc == 1:
        assert len(parts) == 1 and "results not packed" not in waited.stdout
        with tarfile.open(parts[0]) as t:
            names = {n.lstrip("./") for n in t.getnames()}
        assert {"s/runs/a.parquet", "s/notes.json.gz"} <= names and not any(".b.parquet" in n for n in names)
    else:
        assert parts == [] and "session: results not packed (tar exit 2); call wait again to pack them" in waited.stdout
