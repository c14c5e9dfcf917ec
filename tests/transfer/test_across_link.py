"""Transfer agents across the two-host lab's link: the KV pattern, and a cut link.

Host 2 runs the ``transfers`` study's target agent (a 64 MiB pool, its
lists printed, each notification printed with the SHA-256 of the 16 KiB
blocks as the target finds them then).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import aiordma
from aiordma.lab.remote import Fabric, PeerProcess
from aiordma.transfer import DescriptorList, start_agent
from tests.conftest import PEER_TIMEOUT, ROOT

RETRY_BOUND = aiordma.QueuePairOptions().retry_bound
MARGIN = 3.0
"""Seconds allowed beyond the bound: timers and wake-ups on emulated CPUs."""


@asynccontextmanager
async def target(fabric: Fabric) -> AsyncIterator[tuple[PeerProcess, dict[str, str]]]:
    """The study's target agent on host 2, and the lines it published."""
    argv = [sys.executable, "-m", "benchmarks.studies.transfers", "--serve", fabric.peer_addr]
    proc = fabric.start(argv, cwd=ROOT)
    try:
        async with asyncio.timeout(PEER_TIMEOUT):
            await proc.wait_for_output("ready")
        yield proc, dict(line.split(" ", 1) for line in proc.output().splitlines() if " " in line)
    finally:
        await proc.stop()


@pytest.mark.asyncio
async def test_kv_blocks_cross_the_link_and_the_note_follows_them(fabric: Fabric) -> None:
    async with target(fabric) as (proc, lines):
        blocks = DescriptorList.from_bytes(bytes.fromhex(lines["blocks16"]))
        async with await start_agent() as agent:
            peer = agent.peer(bytes.fromhex(lines["agent"]))
            staging = agent.alloc(blocks.nbytes)
            data = random.Random(7).randbytes(blocks.nbytes)
            staging.view()[:] = data
            local = staging.blocks(16 << 10)
            async with asyncio.timeout(PEER_TIMEOUT):
                await agent.write(peer, local, blocks, notify=b"request 1")
                out = await proc.wait_for_output("note " + b"request 1".hex())
            assert out.split()[-1] == hashlib.sha256(data).hexdigest()  # in place before the note
            back = agent.alloc(blocks.nbytes)
            order = random.Random(8).sample(range(len(blocks)), len(blocks))
            async with asyncio.timeout(PEER_TIMEOUT):
                await agent.read(peer, back.blocks(16 << 10), blocks.take(order))
            view = back.view()
            for i, j in enumerate(order):
                assert view[i * 16384 : (i + 1) * 16384] == data[j * 16384 : (j + 1) * 16384]


@pytest.mark.asyncio
async def test_a_cut_link_fails_a_transfer_within_the_retry_bound(fabric: Fabric) -> None:
    async with target(fabric) as (_, lines):
        whole = DescriptorList.from_bytes(bytes.fromhex(lines["whole"]))
        async with await start_agent() as agent:
            peer = agent.peer(bytes.fromhex(lines["agent"]))
            staging = agent.alloc(whole.nbytes)
            task = agent.start_read(peer, staging.blocks(whole.nbytes), whole)
            await asyncio.wait_for(peer.channel(), PEER_TIMEOUT)
            await fabric.link(False)
            cut = time.monotonic()
            try:
                with pytest.raises(aiordma.TransferError):
                    await asyncio.wait_for(task, RETRY_BOUND + MARGIN + PEER_TIMEOUT)
                failed = time.monotonic() - cut
            finally:
                await fabric.link(True)
            print(f"link cut: the transfer failed after {failed:.2f} s (bound "
                  f"{RETRY_BOUND:.2f} s)")  # fmt: skip
            assert failed <= RETRY_BOUND + MARGIN
            assert staging.mr.inflight == 0
