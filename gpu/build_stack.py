#!/usr/bin/env python3
"""Build the vLLM 0.34 stack for the H200 machine (no network there) as sha-named parts of one archive.

Run HERE (needs PyPI). The device image has Python 3.12, torch 2.11.0+cu130, triton 3.6.0, transformers 5.17
and ~200 other packages (gpu/image_packages.txt); vLLM 0.34.0 needs torch 2.14.0 (+ NCCL 2.30.7), triton 3.8
and a few dozen pure-runtime packages the image lacks. This script

1. downloads the cp312 manylinux x86_64 wheels in PINS (``pip download --no-deps --only-binary=:all:``);
2. resolves every ``Requires-Dist`` of every carried wheel (markers evaluated for Linux x86_64, CPython 3.12,
   extras skipped) against PINS, gpu/image_packages.txt and SKIP, and prints one line per requirement
   (carried / image / skipped-why / MISSING); a requirement that is nowhere stops the build;
3. unpacks the wheels into one site folder (purelib + platlib; RECORD files dropped), removes PRUNE (what a
   dense bf16 Llama on Hopper never loads: checked by importing every module on that path against a copy of
   the image here, gpu/check_here.py), and rewrites every CUDA fat binary to sm_90 code only
   (gpu/fatbin_prune.py; the sm_90 cubins are checked byte for byte against the originals with cuobjdump);
4. packs it as one ``tar.xz`` (multi-threaded, 64 MiB blocks so the device decompresses in parallel) and
   splits it into parts named ``pNN-<sha256[:12]>`` plus ``MANIFEST.txt`` (sha256 and size of every part and
   of the whole archive), in OUT (an ignored folder: ``.gpu34/``).

Usage:
    python3.12 gpu/build_stack.py                      # -> .gpu34/pNN-*, MANIFEST.txt, BUILD.json (~25 min on 2 cores)
    python3.12 gpu/build_stack.py --reuse --part-mib 30   # re-split the packed archive only (seconds)
    python3 gpu/carry.py                               # the run calls that send the parts (gpu/README.md)

Options: --out DIR (default .gpu34), --cache DIR (wheels + stage; default /tmp/sdlib-gpu34), --part-mib N
(default 36: a part + the repository's travelling tree must stay under 64 MiB), --no-fatbin-prune,
--xz-level (default -6), --reuse. Never commit OUT or the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fatbin_prune  # noqa: E402  (beside this file)

VLLM_VERSION = "0.34.0"

# name==version: every wheel carried. Versions: the newest that satisfies vLLM 0.34.0's and torch 2.14.0's
# metadata and the device image, except where a comment says why not.
PINS = [
    f"vllm=={VLLM_VERSION}",
    "torch==2.14.0",
    "triton==3.8.0",              # torch 2.14 pins triton~=3.8.0 (the image's 3.6.0 stays, shadowed)
    "nvidia-nccl-cu13==2.30.7",   # torch 2.14's pin; the image's 2.28.9 lacks ncclCommResume (FACTS.md)
    "torchvision==0.29.0",        # vLLM's pin; the image's 0.26 is built for torch 2.11 and fails to load
    # engine / config
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    "msgspec==0.23.0", "pyzmq==27.3.0", "cbor2==6.3.0", "pybase64==1.5.1", "cachetools==8.0.2",
    "setproctitle==1.3.8", "blake3==1.0.11",
    # vllm.entrypoints (LLM's chat/tool parsing, the OpenAI server)
    "openai==2.54.0",             # <3: openai 3.x needs httpx2, which the image lacks (0.26 recipe)
    "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1",
    "oss-harmony==0.0.11",        # vLLM 0.34's name for openai-harmony
    "fastapi==0.136.3",           # vLLM asks <0.137; newer fastapi imports opentelemetry (0.26 recipe)
    "starlette==1.10.0", "annotated-doc==0.0.7", "partial-json-parser==0.2.1.1.post7",
    # structured output, imported at module level by vllm.v1.request / the scheduler
    "xgrammar==0.2.8", "apache-tvm-ffi==0.1.11", "llguidance==1.7.6",
]
# Added after the H200 engine start of 2026-12-02 failed on them and the import graph of vLLM 0.34's source was
# read (docs/gpu_034.md: "What failed on the H200"); kept separate so the reason stays.
PINS_FROM_IMPORT_CHECKS: list[str] = [
    # imported at module level on every engine start: vllm.v1.worker.gpu.model_runner -> gpu.eplb_utils ->
    # vllm.models.deepseek_v4 -> deepseek_v4.amd.mtp -> amd.mega_moe -> quantization.online.base ->
    # quantization.compressed_tensors.utils -> compressed_tensors (and every quantisation config imports it)
    "compressed-tensors==0.17.0", "loguru==0.7.3",
    # CuTe DSL: gpu_worker.compile_or_warm_up_model -> kernel_warmup() imports
    # vllm.model_executor.warmup.minimax_m3_msa_warmup whenever the platform is CUDA (no flag, no guard); its
    # modules import cutlass, cutlass.cute, quack and cuda.bindings at module level. Only the cu13 flavour:
    # its loader picks the newest flavour the driver supports (CUDA 13 on the H200).
    "nvidia-cutlass-dsl==4.8.0", "nvidia-cutlass-dsl-libs-base==4.8.0", "nvidia-cutlass-dsl-libs-core==4.8.0",
    "nvidia-cutlass-dsl-libs-cu13==4.8.0", "quack-kernels==0.6.5",
    # torch.compile: vllm.compilation.wrapper imports depyf when FULL/PIECEWISE graphs meet a module writing a
    # buffer in forward (to word its error) and with a compile debug dump path (monitor.py, depyf_compat)
    "depyf==0.20.0", "astor==0.8.1", "dill==0.4.1",
]
# The OpenAI-compatible server (configs/h200_serving.yaml): uvicorn and the metrics middleware (the 0.26
# bundle lacked them). uvloop and httptools are optional for uvicorn; the image has uvloop.
PINS_SERVER: list[str] = [
    "uvicorn==0.55.0", "prometheus-fastapi-instrumentator==8.1.0",
    "orjson==3.13.0",             # imported at module level by vllm.entrypoints.openai.* (checked here)
    "watchfiles==1.3.0",          # imported at module level by vllm.entrypoints.launchers.utils.ssl
    "python-multipart==0.0.34",   # fastapi needs it where a route takes Form data (transcription routers)
    # vllm.entrypoints.launchers.app.build_app() ends with sagemaker_standards_bootstrap(app), which imports
    # model_hosting_container_standards.sagemaker on every server start (not only for SageMaker routes)
    "model-hosting-container-standards==0.1.16", "jmespath==1.1.0", "supervisor==4.3.0",
]

# Requirements deliberately not carried: name -> why. Each "imported only" claim is from the import statements
# of vLLM 0.34.0's source (every `import`/`from` naming the package, module level or in a function) and is
# checked by gpu/check_here.py, which imports every module on the engine/server path and every module those
# modules import inside functions, and fails on a missing package that is not in its ALLOWED_MISSING.
# The 2026-12-02 H200 attempt died on two entries this list used to have ("compressed-tensors: quantised
# checkpoints only", "nvidia-cutlass-dsl / quack-kernels: CuTe-DSL kernels only"): docs/gpu_034.md.
SKIP = {
    "flashinfer-python": "0.7.3 is not on the registry (0.7.2.post1 and 0.7.4 are); every import is in a function "
                         "behind has_flashinfer() (find_spec) or a FlashInfer backend/env choice; the sampler's "
                         "needs VLLM_USE_FLASHINFER_SAMPLER=0 (gpu/stage.sh sets it)",
    "nvidia-cudnn-cu13": "553 MB wheel; a dense Llama never calls cuDNN (docs/gpu_034.md: cuDNN); the image's 9.19 "
                         "loads and only torch.backends.cudnn.version() raises",
    "nvidia-cutlass-dsl-libs-cu12": "the CUDA 12 flavour of the CuTe DSL (235 MB unpacked); its loader picks the "
                                    "newest flavour the driver supports, cu13 here (carried)",
    "torch-c-dlpack-ext": "quack's requirement: prebuilt addons for torch 2.4-2.9 only (none for 2.14); tvm_ffi "
                          "imports it under try/except ImportError",
    "cuda-toolkit": "CUDA 13.0 user-space libraries: the image has them (torch 2.14 ran on them, FACTS.md)",
    "cuda-bindings": "in the image (cuda.bindings.driver: the CuTe DSL and vLLM's CuTe kernels import it)",
    "nvidia-cusparselt-cu13": "in the image (0.8.0 vs 0.8.1: minor)",
    "nvidia-nvshmem-cu13": "in the image (3.4.5)",
    "torchaudio": "vLLM pins 2.11.0, the image's version; imported only under try/except (multimodal audio)",
    "torchcodec": "video/audio decoding only: multimodal.video_decoders, multimodal.media.audio (try/except)",
    "pynvvideocodec": "video decoding only (multimodal.video_decoders.pynvvideocodec)",
    "tilelang": "imported only by vllm.tilelang_utils (DeepSeek sparse-attention kernels)",
    "nvidia-cudnn-frontend": "imported only by FA4's benchmark helpers (vllm_flash_attn/cute, pruned)",
    "nvtx": "imported only with VLLM_NVTX_SCOPES_FOR_PROFILING=1 (vllm.v1.utils)",
    "fastsafetensors": "load_format=fastsafetensors only (weight_utils: try/except and in a function)",
    "instanttensor": "load_format=instanttensor only (weight_utils, in a function)",
    "tokenspeed-mla": "MLA attention backends only (v1.attention.backends.mla.*, Kimi-K3)",
    "humming-kernels": "imported only by vllm.utils.humming under a guard (quantised MoE kernels)",
    "lm-format-enforcer": "structured-output backend lm-format-enforcer only (v1.structured_output.backend_"
                          "lm_format_enforcer, imported when a request picks it)",
    "outlines-core": "structured-output backend outlines only (v1.structured_output.backend_outlines, utils in a "
                     "function)",
    "lark": "never imported by vLLM 0.34's source", "jsonschema": "never imported by vLLM 0.34's source",
    "python-json-logger": "never imported by vLLM 0.34's source (a logging config may name it)",
    "anthropic": "never imported by vLLM 0.34's source (its Anthropic route has its own pydantic models)",
    "mistral-common": "Mistral tokenizers/parsers and Pixtral/Voxtral only (imported behind is_mistral_tokenizer); "
                      "it asks numpy<2.4, the image has 2.5.2",
    "ijson": "imported only by vllm.parser.mistral",
    "mcp": "tool server only (entrypoints.mcp.tool_server, in functions; --tool-server)",
    "opentelemetry-sdk": "tracing only (vllm.tracing.otel: try/except)",
    "opentelemetry-api": "tracing only (vllm.tracing.otel: try/except)",
    "opentelemetry-exporter-otlp": "tracing only (vllm.tracing.otel: try/except)",
    "opentelemetry-semantic-conventions-ai": "tracing only (vllm.tracing.otel: try/except)",
    "numba": "vLLM pins 0.65.0; the image has 0.68.0 (0.26's n-gram ran on it); 0.34 imports it only for Kimi "
             "models (behind is_numba_available()) and in jit_monitor's numba threading-layer helper",
    "huggingface-hub": "vLLM asks >=2.0 but the image's transformers 5.17 needs <2.0: the image's 1.33 stays",
    "tokenizers": "vLLM asks >=0.23.3, the image has 0.23.2 (transformers 5.17 accepts it); no tokenizer is loaded",
    "setuptools": "vLLM asks <81 (the image's version is not known); only torch.utils.cpp_extension uses it",
    "certifi": "TLS roots only (no network there)", "requests": "in the image (version not known)",
    "sympy": "in the image", "networkx": "in the image", "jinja2": "in the image", "fsspec": "in the image",
    "opencv-python-headless": "in the image (multimodal only)", "pillow": "in the image (multimodal only)",
    "aiohttp": "in the image", "multidict": "in the image", "protobuf": "in the image",
}

PLATFORMS = (["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64", "linux_x86_64"]
             + [f"manylinux_2_{n}_x86_64" for n in range(5, 40)])

# Paths inside site/ that a dense bf16 Llama on Hopper (FA3 / Triton attention, no quantisation, no MoE, no
# multimodal) never loads. Each was checked by gpu/check_here.py (every module on the path imports without it).
PRUNE = [
    # vLLM
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",   # FA2 (Hopper runs FA3)
    "vllm/vllm_flash_attn/cute",                  # FA4 (CuTe DSL, Blackwell)
    "vllm/_moe_C_stable_libtorch.abi3.so",        # MoE kernels (optional import)
    "vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so",  # MLA (DeepSeek)
    "vllm/_flashkda_C.abi3.so", "vllm/_deepselect_C.abi3.so",          # DeepSeek sparse attention
    "vllm/third_party/deep_gemm",                 # FP8 GEMMs
    "vllm/third_party/fmha_sm100", "vllm/third_party/tml_fa4",  # Blackwell attention
    "vllm/vllm-rs",                               # Rust API-server frontend binary
    # torch (torch/include stays: 3.5 MB packed, and Inductor or a JIT extension may want it; torchgen and
    # functorch stay: a top-level package missing here would be imported from the image's torch 2.11 instead)
    "torch/share/cmake", "torch/bin/protoc",
    # triton: profiler, Blackwell ptxas, debug tools, AMD backend
    "triton/backends/nvidia/lib/cupti", "triton/backends/nvidia/lib/cupti-blackwell",
    "triton/backends/nvidia/bin/ptxas-blackwell", "triton/backends/nvidia/bin/nvdisasm",
    "triton/backends/nvidia/bin/cuobjdump", "triton/instrumentation",
    "triton/backends/amd/include", "triton/backends/amd/lib",  # its .py stay: triton discovers backends by entry point
    "triton/_C/libproton.so", "triton/profiler",
    # NCCL: the LLVM bitcode of device functions (NCCL's device API, not used by torch's process groups)
    "nvidia/nccl/lib/libnccl_device.bc", "nvidia/nccl/include",
    # CuTe DSL: the runtime's aarch64 / QNX link stubs
    "nvidia_cutlass_dsl/cu13/lib/stubs",
]
# File name patterns removed everywhere (static libraries, type stubs' sources, tests).
PRUNE_GLOBS = ["*.a", "*.pyi"]

# A wheel's .pth file works only in a site directory; the staged site is put on PYTHONPATH, where Python does not
# read .pth files. Each carried .pth -> the folders (relative to the site) it would add; written to
# site/PYTHONPATH_EXTRA (one per line) for gpu/stage.sh and gpu/check_here.py. A .pth not listed stops the build.
PTH_PATHS = {
    # "import sys, os, nvidia_cutlass_dsl; sys.path.insert(0, .../nvidia_cutlass_dsl/dsl_packages)": `cutlass`
    "nvidia_cutlass_dsl_packages.pth": ["nvidia_cutlass_dsl/dsl_packages"],
}
PYTHONPATH_EXTRA = "PYTHONPATH_EXTRA"


def sh(cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def all_pins() -> list[str]:
    return PINS + PINS_FROM_IMPORT_CHECKS + PINS_SERVER


def wheel_path(cache: Path, pin: str) -> Path | None:
    name, ver = pin.split("==")
    stem = norm(name).replace("-", "_") + "-" + ver + "-"
    m = [f for f in os.listdir(cache) if f.lower().startswith(stem) and f.endswith(".whl")]
    return cache / m[0] if len(m) == 1 else None


def download(cache: Path) -> list[Path]:
    cache.mkdir(parents=True, exist_ok=True)
    todo = [p for p in all_pins() if wheel_path(cache, p) is None]
    for pin in todo:  # one at a time: pip gives up on the whole list when one name fails
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", str(cache)]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        sh(cmd + [pin], env=dict(os.environ, PIP_CONSTRAINT=""))
    out = []
    for pin in all_pins():
        w = wheel_path(cache, pin)
        if w is None:
            raise SystemExit(f"build_stack: no single wheel for {pin} in {cache}")
        out.append(w)
    return out


# ----------------------------------------------------------------------------------------- requirements
def _marker_env() -> dict[str, str]:
    return {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
            "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def _packaging():
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pip vendors it
        from pip._vendor.packaging.requirements import Requirement  # type: ignore
        from pip._vendor.packaging.version import Version  # type: ignore
    return Requirement, Version


def read_image(path: Path = HERE / "image_packages.txt") -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            n, _, v = line.partition("==")
            out[norm(n)] = v or None
    return out


def requirements_report(wheels: list[Path]) -> list[dict]:
    """One row per (carried wheel, requirement): where it is satisfied. Raises on a requirement that is nowhere."""
    Requirement, Version = _packaging()
    env = _marker_env()
    carried = {}
    for w in wheels:
        n, v = w.name.split("-")[:2]
        carried[norm(n)] = v
    image = read_image()
    rows, missing = [], []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(meta).decode()
        who = w.name.split("-")[0]
        for line in text.splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # an extra, or another platform
            n = norm(req.name)
            if n in carried:
                ok = Version(carried[n]) in req.specifier or not str(req.specifier)
                where, ver = ("carried" if ok else "carried (VERSION CLASH)"), carried[n]
                if not ok and n not in SKIP:
                    missing.append(f"{who}: {req} but {n}=={carried[n]} is carried")
            elif n in image:
                ver = image[n]
                if ver is None:
                    where = "image (version not known)"
                elif Version(ver) in req.specifier or not str(req.specifier):
                    where = "image"
                else:
                    where = "image (OTHER VERSION)"
                    if n not in SKIP:
                        missing.append(f"{who}: {req} but the image has {n}=={ver}")
            else:
                where, ver = ("skipped", None) if n in SKIP else ("MISSING", None)
                if n not in SKIP:
                    missing.append(f"{who}: {req}")
            rows.append({"wheel": who, "requirement": str(req), "where": where, "version": ver,
                         "why": SKIP.get(n, "")})
    for r in rows:
        print(f"  {r['wheel']:<22} {r['requirement']:<60} {r['where']:<26} {r['version'] or '':<12} {r['why'][:70]}")
    if missing:
        raise SystemExit("build_stack: unresolved requirements (add to PINS or SKIP with a reason):\n  "
                         + "\n  ".join(missing))
    return rows


# ----------------------------------------------------------------------------------------- site
def unpack(wheels: list[Path], site: Path) -> dict[str, int]:
    """A wheel is a zip: its files and its *.data/{purelib,platlib} go to site/. Returns bytes per wheel."""
    sizes = {}
    for w in wheels:
        n = 0
        with zipfile.ZipFile(w) as z:
            for info in z.infolist():
                name = info.filename
                parts = name.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                        name = "/".join(parts[2:])
                    else:
                        continue  # scripts/headers/data: not needed
                if name.endswith("/") or (parts[0].endswith(".dist-info") and parts[-1] == "RECORD"):
                    continue
                dst = site / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(dst, "wb") as out:
                    shutil.copyfileobj(src, out)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    os.chmod(dst, mode)
                n += info.file_size
        sizes[w.name.split("-")[0]] = n
    return sizes


def pth_paths(site: Path) -> list[str]:
    """The folders the site's .pth files add (PTH_PATHS), written to site/PYTHONPATH_EXTRA; the .pth files go."""
    extra = []
    for f in sorted(site.glob("*.pth")):
        if f.name not in PTH_PATHS:
            raise SystemExit(f"build_stack: {f.name}: a .pth file not in PTH_PATHS ({f.read_text()[:200]!r}); say "
                             "which folders it adds")
        for rel in PTH_PATHS[f.name]:
            if not (site / rel).is_dir():
                raise SystemExit(f"build_stack: {f.name}: {rel} is not a folder of the site")
            extra.append(rel)
        f.unlink()
    (site / PYTHONPATH_EXTRA).write_text("".join(r + "\n" for r in extra))
    return extra


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def prune_paths(site: Path) -> dict[str, int]:
    removed = {}
    for p in PRUNE:
        full = site / p
        if full.exists():
            removed[p] = du(full)
            shutil.rmtree(full) if full.is_dir() else full.unlink()
        else:
            print("prune: not found", p)
    for pat in PRUNE_GLOBS:
        n = 0
        for f in site.rglob(pat):
            if f.is_file():
                n += f.stat().st_size
                f.unlink()
        removed[pat] = n
    for d in list(site.rglob("__pycache__")):
        shutil.rmtree(d, ignore_errors=True)
    return removed


