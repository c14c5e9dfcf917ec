"""Registered memory for the large frames a Dask comm receives.

A large frame is RDMA-read by the receiver into memory it registered. A
new buffer per frame would be registered per frame (in a guest that costs
more than the read of a megabyte) and faulted in page by page; a
:class:`LandingPool` instead keeps blocks of registered memory per device
and lends one to each large frame.

The frame handed to distributed is a view of a lease that holds its block:
the block goes back to the pool when the last view of the frame (a NumPy
array deserialized on it, a slice of that) is gone, from whatever thread
drops it. Until then the data lives there like any other array's. Blocks
come in power-of-two sizes; the pool holds at most ``capacity`` bytes, lent
or free, and a frame it cannot place lands in a fresh buffer as before.

Call order: ``take`` per frame; the frame's last reference going away gives
the block back; ``close`` releases the free blocks (lent ones go when their
frames do).
"""

from __future__ import annotations

import collections
import ctypes
import threading
import weakref
from typing import Any

from aiordma.channel import Access, Device, MemoryRegion, Segment

SMALLEST = 512 << 10
"""The smallest block: frames below this are copied through the channel's
slots (``medium_limit``) and need no registered memory of their own."""
DEFAULT_CAPACITY = 256 << 20
"""Bytes a device's pool holds at most, lent and free."""


def block_size(size: int) -> int:
    """The block a frame of ``size`` bytes lands in: the power of two that fits it."""
    return max(SMALLEST, 1 << (size - 1).bit_length())


class LandingPool:
    """Blocks of registered memory on one device, lent to large frames."""

    def __init__(self, device: Device, capacity: int = DEFAULT_CAPACITY) -> None:
        self._device = device
        self.capacity = capacity
        self._free: dict[int, list[MemoryRegion]] = collections.defaultdict(list)
        self._returned: collections.deque[MemoryRegion] = collections.deque()
        """Blocks whose frames are gone (appended from any thread)."""
        self._held = 0
        self._lent = 0
        self.closed = False

    @property
    def held(self) -> int:
        """Bytes of the pool's blocks, lent and free."""
        self._collect()
        return self._held

    @property
    def lent(self) -> int:
        """Blocks lent to frames that are still alive."""
        self._collect()
        return self._lent

    def take(self, size: int) -> tuple[memoryview, Segment] | None:
        """A writable frame of ``size`` bytes and the registered segment under
        it; None when the pool cannot place it (too large, or full)."""
        self._collect()
        wanted = block_size(size)
        if self.closed or wanted > self.capacity:
            return None
        free = self._free[wanted]
        if free:
            mr = free.pop()
        else:
            if self._held + wanted > self.capacity:
                self._shrink(self._held + wanted - self.capacity)
                if self._held + wanted > self.capacity:
                    return None
            mr = self._device.alloc(wanted, Access.LOCAL_WRITE)
            self._held += wanted
        self._lent += 1
        lease = (ctypes.c_ubyte * size).from_buffer(mr.obj)
        weakref.finalize(lease, self._returned.append, mr)
        return memoryview(lease).cast("B"), mr.segment(0, size)

    def _collect(self) -> None:
        returned = self._returned
        while returned:
            mr = returned.popleft()
            self._lent -= 1
            if self.closed or mr.closed:
                self._release(mr)
            else:
                self._free[mr.length].append(mr)

    def _shrink(self, wanted: int) -> None:
        """Release free blocks, largest first, until ``wanted`` bytes are gone or none is free."""
        for size in sorted(self._free, reverse=True):
            free = self._free[size]
            while free and wanted > 0:
                self._release(free.pop())
                wanted -= size

    def _release(self, mr: MemoryRegion) -> None:
        self._held -= mr.length
        if not mr.closed:
            mr.close()

    def close(self) -> None:
        """Release the free blocks; lent ones are released when their frames go."""
        self.closed = True
        self._collect()
        for free in self._free.values():
            while free:
                self._release(free.pop())


_pools: weakref.WeakKeyDictionary[Device, LandingPool] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def pool_for(device: Device, capacity: int = DEFAULT_CAPACITY) -> LandingPool:
    """The landing pool of ``device`` (one per device and process; ``capacity``
    applies from now on)."""
    with _lock:
        pool = _pools.get(device)
        if pool is None or pool.closed:
            pool = _pools[device] = LandingPool(device, capacity)
        pool.capacity = capacity
        return pool


def frame_for(
    device: Device, size: int, capacity: int = DEFAULT_CAPACITY
) -> tuple[Any, Segment | None]:
    """A frame of ``size`` bytes and, when it lies in registered memory (of a
    pool of at most ``capacity`` bytes), its segment."""
    placed = pool_for(device, capacity).take(size) if size >= SMALLEST and capacity else None
    if placed is None:
        from distributed.protocol.utils import host_array

        return host_array(size), None
    return placed
