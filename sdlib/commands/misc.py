"""``sdlib models`` (the random-weight tiny models), ``sdlib schema`` (every table's columns) and the hidden
``sdlib worker`` (the engine process a sweep starts).

Usage:
    sdlib models                  # random-weight tiny models -> .cache/models/
    sdlib schema                  # every table's columns as Markdown (data/README.md)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sdlib.commands.base import Command
from sdlib.models.tinymodels import build_models
from sdlib.paths import MODELS_DIR


@dataclass
class ModelsCommand(Command):
    """``sdlib models``: build the random-weight tiny models into .cache/models."""

    parser_name = "models"
    parser_help = "build random-weight tiny models into .cache/models"

    seed: int = 0
    force: bool = False

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--force", action="store_true", help="rebuild even if present")

    def run(self) -> int:
        paths = build_models(MODELS_DIR, seed=self.seed, force=self.force)
        for k, v in paths.items():
            print(f"{k}: {v}")
        return 0


@dataclass
class SchemaCommand(Command):
    """``sdlib schema``: print every table's columns as Markdown."""

    parser_name = "schema"
    parser_help = "print every table's columns as Markdown (for data/README.md)"

    def run(self) -> int:
        from sdlib.store.schema import readme_markdown  # pandas, pyarrow: only when the command runs

        print(readme_markdown())
        return 0


@dataclass
class WorkerCommand(Command):
    """``sdlib worker SPEC``: the engine process a sweep starts (not listed in ``sdlib --help``)."""

    parser_name = "worker"

    spec: str

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("spec")

    def run(self) -> int:
        # pydantic, pandas (vLLM once it starts the engine): imported only in the engine process
        from sdlib.run.worker import main as worker_main

        return worker_main([self.spec])
