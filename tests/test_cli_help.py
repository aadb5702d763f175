"""Every ``sdlib`` command answers ``--help`` (help strings are %-formatted by argparse); the commands are one
registry (:data:`sdlib.commands.SUBCOMMANDS`) of args dataclasses."""

import argparse
import dataclasses
import re

import pytest

from sdlib.cli import build_parser, main
from sdlib.commands import SUBCOMMANDS
from sdlib.paths import REPO_ROOT


def _commands(classes=SUBCOMMANDS, prefix=()):
    """(argv prefix, class) of every command and every step of a group (``train fit``), in registry order."""
    for c in classes:
        yield (*prefix, c.parser_name), c
        yield from _commands(c.subcommands, (*prefix, c.parser_name))


COMMANDS = list(_commands())
#: what each command's help says it reads or writes (today's wording)
READS_WRITES = {
    "sweep": ["reads the config", "writes <results_dir>/<name>/"],
    "plan": ["Reads the config", "writes nothing"],
    "serve": ["Reads CONFIG", "Writes <results_dir or data/serving>/<name>/"],
    "report": ["reads its tables; writes nothing"],
    "simulate": ["Reads traces; writes --out (CSV)"],
    "traces": ["output .jsonl or .jsonl.gz (provenance JSON written beside it)"],
    "confidences": ["one of our trace files", "output JSONL.gz (a provenance JSON is written beside it)"],
    "clean": ["Delete cells' files in the config's results folder"],
    "codeedit": ["Print code-edit examples as JSON lines."],
    "train prepare": ["Write a training folder", "Reads the corpus packages"],
    "train fit": ["from a prepared folder and write one folder each", "manifest.json into --out"],
    "train check": ["on the folders in --models", "print one JSON line per method"],
    "train cards": ["Write <models>/README.md from each folder's sdlib_model.json"],
}


def test_top_level_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for c in SUBCOMMANDS:
        if c.parser_help is not None:
            assert c.parser_name in out
    assert "worker" not in out  # no help line: not listed


@pytest.mark.parametrize("argv", [a for a, _ in COMMANDS], ids=" ".join)
def test_command_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.strip()
    text = " ".join(out.split())
    for words in READS_WRITES.get(" ".join(argv), []):
        assert " ".join(words.split()) in text, (argv, words)


def test_every_command_reads_and_writes_are_checked():
    assert set(READS_WRITES) <= {" ".join(a) for a, _ in COMMANDS}


@pytest.mark.parametrize("argv, cls", COMMANDS, ids=[" ".join(a) for a, _ in COMMANDS])
def test_commands_are_args_dataclasses(argv, cls):
    """Each command is a dataclass whose fields are its parser's options, with argparse's defaults."""
    assert dataclasses.is_dataclass(cls) and cls.parser_name == argv[-1] and callable(cls.add_cli_args)
    parser = build_parser()
    for name in argv:  # down to the command's own parser (its options are added when it is first used)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name].add_command_args()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    options = {a.dest: a for a in parser._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))}
    assert set(fields) - {"command_line"} == set(options), argv
    for dest, a in options.items():
        f = fields[dest]
        if a.required or (not a.option_strings and a.nargs is None):
            assert f.default is dataclasses.MISSING, (argv, dest)
        else:
            assert f.default == a.default, (argv, dest, f.default, a.default)
    assert parser._defaults["command"] is cls


def test_from_cli_args_round_trips():
    args = build_parser().parse_args(["sweep", "x.yaml", "--batch-sizes", "1,8", "--no-summary", "--method", "a",
                                      "--method", "b"])
    cmd = args.command.from_cli_args(args)
    assert type(cmd).__name__ == "SweepCommand"
    assert (cmd.config, cmd.batch_sizes, cmd.summary, cmd.method, cmd.strict) == ("x.yaml", [1, 8], False,
                                                                                    ["a", "b"], False)
    args = build_parser().parse_args(["train", "fit", "--max-steps", "target=7", "--shares", "1,1,2,2"])
    cmd = args.command.from_cli_args(args)
    assert type(cmd).__name__ == "TrainFitCommand"
    assert cmd.max_steps == {"target": 7} and cmd.shares == {"target": 1, "draft": 1, "eagle": 2, "eagle3": 2}
    assert cmd.fit_config().max_steps == {"target": 7} and cmd.data == ".train"
    args = build_parser().parse_args(["simulate", "--traces", "reference", "--out", "t.csv", "--sample", "3"])
    cmd = args.command.from_cli_args(args)
    assert (cmd.traces, cmd.out, cmd.sample, cmd.policies, cmd.command_line) == (
        "reference", "t.csv", 3, "fixed,oracle,combine,online,baselines", [])
    assert dataclasses.replace(cmd) == cmd


def test_bad_command_line_is_one_line_in_every_command(capsys):
    """The commands that had their own argparse parsers answer in one line too (exit 2)."""
    for argv, says in ((["train", "fit", "--bogus"], "--bogus"), (["simulate", "--traces", "x"], "--out"),
                       (["codeedit", "x"], "invalid int value"), (["train", "nope"], "invalid choice")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: sdlib") and says in err, err


def test_no_importlib_in_the_command_line():
    for f in [REPO_ROOT / "sdlib" / "cli.py", *sorted((REPO_ROOT / "sdlib" / "commands").glob("*.py"))]:
        assert not re.search(r"\bimportlib\b|__import__", f.read_text()), f


def test_import_sdlib_cli_stays_light():
    """``import sdlib.cli`` imports no vLLM, torch or pandas (they load when a command runs)."""
    import subprocess
    import sys

    code = ("import sys, sdlib.cli; print(sorted(m for m in ('vllm', 'torch', 'pandas', 'transformers') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
