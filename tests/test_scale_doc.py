"""docs/scale.md's numbers are a command's output: its fenced block is ``sdlib plan --paper-matrix --gpus
8,64,512`` printed now (so a change of the cost models, the calibration or the packing that moves a number fails
here until the page is regenerated), and every number its prose quotes (a decimal, a percentage, a count of
three digits or more) is in that output, or is the code constant it names."""

from __future__ import annotations

import re

from sdlib.cli import main
from sdlib.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "scale.md"
COMMAND = "sdlib plan --paper-matrix --gpus 8,64,512"


def _block(text: str) -> list[str]:
    m = re.search(r"^```text\n\$ " + re.escape(COMMAND) + r"\n(.*?)^```", text, flags=re.M | re.S)
    assert m, f"docs/scale.md: no ```text block starting with '$ {COMMAND}'"
    return m.group(1).rstrip("\n").splitlines()


def test_the_block_is_the_commands_output(capsys):
    assert main(COMMAND.split()[1:]) == 0
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    assert _block(DOC.read_text()) == printed, (
        f"docs/scale.md is not what `{COMMAND}` prints now: paste its output into the page")


def test_the_prose_quotes_only_the_output():
    from sdlib.store.files import _sha256

    text = DOC.read_text()
    block = "\n".join(_block(text))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    prose = re.sub(r"`[^`]*`", "", prose)
    constants = {str(_sha256.cache_info().maxsize)}  # the checksum cache the store section names
    quoted = re.findall(r"(?<![\w.])(\d+\.\d+|\d+%|\d{3,})(?![\w.]*\d)", prose)
    assert quoted, "the prose quotes no number: the test would check nothing"
    missing = [q for q in quoted if q not in constants and not re.search(rf"(?<![\d.]){re.escape(q)}(?![\d])", block)]
    assert not missing, f"docs/scale.md quotes numbers that the command does not print: {missing}"
