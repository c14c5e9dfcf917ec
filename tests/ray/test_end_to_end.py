"""Ray end to end in the lab: a head, a producer and a consumer actor, the example as users run it.

In the slow set (``./dev test --slow``): Ray's start, imports and actors take
minutes under the lab's emulation.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Lab

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_transfer.py"
SIZES_KIB = [1, 1024, 16384, 65536]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_actors_pull_arrays_by_rdma_read(lab: Lab) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--device", lab.device, "--auth",
         "--sizes", *map(str, SIZES_KIB)],
        capture_output=True, text=True, timeout=1100,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    for kib in SIZES_KIB:
        assert re.search(rf"^{kib} KiB: consumer ok, driver ok", out.stdout, re.M), out.stdout
    packets = re.search(r"rxe packets received: (\d+) for (\d+) bytes read", out.stdout)
    assert packets is not None, out.stdout
    received, moved = int(packets[1]), int(packets[2])
    assert received >= moved // 4096  # every byte came in RDMA READ responses of at most 4 KiB
    held = re.search(r"registrations held: (\d+) while referenced, (\d+) once freed", out.stdout)
    assert held is not None, out.stdout
    assert int(held[1]) == len(SIZES_KIB)
    assert int(held[2]) == 0
    # Issue 62: the process outlives Ray's report of its death; read after it, the read fails.
    assert re.search(r"^producer process gone [\d.]+ s after", out.stdout, re.M), out.stdout
    assert re.search(r"^killed producer: \w*(Error|Died)", out.stdout, re.M), out.stdout
