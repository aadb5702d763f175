"""gpu/resume_cells.py and carry.py --resume: the done cells a GPU queue resumes travel with it.

On 2026-12-06 the staged checkout carried the headline sweep as its provenance.json alone, so the H100 re-ran the 32
start-0 cells the session before had measured. The queue's jobs now carry the done cells of the blocks they run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile

from sdlib.paths import REPO_ROOT
from sdlib.store import SweepStore
from tests.gpu_scripts import load

SWEEP = "h100_v034_headline"


def _module():
    return load("resume_cells")


def test_queue_jobs_reads_card_sweep_jobs_and_their_options(tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("# a comment\n"
                 "headline\t1500\tbash gpu/card_sweep.sh v034_headline --blocks gsm8k:32,gsm8k:128\n"
                 "  # an indented comment\n"
                 "other\t60\tpython3 gpu/smoke_034.py\n"
                 "av\t420\tbash gpu/card_sweep.sh v034_av_phases\n")
    assert _module().queue_jobs(q) == [("v034_headline", ["--blocks", "gsm8k:32,gsm8k:128"]),
                                       ("v034_av_phases", [])]


def _whole_parts(done: set, dataset: str, batch_sizes: tuple) -> set:
    """Done cells of the block(s), in (engine start, repeat) parts whose every arm is done, read from the run ids
    (``...__<dataset>__bs<B>__r<repeat>[s<start>]__<hash>``) and the config's arms: the rule, by another route."""
    import re
    from collections import defaultdict

    from sdlib.config import load_sweep

    cfg = load_sweep(REPO_ROOT / "configs" / f"{SWEEP}.yaml")
    arms = {c.method.label for c in cfg.cells() if c.workload.label == dataset and c.batch_size in batch_sizes
            and c.start == 0 and c.repeat == 0}
    parts = defaultdict(set)
    for rid in done:
        m = re.fullmatch(rf".+?__(.+)__{dataset}__bs(\d+)__r(\d+)(?:s(\d+))?__\w+", rid)
        if m and int(m[2]) in batch_sizes:
            parts[(m[2], m[3], m[4] or "0")].add((m[1], rid))
    return {rid for cells in parts.values() if {a for a, _ in cells} == arms for _, rid in cells}


def test_a_job_with_blocks_carries_the_whole_parts_of_those_blocks_only():
    mod = _module()
    done = SweepStore(REPO_ROOT / "data" / "sweeps" / SWEEP).done_ids()
    for ds in ("instructcoder", "gsm8k"):
        name, n, files = mod.resume_files("v034_headline", ["--blocks", f"{ds}:32,{ds}:128"], "h100")
        want = _whole_parts(done, ds, (32, 128))
        assert name == SWEEP and n == len(want), ds
        assert {f.name.rsplit(".", 1)[0] for f in files} == want
        # every table file of each such cell, and nothing of another block
        assert all(f.is_file() and f.parent.parent.name == SWEEP for f in files)
        assert len([f for f in files if f.parent.name == "runs"]) == len(want)
    # InstructCoder's two blocks are whole (eleventh session): all 96 travel
    assert mod.resume_files("v034_headline", ["--blocks", "instructcoder:32,instructcoder:128"], "h100")[1] == 96
    # a part of a block (@start) carries the whole block: the part's neighbours are what the job skips
    assert mod.resume_files("v034_headline", ["--blocks", "gsm8k:1,instructcoder:32@1"], "h100")[1] == len(
        _whole_parts(done, "instructcoder", (32,))) + len(_whole_parts(done, "gsm8k", (1,)))
    # no --blocks: the job may run any missing cell, so every whole part travels
    assert mod.resume_files("v034_headline", [], "h100")[1] == sum(
        len(_whole_parts(done, ds, (1, 32, 128))) for ds in ("instructcoder", "gsm8k", "sharegpt", "cnn_dailymail"))
    # a sweep with no folder here carries nothing
    assert mod.resume_files("v034_no_such_sweep", [], "h100") == ("h100_v034_no_such_sweep", 0, [])


def test_a_part_with_a_cell_missing_is_run_again_whole(tmp_path):
    """One cell gone from an engine start's repeat: that (start, repeat) part's other cells stay behind, so the
    next machine runs the part whole and no pair of arms spans two machines."""
    root = tmp_path / "root"
    (root / "data" / "sweeps").mkdir(parents=True)
    (root / "configs").symlink_to(REPO_ROOT / "configs")
    for d in (REPO_ROOT / "data").iterdir():
        if d.name != "sweeps":
            (root / "data" / d.name).symlink_to(d)
    shutil.copytree(REPO_ROOT / "data" / "sweeps" / SWEEP, root / "data" / "sweeps" / SWEEP)
    store = SweepStore(root / "data" / "sweeps" / SWEEP)
    gone = sorted(r for r in store.done_ids() if "__none__instructcoder__bs32__r0__" in r)
    assert len(gone) == 1
    for f in store.cell_files(gone[0]):
        f.unlink()
    mod = _module()
    _, n, files = mod.resume_files("v034_headline", ["--blocks", "instructcoder:32"], "h100", root=root)
    assert n == 48 - 12  # the 12 arms of start 0, repeat 0 stay behind
    assert not any("__bs32__r0__" in f.name for f in files)


