"""``sdlib serve CONFIG.yaml``: run (or resume) a serving sweep.

Reads a serving YAML (e.g. configs/embedded_serving.yaml; schema: sdlib/serve/config.py) and the models
and workloads it names; starts one vLLM OpenAI server at a time (127.0.0.1, a free port); writes
data/serving/<name>/ (or <results_dir>/<name>/): serve_runs, serve_requests, serve_chunks, serve_counters
(parquet, data/README.md), failures/, provenance.json, logs/ (one per server).

Usage:
    sdlib serve configs/embedded_serving.yaml
    sdlib serve configs/embedded_serving.yaml --only eagle3-k3 --only routed
    sdlib serve configs/embedded_serving.yaml --status
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from sdlib.commands.base import ConfigCommand


@dataclass
class ServeCommand(ConfigCommand):
    """``sdlib serve CONFIG``: a serving sweep (a bad config: one line, exit 2, through :func:`sdlib.cli.main`)."""

    parser_name = "serve"
    parser_help = "serving sweep: vLLM's OpenAI server under open-loop traffic -> data/serving/<name>/"
    description = (
        "Serving sweep: speculative decoding behind vLLM's OpenAI server under open-loop traffic.\n\n"
        "Reads CONFIG (serving YAML: models, methods, the task mix, rates, fleets and routing rules,\n"
        "server settings) and the models and workloads it names. Starts each server as\n"
        "`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 and a free port, sends the\n"
        "requests open-loop (gamma/Poisson arrivals) with sdlib's aiohttp client, and always stops\n"
        "the server (an orphan left by a killed run is ended at the next start).\n\n"
        "Writes <results_dir or data/serving>/<name>/: serve_runs, serve_requests, serve_chunks,\n"
        "serve_counters (parquet; columns in data/README.md, `sdlib schema`), failures/,\n"
        "provenance.json and logs/ (one log per server). Finished cells are skipped on a rerun.")
    epilog = "Exit codes: 0 done (failures recorded), 1 with --strict and a failed cell, 2 bad config."
    formatter_class = argparse.RawDescriptionHelpFormatter
    config_help = "serving YAML, e.g. configs/embedded_serving.yaml"
    results_help = "override the config's results_dir"

    only: Optional[list[str]] = None
    skip_failed: bool = False
    strict: bool = False
    status: bool = False
    quiet: bool = False

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        super().add_cli_args(parser)
        parser.add_argument("--only", action="append", help="only this method label or fleet name (repeatable)")
        parser.add_argument("--skip-failed", action="store_true", help="do not retry cells that failed before")
        parser.add_argument("--strict", action="store_true", help="exit 1 if any cell failed")
        parser.add_argument("--status", action="store_true", help="list cells done / failed / to do; start nothing")
        parser.add_argument("--quiet", action="store_true", help="do not echo server output")

    def run(self) -> int:
        # pydantic, pandas and the aiohttp client: imported only when the command runs
        from sdlib.serve.config import load_serving

        cfg = load_serving(self.config, {"results_dir": self.results_dir} if self.results_dir else None)
        if self.status:
            # deferred: sdlib.store.serving_store loads pandas, and only this path needs it
            from sdlib.store.serving_store import ServingStore

            store = ServingStore(cfg.out_dir)
            done, failed = store.done_ids(), set(store.failures().get("run_id", []))
            cells = cfg.cells()
            todo = [c for c in cells if c.run_id not in done]
            print(f"{cfg.name}: {len(cells)} cells, {len(cells) - len(todo)} done, {len(failed)} failed, "
                  f"{len(todo)} to do")
            for c in todo:
                print(("FAILED " if c.run_id in failed else "todo   ") + c.run_id)
            return 0
        # deferred: sdlib.serve.sweep loads pandas, and only this path needs it
        from sdlib.serve.sweep import run_serving

        store = run_serving(cfg, retry_failed=not self.skip_failed, only=self.only, quiet=self.quiet)
        return 1 if (self.strict and len(store.failures())) else 0
