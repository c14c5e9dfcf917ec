"""Every program in the tutorial runs in the lab and prints what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Lab, run_python

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def programs() -> list[tuple[str, str]]:
    """Each ```python block with the ```text block that follows it (its output)."""
    pairs = re.findall(r"```python\n(.*?)```\n.*?```text\n(.*?)```", TUTORIAL.read_text(), re.S)
    return [(code, output) for code, output in pairs]


def test_the_page_has_five_programs_with_outputs() -> None:
    assert len(programs()) == 5
    assert TUTORIAL.read_text().count("```python") == 5


@pytest.mark.parametrize("index", range(5))
def test_program_prints_what_the_page_shows(lab: Lab, index: int) -> None:
    code, expected = programs()[index]
    code = code.replace('"192.0.2.1"', repr(lab.addr))
    proc = run_python(["-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr
    if "rxe0" in expected:
        expected = expected.replace("rxe0", lab.device)
    assert proc.stdout == expected
