"""What every ``sdlib`` subcommand is: an args dataclass with ``add_cli_args`` / ``from_cli_args`` / ``run``
(the shape of vLLM's ``vllm/benchmarks/sweep/`` commands), and the parser that answers a bad command line in
one line.

A subcommand is a ``@dataclass`` subclass of :class:`Command`: its fields are its options (typed, with
argparse's defaults), :meth:`Command.add_cli_args` adds them to its parser, :meth:`Command.from_cli_args`
reads them back off the parsed namespace (one field per option, by name) and :meth:`Command.run` does the
work and returns the exit code. :data:`sdlib.commands.SUBCOMMANDS` lists them all; :mod:`sdlib.cli` builds
``sdlib``'s parser from that tuple.

A command's options are added when its parser is first used (:class:`CommandParser`), so ``sdlib --help``
and every other command import nothing that one command's help needs (``sdlib simulate``'s lists the
registered policies; ``sdlib traces``'s the methods of :mod:`sdlib.run.traces`). Heavy modules (vLLM, torch,
pandas-heavy stages) are imported inside :meth:`Command.run`, so that ``import sdlib.cli`` stays light.

Usage:
    @dataclass
    class HelloCommand(Command):
        parser_name = "hello"
        parser_help = "print a greeting"   # None: not listed in sdlib --help
        name: str = "world"

        @classmethod
        def add_cli_args(cls, parser):
            parser.add_argument("--name", default="world")

        def run(self) -> int:
            print(f"hello {self.name}")
            return 0
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad command line answered in one line (exit 2), as a bad config is."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class UsageError(ValueError):
    """A bad value a command checks itself (the message names the flag): ``error: <message>``, exit 2, as a
    :class:`sdlib.config.ConfigError` (:func:`sdlib.cli.main` answers both)."""


class CommandParser(OneLineParser):
    """One command's parser; its command's options are added the first time it parses or formats its help
    (:meth:`add_command_args`), so that building ``sdlib``'s parser imports no command's dependencies."""

    def __init__(self, *args: Any, command: Optional[type[Command]] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pending = command

    def add_command_args(self) -> CommandParser:
        """Add the command's options now (once); returns the parser."""
        command, self._pending = self._pending, None
        if command is not None:
            command.add_cli_args(self)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.add_command_args()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.add_command_args()
        return super().format_usage()

    def format_help(self) -> str:
        self.add_command_args()
        return super().format_help()


def add_command(subparsers: argparse._SubParsersAction, command: type[Command]) -> CommandParser:
    """``command``'s parser on ``subparsers`` (listed with its ``parser_help``; not listed when that is None);
    a parsed command line carries the class as ``command``."""
    listed = {} if command.parser_help is None else {"help": command.parser_help}  # no help=: not listed
    parser = subparsers.add_parser(command.parser_name, description=command.description, epilog=command.epilog,
                                   formatter_class=command.formatter_class, command=command, **listed)
    parser.set_defaults(command=command)
    return parser


class Command:
    """An ``sdlib`` subcommand; subclasses are dataclasses whose fields are the options (see the module)."""

    #: the command's name on the command line (``sdlib <parser_name>``)
    parser_name: ClassVar[str]
    #: its line in ``sdlib --help`` (%-formatted by argparse); None: not listed
    parser_help: ClassVar[Optional[str]] = None
    #: ``sdlib <name> --help``'s text above the options, and below them
    description: ClassVar[Optional[str]] = None
    epilog: ClassVar[Optional[str]] = None
    formatter_class: ClassVar[type[argparse.HelpFormatter]] = argparse.HelpFormatter
    #: a command group's steps (``sdlib train <step>``): each its own command, listed under ``<step>``
    subcommands: ClassVar[tuple[type[Command], ...]] = ()

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add the command's options to ``parser``; a group adds its steps' parsers."""
        if cls.subcommands:
            sub = parser.add_subparsers(dest=f"{cls.parser_name}_step", required=True, metavar="<step>",
                                        parser_class=CommandParser)
            for step in cls.subcommands:
                add_command(sub, step)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Command:
        """The command of a parsed command line: each field from the namespace's attribute of its name (a field
        the namespace lacks, e.g. ``command_line`` off a bare ``parse_args``, keeps its default)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                      if f.init and hasattr(args, f.name)})

    def run(self) -> int:
        """Do the work; the exit code."""
        raise NotImplementedError(f"sdlib {self.parser_name}: give a step (see --help)")


@dataclass
class ConfigCommand(Command):
    """A command on one config file and its results folder: ``CONFIG`` and ``--results-dir``, with the help
    texts of :attr:`config_help` and :attr:`results_help`; a subclass adds its own options after them."""

    config_help: ClassVar[str] = "sweep YAML"
    results_help: ClassVar[str] = "the results folder (default: the config's)"

    config: str
    results_dir: Optional[str] = None

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("config", help=cls.config_help)
        parser.add_argument("--results-dir", help=cls.results_help)
