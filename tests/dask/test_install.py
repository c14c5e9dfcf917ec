"""Without distributed, importing the backend says what to install (no device needed)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_backend_without_distributed_names_the_extra() -> None:
    code = "import sys; sys.modules['distributed'] = None; import aiordma.dask"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'aiordma[dask]'" in proc.stderr
