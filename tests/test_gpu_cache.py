"""gpu/cache.sh: vLLM's compile cache packed on one GPU machine comes back in parts the device tool returns and is
restored, byte for byte, on the next machine of the same card; a damaged part, another card or a cache too big
for one call restores or packs nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sdlib.paths import REPO_ROOT

CACHE = REPO_ROOT / "gpu" / "cache.sh"

pytestmark = pytest.mark.skipif(shutil.which("sha256sum") is None or shutil.which("split") is None,
                                reason="needs coreutils")


def _cache(cwd: Path, *args: str, card: str = "h100", cache: Path, out: Path | None = None):
    env = {**os.environ, "SDLIB_CARD": card, "SDLIB_COMPILE_CACHE": str(cache), "SDLIB_CACHE_PART_MIB": "1"}
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(CACHE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _fill(root: Path, kib: int) -> dict[str, bytes]:
    files = {"vllm/torch_compile_cache/0123abcd/rank_0_0/model": os.urandom(kib * 2**10),
             "triton/KEY/kernel.cubin": b"cubin" * 100, "inductor/x.py": b"print(1)\n"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_pack_then_restore_on_the_same_card_gives_the_same_files(tmp_path):
    src, out, repo = tmp_path / "src", tmp_path / "out", tmp_path / "repo"
    files = _fill(src, 1536)  # random bytes do not compress: two parts of 1 MiB (SDLIB_CACHE_PART_MIB)
    packed = _cache(tmp_path, "pack", cache=src, out=out)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    parts = sorted(p.name for p in out.glob("cache.tar.*.part*"))
    assert len(parts) == 2 and (out / "CACHE.txt").is_file()
    (repo / ".gpucache" / "h100").mkdir(parents=True)
    for p in out.iterdir():
        shutil.copy(p, repo / ".gpucache" / "h100" / p.name)

    dst = tmp_path / "dst"
    got = _cache(repo, "restore", cache=dst)
    assert got.returncode == 0 and "restored" in got.stdout, got.stdout + got.stderr
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data
    again = _cache(repo, "restore", cache=dst)  # a second call on the warm machine does nothing
    assert again.returncode == 0 and "already restored" in again.stdout

    other = _cache(repo, "restore", card="h200", cache=tmp_path / "dst200")
    assert other.returncode == 0 and "start cold" in other.stdout and not (tmp_path / "dst200").exists()

    # a part damaged on the way: nothing restored
    bad = repo / ".gpucache" / "h100" / parts[1]
    bad.write_bytes(bad.read_bytes()[:-1] + b"\0")
    damaged = _cache(repo, "restore", cache=tmp_path / "dst2")
    assert damaged.returncode == 1 and not (tmp_path / "dst2").exists(), damaged.stdout


def test_a_cache_too_big_for_one_call_is_not_packed(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    _fill(src, 1536)  # two parts
    r = _cache(tmp_path, "pack", "1", cache=src, out=out)  # at most one part: what travels in one call
    assert r.returncode == 3 and "nothing packed" in r.stdout
    assert not out.exists() or not any(out.iterdir())
    # what the call already brings back counts: 6 files there leave room for one part and CACHE.txt
    out.mkdir(exist_ok=True)
    for i in range(6):
        (out / f"res.{i}").write_bytes(b"x")
    r = _cache(tmp_path, "pack", cache=src, out=out)
    assert r.returncode == 3 and "nothing packed" in r.stdout and len(list(out.iterdir())) == 6


def test_an_archive_that_does_not_unpack_restores_nothing(tmp_path):
    """Parts whose sha256 match CACHE.txt but whose archive is broken (a pack cut short): no cache folder at all,
    so no engine reads half a cache."""
    d = tmp_path / "repo" / ".gpucache" / "h100"
    d.mkdir(parents=True)
    (d / "cache.tar.xz.part00").write_bytes(os.urandom(4096))
    import hashlib
    sha = hashlib.sha256((d / "cache.tar.xz.part00").read_bytes()).hexdigest()
    (d / "CACHE.txt").write_text(f"# compile cache for h100 (tar.xz), 4096 bytes\n{sha}  cache.tar.xz.part00\n")
    r = _cache(tmp_path / "repo", "restore", cache=tmp_path / "dst")
    assert r.returncode == 1 and "nothing restored" in r.stdout
    assert not (tmp_path / "dst").exists() and not list(tmp_path.glob("dst.restoring*"))


def test_an_empty_cache_packs_nothing(tmp_path):
    r = _cache(tmp_path, "pack", cache=tmp_path / "none", out=tmp_path / "out")
    assert r.returncode == 0 and "nothing packed" in r.stdout