def test_the_archive_unpacks_to_the_same_files_and_carry_unpacks_it_before_the_queue(tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("headline\t1500\tbash gpu/card_sweep.sh v034_headline --blocks instructcoder:32\n")
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
    assert len(got) == 48 and all("__instructcoder__bs32__" in rid for rid in got)

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


def _carry(tmp_parts_mib: float, *args: str) -> tuple[int, dict, str]:
    """carry.py --json over a stand-in parts folder of one part of ``tmp_parts_mib`` MiB (removed after)."""
    parts = REPO_ROOT / ".gpuresume" / "test_parts_fit"
    parts.mkdir(parents=True, exist_ok=True)
    size = int(tmp_parts_mib * 2**20)
    with open(parts / "p00-test", "wb") as f:
        f.truncate(size)
    (parts / "MANIFEST.txt").write_text(f"# test stack\n{'0' * 64} p00-test {size}\n")
    try:
        r = subprocess.run([sys.executable, str(REPO_ROOT / "gpu" / "carry.py"), "--json", "--dir",
                            ".gpuresume/test_parts_fit", "--tree-mib", "4", *args],
                           capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else {}), r.stderr
    finally:
        shutil.rmtree(parts)


def test_what_rides_along_goes_beside_the_last_part_when_it_fits_else_in_one_more_call():
    extra = REPO_ROOT / ".gpuresume" / "test_fit.tar"
    extra.parent.mkdir(exist_ok=True)
    with open(extra, "wb") as f:
        f.truncate(20 * 2**20)
    try:
        # a 20 MiB archive beside a 14 MiB part and a 4 MiB tree: one call
        rc, info, _ = _carry(14, "--resume", ".gpuresume/test_fit.tar", "--last", "LAST")
        assert rc == 0 and len(info["calls"]) == 1
        assert info["calls"][0]["carry"][-1] == ".gpuresume/test_fit.tar"
        assert info["calls"][0]["command"].endswith("tar -xf .gpuresume/test_fit.tar || echo 'resume: "
                                                    ".gpuresume/test_fit.tar not unpacked; its cells run again'; } && LAST")
        assert info["largest_call_bytes"] == info["calls"][0]["bytes"]
        # beside a 56 MiB part it does not fit: a call of its own, which comes last and runs the steps
        rc, info, _ = _carry(56, "--resume", ".gpuresume/test_fit.tar", "--last", "LAST")
        assert rc == 0 and len(info["calls"]) == 2
        assert info["calls"][0]["command"] == "source gpu/stage.sh .gpuresume/test_parts_fit; [ $? -ne 1 ]"
        assert ".gpuresume/test_fit.tar" in info["calls"][1]["carry"] and info["calls"][1]["command"].endswith("LAST")
        # no archive (nothing to resume) and no cache for the card: a warning each, and the plain last call
        rc, info, err = _carry(14, "--resume", ".gpuresume/none.tar", "--cache", "no_such_card", "--last", "LAST")
        assert rc == 0 and info["calls"][-1]["command"] == "source gpu/stage.sh .gpuresume/test_parts_fit && LAST"
        assert "nothing to resume" in err and "start cold" in err
    finally:
        extra.unlink()


def test_travelling_bytes_counts_a_file_deleted_while_it_counts_as_nothing(tmp_path, monkeypatch):
    """carry.py sizes the checkout while other processes (a parallel test worker) may create and delete files in it:
    a file listed by git but gone before its stat counts 0 bytes instead of failing the whole count."""
    from pathlib import Path

    carry = load("carry")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "kept.bin").write_bytes(b"x" * 100)
    (tmp_path / "vanishes.bin").write_bytes(b"y" * 50)
    assert carry.travelling_bytes(tmp_path) == 150
    real_is_file = Path.is_file

    def is_file_then_gone(self):  # the race: the file exists when asked, and is deleted before its stat
        ok = real_is_file(self)
        if self.name == "vanishes.bin" and ok:
            self.unlink()
        return ok

    monkeypatch.setattr(Path, "is_file", is_file_then_gone)
    assert carry.travelling_bytes(tmp_path) == 100


def test_a_jobs_blocks_are_read_as_sdlib_sweep_reads_them():
    mod = _module()
    assert mod.sweep_blocks(["--blocks", "gsm8k:32,gsm8k:128"]) == "gsm8k:32,gsm8k:128"
    assert mod.sweep_blocks(["--blocks=gsm8k:1", "--strict"]) == "gsm8k:1"
    assert mod.sweep_blocks(["--blocks", "a:1", "--blocks", "b:2"]) == "b:2"  # the last wins, as in sdlib sweep
    assert mod.sweep_blocks(["--block", "gsm8k:1"]) == "gsm8k:1"  # an abbreviation, as argparse takes it
    assert mod.sweep_blocks(["--plan-minutes", "20"]) is None and mod.sweep_blocks([]) is None