def prune_fatbins(site: Path, cuobjdump: str | None) -> list[dict]:
    """sm_90-only device code in every ELF shared object with a .nv_fatbin section; checked with cuobjdump."""
    rows = []
    for f in sorted(site.rglob("*.so*")):
        if not f.is_file() or f.is_symlink():
            continue
        with open(f, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
        try:
            _, cs, info = fatbin_prune.plan(str(f))
        except ValueError as err:
            print(f"fatbin: {f.relative_to(site)}: left as is ({err})")
            continue
        if not cs or info["kept"] >= info["fatbin"]:
            continue
        orig = None
        if cuobjdump:
            orig = f.with_name(f.name + ".orig")
            shutil.copy2(f, orig)
        fatbin_prune.prune(str(f))
        row = {"lib": str(f.relative_to(site)), "fatbin": info["fatbin"], "kept": info["kept"],
               "containers": info["containers"]}
        if orig is not None:
            chk = fatbin_prune.check(str(orig), str(f), cuobjdump)
            orig.unlink()
            row.update(chk)
            if not chk["identical"]:
                raise SystemExit(f"fatbin: {row['lib']}: the sm_90 cubins changed; not shipping that")
        rows.append(row)
        print(f"fatbin: {row['lib']}: {row['fatbin'] / 2**20:.1f} -> {row['kept'] / 2**20:.1f} MiB "
              f"({row.get('sm90_cubins', '?')} sm_90 cubins identical: {row.get('identical', 'not checked')})")
    return rows


def strip_libs(site: Path, cuobjdump: str | None) -> dict[str, int]:
    """``strip --strip-unneeded`` every ELF shared object (debug info and the static symbol table: triton's
    libtriton.so carries 255 MiB of DWARF); dynamic symbols stay, so loading is unchanged. A library whose
    fat binaries were pruned is parsed again afterwards (containers and pointers intact)."""
    strip = shutil.which("strip")
    saved: dict[str, int] = {}
    if strip is None:
        print("strip: not found; libraries left unstripped")
        return saved
    for f in sorted(site.rglob("*.so*")):
        if not f.is_file() or f.is_symlink():
            continue
        with open(f, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
        before = f.stat().st_size
        tmp = f.with_name(f.name + ".strip-tmp")
        r = subprocess.run([strip, "--strip-unneeded", "-o", str(tmp), str(f)], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"strip: {f.relative_to(site)}: left as is ({r.stderr.strip()[:120]})")
            tmp.unlink(missing_ok=True)
            continue
        try:
            _, cs, _ = fatbin_prune.plan(str(tmp))
        except ValueError as err:
            print(f"strip: {f.relative_to(site)}: fat binaries unreadable after strip ({err}); left unstripped")
            tmp.unlink()
            continue
        os.chmod(tmp, f.stat().st_mode)
        os.replace(tmp, f)
        if before - f.stat().st_size > 2**20:
            saved[str(f.relative_to(site))] = before - f.stat().st_size
    print(f"strip: {sum(saved.values()) / 2**20:.1f} MiB saved")
    return saved


def find_cuobjdump(site: Path) -> str | None:
    for c in (shutil.which("cuobjdump"), str(site / "triton/backends/nvidia/bin/cuobjdump")):
        if c and os.path.exists(c):
            return c
    return None


# ----------------------------------------------------------------------------------------- pack
def pack(a, stage: Path, tarxz: Path) -> dict:
    t0 = time.time()
    wheels = download(Path(a.cache) / "wheels")
    print("requirements of the carried wheels (markers for Linux x86_64, CPython 3.12):")
    reqs = requirements_report(wheels)
    shutil.rmtree(stage, ignore_errors=True)
    site = stage / "site"
    site.mkdir(parents=True)
    wheel_bytes = {w.name.split("-")[0]: w.stat().st_size for w in wheels}
    unpacked = unpack(wheels, site)
    # keep a copy of cuobjdump outside the site before pruning removes triton's
    cuobj = find_cuobjdump(site)
    if cuobj and str(site) in cuobj:
        keep = stage / "cuobjdump"
        shutil.copy2(cuobj, keep)
        cuobj = str(keep)
    removed = prune_paths(site)
    extra_paths = pth_paths(site)
    print(f"PYTHONPATH extra (from .pth files): {extra_paths}")
    if a.stage_only == "paths":
        print(f"site (paths pruned, fat binaries not): {site}")
        return {}
    fat = [] if a.no_fatbin_prune else prune_fatbins(site, cuobj)
    stripped = strip_libs(site, cuobj)
    if a.stage_only == "site":
        print(f"site: {site}")
        return {}
    total = du(site)
    print(f"site: {total / 2**20:.1f} MiB unpacked after pruning")
    # per top-level entry, for the report
    per_top: dict[str, int] = {}
    for p in site.iterdir():
        per_top[p.name] = du(p)
    with open(tarxz, "wb") as out:
        tar = subprocess.Popen(["tar", "-C", str(stage), "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
                                "-cf", "-", "site"], stdout=subprocess.PIPE)
        subprocess.run(["xz", f"-T{os.cpu_count() or 1}", a.xz_level, "--block-size=64MiB", "-c"],
                       stdin=tar.stdout, stdout=out, check=True)
        if tar.wait() != 0:
            raise SystemExit("tar failed")
    info = {"vllm": VLLM_VERSION, "pins": all_pins(), "wheel_bytes": wheel_bytes, "unpacked_bytes": unpacked,
            "pruned_paths_bytes": removed, "fatbin": fat, "strip_saved_bytes": stripped, "site_bytes": total, "site_top_bytes": per_top,
            "pythonpath_extra": extra_paths, "xz_level": a.xz_level,
            "archive_bytes": tarxz.stat().st_size, "build_s": round(time.time() - t0, 1),
            "requirements": reqs}
    (stage / "BUILD.json").write_text(json.dumps(info, indent=1))
    return info


def split(a, tarxz: Path, stage: Path) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        if re.match(r"p\d\d-[0-9a-f]{12}$", f.name) or f.name in ("MANIFEST.txt", "BUILD.json"):
            f.unlink()
    chunk = int(a.part_mib * 2**20)
    whole = hashlib.sha256()
    lines = []
    with open(tarxz, "rb") as f:
        i = 0
        while True:
            b = f.read(chunk)
            if not b:
                break
            whole.update(b)
            h = hashlib.sha256(b).hexdigest()
            name = f"p{i:02d}-{h[:12]}"
            (out / name).write_bytes(b)
            lines.append(f"{h}  {name}  {len(b)}")
            i += 1
    size = tarxz.stat().st_size
    head = (f"# sdlib vLLM {VLLM_VERSION} stack for the H200 image: site.tar.xz {size} bytes sha256 "
            f"{whole.hexdigest()} parts {i} part-mib {a.part_mib}\n")
    (out / "MANIFEST.txt").write_text(head + "\n".join(lines) + "\n")
    if (stage / "BUILD.json").exists():
        shutil.copy2(stage / "BUILD.json", out / "BUILD.json")
    print((out / "MANIFEST.txt").read_text())
    print(f"{i} parts of <= {a.part_mib} MiB in {out} ({size / 2**20:.1f} MiB)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".gpu34")
    ap.add_argument("--cache", default="/tmp/sdlib-gpu34")
    ap.add_argument("--part-mib", type=float, default=36)
    ap.add_argument("--xz-level", default="-6",
                    help="xz preset: -6 packs within 2%% of -9e (docs/gpu_034.md), which took 52 min on 2 cores")
    ap.add_argument("--no-fatbin-prune", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="re-split CACHE/stage/site.tar.xz")
    ap.add_argument("--report-only", action="store_true", help="download and print the requirements report")
    ap.add_argument("--stage-only", choices=["paths", "site"],
                    help="stop after pruning paths / after the fat binaries too (no archive): for gpu/check_here.py")
    a = ap.parse_args(argv)
    if a.report_only:
        requirements_report(download(Path(a.cache) / "wheels"))
        return 0
    stage = Path(a.cache) / "stage"
    stage.mkdir(parents=True, exist_ok=True)
    tarxz = stage / "site.tar.xz"
    if not (a.reuse and tarxz.exists()):
        pack(a, stage, tarxz)
        if a.stage_only:
            return 0
    split(a, tarxz, stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
