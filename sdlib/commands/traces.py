"""``sdlib traces``: teacher-forced acceptance traces of our models, one trace file (and its provenance) for one
dataset (the library: :mod:`sdlib.run.traces`).

Usage:
    sdlib traces --models .cache/models --dataset code_edit --num-requests 32 \\
        --max-output-tokens 64 --k 8 --out data/traces/embedded_code_edit.jsonl.gz
    sdlib traces --from-sweep data/sweeps/<name> --dataset code_edit --out ...  # reuse greedy outputs
    sdlib traces --dataset sharegpt --save-prompts build/p.jsonl.gz   # only the prompts (no engine)
    sdlib traces --dataset sharegpt --prompts build/p.jsonl.gz --out ...  # where the data cannot load
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import Optional

from sdlib.commands.base import Command, UsageError
from sdlib.core.registry import NGRAM_MAX, NGRAM_MIN
from sdlib.extract.ngram import DEFAULT_K
from sdlib.paths import MODELS_DIR, repo_relative, resolve
from sdlib.vllm.engine import EngineSettings


@dataclass
class TracesCommand(Command):
    """``sdlib traces --out FILE``: write one trace file (and its provenance) for one dataset."""

    parser_name = "traces"
    parser_help = "write teacher-forced acceptance traces of our models (JSONL + provenance)"

    out: Optional[str] = None
    models: str = str(MODELS_DIR)
    dataset: str = "code_edit"
    num_requests: int = 32
    max_output_tokens: int = 64
    k: Optional[int] = None  # None: sdlib.extract.ngram.DEFAULT_K
    methods: Optional[str] = None  # None: every method of sdlib.run.traces.METHODS
    ngram_min: int = NGRAM_MIN
    ngram_max: int = NGRAM_MAX
    seed: int = 42
    source: str = "auto"
    max_prompt_tokens: Optional[int] = None
    ignore_eos: bool = False
    from_sweep: Optional[str] = None
    dtype: str = "float32"
    max_model_len: int = 2048
    max_num_seqs: int = 256
    prefix_caching: bool = False
    no_retry: bool = False
    prompts: Optional[str] = None
    save_prompts: Optional[str] = None
    eagle3_engine: str = "vllm"

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        # the trace producer (pandas, sdlib.vllm): its methods and description, imported when this parser is built
        from sdlib.run import traces as stage

        parser.description = stage.__doc__.split("\n\n")[0]
        ap = parser
        ap.add_argument("--models", default=str(MODELS_DIR),
                        help="folder with target/ and the drafters (default: %(default)s)")
        ap.add_argument("--dataset", default="code_edit", help="workload name (sdlib.config.DATASETS)")
        ap.add_argument("--num-requests", type=int, default=32)
        ap.add_argument("--max-output-tokens", type=int, default=64)
        ap.add_argument("--k", type=int, help="num_speculative_tokens for every method (authors: 20)")
        ap.add_argument("--methods", help=f"comma-separated subset of {','.join(stage.METHODS)}")
        ap.add_argument("--ngram-min", type=int, default=NGRAM_MIN)
        ap.add_argument("--ngram-max", type=int, default=NGRAM_MAX)
        ap.add_argument("--seed", type=int, default=42, help="prompt sampling seed")
        ap.add_argument("--source", default="auto", help="workload source: auto, local, package, hub")
        ap.add_argument("--max-prompt-tokens", type=int, default=None)
        ap.add_argument("--ignore-eos", action="store_true", help="greedy outputs run to max-output-tokens")
        ap.add_argument("--from-sweep", default=None, help="take greedy outputs from this sweep folder (no-SD, bs 1)")
        ap.add_argument("--dtype", default="float32")
        ap.add_argument("--max-model-len", type=int, default=2048)
        ap.add_argument("--max-num-seqs", type=int, default=256)
        ap.add_argument("--prefix-caching", action="store_true",
                        help="faster, but changes draft-model proposals on vLLM 0.32 CPU (see EngineSettings)")
        ap.add_argument("--no-retry", action="store_true", help="do not re-run mismatched positions")
        ap.add_argument("--prompts", default=None,
                        help="take the prompts (token ids, in order) from this prompt file of --dataset "
                             "(sdlib.workloads.promptfile), e.g. on a machine without the dataset's package")
        ap.add_argument("--save-prompts", default=None, metavar="FILE",
                        help="write the prompts this run would use to FILE (a prompt file) and stop: no engine")
        ap.add_argument("--eagle3-engine", choices=list(stage.EAGLE3_ENGINES), default="vllm",
                        help="what measures EAGLE-3's acceptance: vLLM, one request per position (default), or "
                             "offline, the head's draft chain in torch float32 (about a thousand times cheaper "
                             "on a CPU; the chain `sdlib confidences` reads)")
        ap.add_argument("--out", help="output .jsonl or .jsonl.gz (provenance JSON written beside it); "
                                      "required unless --save-prompts")

    def run(self) -> int:
        # the trace producer (pandas; vLLM when its engines start): imported only when the command runs
        from sdlib.run.traces import METHODS, greedy_from_sweep, make_traces
        from sdlib.sim.traces import write_traces

        logging.basicConfig(level=logging.INFO, format="%(message)s")
        s = EngineSettings(dtype=self.dtype, max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs,
                           enable_prefix_caching=self.prefix_caching)
        if self.save_prompts:
            return self._save_prompts(s)
        if not self.out:
            raise UsageError("--out: required (unless --save-prompts)")
        prompts = prompts_info = None
        if self.prompts:
            # deferred: sdlib.store and sdlib.workloads load pandas and pydantic, and only this path needs them
            from sdlib.store.files import sha256_file
            from sdlib.workloads import WorkloadError
            from sdlib.workloads.promptfile import read_prompt_file

            if self.from_sweep:
                raise UsageError("--prompts and --from-sweep: give one (the sweep has its own prompts)")
            try:
                prompts, prompts_info = read_prompt_file(self.prompts)
            except WorkloadError as e:
                raise UsageError(str(e)) from None
            if prompts_info.get("dataset") != self.dataset:
                raise UsageError(f"--prompts: {self.prompts} holds {prompts_info.get('dataset')!r} prompts, "
                                 f"not --dataset {self.dataset!r}")
            prompts_info = {**prompts_info, "file": repo_relative(resolve(self.prompts)),
                            "sha256": sha256_file(resolve(self.prompts))}
        greedy = None
        if self.from_sweep:
            greedy = greedy_from_sweep(self.from_sweep, dataset=self.dataset)[: self.num_requests]
        methods = ",".join(METHODS) if self.methods is None else self.methods
        run = make_traces(self.models, self.dataset, self.num_requests, self.max_output_tokens,
                          DEFAULT_K if self.k is None else self.k,
                          [m.strip() for m in methods.split(",") if m.strip()], self.ngram_min, self.ngram_max,
                          s, greedy=greedy, seed=self.seed, source=self.source,
                          max_prompt_tokens=self.max_prompt_tokens, ignore_eos=self.ignore_eos,
                          retry_batch=None if self.no_retry else 16,
                          greedy_source=f"sweep:{repo_relative(resolve(self.from_sweep))}" if self.from_sweep
                          else "given", prompts=prompts, prompts_info=prompts_info,
                          eagle3_engine=self.eagle3_engine)
        path = write_traces(run.traces, self.out, {**run.info, "argv": sys.argv})
        print(f"wrote {path} ({run.info['num_requests']} requests, {run.info['output_tokens']} output tokens)")
        for m, v in run.info["mean_acc_len"].items():
            st = run.info["model_stats"].get(m)
            extra = ""
            if st and st.get("engine") == "offline":
                extra = f"; {st['positions']} positions, offline"
            elif st:
                extra = (f"; {st['positions']} positions, mismatches prefill {st['mismatch_prefill']} / verify "
                         f"{st['mismatch_verify']}, unresolved {st['unresolved']}")
            print(f"  {m:12s} mean acc_len {v:.3f}  ({run.info['timings_s'].get(m, float('nan')):.1f} s{extra})")
        print("  timings (s): " + ", ".join(f"{a} {b:.1f}" for a, b in run.info["timings_s"].items())
              + "; engine start: " + ", ".join(f"{a} {b:.1f}" for a, b in run.info["engine_start_s"].items()))
        return 0

    def _save_prompts(self, s: EngineSettings) -> int:
        """``--save-prompts``: the prompts of this run (tokenized as the run would) to a prompt file."""
        # deferred: the trace producer (pandas, sdlib.vllm), sdlib.store and sdlib.workloads (pydantic) load
        # seconds of modules, and only this path needs them
        from sdlib.run.traces import prompt_limit, trace_prompts
        from sdlib.store import git_commit, utc_now
        from sdlib.workloads.promptfile import write_prompt_file

        k = DEFAULT_K if self.k is None else self.k
        limit = prompt_limit(s, self.max_output_tokens, k, self.max_prompt_tokens)
        target = resolve(self.models) / "target"
        prompts = trace_prompts(target, self.dataset, self.num_requests, limit, self.seed, self.source)
        info = {"dataset": self.dataset, "seed": self.seed, "source": self.source,
                "sources": sorted({p.source or "" for p in prompts}), "tokenizer": repo_relative(target),
                "limit": limit, "num_requests": self.num_requests, "written_at": utc_now(),
                "git_commit": git_commit(), "argv": ["sdlib", *sys.argv[1:]]}
        path = write_prompt_file(prompts, self.save_prompts, info)
        print(f"wrote {path} ({len(prompts)} {self.dataset} prompts within {limit} tokens)")
        return 0
