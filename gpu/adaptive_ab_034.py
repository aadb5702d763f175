"""Does vLLM 0.34's adaptive verification leave padded draft slots unverified? A step-time A/B on the H200
(issue 23 item 3), with the cost tables it profiles at start-up.

vLLM 0.34 counts ``num_draft_tokens`` in the scheduler, before the worker trims what it verifies, so its counters
cannot tell (data/gpu/h200_v034_2026-12-04.json). The budget (``AdaptiveVerificationManager.get_num_tokens``,
vllm/v1/worker/gpu/spec_decode/adaptive_verification.py) ranks slots by the running product of their
confidences and keeps the budget that maximises expected tokens per unit of cost; sdlib's speculator gives real
drafts confidence 1 and padding 0 (sdlib/vllm/speculator.py), so the padding should fall out of the budget. This
times it. Three engines, the Llama-3.1-8B shape with dummy weights and the target pinned (its greedy token is
always 0), sdlib's custom proposer ``ProposeZeros`` drafting 2 zeros a step (both accepted), padded with token 1
(always rejected) up to K:

* ``k5n2-adaptive``: K = 5, 2 drafted + 3 padded, ``enable_adaptive_verification``;
* ``k5n2-fixed``:    the same without it (every row verifies 1 + 5 tokens);
* ``k2n2-fixed``:    K = 2, 2 drafted, no padding (every row verifies 1 + 2: what trimming would leave).

Every arm gains 3 tokens per row per step, so the step times compare only what is verified. If adaptive
verification trims the padding, ``k5n2-adaptive`` steps cost about what ``k2n2-fixed`` steps do; if it verifies
the padding, about what ``k5n2-fixed`` steps do. Each engine times ``--reps`` generate calls per batch size,
the batch sizes interleaved; the interval on a step-time ratio is a bootstrap over those calls (one engine start
per arm: engine-start variance is not in it, and the run says so).

    python3 gpu/adaptive_ab_034.py [--bs 32,128] [--reps 4] [--max-tokens 193]    (on the H200, after stage.sh)

Writes $OUT/adaptive_ab_034.json (commit, vLLM version, device, per-call rows, the per-arm step times, the ratios
with intervals, and the adaptive engine's cost tables sampled at powers of two and its capture sizes).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT") or "build/adaptive_ab_034")

ARMS = {  # name: (K, drafted per step, adaptive verification)
    "k5n2-adaptive": (5, 2, True),
    "k5n2-fixed": (5, 2, False),
    "k2n2-fixed": (2, 2, False),
}
#: the comparisons: (arm, reference) step-time ratios
PAIRS = (("k5n2-adaptive", "k2n2-fixed"), ("k5n2-adaptive", "k5n2-fixed"), ("k5n2-fixed", "k2n2-fixed"))
PROMPT_LEN = 128


def _smoke():
    """gpu/smoke_034.py's helpers (model shapes, prompts, engine close and reap)."""
    spec = importlib.util.spec_from_file_location("smoke_034", HERE / "smoke_034.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _w_cost_tables(worker):
    """In the engine's worker: the adaptive verification cost tables (draft ms by request count, verify ms by
    token count) sampled at 0, 1, 2, 4, ... and at the capture limit, with that limit."""
    av = getattr(getattr(worker, "model_runner", None), "adaptive_verification", None)
    if av is None or av.cost_tables is None:
        return None
    draft, verify = av.cost_tables

    def sample(t):
        idx = sorted({0, len(t) - 1, *[2 ** i for i in range(0, 20) if 2 ** i < len(t)],
                      *[3 * 2 ** i for i in range(0, 19) if 3 * 2 ** i < len(t)]})
        return [[int(i), round(float(t[i]), 4)] for i in idx]

    return {"draft_ms_by_reqs": sample(draft), "verify_ms_by_tokens": sample(verify),
            "cudagraph_limit": int(getattr(av, "_cudagraph_limit", 0))}


def engine_kwargs(paths: dict, k: int, n: int, adaptive: bool, max_num_seqs: int) -> dict:
    from sdlib.vllm import compat as vc

    spec = vc.speculative_config({"method": "custom_class", "model": "sdlib.vllm.proposers.ProposeZeros",
                                  "num_speculative_tokens": k, "enable_adaptive_verification": adaptive})
    spec["speculator_options"].update({"pad": 1, "n": n})
    return dict(model=paths["llama-3.1-8b"], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                max_model_len=1024, max_num_seqs=max_num_seqs, gpu_memory_utilization=0.85, seed=0,
                disable_log_stats=False, enable_prefix_caching=False, speculative_config=spec)


def timed_call(llm, smoke, bs: int, max_tokens: int, seed: int) -> dict:
    from vllm import SamplingParams

    from sdlib.vllm import compat as vc

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    ps = [vc.token_prompt(p) for p in smoke.prompts(bs, length=PROMPT_LEN, seed=seed)]
    before = vc.read_spec_counters(llm)
    t = time.perf_counter()
    outs = llm.generate(ps, sp, use_tqdm=False)
    wall = time.perf_counter() - t
    c = vc.diff_counters(vc.read_spec_counters(llm), before)
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = c["num_drafts"] / bs if c["num_drafts"] else None  # one draft per row per decode step
    return {"bs": bs, "wall_s": round(wall, 5), "tokens": toks, "tok_s": round(toks / wall, 2),
            "decode_steps": steps, "step_ms": round(1e3 * wall / steps, 4) if steps else None,
            "tokens_per_row_step": round((toks / bs - 1) / steps, 4) if steps else None, "counters": c}


def run_arm(name: str, smoke, paths: dict, bss: list[int], reps: int, max_tokens: int) -> dict:
    from vllm import LLM

    k, n, adaptive = ARMS[name]
    t0 = time.time()
    llm = None
    out: dict = {"arm": name, "k": k, "drafted": n, "adaptive": adaptive, "rows": []}
    try:
        llm = LLM(**engine_kwargs(paths, k, n, adaptive, max(bss)))
        out["engine_start_s"] = round(time.time() - t0, 1)
        from sdlib.vllm import replay as vr

        vr.pin_target(llm)
        cfg = llm.llm_engine.vllm_config.compilation_config
        out["cudagraph_mode"] = str(cfg.cudagraph_mode)
        out["capture_sizes"] = list(getattr(cfg, "cudagraph_capture_sizes", None) or [])
        if adaptive:
            try:
                out["cost_tables"] = llm.collective_rpc(_w_cost_tables)[0]
            except Exception as e:  # noqa: BLE001 - a record, not a failure of the A/B
                out["cost_tables_error"] = f"{type(e).__name__}: {e}"[:300]
        for bs in bss:  # warm-up: Triton JIT and the batch shapes
            timed_call(llm, smoke, bs, 16, seed=10_000 + bs)
        for r in range(reps):
            for bs in (bss if r % 2 == 0 else bss[::-1]):
                row = timed_call(llm, smoke, bs, max_tokens, seed=1000 * r + bs)
                row["rep"] = r
                out["rows"].append(row)
                print(f"[adaptive_ab] {name} bs {bs} rep {r}: {row['step_ms']} ms/step, "
                      f"{row['tokens_per_row_step']} tokens/row/step", flush=True)
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - recorded, the next arm runs
        out.update(ok=False, error=f"{type(e).__name__}: {e}"[:600], tb=traceback.format_exc()[-1500:])
    finally:
        smoke.close(llm)
    out["t_s"] = round(time.time() - t0, 1)
    return out


def ratio_intervals(arms: list[dict], n_boot: int = 4000, seed: int = 0) -> list[dict]:
    """Step-time ratio (arm / reference) per batch size: the ratio of mean step times, with a percentile bootstrap
    over each arm's timed calls (resampled independently)."""
    rng = np.random.default_rng(seed)
    by = {a["arm"]: a for a in arms if a.get("ok")}
    res = []
    for a, b in PAIRS:
        if a not in by or b not in by:
            continue
        for bs in sorted({r["bs"] for r in by[a]["rows"]}):
            xa = np.array([r["step_ms"] for r in by[a]["rows"] if r["bs"] == bs and r["step_ms"]])
            xb = np.array([r["step_ms"] for r in by[b]["rows"] if r["bs"] == bs and r["step_ms"]])
            if not len(xa) or not len(xb):
                continue
            boot = (rng.choice(xa, (n_boot, len(xa))).mean(1) / rng.choice(xb, (n_boot, len(xb))).mean(1))
            res.append({"arm": a, "reference": b, "bs": bs, "step_ms_arm": round(float(xa.mean()), 4),
                        "step_ms_reference": round(float(xb.mean()), 4),
                        "ratio": round(float(xa.mean() / xb.mean()), 4),
                        "lo": round(float(np.quantile(boot, 0.025)), 4),
                        "hi": round(float(np.quantile(boot, 0.975)), 4), "n_arm": len(xa), "n_reference": len(xb)})
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", default="32,128", help="batch sizes, comma-separated")
    ap.add_argument("--reps", type=int, default=4, help="timed generate calls per batch size and arm")
    ap.add_argument("--max-tokens", type=int, default=193, help="output tokens per request (1 + 3 per step)")
    ap.add_argument("--arms", default=",".join(ARMS), help="arms, comma-separated, in order")
    a = ap.parse_args(argv)
    bss = [int(x) for x in a.bs.split(",")]
    names = a.arms.split(",")
    bad = [x for x in names if x not in ARMS]
    if bad:
        print(f"adaptive_ab: unknown arm(s) {bad}; known: {list(ARMS)}", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with module functions
    smoke = _smoke()
    paths = smoke.model_dirs()
    import vllm

    rec = {"producer": "gpu/adaptive_ab_034.py", "commit": os.environ.get("SDLIB_GIT_COMMIT", "unknown"),
           "vllm": vllm.__version__, "host": platform.node(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "settings": {"bs": bss, "reps": a.reps, "max_tokens": a.max_tokens, "prompt_len": PROMPT_LEN,
                        "arms": {x: dict(zip(("k", "drafted", "adaptive"), ARMS[x])) for x in names}},
           "variance_note": "one engine start per arm: the intervals hold call-to-call variation only"}
    try:
        import torch

        rec["device"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        rec["device"] = "unknown"
    OUT.mkdir(parents=True, exist_ok=True)
    rec["arms"] = []
    for name in names:
        rec["arms"].append(run_arm(name, smoke, paths, bss, a.reps, a.max_tokens))
        rec["ratios"] = ratio_intervals(rec["arms"])
        (OUT / "adaptive_ab_034.json").write_text(json.dumps(rec, indent=1, default=str))
    for r in rec["ratios"]:
        print(f"[adaptive_ab] bs {r['bs']}: {r['arm']} / {r['reference']} = {r['ratio']} [{r['lo']}, {r['hi']}]")
    return 0 if all(x.get("ok") for x in rec["arms"]) else 1


if __name__ == "__main__":
    sys.exit(main())
