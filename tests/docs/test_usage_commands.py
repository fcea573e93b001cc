"""docs/usage.md's command list names every command `ragen` has (it once left out `ragen export`), and no command
`ragen` lacks: the list and the command line are two copies of one list, so a test ties them."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from ragen_cli.main import app

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def _documented() -> set[str]:
    """The commands of the first code block of usage.md's "Command line" section: each line's `ragen <name>`."""
    section = USAGE.read_text().split("## Command line", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return {match.group(1) for match in re.finditer(r"^ragen ([a-z][a-z-]*)", block, re.MULTILINE)}


def test_the_usage_page_lists_every_command_of_the_command_line():
    commands = set(typer.main.get_command(app).commands)
    assert _documented() == commands
