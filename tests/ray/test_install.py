"""Without Ray, importing the transport says what to install (no device needed)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_transport_without_ray_names_the_extra() -> None:
    code = "import sys; sys.modules['ray'] = None; import aiordma.ray"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'aiordma[ray]'" in proc.stderr
