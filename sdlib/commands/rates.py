"""``sdlib rates``: the synthetic acceptance rates per draft position (YAML-ready JSON) that reproduce the
authors' traces on average (the rates: :func:`sdlib.sim.closed_form.per_position_rates`).

Usage:
    sdlib rates --datasets sharegpt,gsm8k --method eagle3 --k 3
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from sdlib.commands.base import Command


@dataclass
class RatesCommand(Command):
    """``sdlib rates``: print the synthetic acceptance rates that reproduce a trace set on average."""

    parser_name = "rates"
    parser_help = "synthetic acceptance rates per draft position that reproduce the authors' traces"
    description = ("Per-position synthetic acceptance rates from the authors' traces, for vLLM's "
                   "synthetic_acceptance_rates (a config's options).")

    datasets: str = "sharegpt,gsm8k"
    method: str = "eagle3"
    k: int = 3

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--datasets", default="sharegpt,gsm8k", help="reference datasets, comma-separated")
        parser.add_argument("--method", default="eagle3", choices=["eagle3", "ngram"])
        parser.add_argument("--k", type=int, default=3)

    def run(self) -> int:
        # the traces and the simulator (pandas): imported only when the command runs
        from sdlib.sim.closed_form import per_position_rates
        from sdlib.sim.prepared import prepare_traces
        from sdlib.sim.traces import load_reference_traces

        prep = prepare_traces(load_reference_traces([d.strip() for d in self.datasets.split(",") if d.strip()]))
        rates = per_position_rates(prep, self.method, self.k)
        print(json.dumps({"synthetic_acceptance_rates": [round(r, 4) for r in rates],
                          "source": f"authors' Llama-3.1-8B traces ({self.datasets}), {self.method}, k={self.k}"}))
        return 0
