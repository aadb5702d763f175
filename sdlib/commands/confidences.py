"""``sdlib confidences``: EAGLE-3's top-1 probability of each draft along one of our traces (the library:
:mod:`sdlib.run.confidences`).

Usage:
    sdlib confidences --traces data/traces/embedded_code_edit.jsonl.gz --models data/models \\
        --out data/traces/confidences/embedded_code_edit.jsonl.gz
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Optional

from sdlib.commands.base import Command


@dataclass
class ConfidencesCommand(Command):
    """``sdlib confidences --traces FILE --out FILE``: the draft confidences of every request of a trace file."""

    parser_name = "confidences"
    parser_help = "EAGLE-3's top-1 probability of each draft along one of our traces (JSONL + provenance)"

    traces: str
    out: str
    models: str = "data/models"
    k: Optional[int] = None
    device: str = "cpu"
    #: the command line as typed (``sdlib confidences ...``), recorded in the provenance
    command_line: list[str] = field(default_factory=list)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        from sdlib.run import confidences as stage  # numpy: its description, imported when this parser is built

        parser.description = stage.__doc__.split("\n\n")[0]
        parser.add_argument("--traces", required=True, help="one of our trace files (data/traces/*.jsonl.gz)")
        parser.add_argument("--models", default="data/models",
                            help="folder with target/ and eagle3/ (default data/models)")
        parser.add_argument("--k", type=int, help="drafts per position (default: the trace's k)")
        parser.add_argument("--device", default="cpu",
                            help="torch device for the target and head, float32 either way: cpu (default), cuda, "
                                 "auto (cuda when there is one)")
        parser.add_argument("--out", required=True, help="output JSONL.gz (a provenance JSON is written beside it)")

    def run(self) -> int:
        from sdlib.run.confidences import write_confidences  # numpy (torch as it loads): only when the command runs

        try:  # the provenance records `sdlib confidences <these arguments>`
            info = write_confidences(self.traces, self.models, self.out, self.k,
                                     argv=self.command_line[2:] if self.command_line else None, device=self.device)
        except (FileNotFoundError, ValueError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        ag = info["agreement_with_trace_acc_eagle"]
        print(f"{self.out}: k={info['k']}, {ag['equal']}/{ag['positions']} positions agree with the trace's "
              f"acc_eagle; {info['seconds']} s")
        return 0
