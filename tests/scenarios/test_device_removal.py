"""Removing the RDMA device under live connections (lab device, restored afterwards).

``rdma link delete`` completes only once every process has released the
device, so the test also proves that aiordma lets go of everything it holds.
librdmacm (rdma-core 44 to 64) releases its own context on a removed device
only while another device exists, so a second rxe device on ``lo`` is kept
during the test.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import aiordma
from aiordma.cm import _rdmacm
from aiordma.cm._events import release_removed_device
from aiordma.verbs.discovery import find_roce_endpoint, list_devices
from tests.conftest import Lab

KEEPER = "rxe_keep"


def _rdma(*args: str) -> str:
    return subprocess.run(["rdma", *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout  # fmt: skip


def _netdev(device: str) -> str:
    link = next(row for row in json.loads(_rdma("-j", "link", "show")) if row["ifname"] == device)
    return str(link["netdev"])


async def _delete(device: str) -> None:
    """Delete ``device``, helping librdmacm in this process let go of it meanwhile."""
    proc = await asyncio.create_subprocess_exec("rdma", "link", "delete", device)
    release_removed_device(device)
    assert await asyncio.wait_for(proc.wait(), 60) == 0


@pytest_asyncio.fixture
async def removable(lab: Lab) -> AsyncIterator[None]:
    netdev = _netdev(lab.device)
    _rdma("link", "add", KEEPER, "type", "rxe", "netdev", "lo")
    try:
        yield
    finally:
        if find_roce_endpoint(list_devices(), device=lab.device) is None:
            _rdma("link", "add", lab.device, "type", "rxe", "netdev", netdev)
        _rdmacm.device_names()
        await _delete(KEEPER)
    # The GID table fills in after the link is added; sysfs offers no event to await.
    async with asyncio.timeout(30):
        while find_roce_endpoint(list_devices(), device=lab.device) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
@pytest.mark.usefixtures("removable")
async def test_removal_fails_connections_and_stops_the_server(lab: Lab) -> None:
    async def hold(conn: aiordma.Connection) -> None:
        await conn.wait_closed()

    server = await aiordma.start_server(hold, lab.addr, 0)
    serving = asyncio.create_task(server.serve_forever())
    conn = await aiordma.connect(lab.addr, server.addresses[0][1])
    (pending,) = await conn.post_recv_batch([conn.alloc(64)])
    remove = asyncio.create_task(_delete(lab.device))
    try:
        with pytest.raises(aiordma.ConnectionLostError, match="removed"):
            await asyncio.wait_for(pending, 30)
        with pytest.raises(aiordma.DeviceError, match="removed"):
            await asyncio.wait_for(serving, 30)
        await asyncio.wait_for(conn.wait_closed(), 30)
        await remove  # completes only once nothing holds the device any more
    finally:
        remove.cancel()
        async with asyncio.timeout(30), server:
            pass
    assert conn.closed
    assert conn.device.removed
    assert conn.device.closed
