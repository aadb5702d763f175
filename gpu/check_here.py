#!/usr/bin/env python3
"""Check the staged site HERE (no GPU): import every module an engine start (dense Llama, dummy weights, CUDA
graphs, FA3/Triton attention, every spec-decode method sdlib uses) and the OpenAI server import, under a copy of
the H200 image's Python packages, and fail on a package nobody carries.

What is imported, in a child Python that sees what the H200 sees (the site first on PYTHONPATH, as gpu/stage.sh
puts it there, plus the folders its .pth files would add, site/PYTHONPATH_EXTRA; then this checkout for sdlib):

1. CORE: the modules named below (the engine, the V2 runner and its warm-up, the quantisation registry, the model
   loader, the attention backends, the samplers, the speculators, the server, the carried packages themselves).
2. CALLS: the imports an engine start makes by name at run time: every quantisation method's config class
   (``get_quantization_config``, as a checkpoint with a quantization_config has them all imported), the
   FLASH_ATTN / TRITON_ATTN backend classes, the Llama / EAGLE / EAGLE-3 model classes from the model registry,
   the config and speculator classes of ngram, ngram_gpu, eagle, eagle3, draft_model and (after vLLM's plugin
   loader has run sdlib's entry point) sdlib_custom.
3. LAZY: every ``import`` written inside a function of every vLLM module that steps 1-2 loaded (read from its
   source with ast), imported in turn: the imports those functions make when an engine starts or a server
   builds its app (kernel_warmup's CuTe-DSL warm-ups, build_app's SageMaker bootstrap, ...). A module that is
   not on any run path is imported too: the check is a superset.

Fails (exit 1) when a module of steps 1-2 fails to import, or when step 3 meets a ModuleNotFoundError of a
package (or pruned vLLM module) that is not in ALLOWED_MISSING, each with the reason it is never reached on
these paths. It says which function imports what, so a new entry must be argued, not guessed. WALK then
imports every module of the engine's packages and lists what is missing there (information only).

The copy of the image is a Python 3.12 virtualenv with the image's versions where they are known
(gpu/image_packages.txt: torch 2.11.0+cu130 with its CUDA 13 libraries and cuda-bindings, cuDNN 9.19, NCCL
2.28.9, triton 3.6, transformers 5.17, huggingface_hub 1.33, tokenizers 0.23.2, numba 0.68, torchvision 0.26,
...) and no package the image lacks (pydantic is not there). With no driver here, a stub libcuda.so.1 (every
symbol the carried libraries import from the driver, returning CUDA_ERROR_NO_DEVICE) lets the extensions load,
and vLLM's platform is forced to CUDA at capability 9.0.

Usage:
    python3.12 -m venv /tmp/img && /tmp/img/bin/pip install torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 \\
        numpy==2.5.2 transformers==5.17.0 huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0 \\
        sentencepiece==0.2.2 tiktoken==0.14.0 numba==0.68.0 regex psutil requests tqdm py-cpuinfo protobuf \\
        aiohttp pillow prometheus-client pyyaml einops cloudpickle ninja opencv-python-headless jinja2 msgpack \\
        anyio httpx click rich typer uvloop && /tmp/img/bin/pip uninstall -y pydantic pydantic-core \\
        annotated-types typing-inspection          # not in the image (~5 GB, once; torch brings cuda-bindings)
    python3.12 gpu/build_stack.py --stage-only site   # the pruned site in /tmp/sdlib-gpu34/stage/site
    python3 gpu/check_here.py --python /tmp/img/bin/python --site /tmp/sdlib-gpu34/stage/site
    # or the site as the H200 gets it: unpack the parts with gpu/stage.sh, then --site /tmp/sdlib034/site
    python3 gpu/check_here.py --without compressed_tensors,cutlass ...   # what a build lacking them gets: FAILED
    # on the H200 after `source gpu/stage.sh .gpu34` (the image itself, the real driver; ~1 min):
    python3 gpu/check_here.py --on-gpu --python python3 --site /tmp/sdlib034/site
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CORE = """vllm.entrypoints.llm vllm.engine.arg_utils vllm.v1.engine.core vllm.v1.engine.core_client
vllm.v1.engine.llm_engine vllm.sampling_params vllm.plugins
vllm.v1.worker.gpu_worker vllm.v1.worker.gpu.model_runner vllm.v1.worker.gpu.warmup vllm.v1.worker.gpu.eplb_utils
vllm.v1.worker.gpu.cudagraph_utils vllm.v1.worker.gpu.sample.sampler vllm.v1.worker.gpu.structured_outputs
vllm.v1.worker.gpu.spec_decode vllm.v1.worker.gpu.spec_decode.speculator
vllm.v1.worker.gpu.spec_decode.speculator_config
vllm.v1.worker.gpu.spec_decode.rejection_sampler vllm.v1.worker.gpu.spec_decode.adaptive_verification
vllm.v1.worker.gpu.spec_decode.eagle.speculator vllm.v1.worker.gpu.spec_decode.ngram.speculator
vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator vllm.v1.worker.gpu.spec_decode.autoregressive.speculator
vllm.v1.spec_decode.metrics vllm.v1.spec_decode.dynamic vllm.v1.sample.ops.topk_topp_sampler
vllm.v1.attention.selector vllm.v1.attention.backends.registry vllm.v1.attention.backends.fa_utils
vllm.v1.attention.backends.flash_attn vllm.v1.attention.backends.triton_attn vllm.vllm_flash_attn
vllm.model_executor.models.llama vllm.model_executor.models.llama_eagle vllm.model_executor.models.llama_eagle3
vllm.model_executor.models.registry vllm.model_executor.layers.linear vllm.model_executor.layers.utils
vllm.model_executor.layers.quantization vllm.model_executor.layers.quantization.online.base
vllm.model_executor.model_loader vllm.model_executor.model_loader.dummy_loader
vllm.model_executor.model_loader.base_loader
vllm.model_executor.model_loader.default_loader vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm
vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm_plans vllm.model_executor.warmup.kernel_warmup
vllm.model_executor.warmup.minimax_m3_msa_warmup vllm.model_executor.warmup.step5_dsa_warmup
vllm.compilation.backends vllm.compilation.cuda_graph vllm.compilation.wrapper vllm.compilation.monitor
vllm.distributed.device_communicators.pynccl vllm._custom_ops vllm.v1.structured_output
vllm.v1.structured_output.backend_xgrammar vllm.v1.structured_output.backend_guidance
vllm.v1.executor.uniproc_executor vllm.v1.executor.multiproc_executor
vllm.entrypoints.openai.api_server vllm.entrypoints.launchers.app vllm.entrypoints.serve.sagemaker.api_router
compressed_tensors cutlass cutlass.cute quack cuda.bindings.driver depyf model_hosting_container_standards.sagemaker
uvicorn prometheus_fastapi_instrumentator sdlib.vllm.compat sdlib.vllm.plugin sdlib.vllm.speculator""".split()
WALK = """vllm.entrypoints vllm.v1.worker.gpu vllm.v1.engine vllm.v1.core vllm.v1.sample vllm.v1.spec_decode
vllm.v1.metrics vllm.compilation vllm.v1.executor vllm.model_executor.model_loader vllm.model_executor.layers
vllm.distributed vllm.v1.structured_output""".split()
LAZY_ROUNDS = 20  # until no round loads a new vLLM module (5 rounds for vLLM 0.34.0)
SPEC_METHODS = ["ngram", "ngram_gpu", "eagle", "eagle3", "draft_model", "sdlib_custom"]
MODEL_ARCHS = ["LlamaForCausalLM", "EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3"]

# Missing in step 3 and fine: module (a top-level package, or a vLLM module build_stack.py prunes) -> why no
# engine start or server of these paths imports it. A key covers its submodules. Three kinds: vLLM requirements
# that build_stack.py does not carry (its SKIP says why too), packages vLLM imports only for other platforms or
# features (not requirements: vLLM itself guards them), and pruned vLLM modules.
_QUANT = "kernels of one quantisation method or MoE expert backend (a dense bf16 checkpoint has no quantization_config)"
ALLOWED_MISSING = {
    # vLLM 0.34.0 requirements, not carried
    "flashinfer": "requirement, not carried (flashinfer-python 0.7.3 is not on the registry); imported only in "
                  "functions behind has_flashinfer() (find_spec), a FlashInfer attention/MoE/all-reduce backend or "
                  "VLLM_USE_FLASHINFER_SAMPLER (0 in gpu/stage.sh)",
    "fastsafetensors": "requirement, not carried: load_format=fastsafetensors only",
    "instanttensor": "requirement, not carried: load_format=instanttensor only",
    "mcp": "requirement, not carried: the MCP tool server (--tool-server) only",
    "nvtx": "requirement, not carried: VLLM_NVTX_SCOPES_FOR_PROFILING=1 only",
    "torchcodec": "requirement, not carried: video/audio decoding (multimodal) only",
    "PyNvVideoCodec": "requirement, not carried: video decoding (multimodal) only",
    "mistral_common": "requirement, not carried: Mistral tokenizers/parsers, Pixtral/Voxtral only",
    "ijson": "requirement, not carried: vllm.parser.mistral only (behind is_mistral_tokenizer)",
    "lmformatenforcer": "requirement, not carried: the lm-format-enforcer structured-output backend, only when a "
                        "request asks for it",
    "tokenspeed_mla": "requirement, not carried: MLA attention (Kimi-K3 / DeepSeek) only",
    "compressed_tensors.compressors.quantized_compressors": "a path compressed-tensors 0.17.0 does not have; the "
                        "zentorch (CPU) kernel tries it after the 0.17 path (try/except ImportError)",
    # not vLLM requirements: other platforms
    "aiter": "ROCm only", "amdsmi": "ROCm only", "flydsl": "ROCm only (FlyDSL kernels)",
    "libtpu": "TPU only", "tpu_inference": "TPU only", "vllm_xpu_kernels": "XPU only",
    "zentorch": "CPU (AMD Zen) only",
    # not vLLM requirements: other features
    "deep_ep": "expert-parallel all2all (MoE) only", "mori": "expert-parallel all2all (MoE, ROCm) only",
    "nixl_ep": "expert-parallel all2all (MoE) only", "moonep": "expert-parallel all2all (MoE) only",
    "ray": "distributed_executor_backend=ray only (the default is chosen behind find_spec('ray'))",
    "modelscope": "VLLM_USE_MODELSCOPE=1 only",
    "transformers_modules": "trust_remote_code dynamic modules (try/except ImportError)",
    "transformers.models.embedding_gemma2": "a newer transformers' model: multimodal video processor defaults only",
    "quark": _QUANT, "torchao": _QUANT, "fbgemm_gpu": _QUANT, "conch": _QUANT, "triton_kernels": _QUANT,
    "b12x": _QUANT, "hpc": _QUANT, "auto_round_kernel": _QUANT,
    "runai_model_streamer": "load_format=runai_streamer only",
    "gpt_oss": "the tool server's gpt-oss built-in tools only",
    "xielu": "the xIELU activation (Apertus models) only, under try/except",
    "cohere": "VLLM_ENABLE_COHERE_API=1 only (then under try/except)",
    "fastokens": "VLLM_USE_FASTOKENS=1 only",
    # vLLM modules build_stack.py prunes (PRUNE), or that the 0.34.0 wheel does not have
    "vllm._C": "not in the 0.34.0 wheel: only the base Platform.import_kernels tries it (try/except); "
               "CudaPlatform.import_kernels loads vllm._C_stable_libtorch (carried)",
    "vllm._moe_C_stable_libtorch": "pruned (MoE kernels); CudaPlatform.import_kernels imports it under "
                                   "contextlib.suppress(ImportError)",
    "vllm.vllm_flash_attn.cute": "pruned (FA4): imported only with fa_version 4 (Blackwell; Hopper gets FA3, "
                                 "fa_utils.get_flash_attn_version), for RSWA mask mods and DeepSeek-V4 kernels",
    "vllm.third_party.fmha_sm100": "pruned (Blackwell attention): minimax_m3_msa_warmup imports it only after finding "
                                   "a MiniMax-M3 sparse-attention module on an SM100 GPU; MiniMax-M3 kernels",
    "vllm._deepselect_C": "pruned: DeepSeek/Kimi sparse-attention top-k only",
    "vllm._flashkda_C": "pruned: Kimi-K3 KDA prefill only",
}

CHILD = r'''
import ast, collections, importlib, importlib.util, json, pkgutil, sys, time, traceback
arg = json.loads(sys.argv[1])


class Without:  # --without: these packages behave as absent (how a build that lacks them would look)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in arg["without"]:
            raise ModuleNotFoundError(f"No module named {name!r} (check_here --without)", name=name)
        return None


sys.meta_path.insert(0, Without())
import torch
if not arg["on_gpu"]:  # no driver here: the H200's platform and capability
    import vllm.platforms as P
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    P._current_platform = CudaPlatform()
    CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(9, 0))
    CudaPlatform.get_device_name = classmethod(lambda cls, device_id=0: "NVIDIA H200")
    torch.cuda.get_device_capability = lambda d=None: (9, 0)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
out = {"versions": {}, "core": {}, "calls": {}, "lazy": {"statements": 0, "targets": 0, "ok": 0,
       "missing": collections.defaultdict(list), "other": collections.defaultdict(list)},
       "walk": {"ok": 0, "other": 0, "missing": collections.defaultdict(list)}}
for m in ("torch", "triton", "vllm", "transformers", "numpy", "pydantic", "compressed_tensors", "cutlass", "quack",
          "model_hosting_container_standards", "sdlib"):
    try:
        mod = importlib.import_module(m)
        out["versions"][m] = [getattr(mod, "__version__", None), getattr(mod, "__file__", None)]
    except BaseException as e:
        out["versions"][m] = [f"{type(e).__name__}: {e}"[:200], None]


def err(e):
    return f"{type(e).__name__}: {e}"[:400]


for m in arg["core"]:
    try:
        importlib.import_module(m); out["core"][m] = "ok"
    except BaseException as e:
        out["core"][m] = err(e)


def call(name, fn):
    try:
        r = fn(); out["calls"][name] = "ok" if r is None else f"ok: {r}"[:200]
    except BaseException as e:
        out["calls"][name] = err(e)


from vllm.model_executor.layers import quantization as Q
for q in Q.QUANTIZATION_METHODS:
    call(f"get_quantization_config({q})", lambda q=q: Q.get_quantization_config(q).__name__)
from vllm.v1.attention.backends.registry import AttentionBackendEnum as A
for b in ("FLASH_ATTN", "TRITON_ATTN"):
    call(f"attention backend {b}", lambda b=b: getattr(A, b).get_class().__name__)
from vllm.model_executor.models.registry import ModelRegistry as R
for a in arg["archs"]:
    call(f"model {a}", lambda a=a: R.models[a].load_model_cls().__name__)
from importlib import metadata
from vllm.plugins import load_general_plugins
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.worker.gpu.spec_decode import speculator_config as SC
eps = sorted(f"{e.name}={e.value}" for e in metadata.entry_points(group="vllm.general_plugins"))
call("vllm general plugins", lambda: (load_general_plugins(), f"entry points {[e.split('=')[0] for e in eps]}")[1])
if "sdlib_custom" not in SC.registered_speculative_methods():
    if any(e.startswith("sdlib=") for e in eps):
        out["calls"]["sdlib entry point registers sdlib_custom"] = "FAILED: the entry point ran, sdlib_custom absent"
    else:  # a --stage-only site: gpu/stage.sh writes the entry point when it unpacks the parts
        import sdlib.vllm.plugin
        call("sdlib.vllm.plugin.register() (no sdlib entry point in this site: gpu/stage.sh writes it)",
             lambda: None if sdlib.vllm.plugin.register() else 1 / 0)


def spec(meth):
    cfg = (resolve_obj_by_qualname(SC._CONFIG_BY_METHOD[meth]) if meth in SC._CONFIG_BY_METHOD
           else SC.get_custom_speculator_config_class(meth))
    if isinstance(cfg, str):
        cfg = resolve_obj_by_qualname(cfg)
    return f"{cfg.__name__} -> {resolve_obj_by_qualname(cfg.speculator_class).__name__}"


for meth in arg["spec_methods"]:
    call(f"speculative method {meth}", lambda meth=meth: spec(meth))

# step 3: the imports written inside functions of every vLLM module loaded so far
def in_functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    yield node.name, sub


def function_imports(names):
    """(module, imported names) -> {"importer:line (function)"} for the imports inside functions of `names`"""
    targets = collections.defaultdict(set)
    for n in names:
        mod = sys.modules[n]
        try:
            tree = ast.parse(open(mod.__file__, encoding="utf-8").read())
        except Exception:
            continue
        pkg = n if mod.__file__.endswith("__init__.py") else n.rpartition(".")[0]
        for fn, st in in_functions(tree):
            out["lazy"]["statements"] += 1
            where = f"{n}:{st.lineno} ({fn})"
            if isinstance(st, ast.Import):
                for a in st.names:
                    targets[(a.name, ())].add(where)
            else:
                try:
                    base = (importlib.util.resolve_name("." * st.level + (st.module or ""), pkg) if st.level
                            else st.module)
                except Exception:
                    continue
                targets[(base, tuple(a.name for a in st.names if a.name != "*"))].add(where)
    return targets


def vllm_modules():
    return {n for n, m in list(sys.modules.items())
            if n.startswith("vllm") and (getattr(m, "__file__", None) or "").endswith(".py")}


out["lazy"]["path_modules"] = len(vllm_modules())
out["lazy"]["rounds"] = []
swept, seen_t = set(), set()
for rnd in range(1, arg["rounds"] + 1):
    todo = sorted(vllm_modules() - swept)
    if not todo:
        break
    swept |= set(todo)
    tried = 0
    for (base, names), wheres in sorted(function_imports(todo).items()):
        for t in [base] + [f"{base}.{x}" for x in names]:
            if t in seen_t:
                continue
            seen_t.add(t)
            miss = lambda e: out["lazy"]["missing"][e.name or "?"].append([t, sorted(wheres)[:3], len(wheres), rnd])
            if t != base:  # `from base import x`: x is a submodule only if base is a package that has no x yet
                parent = sys.modules.get(base)
                if parent is None or not hasattr(parent, "__path__"):
                    continue  # base failed (counted there) or is a module: x is a name
                try:
                    if hasattr(parent, t.rpartition(".")[2]) or importlib.util.find_spec(t) is None:
                        continue  # a name
                except ModuleNotFoundError as e:  # a module __getattr__ that imports (vllm.utils.humming)
                    miss(e)
                    continue
                except BaseException:
                    continue
            out["lazy"]["targets"] += 1
            tried += 1
            try:
                importlib.import_module(t); out["lazy"]["ok"] += 1
            except ModuleNotFoundError as e:
                miss(e)
            except BaseException as e:
                out["lazy"]["other"][err(e)[:160]].append([t, sorted(wheres)[:2], rnd])
    out["lazy"]["rounds"].append([len(todo), tried])
for root in arg["walk"]:
    try:
        pkg = importlib.import_module(root)
    except BaseException:
        out["walk"]["other"] += 1; continue
    names = [root] + [x.name for x in pkgutil.walk_packages(pkg.__path__, root + ".", onerror=lambda n: None)]
    for n in names:
        try:
            importlib.import_module(n); out["walk"]["ok"] += 1
        except ModuleNotFoundError as e:
            out["walk"]["missing"][e.name or "?"].append(n)
        except BaseException:
            out["walk"]["other"] += 1
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


def site_pythonpath(site: Path) -> list[str]:
    """The site, then the folders its .pth files would add (site/PYTHONPATH_EXTRA, written by build_stack.py)."""
    extra = site / "PYTHONPATH_EXTRA"
    rels = [x.strip() for x in extra.read_text().splitlines() if x.strip()] if extra.exists() else []
    return [str(site)] + [str(site / r) for r in rels]


def allowed(name: str) -> str | None:
    """The reason a missing module is fine, or None (the longest ALLOWED_MISSING key that is it or a parent)."""
    keys = [k for k in ALLOWED_MISSING if name == k or name.startswith(k + ".")]
    return ALLOWED_MISSING[max(keys, key=len)] if keys else None


def report(r: dict) -> int:
    for m, (v, f) in r["versions"].items():
        print(f"{m:<34} {str(v):<16} {f}")
    bad = {m: e for m, e in r["core"].items() if e != "ok" and "NVIDIA driver" not in e}
    print(f"core modules: {len(r['core']) - len(bad)}/{len(r['core'])} import" + ("" if not bad else ""))
    for m, e in bad.items():
        print(f"  CORE FAILED {m}: {e}")
    badc = {c: e for c, e in r["calls"].items() if not e.startswith("ok")}
    print(f"calls: {len(r['calls']) - len(badc)}/{len(r['calls'])} resolve")
    for c, e in r["calls"].items():
        if c.startswith(("attention", "model", "speculative", "vllm general", "sdlib")) or c in badc:
            print(f"  {'FAILED ' if c in badc else ''}{c}: {e}")
    lz = r["lazy"]
    print(f"lazy: {lz['statements']} import statements in functions of the vLLM modules loaded ({lz['path_modules']} "
          f"by core + calls, then by each round: {[r[0] for r in lz['rounds']]}); {lz['targets']} modules "
          f"imported, {lz['ok']} ok")
    unexplained = {}
    for name, rows in sorted(lz["missing"].items(), key=lambda kv: (min(x[3] for x in kv[1]), kv[0])):
        why = allowed(name)
        n = sum(x[2] for x in rows)
        tag = "allowed" if why else "MISSING"
        print(f"  {tag} {name:<36} round {min(x[3] for x in rows)}, {n:>3} statements, e.g. {rows[0][1][0]} "
              f"imports {rows[0][0]}")
        if why:
            print(f"      why: {why}")
        else:
            unexplained[name] = rows
            for t, w, _, rnd in sorted(rows, key=lambda x: (x[3], x[0]))[:8]:
                print(f"      round {rnd}: {t} <- {w}")
    for e, rows in sorted(lz["other"].items()):
        print(f"  other error ({len(rows)}, not a missing module): {' '.join(e.split())[:110]} e.g. {rows[0][0]} "
              f"<- {rows[0][1][0]}")
    w = r["walk"]
    print(f"walk (information): {w['ok']} modules import, {w['other']} fail for other reasons (no GPU, ROCm ...)")
    for name, mods in sorted(w["missing"].items()):
        print(f"  missing {name:<34} in {len(mods):>3} modules, e.g. {mods[:2]}")
    failed = bool(bad or badc or unexplained)
    print("check_here: " + ("FAILED: " + "; ".join(
        ([f"{len(bad)} core modules"] if bad else []) + ([f"{len(badc)} calls"] if badc else [])
        + ([f"missing on the engine/server path: {sorted(unexplained)}"] if unexplained else []))
        if failed else "ok (every core module and call imports; nothing unexplained is missing)"))
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="the image copy's python (a 3.12 virtualenv)")
    ap.add_argument("--site", default="/tmp/sdlib-gpu34/stage/site")
    ap.add_argument("--json", help="also write the child's full result here")
    ap.add_argument("--on-gpu", action="store_true",
                    help="on a GPU machine (the H200 after gpu/stage.sh): the real driver, no stub, no platform mock")
    ap.add_argument("--without", help="comma-separated top-level packages to treat as absent (shows what the check "
                    "says about a build that lacks them, e.g. --without compressed_tensors,cutlass)")
    ap.add_argument("--rounds", type=int, default=LAZY_ROUNDS,
                    help="step 3 repeated on the modules the previous round loaded (default %(default)s)")
    a = ap.parse_args(argv)
    site = Path(a.site)
    if not (site / "vllm").is_dir():
        print(f"check_here: {site} has no vllm/: not a staged site", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site_pythonpath(site) + [str(ROOT)]),
               VLLM_USE_FLASHINFER_SAMPLER="0", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONDONTWRITEBYTECODE="1")
    if not a.on_gpu:
        env["LD_LIBRARY_PATH"] = str(libcuda_stub(site, Path(tempfile.mkdtemp(prefix="cudastub-"))))
    arg = {"on_gpu": a.on_gpu, "core": CORE, "walk": WALK, "archs": MODEL_ARCHS, "spec_methods": SPEC_METHODS, "rounds": a.rounds,
           "without": a.without.split(",") if a.without else []}
    p = subprocess.run([a.python, "-c", CHILD, json.dumps(arg)], capture_output=True, text=True, env=env,
                       timeout=3600, cwd=str(ROOT))
    line = next((x for x in p.stdout.splitlines() if x.startswith("CHECK ")), None)
    if line is None:
        print(p.stdout[-3000:], p.stderr[-3000:])
        return 1
    r = json.loads(line[6:])
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return report(r)


if __name__ == "__main__":
    sys.exit(main())
