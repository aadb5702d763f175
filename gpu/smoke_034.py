#!/usr/bin/env python3
"""First call on the H200 after staging vLLM 0.34: does the stack load, and does every sdlib path run on it?

Prints one ``RESULT {json}`` line per check and writes them all to ``$OUT/smoke_034.json`` (rewritten after
each check, so a timeout keeps what finished). Checks, in priority order (a global deadline skips the rest):

  env       python, sys.path order, versions and file locations of torch / triton / vllm / transformers /
            numpy / huggingface_hub / tokenizers / numba / pydantic / typing_extensions / setuptools (a stale
            image copy shadowing a carried one shows here), CUDA device, NCCL, cuDNN (expected: the image's
            9.19 under torch 2.14's 9.24 check; vLLM never calls it)
  kernels   device code from every fat-binary-pruned library runs on sm_90: elementwise/softmax/layer norm
            (libtorch_cuda), bf16 matmul, a torch.compile'd function (Inductor -> Triton 3.8 -> ptxas), CUDA
            graph capture/replay, vllm._C (RMS norm), FA3 (varlen), a one-rank NCCL all-reduce
  imports   gpu/check_here.py's CORE (the engine, V2 runner and its kernel warm-up, quantisation registry, model
            loader, FA3/Triton attention, the speculators, api_server and build_app's SageMaker bootstrap, the
            CuTe DSL, compressed-tensors) + uvloop; the whole check (run-time and function-level imports too):
            python3 gpu/check_here.py --on-gpu --python python3 --site /tmp/sdlib034/site
  engines   Llama-3.1-8B shape, dummy weights, no tokenizer, bf16, FA3, CUDA graphs on (capture sizes
            1..16), each in this process one after another under its own time limit:
            none | ngram k=3 | eagle3 k=3 synthetic L=2.5 | sdlib custom proposer (sdlib_custom) with the
            replay hooks and a pinned target | eagle3 + enable_adaptive_verification | Dynamic SD
            (num_speculative_tokens_per_batch_size) | phase timers (in-process engine, eagle3) | ragged drafts
            on 0.34: sdlib's custom proposer drafting 2 of K = 3 (padding at confidence 0) under adaptive
            verification, pinned target

Usage (on the H200, after `source gpu/stage.sh`; ~6 min):
    python3 gpu/smoke_034.py 2>&1 | tee $OUT/smoke_034.log
    python3 gpu/smoke_034.py --only env,kernels,imports          # no engines (~1 min)
    python3 gpu/smoke_034.py --only none,eagle3 --deadline 200
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT") or "build/smoke_034")
RESULTS: list[dict] = []
T0 = time.time()

ENGINE_CHECKS = ["none", "eagle3", "ngram", "custom_replay", "dynamic_sd", "adaptive", "phase_timers",
                 "custom_adaptive"]
ALL = ["env", "kernels", "imports", *ENGINE_CHECKS]


def emit(name: str, ok: bool, **kw) -> dict:
    r = {"check": name, "ok": bool(ok), "t_s": round(time.time() - T0, 1), **kw}
    RESULTS.append(r)
    print("RESULT " + json.dumps(r, default=str), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "smoke_034.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    return r


class Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    def handler(signum, frame):
        raise Timeout(f"over {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------------ env
def check_env() -> None:
    from importlib import metadata

    site = os.environ.get("SDLIB_GPU_STACK", "").split(" ")[-1] or "/tmp/sdlib034/site"
    info: dict = {"python": sys.version.split()[0], "sys_path_head": sys.path[:4], "site": site}
    problems = []
    for mod, dist in [("torch", "torch"), ("triton", "triton"), ("vllm", "vllm"), ("transformers", "transformers"),
                      ("numpy", "numpy"), ("huggingface_hub", "huggingface-hub"), ("tokenizers", "tokenizers"),
                      ("numba", "numba"), ("pydantic", "pydantic"), ("typing_extensions", "typing-extensions"),
                      ("setuptools", "setuptools"), ("torchvision", "torchvision"), ("safetensors", "safetensors"),
                      ("xgrammar", "xgrammar"), ("msgspec", "msgspec"), ("zmq", "pyzmq"), ("uvicorn", "uvicorn"),
                      ("uvloop", "uvloop"), ("fastapi", "fastapi"), ("openai", "openai"),
                      ("compressed_tensors", "compressed-tensors"), ("cutlass", "nvidia-cutlass-dsl"),
                      ("quack", "quack-kernels"), ("model_hosting_container_standards",
                                                   "model-hosting-container-standards")]:
        row = {}
        try:
            row["dist"] = metadata.version(dist)
        except Exception as e:  # noqa: BLE001
            row["dist"] = f"no metadata: {type(e).__name__}"
        try:
            m = importlib.import_module(mod)
            row["version"] = getattr(m, "__version__", None)
            row["file"] = getattr(m, "__file__", None)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        info[mod] = row
        carried = mod in ("torch", "triton", "vllm", "torchvision", "pydantic", "xgrammar", "msgspec", "zmq",
                          "uvicorn", "fastapi", "openai", "compressed_tensors", "cutlass", "quack",
                          "model_hosting_container_standards")
        if carried and row.get("file") and not str(row["file"]).startswith(site):
            problems.append(f"{mod} imported from {row['file']}, not from the carried site {site}")
        if "error" in row and mod not in ("setuptools",):
            problems.append(f"{mod}: {row['error']}")
    import torch

    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        problems.append("CUDA not available")
    try:
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception as e:  # noqa: BLE001
        info["cudnn"] = f"{type(e).__name__}: {str(e)[:200]} (expected with the image's cuDNN 9.19; unused)"
    info["env"] = {k: os.environ.get(k) for k in ("VLLM_USE_FLASHINFER_SAMPLER", "NCCL_NVLS_ENABLE",
                                                   "HF_HUB_OFFLINE", "PYTHONPATH")}
    emit("env", not problems, problems=problems, **info)


# ------------------------------------------------------------------------------------------------ kernels
def check_kernels() -> None:
    import torch

    res, problems = {}, []

    def run(name, fn):
        t = time.time()
        try:
            res[name] = {"ok": True, "value": fn(), "s": round(time.time() - t, 2)}
        except Exception as e:  # noqa: BLE001
            res[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
            problems.append(name)

    dev = "cuda"
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def elementwise():
        y = torch.softmax(x.float(), -1).sum().item()
        z = torch.nn.functional.layer_norm(x, (4096,)).float().abs().mean().item()
        return [round(y, 1), round(z, 3), torch.cumsum(x[0].float(), 0)[-1].item() != 0]

    def matmul():
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            a @ a
        torch.cuda.synchronize()
        t = time.time()
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        return round(10 * 2 * 8192 ** 3 / (time.time() - t) / 1e12, 1)  # TFLOP/s

    def compiled():
        f = torch.compile(lambda t: torch.nn.functional.silu(t) * t + 1.0)
        return float((f(x) - (torch.nn.functional.silu(x) * x + 1.0)).abs().max().item())

    def graph():
        s = torch.zeros(1024, device=dev)
        g = torch.cuda.CUDAGraph()
        static = torch.ones(1024, device=dev)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            s.copy_(static * 2)
        g.replay()
        torch.cuda.synchronize()
        return float(s.sum().item())

    def vllm_c():
        from vllm import _custom_ops as ops

        inp = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
        w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(inp)
        ops.rms_norm(out, inp, w, 1e-5)
        ref = inp.float() * torch.rsqrt(inp.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return float((out.float() - ref).abs().max().item())

    def fa3():
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        q = torch.randn(64, 32, 128, device=dev, dtype=torch.bfloat16)
        k = torch.randn(64, 8, 128, device=dev, dtype=torch.bfloat16)
        cu = torch.tensor([0, 32, 64], device=dev, dtype=torch.int32)
        o = flash_attn_varlen_func(q, k, k, max_seqlen_q=32, cu_seqlens_q=cu, max_seqlen_k=32, cu_seqlens_k=cu,
                                   causal=True, fa_version=3)
        o = o[0] if isinstance(o, tuple) else o
        return list(o.shape)

    def nccl():
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
        t = torch.ones(1024, device=dev)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        v = float(t.sum().item())
        dist.destroy_process_group()
        return v

    for name, fn in [("elementwise_libtorch_cuda", elementwise), ("bf16_matmul_tflops", matmul),
                     ("torch_compile_triton", compiled), ("cuda_graph", graph), ("vllm_C_rms_norm", vllm_c),
                     ("fa3_varlen", fa3), ("nccl_all_reduce", nccl)]:
        run(name, fn)
    emit("kernels", not problems, failed=problems, **res)


# ------------------------------------------------------------------------------------------------ imports
sys.path.insert(0, str(ROOT / "gpu"))
from check_here import CORE  # noqa: E402  (the engine/server path's modules, defined once: gpu/check_here.py)

IMPORTS = [*CORE, "uvloop"]


def check_imports() -> None:
    bad = {}
    for m in IMPORTS:
        try:
            importlib.import_module(m)
        except BaseException as e:  # noqa: BLE001
            bad[m] = f"{type(e).__name__}: {e}"[:300]
    from importlib import metadata

    plugins = [f"{ep.name}={ep.value}" for ep in metadata.entry_points(group="vllm.general_plugins")]
    from vllm.v1.attention.backends import fa_utils

    try:
        fa = fa_utils.get_flash_attn_version()
    except Exception as e:  # noqa: BLE001
        fa = f"{type(e).__name__}: {e}"
    emit("imports", not bad and any(p.startswith("sdlib=") for p in plugins), failed=bad, plugins=plugins,
         flash_attn_version=fa, n=len(IMPORTS))


# ------------------------------------------------------------------------------------------------ engines
def model_dirs() -> dict[str, str]:
    from sdlib.models.shapes import write_shape

    return {n: str(write_shape(n)) for n in ("llama-3.1-8b", "eagle3-llama-3.1-8b")}


def base_kwargs(paths: dict, max_num_seqs: int = 16) -> dict:
    return dict(model=paths["llama-3.1-8b"], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                max_model_len=2048, max_num_seqs=max_num_seqs, gpu_memory_utilization=0.40, seed=0,
                disable_log_stats=False, enable_prefix_caching=False,
                compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]})


def prompts(n: int, length: int = 128, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1000, 120000) for _ in range(length)] for _ in range(n)]


def generate(llm, n: int, max_tokens: int = 64) -> dict:
    from vllm import SamplingParams

    from sdlib.vllm import compat as vc

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    ps = [vc.token_prompt(p) for p in prompts(n, seed=n)]
    llm.generate(ps[:1], sp, use_tqdm=False)  # warm-up (Triton JIT)
    before = vc.read_spec_counters(llm)
    t = time.time()
    outs = llm.generate(ps, sp, use_tqdm=False)
    dt = time.time() - t
    c = vc.diff_counters(vc.read_spec_counters(llm), before)
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    det = vc.request_spec_metrics(outs[0].outputs[0])
    mean_acc = (1 + c["num_accepted_tokens"] / c["num_drafts"]) if c["num_drafts"] else None
    return {"bs": n, "tok_s": round(toks / dt, 1), "counters": c,
            "mean_acceptance_length": round(mean_acc, 3) if mean_acc else None,
            "draft_tokens_per_draft": round(c["num_draft_tokens"] / c["num_drafts"], 3) if c["num_drafts"] else None,
            "detailed_first_steps": None if det is None else {"drafted": det[0][:12], "accepted": det[1][:12]}}


def delta_steps(llm, max_tokens: int = 48) -> list[int]:
    """Tokens gained per engine step by one request driven through llm_engine (DELTA outputs)."""
    from sdlib.vllm import compat as vc

    eng = llm.llm_engine
    eng.add_request("delta-0", vc.token_prompt(prompts(1, seed=99)[0]), vc.delta_sampling_params(max_tokens, 0.0, 0, True))
    steps = []
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.request_id.startswith("delta-0") and o.outputs and o.outputs[0].token_ids:
                steps.append(len(o.outputs[0].token_ids))
    return steps


def close(llm) -> None:
    from sdlib.vllm.engine import close_engine

    if llm is not None:
        close_engine(llm)
    reap()


def reap() -> None:
    """End this script's leftover child processes (an engine core left by a failed or timed-out start) and wait
    until the GPU's memory is back, so that the next engine can size its KV cache."""
    import gc

    import psutil
    import torch

    gc.collect()
    for c in psutil.Process().children(recursive=True):
        with contextlib.suppress(Exception):
            c.kill()
    torch.cuda.empty_cache()
    for _ in range(40):
        free, total = torch.cuda.mem_get_info()
        if free > 0.85 * total:
            break
        time.sleep(0.5)


