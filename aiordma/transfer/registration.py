"""Memory a transfer agent registered, and the descriptor lists of its blocks.

Made by :meth:`Agent.register <aiordma.transfer.Agent.register>` and
:meth:`Agent.alloc <aiordma.transfer.Agent.alloc>`; its :meth:`~Registration.blocks`
and :meth:`~Registration.descriptors` are what transfers and peers name.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Protocol

from aiordma._checks import check_int
from aiordma.channel import Access, MemoryRegion
from aiordma.exceptions import ResourceClosedError
from aiordma.transfer.descriptors import DescriptorList, RegionInfo

REMOTE = Access.REMOTE_READ | Access.REMOTE_WRITE
"""The access flags that expose memory to peers."""


class Owner(Protocol):
    """What a registration needs of its agent."""

    @property
    def id(self) -> int: ...

    def is_closing(self) -> bool: ...

    async def unregister(self, reg: Registration, /) -> None: ...


class Registration:
    """Memory an agent registered: what its descriptor lists name.

    Made by :meth:`Agent.register` / :meth:`Agent.alloc`; ended by
    :meth:`Agent.unregister` (or :meth:`aclose`).
    """

    def __init__(self, agent: Owner, mr: MemoryRegion) -> None:
        self.agent = agent
        """The agent that registered it."""
        self.mr = mr
        """The memory region (its ``view()`` is the memory)."""
        self.info = RegionInfo(mr.addr, mr.length, mr.lkey,
                               mr.rkey if mr.access & REMOTE else 0, int(mr.access))  # fmt: skip

    def __repr__(self) -> str:
        state = "unregistered" if self.mr.closed else repr(self.mr.access)
        return f"<Registration {self.mr.length} bytes at {self.mr.addr:#x} {state}>"

    def __len__(self) -> int:
        return self.mr.length

    def view(self) -> memoryview:
        """The registered memory, byte-wise (no copy)."""
        return self.mr.view()

    def blocks(self, size: int, count: int | None = None, *, offset: int = 0) -> DescriptorList:
        """``count`` blocks of ``size`` bytes back to back from ``offset`` (as many
        as fit by default): a pool of equal blocks, such as a KV cache's."""
        self._check_open()
        check_int("size", size)
        check_int("offset", offset)
        if count is not None:
            check_int("count", count)
        if size <= 0 or offset < 0:
            raise ValueError(f"block size {size} must be positive and offset {offset} "
                             "not negative")  # fmt: skip
        room = (self.mr.length - offset) // size if offset <= self.mr.length else 0
        if count is None:
            count = room
        if count < 1 or count > room:
            raise ValueError(f"{count} blocks of {size} bytes from offset {offset} do not fit "
                             f"the {self.mr.length}-byte registration")  # fmt: skip
        base = self.mr.addr + offset
        return DescriptorList.trusted(
            self.agent.id, (self.info,), array("Q", range(base, base + count * size, size)),
            array("Q", [size]) * count, array("I", bytes(4 * count)),
        )  # fmt: skip

    def descriptors(self, spans: Iterable[tuple[int, int]]) -> DescriptorList:
        """One block per ``(offset, length)`` of ``spans``; ValueError names one outside."""
        self._check_open()
        return DescriptorList.spans(self.agent.id, self.info, spans)

    def _check_open(self) -> None:
        if self.agent.is_closing():
            raise ResourceClosedError("the transfer agent is closed")
        if self.mr.closed:
            raise ResourceClosedError("this registration was unregistered")

    async def aclose(self) -> None:
        """:meth:`Agent.unregister` this registration."""
        await self.agent.unregister(self)
