"""Importing the transport (no device needed): without Ray it says what to
install; with Ray, Ray is imported only once its manager is used."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_transport_without_ray_names_the_extra() -> None:
    code = "import sys; sys.modules['ray'] = None; import aiordma.ray"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'aiordma[ray]'" in proc.stderr


def test_exchanging_arrays_without_ray_leaves_ray_unimported() -> None:
    """Ray's import takes seconds (minutes on a loaded guest): a process that
    only exchanges arrays, as a producer outside Ray does, never pays it."""
    code = (
        "import sys, aiordma.ray as r; r.ArrayExchange; print('ray' in sys.modules); "
        "r.AiordmaTransport; print('ray' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