def run_engine(name: str, kw: dict, bss=(1, 8), extra=None) -> None:
    from vllm import LLM

    t = time.time()
    llm = None
    try:
        llm = LLM(**kw)
        start_s = round(time.time() - t, 1)
        runs = [generate(llm, b) for b in bss]
        more = extra(llm) if extra else {}
        ok = all(r["tok_s"] > 0 for r in runs) and more.pop("ok", True)
        emit(name, ok, engine_start_s=start_s, runs=runs, speculative_config=kw.get("speculative_config"), **more)
    finally:
        close(llm)


def engine_checks(which: list[str], deadline: float, per_engine: float) -> None:
    from sdlib.vllm import compat as vc

    paths = model_dirs()
    eagle = paths["eagle3-llama-3.1-8b"]
    synth = {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}

    def c_none():
        run_engine("none", base_kwargs(paths))

    def c_eagle3():
        kw = base_kwargs(paths)
        kw["speculative_config"] = {"method": "eagle3", "model": eagle, "num_speculative_tokens": 3, **synth}
        kw["per_request_spec_decode_metrics"] = "detailed"
        run_engine("eagle3", kw, extra=lambda llm: {"delta_steps": delta_steps(llm)[:24]})

    def c_ngram():
        kw = base_kwargs(paths)
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                    "prompt_lookup_max": 4}
        kw["per_request_spec_decode_metrics"] = "detailed"
        run_engine("ngram", kw, extra=lambda llm: {"delta_steps": delta_steps(llm)[:24]})

    def c_custom_replay():
        # sdlib's custom proposer through the registered method, the target pinned (greedy token always 0) and
        # the replay hooks overwriting drafts: a = 2 of K = 3 accepted at every position -> per_pos [N, N, 0]
        import numpy as np

        from sdlib.vllm import replay as vr

        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        kw = base_kwargs(paths)
        spec = vc.speculative_config({"method": "custom_class", "model": "sdlib.vllm.proposers.ProposeNothing",
                                      "num_speculative_tokens": 3})
        spec["speculator_options"]["pad"] = 1
        kw["speculative_config"] = spec

        def extra(llm):
            pinned = vr.pin_target(llm)
            kind = vr.install(llm, 3)
            L = 96
            plans = {i: (np.arange(1, L), np.full(L - 1, 3), np.full(L - 1, 2)) for i in range(8)}
            vr.set_plans(llm, vr.ReplayPlans(3, plans=plans, output_len={i: 64 for i in range(8)}))
            before = vc.read_spec_counters(llm)
            eng = llm.llm_engine
            for i, p in enumerate(prompts(8, seed=5)):
                eng.add_request(f"r{i}{vr.KEY_SEP}{i}", vc.token_prompt(p), vc.delta_sampling_params(64, 0.0, 0, True))
            gained: dict[str, list[int]] = {}
            outs: dict[str, list[int]] = {}
            while eng.has_unfinished_requests():
                for o in eng.step():
                    if o.outputs and o.outputs[0].token_ids:
                        gained.setdefault(o.request_id, []).append(len(o.outputs[0].token_ids))
                        outs.setdefault(o.request_id, []).extend(int(t) for t in o.outputs[0].token_ids)
            c = vc.diff_counters(vc.read_spec_counters(llm), before)
            st = vr.stats(llm)
            first = sorted(gained)[0] if gained else None
            all_zero = all(t == 0 for v in outs.values() for t in v)
            ok = (kind == "v2" and all_zero and len(c["accepted_per_pos"]) == 3 and c["accepted_per_pos"][2] == 0
                  and c["accepted_per_pos"][0] > 0 and c["accepted_per_pos"][0] == c["accepted_per_pos"][1])
            return {"ok": ok, "pinned_model": pinned, "replay_runner": kind, "replay_counters": c, "hook_stats": st,
                    "gained_first_request": gained.get(first, [])[:20], "outputs_all_token_0": all_zero}

        run_engine("custom_replay", kw, bss=(1,), extra=extra)

    def c_dynamic():
        kw = base_kwargs(paths)
        kw["speculative_config"] = {"method": "eagle3", "model": eagle, "num_speculative_tokens": 3, **synth,
                                    "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 16, 1]]}
        run_engine("dynamic_sd", kw, bss=(1, 8))

    def c_adaptive():
        kw = base_kwargs(paths)
        kw["speculative_config"] = {"method": "eagle3", "model": eagle, "num_speculative_tokens": 3,
                                    "enable_adaptive_verification": True}
        kw["compilation_config"] = dict(kw["compilation_config"], cudagraph_mode="FULL_AND_PIECEWISE")
        try:
            run_engine("adaptive", kw, bss=(1, 8))
        except Exception as e:  # noqa: BLE001 - then with synthetic acceptance too, to see which part refuses
            emit("adaptive", False, error=f"{type(e).__name__}: {e}"[:600], tb=traceback.format_exc()[-1500:])
            reap()
            kw["speculative_config"].update(synth)
            run_engine("adaptive_synthetic", kw, bss=(1, 8))

    def c_phase_timers():
        # in-process engine core (the sdlib sweep's phase_timers path) in a child process: the env var must be
        # set before vLLM starts an engine, and this process already started multi-process ones
        import subprocess

        code = ("import json,os; os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']='0'; "
                "from sdlib.vllm.selfcheck import self_check; r=self_check('eagle3'); "
                "print('SELFCHECK '+json.dumps({'rows': r['rows'], 'describe': r['describe'], 'tokens': r['tokens']}))")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=max(30, per_engine), cwd=str(ROOT))
        line = next((x for x in p.stdout.splitlines() if x.startswith("SELFCHECK ")), None)
        if line is None:
            emit("phase_timers", False, rc=p.returncode, tail=(p.stdout + p.stderr)[-2000:])
            return
        r = json.loads(line[len("SELFCHECK "):])
        missing = r["describe"].get("missing", {})
        emit("phase_timers", not missing and r["describe"].get("runner_kind") == "v2", **r)

    def c_custom_adaptive():
        # does adaptive verification leave the padded (confidence 0) slots unverified? 2 zeros drafted of K = 3,
        # the target pinned: accepted_per_pos [N, N, 0] either way; draft tokens per draft 3 (padding verified)
        # or about 2 (trimmed)
        from sdlib.vllm import replay as vr

        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        kw = base_kwargs(paths)
        spec = vc.speculative_config({"method": "custom_class", "model": "sdlib.vllm.proposers.ProposeZeros",
                                      "num_speculative_tokens": 3, "enable_adaptive_verification": True})
        spec["speculator_options"].update({"pad": 1, "n": 2})
        kw["speculative_config"] = spec
        kw["compilation_config"] = dict(kw["compilation_config"], cudagraph_mode="FULL_AND_PIECEWISE")

        def extra(llm):
            vr.pin_target(llm)
            return {"ok": True, "after_pin": [generate(llm, b) for b in (1, 8)]}

        run_engine("custom_adaptive", kw, bss=(1,), extra=extra)

    table = {"custom_adaptive": c_custom_adaptive, "none": c_none, "eagle3": c_eagle3, "ngram": c_ngram, "custom_replay": c_custom_replay,
             "dynamic_sd": c_dynamic, "adaptive": c_adaptive, "phase_timers": c_phase_timers}
    for name in [n for n in ENGINE_CHECKS if n in which]:
        left = deadline - (time.time() - T0)
        if left < 40:
            emit(name, False, skipped=f"deadline ({deadline:.0f} s) reached")
            continue
        try:
            with time_limit(min(per_engine, left)):
                table[name]()
        except Exception as e:  # noqa: BLE001 - record and go on
            emit(name, False, error=f"{type(e).__name__}: {e}"[:800], tb=traceback.format_exc()[-2500:])
            reap()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(ALL), help=f"comma list of {ALL}")
    ap.add_argument("--deadline", type=float, default=330, help="seconds after start: no engine starts later")
    ap.add_argument("--per-engine", type=float, default=150, help="time limit of one engine check (s)")
    a = ap.parse_args(argv)
    which = a.only.split(",")
    for name, fn in (("env", check_env), ("kernels", check_kernels), ("imports", check_imports)):
        if name in which:
            try:
                with time_limit(120):
                    fn()
            except Exception as e:  # noqa: BLE001
                emit(name, False, error=f"{type(e).__name__}: {e}"[:800], tb=traceback.format_exc()[-2500:])
    if any(n in which for n in ENGINE_CHECKS):
        engine_checks(which, a.deadline, a.per_engine)
    ok = sum(r["ok"] for r in RESULTS)
    print(f"SMOKE {ok}/{len(RESULTS)} checks ok in {time.time() - T0:.0f} s; {OUT / 'smoke_034.json'}", flush=True)
    return 0 if ok == len(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
