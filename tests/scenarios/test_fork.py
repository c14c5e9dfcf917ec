"""Registered memory and fork (lab device, asyncio and uvloop).

Dask's nannies start workers as child processes, and any program may run a
subprocess. Before Linux 5.13 a fork made the parent's registered pages
copy-on-write: the parent's next write moved its buffer to a new page while
the adapter kept using the old one, now the child's, and RDMA sent stale
data unless ``ibv_fork_init()`` had run first. The lab's kernel copies
pinned pages for the child at fork instead, which rdma-core reports as
"fork unneeded"; these tests pin that fact and what it guarantees.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from pyverbs import enums
from pyverbs.fork import is_fork_initialized

import aiordma
from aiordma import Access
from tests.conftest import Lab, Pair


def test_the_kernel_makes_fork_safe_without_ibv_fork_init(lab: Lab) -> None:
    assert is_fork_initialized() == enums.IBV_FORK_UNNEEDED


@pytest.mark.asyncio
@pytest.mark.both_loops("subprocess")
async def test_a_buffer_written_after_a_fork_is_sent_as_written(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    size = 1 << 20
    source = device.alloc(size)
    source.view()[:] = b"\x11" * size
    target = device.alloc(size, Access.REMOTE_WRITE)
    remote = target.remote()
    await a.rdma_write(source, remote)  # the pages are pinned and in use
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child keeps its copy mapped until the parent is done
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        source.view()[:] = b"\x22" * size  # with copy-on-write, a new page for the parent
        await a.rdma_write(source, remote)
        assert bytes(target.view()) == b"\x22" * size
    finally:
        os.close(write_end)
        _, status = await asyncio.to_thread(os.waitpid, child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
