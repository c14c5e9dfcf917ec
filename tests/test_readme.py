"""The README's Python snippets run as written, on the lab device."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Lab, run_python

README = Path(__file__).resolve().parent.parent / "README.md"


EXPECTED = ["5", "hello, ada", "HI\n4194304"]
"""What each Python snippet of the README prints, in order."""


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_snippet_runs(lab: Lab, index: int) -> None:
    snippets = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(snippets) == len(EXPECTED)
    code = snippets[index].replace('"192.0.2.1"', repr(lab.addr))
    proc = run_python(["-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == EXPECTED[index]
