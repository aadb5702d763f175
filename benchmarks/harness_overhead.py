"""Harness overhead: output tokens/s with sdlib's extraction on vs off, on the same engine.

"off" = plain ``llm.generate`` (final outputs only). "on" = sdlib's driver: DELTA
outputs through ``LLMEngine.step()``, per-request timestamps, per-step records,
vLLM's detailed per-request metrics, and the tables built from them. Same
engine, same prompts, same batch (all requests submitted at once), alternated
over repeats. Prints one table and the ratio on/off with a 95% interval (bootstrap over the paired
repeats); not a test. ``--out FILE`` also writes it as markdown with its provenance (``make bench`` ->
``data/benchmarks/harness_overhead.md``, which docs/FINDINGS.md links).

Usage:
    python benchmarks/harness_overhead.py [--method draft_model] [--batch-size 16] [--requests 32] [--tokens 64]
                                          [--repeats 5] [--out data/benchmarks/harness_overhead.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="draft_model", choices=["none", "ngram", "draft_model", "eagle"])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="also write the result as markdown here (make bench: data/benchmarks/harness_overhead.md)")
    a = ap.parse_args()

    from sdlib.vllm import compat as vc
    from sdlib.config import parse_sweep
    from sdlib.core import bootstrap
    from sdlib.run.driver import drive
    from sdlib.paths import MODELS_DIR
    from sdlib.extract.tables import build_tables
    from sdlib.models.tinymodels import build_models
    from sdlib.store.provenance import device_name
    from sdlib.workloads import load_prompts

    paths = build_models(MODELS_DIR)
    method = {"name": a.method, "num_spec_tokens": 3}
    if a.method in ("draft_model", "eagle"):
        method["model"] = str(paths["draft" if a.method == "draft_model" else "eagle"])
    sweep = parse_sweep({
        "name": "bench", "models": [{"path": str(paths["target"]), "name": "tiny", "max_model_len": 1024}],
        "methods": [method],
        "workloads": [{"dataset": "humaneval", "source": "package", "num_requests": a.requests,
                       "max_output_tokens": a.tokens, "ignore_eos": True, "max_prompt_tokens": 512}],
        "batch_sizes": [a.batch_size], "engine": {"gpu_memory_utilization": 0.2, "enforce_eager": True},
    })
    cell = sweep.cells()[0]
    llm = vc.make_llm(cell.model, cell.method, sweep.engine, max_batch=a.batch_size, seed=0)
    prompts = load_prompts(cell.workload, llm.get_tokenizer())
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=a.tokens, temperature=0.0, ignore_eos=True)
    plain = [vc.token_prompt(p.prompt_token_ids) for p in prompts]
    detailed = a.method != "none" and vc.has_detailed_metrics()

    def off() -> float:
        t = time.perf_counter()
        outs = llm.generate(plain, sp, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)

    def on() -> float:
        t = time.perf_counter()
        before = vc.read_spec_counters(llm)
        res = drive(llm.llm_engine, prompts, len(prompts),
                    lambda p: vc.delta_sampling_params(a.tokens, 0.0, 0, True),
                    spec_metrics=vc.request_spec_metrics, id_prefix=f"b{time.perf_counter_ns()}-")
        build_tables(cell, res, vc.diff_counters(vc.read_spec_counters(llm), before), "bench", "", detailed)
        return sum(len(r.token_ids) for r in res.requests) / (time.perf_counter() - t)

    off(), on()  # warm-up
    r_off, r_on = [], []
    for _ in range(a.repeats):
        r_off.append(off())
        r_on.append(on())
    m_off, m_on = statistics.mean(r_off), statistics.mean(r_on)
    # on and off of a repeat ran back to back on the same engine: drawn together
    lo, hi = bootstrap.paired_ratio_interval(r_on, r_off, bootstrap.rng("harness_overhead", a.method))
    verdict = ("the interval includes 1: no overhead (or gain) is established" if lo <= 1 <= hi
               else f"extraction {'slows' if hi < 1 else 'speeds up'} generation (interval excludes 1)")
    lines = [
        f"vLLM {vc.vllm_version()} | {device_name()} | tiny target, method {a.method} (k=3) | "
        f"{len(prompts)} requests x {a.tokens} tokens, all submitted at once | {a.repeats} repeats, off/on alternated",
        f"{'extraction':<12}{'tok/s mean':>12}{'runs':>48}",
        f"{'off':<12}{m_off:>12.1f}{str([round(x, 1) for x in r_off]):>48}",
        f"{'on':<12}{m_on:>12.1f}{str([round(x, 1) for x in r_on]):>48}",
        f"ratio on/off = {m_on / m_off:.3f}, 95% CI [{lo:.3f}, {hi:.3f}] (bootstrap over the {a.repeats} paired repeats); "
        f"{verdict}",
    ]
    print("\n".join(lines))
    if a.out:
        write_markdown(a.out, lines, sys.argv)
    return 0


def write_markdown(path: str, lines: list[str], argv: list[str]) -> Path:
    """The result as markdown, its first line naming the producer (tests/test_artefacts.py checks it)."""
    from sdlib.store.provenance import git_commit, utc_now

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["python", "benchmarks/harness_overhead.py", *argv[1:]])
    text = ["# Harness overhead (written by `make bench`: benchmarks/harness_overhead.py)", "",
            f"Command: `{cmd}`; git {git_commit()}; {utc_now()}.", "",
            "Output tokens/s of plain `llm.generate` (off) and of sdlib's extraction (on: DELTA step loop, "
            "timestamps, detailed metrics, tables) on the same engine, with the random-weight tiny models of "
            "`sdlib models` (a random draft accepts almost nothing; the harness cost does not depend on it). "
            "On a shared CPU the run-to-run spread can be larger than the difference; the interval says whether "
            "a difference is established.", "",
            "```", *lines, "```", ""]
    out.write_text("\n".join(text))
    return out


if __name__ == "__main__":
    sys.exit(main())
