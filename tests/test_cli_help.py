"""Every ``sdlib`` command answers ``--help`` (help strings are %-formatted by argparse)."""

import pytest

from sdlib.cli import DELEGATED, build_parser, main


def test_top_level_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in DELEGATED:
        assert name in out


@pytest.mark.parametrize("cmd", sorted(set(build_parser()._subparsers._group_actions[0].choices) - {"worker"}))
def test_command_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip()
