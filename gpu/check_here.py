#!/usr/bin/env python3
"""Check the staged site HERE (no GPU): import every module a dense Llama + spec decode + the OpenAI server
needs, under a copy of the H200 image's Python packages, and list the modules nobody carries.

The copy of the image is a Python 3.12 virtualenv with the image's versions where they are known
(gpu/image_packages.txt: torch 2.11.0+cu130 with its CUDA 13 libraries, cuDNN 9.19, NCCL 2.28.9, triton 3.6,
transformers 5.17, huggingface_hub 1.33, tokenizers 0.23.2, numba 0.68, torchvision 0.26, ...) and no package
the image lacks (pydantic is not there). The site goes first on PYTHONPATH, as gpu/stage.sh puts it on the
device, so a carried package shadows the image's and a package the site lacks comes from the image. With no
driver here, a stub libcuda.so.1 (every symbol the carried libraries import from the driver, returning
CUDA_ERROR_NO_DEVICE) lets the extensions load, and vLLM's platform is forced to CUDA at capability 9.0.

Usage:
    python3.12 -m venv /tmp/img && /tmp/img/bin/pip install torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 \\
        numpy==2.5.2 transformers==5.17.0 huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0 \\
        sentencepiece==0.2.2 tiktoken==0.14.0 numba==0.68.0 regex psutil requests tqdm py-cpuinfo protobuf \\
        aiohttp pillow prometheus-client pyyaml einops cloudpickle ninja opencv-python-headless jinja2 msgpack \\
        anyio httpx click rich typer uvloop && /tmp/img/bin/pip uninstall -y pydantic pydantic-core \\
        annotated-types typing-inspection          # not in the image (~4 GB, once)
    python3.12 gpu/build_stack.py --stage-only site   # the pruned site in /tmp/sdlib-gpu34/stage/site
    python3 gpu/check_here.py --python /tmp/img/bin/python --site /tmp/sdlib-gpu34/stage/site
Exit 1 when a module of the dense-Llama path (CORE) is missing something; other gaps are listed (expected:
MoE, quantisation, multimodal, ROCm, Ray, KV connectors).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CORE = """vllm.entrypoints.llm vllm.engine.arg_utils vllm.v1.engine.core vllm.v1.engine.llm_engine vllm.sampling_params
vllm.v1.worker.gpu_worker vllm.v1.worker.gpu.model_runner vllm.v1.attention.backends.flash_attn
vllm.v1.attention.backends.triton_attn vllm.vllm_flash_attn vllm.model_executor.models.llama
vllm.model_executor.models.llama_eagle vllm.model_executor.models.llama_eagle3 vllm.v1.spec_decode.metrics
vllm.compilation.backends vllm.compilation.cuda_graph vllm.model_executor.model_loader.dummy_loader
vllm.distributed.device_communicators.pynccl vllm._custom_ops vllm.entrypoints.openai.api_server
vllm.v1.executor.uniproc_executor vllm.v1.executor.multiproc_executor
vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm_plans vllm.model_executor.warmup.kernel_warmup
uvicorn prometheus_fastapi_instrumentator""".split()
WALK = """vllm.entrypoints vllm.v1.worker.gpu vllm.v1.engine vllm.v1.core vllm.v1.sample vllm.v1.spec_decode
vllm.v1.metrics vllm.compilation vllm.v1.executor vllm.model_executor.model_loader vllm.model_executor.layers
vllm.distributed vllm.v1.structured_output""".split()

CHILD = r'''
import importlib, pkgutil, sys, collections, json
import torch
import vllm.platforms as P
from vllm.platforms.cuda import CudaPlatform
from vllm.platforms.interface import DeviceCapability
P._current_platform = CudaPlatform()
CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(9, 0))
CudaPlatform.get_device_name = classmethod(lambda cls, device_id=0: "NVIDIA H200")
torch.cuda.get_device_capability = lambda d=None: (9, 0)
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
core, walk = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"versions": {}, "core": {}, "missing": collections.defaultdict(list), "other": 0, "ok": 0}
for m in ("torch", "triton", "vllm", "transformers", "numpy", "pydantic"):
    mod = importlib.import_module(m)
    out["versions"][m] = [getattr(mod, "__version__", None), mod.__file__]
for m in core:
    try:
        importlib.import_module(m); out["core"][m] = "ok"
    except BaseException as e:
        out["core"][m] = f"{type(e).__name__}: {e}"[:300]
for root in walk:
    pkg = importlib.import_module(root)
    names = [root] + [x.name for x in pkgutil.walk_packages(pkg.__path__, root + ".")]
    for n in names:
        try:
            importlib.import_module(n); out["ok"] += 1
        except ModuleNotFoundError as e:
            out["missing"][e.name].append(n)
        except BaseException:
            out["other"] += 1
print("CHECK " + json.dumps(out))
'''


def libcuda_stub(site: Path, d: Path) -> Path:
    """A libcuda.so.1 exporting every ``cu*`` symbol the site's libraries import (each returns 100)."""
    syms = set()
    for f in site.rglob("*.so*"):
        if f.is_file() and not f.is_symlink():
            r = subprocess.run(["nm", "-D", "--undefined-only", str(f)], capture_output=True, text=True)
            syms |= {ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if ln.split()[-1].startswith("cu")}
    src = d / "stub.c"
    src.write_text("\n".join(f"int {s}(){{return 100;}}" for s in sorted(syms)) + "\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), str(src), "-Wl,-soname,libcuda.so.1"],
                   check=True)
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="the image copy's python (a 3.12 virtualenv)")
    ap.add_argument("--site", default="/tmp/sdlib-gpu34/stage/site")
    a = ap.parse_args(argv)
    import json

    site = Path(a.site)
    stub = libcuda_stub(site, Path(tempfile.mkdtemp(prefix="cudastub-")))
    env = dict(os.environ, PYTHONPATH=str(site), LD_LIBRARY_PATH=str(stub), VLLM_USE_FLASHINFER_SAMPLER="0")
    p = subprocess.run([a.python, "-c", CHILD, json.dumps(CORE), json.dumps(WALK)], capture_output=True, text=True,
                       env=env, timeout=1800)
    line = next((x for x in p.stdout.splitlines() if x.startswith("CHECK ")), None)
    if line is None:
        print(p.stdout[-3000:], p.stderr[-3000:])
        return 1
    r = json.loads(line[6:])
    for m, (v, f) in r["versions"].items():
        print(f"{m:<13} {v:<16} {f}")
    bad = {m: e for m, e in r["core"].items() if e != "ok" and "NVIDIA driver" not in e}
    print(f"core modules: {len(r['core']) - len(bad)}/{len(r['core'])} import" + ("" if not bad else f"; FAILED: {bad}"))
    print(f"walk: {r['ok']} modules import, {r['other']} fail for other reasons (no GPU, ROCm, Ray ...)")
    for name, mods in sorted(r["missing"].items()):
        print(f"  missing {name:<22} in {len(mods):>3} modules, e.g. {mods[:2]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
