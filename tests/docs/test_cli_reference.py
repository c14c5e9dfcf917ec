"""The command-line reference names every subcommand, option and environment variable."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from aiordma.cli import build_parser

CLI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_command_and_option_is_documented() -> None:
    page = CLI_PAGE.read_text()
    missing = []
    for name, sub in _subparsers(build_parser()).items():
        if f"`aiordma {name}" not in page:
            missing.append(name)
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and f"`{option}" not in page:
                    missing.append(f"{name} {option}")
    assert missing == []


def test_every_environment_variable_is_documented() -> None:
    package = Path(__file__).resolve().parents[2] / "aiordma"
    read = {
        name
        for source in package.rglob("*.py")
        for name in re.findall(r"\bAIORDMA_[A-Z0-9_]+\b", source.read_text())
    }
    assert len(read) >= 5
    assert sorted(read - set(re.findall(r"AIORDMA_[A-Z0-9_]+", CLI_PAGE.read_text()))) == []
