"""rdma_cm bookkeeping: many connections come and go without leaving anything behind."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import aiordma
from tests.conftest import Lab, open_fds, rdma_counts

CYCLES = 500


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_connect_close_cycles_leave_nothing_behind(lab: Lab) -> None:
    handled = 0
    changed = asyncio.Event()

    async def hold(conn: aiordma.Connection) -> None:
        nonlocal handled
        await conn.wait_closed()  # the server has forgotten the connection by now
        handled += 1
        changed.set()

    async def cycle(port: int) -> None:
        conn = await aiordma.connect(lab.addr, port)
        conn.alloc(4096)
        await conn.close()

    async with await aiordma.start_server(hold, lab.addr, 0) as server:
        port = server.addresses[0][1]

        def settled(connections: int) -> bool:
            # On a busy machine a client may close before the server's set-up
            # of its connection ends: that one ends in the server's
            # setup_failed count and never reaches the handler.
            failed: int = server.stats().get("setup_failed", 0)
            return handled + failed >= connections

        async def settle(connections: int) -> None:
            # The server learns of a connection, and of its disconnect, a
            # moment after the client's connect and close return. A failed
            # set-up sets no event, so the count is looked at again each second.
            async with asyncio.timeout(60):
                while not settled(connections):
                    changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), 1)

        await cycle(port)  # opens the shared device and this loop's completion queue
        await settle(1)
        fds, counts = open_fds(), rdma_counts(lab.device)
        for _ in range(CYCLES):
            await cycle(port)
        await settle(1 + CYCLES)
        assert not server.connections
        assert open_fds() == fds
        assert rdma_counts(lab.device) == counts
