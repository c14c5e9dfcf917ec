"""rdma_cm bookkeeping: many connections come and go without leaving anything behind."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import aiordma
from tests.conftest import Lab, open_fds, rdma_counts


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
@pytest.mark.parametrize("cycles", [50, pytest.param(500, marks=pytest.mark.slow)])
async def test_connect_close_cycles_leave_nothing_behind(lab: Lab, cycles: int) -> None:
    """Each cycle's cm_id, queue pair, memory and descriptors go at its
    close: 50 cycles show a leak of one per cycle fifty times over; 500 (a
    soak, ``--slow``) give rarer interleavings, such as a client closing
    during the server's set-up of its connection, their chance."""
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
        for _ in range(cycles):
            await cycle(port)
        await settle(1 + cycles)
        assert not server.connections
        assert open_fds() == fds
        assert rdma_counts(lab.device) == counts
