"""gpu/resume_cells.py and carry.py --resume: the done cells a GPU queue resumes travel with it.

On 2026-12-06 the staged checkout carried the headline sweep as its provenance.json alone, so the H100 re-ran the 32
start-0 cells the session before had measured. The queue's jobs now carry the done cells of the blocks they run.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile

from sdlib.paths import REPO_ROOT
from sdlib.store import SweepStore

SWEEP = "h100_v034_headline"


def _module():
    spec = importlib.util.spec_from_file_location("resume_cells", REPO_ROOT / "gpu" / "resume_cells.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_queue_jobs_reads_card_sweep_jobs_and_their_options(tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("# a comment\n"
                 "headline\t1500\tbash gpu/card_sweep.sh v034_headline --blocks gsm8k:32,gsm8k:128\n"
                 "other\t60\tpython3 gpu/smoke_034.py\n"
                 "av\t420\tbash gpu/card_sweep.sh v034_av_phases\n")
    assert _module().queue_jobs(q) == [("v034_headline", ["--blocks", "gsm8k:32,gsm8k:128"]),
                                       ("v034_av_phases", [])]


def test_a_job_with_blocks_carries_the_done_cells_of_those_blocks_only():
    mod = _module()
    done = SweepStore(REPO_ROOT / "data" / "sweeps" / SWEEP).done_ids()
    name, n, files = mod.resume_files("v034_headline", ["--blocks", "gsm8k:32,gsm8k:128"], "h100")
    want = {r for r in done if "__gsm8k__bs32__" in r or "__gsm8k__bs128__" in r}
    assert name == SWEEP and n == len(want)
    assert {f.name.rsplit(".", 1)[0] for f in files} == want
    # every table file of each such cell, and nothing of another block
    assert all(f.is_file() and f.parent.parent.name == SWEEP for f in files)
    assert len([f for f in files if f.parent.name == "runs"]) == len(want)
    # a part of a block (@start) carries the whole block: the part's neighbours are what the job skips
    assert mod.resume_files("v034_headline", ["--blocks", "gsm8k:32@1"], "h100")[1] == len(
        {r for r in done if "__gsm8k__bs32__" in r})
    # no --blocks: the job may run any missing cell, so every done cell travels
    assert mod.resume_files("v034_headline", [], "h100")[1] == len(done)
    # a sweep with no folder here carries nothing
    assert mod.resume_files("v034_no_such_sweep", [], "h100") == ("h100_v034_no_such_sweep", 0, [])


def test_the_archive_unpacks_to_the_same_files_and_carry_unpacks_it_before_the_queue(tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("headline\t1500\tbash gpu/card_sweep.sh v034_headline --blocks gsm8k:32\n")
    out = tmp_path / "h100.tar"
    r = subprocess.run([sys.executable, str(REPO_ROOT / "gpu" / "resume_cells.py"), str(q), "--card", "h100",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "x", filter="data")
    assert names and all(n.startswith(f"data/sweeps/{SWEEP}/") for n in names)
    for n in names:
        assert (tmp_path / "x" / n).read_bytes() == (REPO_ROOT / n).read_bytes()
    # the unpacked cells are done cells for the sweep's own store (checksums intact)
    got = SweepStore(tmp_path / "x" / "data" / "sweeps" / SWEEP).done_ids()
    assert got and all("__gsm8k__bs32__" in rid for rid in got)

    # carry.py reads a parts folder inside the checkout (.gpu34 here; a stand-in of one small part in CI)
    parts = REPO_ROOT / ".gpuresume" / "test_parts"
    parts.mkdir(parents=True, exist_ok=True)
    (parts / "p00-test").write_bytes(b"x" * 100)
    (parts / "MANIFEST.txt").write_text("# test stack\n" + "0" * 64 + " p00-test 100\n")
    inside = REPO_ROOT / ".gpuresume" / "test_carry.tar"
    inside.write_bytes(out.read_bytes())
    try:
        r = subprocess.run([sys.executable, str(REPO_ROOT / "gpu" / "carry.py"), "--json", "--dir",
                            ".gpuresume/test_parts", "--resume", ".gpuresume/test_carry.tar", "--last",
                            "bash gpu/session.sh start q"],
                           capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert r.returncode == 0, r.stderr
        last = json.loads(r.stdout)["calls"][-1]
        assert ".gpuresume/test_carry.tar" in last["carry"]
        cmd = last["command"]
        assert cmd.index("tar -xf .gpuresume/test_carry.tar") < cmd.index("bash gpu/session.sh start q")
    finally:
        inside.unlink()
        shutil.rmtree(parts)


def test_a_queue_with_nothing_to_resume_writes_no_archive(tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("x\t60\tbash gpu/card_sweep.sh v034_no_such_sweep\n")
    out = tmp_path / "none.tar"
    out.write_text("stale")
    assert _module().main([str(q), "--card", "h200", "--out", str(out)]) == 0
    assert not out.exists()
