"""Record 0022: how fast rxe carries SEND/RECV of one stream's piece sizes (8, 32 and
64 KiB), busy-polling and waiting on events (``-e``), 8 and 32 in flight; then the
stream of stream_cpu.py with 8 KiB and 32 KiB buffers, alternated twice.

    aiordma lab -- .venv/bin/python benchmarks/records/0022-stream-cost/rxe_pieces.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from aiordma.bench import perftest

ADDR = os.environ.get("AIORDMA_ADDR", "192.0.2.1")
STREAM = Path(__file__).with_name("stream_cpu.py")


def ib_send_bw(size: int, depth: int, events: bool) -> str:
    """perftest's average MB/s for ``size``-byte sends, ``depth`` in flight."""
    argv = ["ib_send_bw", "-d", "rxe0", "-R", "-F", "-s", str(size), "-t", str(depth),
            "-n", str(max(800, (8 << 20) // size)), "-p", "18600"]  # fmt: skip
    if events:
        argv.append("-e")
    output = perftest._client_output("ib_send_bw", argv, ADDR, perftest.start_local, 120)
    row = perftest.parse_row(output or "")
    return row[3] if row else "?"  # bytes, iterations, peak, average, rate


def main() -> None:
    for size in (8192, 32768, 65536):
        for depth in (8, 32):
            busy, events = ib_send_bw(size, depth, False), ib_send_bw(size, depth, True)
            print(f"ib_send_bw {size:6d} B, {depth:2d} in flight: {busy} MB/s busy, "
                  f"{events} MB/s with -e", flush=True)  # fmt: skip
    for _ in range(2):
        for buffers in (8192, 32768):
            print(f"stream, buffers of {buffers} B: ", end="", flush=True)
            env = {**os.environ, "BUFFER_SIZE": str(buffers), "SECONDS": "4"}
            subprocess.run([sys.executable, str(STREAM)], env=env, check=True)


main()
