"""``sdlib codeedit N``: print N code-edit examples as JSON lines (the generator:
:mod:`sdlib.workloads.codeedit`).

Usage:
    sdlib codeedit 5 --seed 0
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from sdlib.commands.base import Command


@dataclass
class CodeEditCommand(Command):
    """``sdlib codeedit N``: print N code-edit examples as JSON lines."""

    parser_name = "codeedit"
    parser_help = "print code-edit examples as JSON lines"
    description = "Print code-edit examples as JSON lines."

    n: int
    seed: int = 0
    edits_per_function: int = 1

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("n", type=int)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--edits-per-function", type=int, default=1)

    def run(self) -> int:
        # sdlib.workloads (pydantic, pandas): imported only when the command runs
        from sdlib.workloads.codeedit import generate_code_edits

        for ex in generate_code_edits(self.n, self.seed, edits_per_function=self.edits_per_function):
            print(json.dumps(ex))
        return 0
