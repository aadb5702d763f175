"""The one command line: ``sdlib <command>`` (the same as ``python -m sdlib <command>``).

Usage:
    sdlib sweep configs/embedded_default.yaml      # run (or resume) a sweep -> data/sweeps/<name>/
    sdlib validate configs/embedded_default.yaml   # check a config and its paths; start nothing
    sdlib status configs/embedded_default.yaml     # cells done / failed / to do / stale
    sdlib plan configs/h200_replay.yaml --gpu-minutes 20  # estimated GPU minutes; the blocks that fit
    sdlib clean configs/embedded_default.yaml --stale  # remove the cells of an older config
    sdlib report configs/embedded_default.yaml     # tok/s, speedup and acceptance per cell
    sdlib serve configs/embedded_serving.yaml      # serving sweep (vLLM OpenAI server) -> data/serving/<name>/
    sdlib models                                   # random-weight tiny models -> .cache/models/
    sdlib train prepare|fit|check|cards ...        # the trained embedded models -> data/models/
    sdlib traces --out data/traces/x.jsonl.gz ...  # teacher-forced acceptance traces of our models
    sdlib codeedit 5                               # print code-edit examples (JSON lines)
    sdlib schema                                   # every table's columns as Markdown (data/README.md)
    sdlib selfcheck --method eagle                 # phase timers on a tiny dummy-weight engine
    sdlib simulate --traces reference --out t.csv  # per-step policies vs fixed k vs Oracle Combine (simulated)
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Optional

from sdlib import __version__
from sdlib.commands import SUBCOMMANDS
from sdlib.commands.base import CommandParser, OneLineParser, UsageError, add_command

DESCRIPTION = ("Measure speculative decoding inside vLLM at real batch sizes: run sweeps into tidy tables, "
               "make acceptance traces, train the embedded models.")


def build_parser() -> OneLineParser:
    """``sdlib``'s parser: one subparser per class of :data:`sdlib.commands.SUBCOMMANDS` (a parsed command line
    carries its class as ``command``)."""

    ap = OneLineParser(prog="sdlib", description=DESCRIPTION,
                       epilog="Each command has --help. Docs: README.md, docs/, data/README.md.")
    ap.add_argument("--version", action="version", version=f"sdlib {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="<command>", parser_class=CommandParser)
    for command in SUBCOMMANDS:
        add_command(sub, command)
    return ap


def os_error_line(err: OSError) -> str:
    """``<file>: <why>`` for an OSError (what the user can act on), e.g. ``out/x.parquet: No space left on
    device (ENOSPC)``."""

    name = errno.errorcode.get(err.errno or 0)
    why = f"{err.strerror or err}{f' ({name})' if name else ''}"
    return f"{err.filename}: {why}" if err.filename else why


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.command_line = ["sdlib", *argv]  # the command as typed, for the provenance some commands record
    command = args.command.from_cli_args(args)
    # pydantic and the policy registry (pandas): imported once a command runs, so that `import sdlib.cli` stays light
    from sdlib.config import ConfigError

    try:
        return command.run()
    except (ConfigError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM outside a sweep (a sweep says what it kept itself)
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # a full disk, a read-only folder, ...: one line naming the file, not a traceback
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
