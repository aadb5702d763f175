"""Every ``sdlib`` subcommand, one args dataclass each (:class:`sdlib.commands.base.Command`), listed in
:data:`SUBCOMMANDS` in the order ``sdlib --help`` shows them.

Add a command: a ``@dataclass`` subclass of :class:`~sdlib.commands.base.Command` in a module here (its
options as fields, ``add_cli_args``, ``run``), and its class in :data:`SUBCOMMANDS`.

Usage:
    from sdlib.commands import SUBCOMMANDS
    [c.parser_name for c in SUBCOMMANDS]      # ['sweep', 'plan', ..., 'simulate', 'worker']
"""

from __future__ import annotations

from sdlib.commands.base import Command
from sdlib.commands.codeedit import CodeEditCommand
from sdlib.commands.confidences import ConfidencesCommand
from sdlib.commands.misc import ModelsCommand, SchemaCommand, WorkerCommand
from sdlib.commands.rates import RatesCommand
from sdlib.commands.report import ReportCommand
from sdlib.commands.selfcheck import SelfCheckCommand
from sdlib.commands.serve import ServeCommand
from sdlib.commands.simulate import SimulateCommand
from sdlib.commands.sweep import CleanCommand, PlanCommand, RekeyCommand, StatusCommand, SweepCommand, ValidateCommand
from sdlib.commands.traces import TracesCommand
from sdlib.commands.train import TrainCommand

#: the subcommands of ``sdlib``, in --help order (``worker`` has no help line: not listed)
SUBCOMMANDS: tuple[type[Command], ...] = (
    SweepCommand, PlanCommand, ValidateCommand, StatusCommand, CleanCommand, RekeyCommand,
    ModelsCommand, SchemaCommand, TrainCommand, TracesCommand, ConfidencesCommand, ServeCommand,
    CodeEditCommand, SelfCheckCommand, RatesCommand, ReportCommand, SimulateCommand, WorkerCommand,
)

__all__ = ["SUBCOMMANDS", "Command"]
