"""Shared test set-up: the lab's RDMA device and the event loops every async test runs on.

Tests that take the ``lab`` fixture need a real RDMA device and are marked
``rdma``. Without a device they fail (never skip): run them with
``./dev test``, which provides one, or deselect them with ``-m "not rdma"``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import pytest
import pytest_asyncio
import uvloop

import aiordma
from aiordma.lab.runner import native_environment


@dataclass(frozen=True)
class Lab:
    """Where the real RDMA device of this test run is."""

    device: str
    addr: str
    addr6: str | None


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rdma)


@pytest.fixture(scope="session")
def lab() -> Lab:
    env = dict(os.environ) if os.environ.get("AIORDMA_DEVICE") else native_environment()
    if not env or not env.get("AIORDMA_ADDR"):
        pytest.fail(
            "this test needs a real RDMA device and none was found: run the suite with "
            "'./dev test' (it boots the rxe lab when the host has no RDMA), or deselect "
            "device tests with -m 'not rdma'",
            pytrace=False,
        )
    device = env["AIORDMA_DEVICE"]
    if not os.path.exists(f"/sys/class/infiniband/{device}"):
        pytest.fail(f"AIORDMA_DEVICE={device} names no RDMA device on this host", pytrace=False)
    return Lab(device=device, addr=env["AIORDMA_ADDR"], addr6=env.get("AIORDMA_ADDR6"))


@pytest_asyncio.fixture
async def device(lab: Lab) -> AsyncIterator[aiordma.Device]:
    """The lab device, opened for one test on that test's loop."""
    async with aiordma.Device(lab.device) as dev:
        yield dev


@pytest_asyncio.fixture
async def pair(device: aiordma.Device) -> tuple[aiordma.QueuePair, aiordma.QueuePair]:
    """Two queue pairs on the lab device, connected to each other."""
    return await aiordma.connect_loopback_pair(device)
