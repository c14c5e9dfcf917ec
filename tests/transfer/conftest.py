"""The transfer tests' agents on the lab device, and their two pools."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

import pytest
import pytest_asyncio

from aiordma import Access
from aiordma.transfer import Agent, DescriptorList, Peer, Registration, start_agent
from tests.conftest import Lab

RW = Access.REMOTE_READ | Access.REMOTE_WRITE


@pytest_asyncio.fixture
async def agents(lab: Lab) -> AsyncIterator[tuple[Agent, Agent]]:
    """A listening agent (whose pool is written and read) and one that dials it."""
    async with await start_agent(lab.addr) as target, await start_agent() as source:
        yield target, source


class Pools(NamedTuple):
    """The two sides of a transfer: the target's ``pool``, the source's
    ``local`` memory, ``remote`` (the pool's blocks as the source gets them)
    and ``peer`` (the target as the source knows it); unpacked in this
    order by the tests."""

    target: Agent
    source: Agent
    pool: Registration
    local: Registration
    remote: DescriptorList
    peer: Peer


@pytest.fixture
def pools(agents: tuple[Agent, Agent]) -> Callable[..., Pools]:
    """``pools(size, block, remote=RW)``: ``size`` bytes on each side, the
    target's exposed with ``remote`` and listed in blocks of ``block``."""
    target, source = agents

    def make(size: int, block: int, remote: Access = RW) -> Pools:
        pool = target.alloc(size, remote=remote)
        listed = DescriptorList.from_bytes(pool.blocks(block).to_bytes())
        local = source.alloc(size)
        return Pools(target, source, pool, local, listed, source.peer(target.metadata()))

    return make
