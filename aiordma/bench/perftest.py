"""Running perftest (the C reference) on the same device, and reading its result table."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

from aiordma.bench.stats import Latency, Result

TOOLS = {
    "send_lat": "ib_send_lat",
    "write_lat": "ib_write_lat",
    "read_lat": "ib_read_lat",
    "write_bw": "ib_write_bw",
    "read_bw": "ib_read_bw",
    "send_rate": "ib_send_bw",
    "msg_lat": "ib_send_lat",
    "msg_reg_lat": "ib_send_lat",
    "msg_bw": "ib_write_bw",
    "msg_into_bw": "ib_write_bw",
    "msg_rate": "ib_send_bw",
    "msg_reg_bw": "ib_write_bw",
    "xfer_read": "ib_read_bw",
    "xfer_write": "ib_write_bw",
}
"""The perftest tool that measures what each aiordma mode measures."""

EVENTS = frozenset({"send_lat", "msg_lat", "msg_reg_lat"})
"""Modes also compared with their tool run with ``-e``: waiting for each
completion on the completion channel, as an awaited design must, instead of
busy polling (the C floor for any event-driven round trip)."""
EVENTS_TOOL = "perftest-e"
"""The :attr:`Result.tool` of a run with ``-e``."""


def parse_row(output: str) -> list[str] | None:
    """The first row of perftest's result table (it starts with the message size)."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) > 3 and re.fullmatch(r"\d+", fields[0]) and re.fullmatch(r"\d+", fields[1]):
            return fields
    return None


def to_result(mode: str, row: list[str], depth: int, tool: str = "perftest") -> Result:
    """A perftest row as a :class:`Result`.

    Latency tools report half a round trip: ``extra['one_way']`` keeps that,
    and the latency figures are doubled so they compare with an awaited
    operation (post, then its completion: a full round trip).
    """
    size, iterations = int(row[0]), int(row[1])
    if mode.endswith("_lat"):
        # bytes, iterations, t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9%
        typical, avg, p99, p999 = (float(row[i]) for i in (4, 5, 7, 8))
        latency = Latency(2 * typical, 2 * p99, 2 * p999, 2 * avg)
        return Result(tool, mode, size, 1, iterations, iterations * avg * 2e-6, latency,
                      {"one_way_typical_us": typical})  # fmt: skip
    # bytes, iterations, BW peak [MB/s], BW average [MB/s], MsgRate [Mpps].
    # Bandwidth has two decimals and the rate six: a short run of small
    # messages prints 0.00 MB/s, a run of large ones 0.000044 Mpps. The time
    # comes from whichever figure carries more significant digits.
    average, mpps = float(row[3]), float(row[4])
    if mpps * 1e4 > average and mpps > 0:
        seconds = iterations / (mpps * 1e6)
    elif average > 0:
        seconds = size * iterations / (average * 1e6)
    else:
        seconds = math.inf
    return Result(tool, mode, size, depth, iterations, seconds, None,
                  {"msg_rate_mpps": mpps})  # fmt: skip


PORT = 18515
"""The port perftest's first server listens on (each retry takes the next:
a server left hanging by a failed attempt cannot catch its successor's client)."""


def client_timeout(size: int, iterations: int) -> float:
    """Seconds one perftest client run may take before it is given up: 30 s
    for the connection, plus 10 ms per iteration and its bytes at 5 MB/s,
    both far slower than the slowest lab link (a hung client, which the
    two-host lab's link now and then causes, is retried the sooner)."""
    return 30.0 + iterations * (0.01 + 2 * max(size, 4096) / 5e6)


ATTEMPTS = 3
"""Server and client pairs tried before a reference row is given up (across
the two-host lab's link a perftest client now and then hangs or fails)."""


def _no_result(tool: str, why: str) -> None:
    print(f"aiordma bench: {tool} gave no result: {why}", file=sys.stderr, flush=True)


def start_local(argv: list[str]) -> Callable[[], None]:
    """Start perftest's server here; returns what stops it."""
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop() -> None:
        server.kill()
        server.wait()

    return stop


def run(
    mode: str,
    device: str,
    addr: str,
    size: int,
    iterations: int,
    depth: int,
    start_server: Callable[[list[str]], Callable[[], None]] = start_local,
    events: bool = False,
) -> Result | None:
    """Run the matching perftest server (``start_server``: here, by
    default) and client (over rdma_cm, to ``addr``); None if unavailable.
    With ``events`` (modes in :data:`EVENTS`) both wait on completion events."""
    tool = TOOLS.get(mode)
    if tool is None or shutil.which(tool) is None or (events and mode not in EVENTS):
        return None
    base = [tool, "-d", device, "-R", "-F", "-s", str(size), "-n", str(iterations)]
    if events:
        base.append("-e")
    if not mode.endswith("_lat"):
        base += ["-t", str(depth)]
    for attempt in range(ATTEMPTS):
        argv = [*base, "-p", str(PORT + attempt)]
        output = _client_output(tool, argv, addr, start_server, client_timeout(size, iterations))
        row = None if output is None else _figures(tool, mode, output)
        if row is not None:
            return to_result(mode, row, depth, EVENTS_TOOL if events else "perftest")
        if attempt + 1 < ATTEMPTS:
            print(f"aiordma bench: running {tool} again", file=sys.stderr, flush=True)
    return None


def _figures(tool: str, mode: str, output: str) -> list[str] | None:
    """The result row of a client that exited 0, if it holds a figure:
    None (saying why, with the output's end) for a missing table or for a
    row of zeros, which perftest prints when its run measured nothing."""
    row = parse_row(output)
    tail = " | ".join(output.strip().splitlines()[-4:])
    if row is None:
        _no_result(tool, f"it exited 0 with no result table ({tail[-300:]})")
        return None
    figures = [row[5]] if mode.endswith("_lat") else [row[3], row[4]]
    if all(float(figure) == 0 for figure in figures):
        _no_result(tool, f"it exited 0 but measured nothing: its row is {' '.join(row)}")
        return None
    return row


def _client_output(
    tool: str,
    base: list[str],
    addr: str,
    start_server: Callable[[list[str]], Callable[[], None]],
    timeout: float,
) -> str | None:
    """One perftest server and its client's output (None: no result)."""
    stop = start_server(base)
    try:
        for _ in range(50):  # the server needs a moment to listen; the client retries
            try:
                client = subprocess.run(
                    [*base, addr], capture_output=True, text=True, timeout=timeout,
                    check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                _no_result(tool, f"its client did not finish within {timeout:.0f} s")
                return None
            if client.returncode == 0:
                return client.stdout
            time.sleep(0.2)
        _no_result(tool, client.stderr.strip()[-300:] or f"exit status {client.returncode}")
        return None
    finally:
        stop()
