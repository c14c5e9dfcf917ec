"""The README's Python snippets run as written, on the lab device."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import Lab

README = Path(__file__).resolve().parent.parent / "README.md"


def test_first_look_snippet_runs(lab: Lab) -> None:
    (snippet,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    proc = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "5"
