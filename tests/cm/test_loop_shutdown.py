"""A loop that ends with connections open or closing still shuts down (lab device).

``asyncio.run`` ends by cancelling every task left and waiting for them.
distributed's ``check_rpc_with_many_connections`` on ``rdma://`` hung
there (issue 41): a connection's close had started from a callback in the
loop's last turn, its task was cancelled before its first step, so its
body never ran, and the server's handler waiting for that close never
ended. Each run here ends its loop with closes started that way, others
started normally, and connections and the server left open, a few times
in a row, in a process of its own (a hang must not take the suite with it).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import Lab, run_python

SCRIPT = """
import asyncio, sys
import uvloop
import aiordma

ADDR, LOOP, ROUNDS, N = sys.argv[1], sys.argv[2], int(sys.argv[3]), 6


async def main() -> None:
    accepted = []
    ready = asyncio.Event()

    async def hold(conn):
        accepted.append(conn)
        if len(accepted) == N:
            ready.set()
        await conn.wait_closed()

    server = await aiordma.start_server(hold, ADDR, 0)
    port = server.addresses[0][1]
    clients = [await aiordma.connect(ADDR, port) for _ in range(N)]
    await asyncio.wait_for(ready.wait(), 60)
    loop = asyncio.get_running_loop()
    for conn in accepted[::2]:
        loop.call_soon(conn.close)  # its task is made in the loop's last turn
    for conn in clients[1::3]:
        conn.close()


factory = uvloop.new_event_loop if LOOP == "uvloop" else asyncio.new_event_loop
for _ in range(ROUNDS):
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
print("ended", flush=True)
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_loop_ending_with_connections_open_or_closing_shuts_down(lab: Lab, loop: str) -> None:
    try:
        proc = run_python(["-c", SCRIPT, lab.addr, loop, "3"], timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the loop's shutdown hung: {exc.stderr!r}", pytrace=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ended"]
    assert "Task was destroyed but it is pending" not in proc.stderr
    assert "was never awaited" not in proc.stderr
