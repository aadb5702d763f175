"""``sdlib selfcheck``: the phase timers on a tiny dummy-weight engine in this process (the check itself:
:func:`sdlib.vllm.selfcheck.self_check`).

Usage:
    sdlib selfcheck --method eagle     # prints RESULT {json}: the phases seen, their totals, the device
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from sdlib.commands.base import Command


@dataclass
class SelfCheckCommand(Command):
    """``sdlib selfcheck [--method M] [--eager]``: print a ``RESULT {json}`` line."""

    parser_name = "selfcheck"
    parser_help = "time the phases of a tiny dummy-weight engine in this process (phase-timer self-check)"
    description = "Self-check of the phase timers on a tiny dummy-weight engine."

    method: str = "draft_model"
    eager: bool = False
    remote: bool = False

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--method", default="draft_model", help="none, ngram, draft_model, eagle, eagle3")
        parser.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
        parser.add_argument("--remote", action="store_true",
                            help="timers inside the engine's worker processes (collective_rpc), as with tensor "
                                 "parallel")

    def run(self) -> int:
        from sdlib.vllm.selfcheck import self_check  # pandas, and vLLM: imported only when the command runs

        res = self_check(self.method, enforce_eager=True if self.eager else None, remote=self.remote)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
