"""``sdlib report CONFIG_OR_DIR``: a sweep's results in one table (the table: :mod:`sdlib.run.report`).

Usage:
    sdlib report configs/embedded_default.yaml            # a text table
    sdlib report data/sweeps/embedded_default --csv       # or --json
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sdlib.commands.base import Command, UsageError


@dataclass
class ReportCommand(Command):
    """``sdlib report CONFIG_OR_DIR [--csv | --json]``: reads a sweep's tables, prints the table (stdout)."""

    parser_name = "report"
    parser_help = "tok/s, speedup (95%% intervals) and acceptance length per cell of a sweep"
    description = ("tok/s and speedup with 95% intervals and the mean acceptance length per cell of a sweep "
                   "(reads its tables; writes nothing).")

    target: str
    results_dir: Optional[str] = None
    csv: bool = False
    json: bool = False

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("target", help="a sweep YAML, or a sweep's results folder")
        parser.add_argument("--results-dir", help="with a YAML: the results folder it was run with")
        fmt = parser.add_mutually_exclusive_group()
        fmt.add_argument("--csv", action="store_true", help="CSV on stdout")
        fmt.add_argument("--json", action="store_true", help="JSON records on stdout")

    def run(self) -> int:
        # the config (pydantic), the store and the intervals (pandas): imported only when the command runs
        from sdlib.config import load_sweep
        from sdlib.run.report import format_report, report_table
        from sdlib.store import SweepStore

        target = Path(self.target).expanduser().resolve()
        cells = None
        if target.is_dir():
            folder = target
        elif target.is_file():
            overrides = ({"results_dir": str(Path(self.results_dir).expanduser().resolve())} if self.results_dir
                         else None)
            sweep = load_sweep(target, overrides)
            folder = sweep.out_dir
            cells = {c.run_id for c in sweep.cells()}  # exactly this config's cells, whatever ran last in the folder
        else:
            raise UsageError(f"report: {self.target} is neither a sweep config nor a results folder")
        if not (folder / "runs").is_dir():
            raise UsageError(f"report: {folder} has no runs table (has the sweep run?)")
        store = SweepStore(folder)
        t = report_table(store, cells=cells)
        if self.csv:
            t.to_csv(sys.stdout, index=False)
        elif self.json:
            print(t.to_json(orient="records", indent=1))
        elif t.empty and cells is not None:
            done = len(store.done_ids() & cells)
            print(f"no finished cells of {self.target} in {folder} ({done} of {len(cells)} done; "
                  f"sdlib status {self.target})")
        else:
            print(format_report(t))
        return 0
