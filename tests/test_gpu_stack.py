"""The vLLM 0.34 support that can be checked without a GPU: sdlib's version switches (sdlib.vllm.compat), the
host n-gram look-up kept for 0.34 (sdlib.vllm.ngram_host) against vLLM's own, and the staging recipe's fat-binary
pruner (gpu/fatbin_prune.py) on a small library built with nvcc for four architectures."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sdlib.vllm import compat as vc

ROOT = Path(__file__).resolve().parent.parent


def test_version_tuple():
    assert vc.version_tuple("0.34.0+cu130") == (0, 34, 0)
    assert vc.version_tuple("0.32.0") == (0, 32, 0)
    assert vc.has_v1_model_runner("0.33.0") and not vc.has_v1_model_runner("0.34.0")
    assert vc.ngram_rule("0.26.0") == "earliest" and vc.ngram_rule("0.34.1") == "rightmost"


def test_custom_class_becomes_the_registered_method_from_034():
    spec = {"method": "custom_class", "model": "sdlib.vllm.proposers.ProposeNothing", "num_speculative_tokens": 3,
            "speculator_options": {"pad": 1}}
    assert vc.speculative_config(spec, version="0.32.0") is spec
    out = vc.speculative_config(spec, version="0.34.0", register=False)
    assert out == {"method": "sdlib_custom", "num_speculative_tokens": 3,
                   "speculator_options": {"pad": 1, "proposer": "sdlib.vllm.proposers.ProposeNothing"}}
    ng = {"method": "ngram", "num_speculative_tokens": 3}
    assert vc.speculative_config(ng, version="0.34.0") is ng
    assert vc.speculative_config(None) is None


def test_server_command_uses_the_translation(monkeypatch):
    from types import SimpleNamespace

    from sdlib.vllm import server as vs

    model = SimpleNamespace(resolved_path="m", dtype="bfloat16", max_model_len=64, tensor_parallel_size=1,
                            load_format="dummy", tokenizer=None, skip_tokenizer_init=True)
    method = SimpleNamespace(speculative_config=lambda: {"method": "custom_class", "model": "a.B",
                                                         "num_speculative_tokens": 2})
    server = SimpleNamespace(gpu_memory_utilization=0.5, max_num_seqs=4, seed=0, enable_prefix_caching=False,
                             enforce_eager=True, per_request_metrics=False, extra_args=[])
    cmd = vs.server_command(model, method, server, port=1, version="0.34.0")
    spec = cmd[cmd.index("--speculative-config") + 1]
    assert '"method": "sdlib_custom"' in spec and '"proposer": "a.B"' in spec
    cmd = vs.server_command(model, method, server, port=1, version="0.26.0")
    assert '"method": "custom_class"' in cmd[cmd.index("--speculative-config") + 1]


def test_ngram_host_copy_matches_vllm():
    pytest.importorskip("numba")
    ref = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    from sdlib.vllm.ngram_host import batch_propose_numba, find_longest_matched_ngram_and_propose_tokens

    rng = np.random.default_rng(0)
    for _ in range(200):
        ctx = rng.integers(0, 4, size=int(rng.integers(1, 40))).astype(np.int32)
        for nmin, nmax, k in ((1, 3, 4), (2, 4, 3), (3, 7, 8)):
            want = ref._find_longest_matched_ngram_and_propose_tokens(ctx, nmin, nmax, 64, k)
            got = find_longest_matched_ngram_and_propose_tokens(ctx, nmin, nmax, 64, k)
            assert got.tolist() == want.tolist()
    tok = rng.integers(0, 3, size=(3, 30)).astype(np.int32)
    n = np.array([30, 12, 2], dtype=np.int32)
    d1, c1 = np.zeros((3, 4), np.int32), np.zeros(3, np.int32)
    d2, c2 = np.zeros((3, 4), np.int32), np.zeros(3, np.int32)
    batch_propose_numba([0, 1, 2], n, tok, 2, 3, 64, 4, d1, c1)
    ref.batch_propose_numba([0, 1, 2], n, tok, 2, 3, 64, 4, d2, c2)
    assert d1.tolist() == d2.tolist() and c1.tolist() == c2.tolist()


def _cuobjdump():
    if shutil.which("cuobjdump"):
        return shutil.which("cuobjdump")
    try:
        import triton

        p = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
        return str(p) if p.exists() else None
    except Exception:  # noqa: BLE001
        return None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_fatbin_prune_keeps_exactly_the_sm90_code(tmp_path):
    sys.path.insert(0, str(ROOT / "gpu"))
    import fatbin_prune as fp

    (tmp_path / "k.cu").write_text("__global__ void add(float *x) { x[threadIdx.x] += 1.0f; }\n"
                                   'extern "C" void launch(float *x) { add<<<1, 32>>>(x); }\n')
    lib = tmp_path / "libk.so"
    gencode = [f"-gencode=arch=compute_{a},code={c}" for a, c in
               (("80", "sm_80"), ("90", "sm_90"), ("90", "compute_90"), ("100", "sm_100"))]
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", *gencode, "-o", str(lib), str(tmp_path / "k.cu")],
                   check=True, capture_output=True)
    orig = tmp_path / "orig.so"
    shutil.copy2(lib, orig)
    _, cs, info = fp.plan(str(lib))
    assert cs and info["pointers"] >= len(cs)  # every container is pointed to, and only at its start
    before = {(e.kind, e.arch) for c in cs for e in c.entries}
    assert {(fp.KIND_ELF, 80), (fp.KIND_ELF, 90), (fp.KIND_ELF, 100)} <= before
    fp.prune(str(lib))
    assert lib.stat().st_size == orig.stat().st_size
    b = lib.read_bytes()
    secs = fp._sections(b)
    after = [(e.kind, e.arch) for name in fp.FATBIN_SECTIONS if name in secs
             for c in fp.containers(b, secs[name]) for e in c.entries]
    assert after and all(x == (fp.KIND_ELF, 90) for x in after)
    # bytes outside the fat-binary section are untouched
    fb = secs[".nv_fatbin"]
    o = orig.read_bytes()
    assert o[:fb["off"]] == b[:fb["off"]] and o[fb["off"] + fb["size"]:] == b[fb["off"] + fb["size"]:]
    cuobj = _cuobjdump()
    if cuobj:
        chk = fp.check(str(orig), str(lib), cuobj)
        assert chk["identical"] and chk["sm90_cubins"] >= 1


def _gpu_module(name):
    sys.path.insert(0, str(ROOT / "gpu"))
    import importlib

    return importlib.import_module(name)


def test_every_requirement_the_h200_died_on_is_carried_not_skipped():
    """The 2026-12-02 H200 engine start failed on compressed_tensors, then cutlass (build_stack.SKIP had them);
    build_app() imports model_hosting_container_standards. A name is either carried or skipped, never both."""
    bs = _gpu_module("build_stack")
    pinned = {bs.norm(p.split("==")[0]) for p in bs.all_pins()}
    for n in ("compressed-tensors", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13", "quack-kernels",
              "model-hosting-container-standards", "depyf"):
        assert n in pinned and n not in bs.SKIP, n
    assert not pinned & {bs.norm(k) for k in bs.SKIP}
    assert all(bs.SKIP.values())  # every skip says why


def test_pth_files_become_pythonpath_extra(tmp_path):
    bs = _gpu_module("build_stack")
    (tmp_path / "nvidia_cutlass_dsl" / "dsl_packages" / "cutlass").mkdir(parents=True)
    (tmp_path / "nvidia_cutlass_dsl_packages.pth").write_text("import sys, os, nvidia_cutlass_dsl; ...\n")
    assert bs.pth_paths(tmp_path) == ["nvidia_cutlass_dsl/dsl_packages"]
    assert (tmp_path / bs.PYTHONPATH_EXTRA).read_text() == "nvidia_cutlass_dsl/dsl_packages\n"
    assert not (tmp_path / "nvidia_cutlass_dsl_packages.pth").exists()
    ch = _gpu_module("check_here")
    assert ch.site_pythonpath(tmp_path) == [str(tmp_path), str(tmp_path / "nvidia_cutlass_dsl/dsl_packages")]
    (tmp_path / "other.pth").write_text("somewhere\n")
    with pytest.raises(SystemExit, match="other.pth"):
        bs.pth_paths(tmp_path)


def test_check_here_allows_only_listed_missing_modules():
    ch = _gpu_module("check_here")
    assert ch.allowed("flashinfer.comm") == ch.ALLOWED_MISSING["flashinfer"]
    assert ch.allowed("vllm.vllm_flash_attn.cute.interface") == ch.ALLOWED_MISSING["vllm.vllm_flash_attn.cute"]
    for name in ("compressed_tensors", "cutlass", "quack", "model_hosting_container_standards", "vllm.vllm_flash",
                 "flashinferx"):
        assert ch.allowed(name) is None, name
    assert {"compressed_tensors", "cutlass", "cutlass.cute", "quack"} <= set(ch.CORE)
