"""``sdlib train check``: load the trained folders in the CPU build of vLLM and measure acceptance.

One engine per method (target alone, draft_model, eagle, eagle3; k=3), each in
its own process (``sdlib train _check-one``), so engines never share memory
and a crash is reported, not fatal; or, with ``one_process=True``, all of them
one after the other in one such process (one Python and vLLM start instead of
one per method: the tests use it). Engines come from
:func:`sdlib.vllm.engine.make_engine` with the sweep's habits (bf16 here, as
the weights are saved; prefix caching off); nothing here imports vLLM.

Usage:
    sdlib train check --models data/models                     # fixed chat prompts
    sdlib train check --models /tmp/m --data .train -n 8       # held-out prompts of a prepared folder
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from sdlib.core.registry import method_spec
from sdlib.models.train.prepare import heldout_prompts
from sdlib.models.train.presets import SWEEP_SEED
from sdlib.paths import REPO_ROOT
from sdlib.vllm.compat import read_spec_counters
from sdlib.vllm.engine import EngineSettings, close_engine, greedy_outputs, make_engine


def check_prompts(tokenizer_dir: Path, n: int) -> list[list[int]]:
    """``n`` chat-templated prompts, cycling: ShareGPT-like, a HumanEval problem, a code edit
    (the sweep's first, held out), a story request; each cut to 400 tokens."""
    # deferred: transformers takes seconds to import, and only this path needs it
    from transformers import AutoTokenizer

    # deferred: sdlib.workloads loads pandas and the dataset readers, and only this path needs it
    from sdlib.workloads import HUMANEVAL_PREFIX, codeedit, format_code_prompt

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    texts = [
        "What are the main differences between a list and a tuple in Python?",
        HUMANEVAL_PREFIX + 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    ]
    ex = codeedit.generate_code_edits(1, seed=SWEEP_SEED)[0]
    texts.append(format_code_prompt(ex["instruction"], ex["input"]))
    texts.append("Write a short story about a robot who learns to paint.")
    out = []
    for t in (texts * n)[:n]:
        ids = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out.append([int(i) for i in ids][:400])
    return out


def check_one(models: Path, method: str, k: int, n: int, max_tokens: int,
              data_dir: Optional[Path] = None, max_prompt_len: int = 512) -> dict:
    """One vLLM engine (CPU build) in this process: greedy outputs and spec-decode counters."""
    # deferred: transformers takes seconds to import, and only this path needs it
    from transformers import AutoTokenizer

    settings = EngineSettings(dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.2,
                              enforce_eager=True, max_num_seqs=max(4, n), seed=0)
    folder = method_spec(method).trained
    drafter = models / folder if folder else None
    t0 = time.perf_counter()
    llm = make_engine(models / "target", method, k=k, drafter=drafter, settings=settings)
    t_load = time.perf_counter() - t0
    try:
        prompts = (heldout_prompts(data_dir, n, max_prompt_len) if data_dir is not None
                   else check_prompts(models / "tokenizer", n))
        t0 = time.perf_counter()
        outs = [ids for ids, _ in greedy_outputs(llm, prompts, max_tokens)]
        t_gen = time.perf_counter() - t0
        c = read_spec_counters(llm)
    finally:
        close_engine(llm)
    text0 = AutoTokenizer.from_pretrained(str(models / "tokenizer")).decode(outs[0], skip_special_tokens=True)
    res = {"method": method, "k": k if method != "none" else 0, "load_s": round(t_load, 1),
           "generate_s": round(t_gen, 2), "outputs": outs, "text0": text0[:200], **c}
    if c["num_draft_tokens"]:
        res["acceptance_rate"] = round(c["num_accepted_tokens"] / c["num_draft_tokens"], 4)
        res["mean_acceptance_length"] = round(1 + c["num_accepted_tokens"] / max(1, c["num_drafts"]), 4)
    return res


def check(models: Path, methods=("none", "draft_model", "eagle", "eagle3"), k: int = 3, n: int = 4,
          max_tokens: int = 32, timeout_s: int = 900, data_dir: Optional[Path] = None,
          max_prompt_len: int = 512, one_process: bool = False) -> list[dict]:
    """Load ``models`` in the CPU build of vLLM, one engine per subprocess (``one_process``: every engine,
    one after the other, in one subprocess; a method after a crash is reported failed with the crash's
    output); returns one dict each (``ok``, acceptance counters, ``same_as_target``: greedy outputs equal
    the target's).

    Prompts: ``n`` fixed chat prompts, or with ``data_dir`` the first held-out
    prompts of a prepared folder (what the sweep will see)."""
    results: list[dict[str, Any]] = []
    for ms in ([list(methods)] if one_process else [[m] for m in methods]):
        cmd = [sys.executable, "-m", "sdlib", "train", "_check-one", "--models", str(Path(models).resolve()),
               "--method", ",".join(ms), "-k", str(k), "-n", str(n), "--max-tokens", str(max_tokens)]
        if data_dir is not None:
            cmd += ["--data", str(Path(data_dir).resolve()), "--max-prompt-len", str(max_prompt_len)]
        env = dict(os.environ)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s * len(ms), env=env,
                           cwd=str(REPO_ROOT))
        wall = round(time.perf_counter() - t0, 1)
        got = {}
        for ln in p.stdout.splitlines():
            if ln.startswith("{\"method\""):
                r = json.loads(ln)
                got[r["method"]] = r
        for m in ms:
            if m in got and (p.returncode == 0 or len(ms) > 1):
                results.append({**got[m], "ok": True, "wall_s": wall})
            else:
                results.append({"method": m, "ok": False, "rc": p.returncode, "wall_s": wall,
                                "stderr_tail": p.stderr[-3000:]})
    base = next((r for r in results if r["method"] == "none" and r["ok"]), None)
    for r in results:
        if base is not None and r["ok"] and r["method"] != "none":
            r["same_as_target"] = r["outputs"] == base["outputs"]
    return results
