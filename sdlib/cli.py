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

import argparse
import sys

from sdlib.config import ConfigError
from sdlib.commands.sweep import add_parsers as add_sweep_parsers

DESCRIPTION = ("Measure speculative decoding inside vLLM at real batch sizes: run sweeps into tidy tables, "
               "make acceptance traces, train the embedded models.")

#: commands that hand the rest of the command line to a stage's own parser (its --help says more)
DELEGATED = {
    "train": ("train, check and describe the embedded models (prepare, fit, check, cards)",
              "sdlib.commands.train"),
    "traces": ("write teacher-forced acceptance traces of our models (JSONL + provenance)", "sdlib.run.traces"),
    "confidences": ("EAGLE-3's top-1 probability of each draft along one of our traces (JSONL + provenance)",
                    "sdlib.run.confidences"),
    "serve": ("serving sweep: vLLM's OpenAI server under open-loop traffic -> data/serving/<name>/",
              "sdlib.serve.cli"),
    "codeedit": ("print code-edit examples as JSON lines", "sdlib.workloads.codeedit"),
    "selfcheck": ("time the phases of a tiny dummy-weight engine in this process (phase-timer self-check)",
                  "sdlib.vllm.selfcheck"),
    "rates": ("synthetic acceptance rates per draft position that reproduce the authors' traces",
              "sdlib.sim.closed_form"),
    "report": ("tok/s, speedup (95%% intervals) and acceptance length per cell of a sweep", "sdlib.run.report"),
    "simulate": ("simulate per-step policies, baselines and oracle bounds on acceptance traces (CSV)",
                 "sdlib.sim.policy.cli"),
}


def _models(args) -> int:
    from sdlib.models.tinymodels import build_models
    from sdlib.paths import MODELS_DIR

    paths = build_models(MODELS_DIR, seed=args.seed, force=args.force)
    for k, v in paths.items():
        print(f"{k}: {v}")
    return 0


def _schema(args) -> int:
    from sdlib.store.schema import readme_markdown

    print(readme_markdown())
    return 0


def _worker(args) -> int:
    from sdlib.run.worker import main as worker_main

    return worker_main([args.spec])


def _delegate(args) -> int:
    import importlib

    mod = importlib.import_module(DELEGATED[args.cmd][1])
    rc = mod.main(args.rest, prog=f"sdlib {args.cmd}")
    return int(rc or 0)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad command line answered in one line (exit 2), as a bad config is."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from sdlib import __version__

    ap = OneLineParser(prog="sdlib", description=DESCRIPTION,
                       epilog="Each command has --help. Docs: README.md, docs/, data/README.md.")
    ap.add_argument("--version", action="version", version=f"sdlib {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="<command>")
    add_sweep_parsers(sub)
    m = sub.add_parser("models", help="build random-weight tiny models into .cache/models")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--force", action="store_true", help="rebuild even if present")
    m.set_defaults(func=_models)
    sc = sub.add_parser("schema", help="print every table's columns as Markdown (for data/README.md)")
    sc.set_defaults(func=_schema)
    for name, (help_, _) in DELEGATED.items():
        d = sub.add_parser(name, help=help_, add_help=False, prefix_chars="\0")
        d.add_argument("rest", nargs=argparse.REMAINDER)
        d.set_defaults(func=_delegate)
    w = sub.add_parser("worker")  # the engine process a sweep starts (not listed in --help)
    w.add_argument("spec")
    w.set_defaults(func=_worker)
    return ap


def os_error_line(err: OSError) -> str:
    """``<file>: <why>`` for an OSError (what the user can act on), e.g. ``out/x.parquet: No space left on
    device (ENOSPC)``."""
    import errno

    name = errno.errorcode.get(err.errno or 0)
    why = f"{err.strerror or err}{f' ({name})' if name else ''}"
    return f"{err.filename}: {why}" if err.filename else why


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM outside a sweep (a sweep says what it kept itself)
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # a full disk, a read-only folder, ...: one line naming the file, not a traceback
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
