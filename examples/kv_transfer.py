"""KV-cache blocks from a prefill process into a decode process's pool, with transfer agents.

    python examples/kv_transfer.py decode HOST [--blocks N]
    python examples/kv_transfer.py prefill AGENT BLOCKS

The decode process registers a pool of equal blocks that peers may write,
picks ``N`` free blocks (scattered, in any order) for a request, and prints
two lines: its agent's metadata and those blocks' descriptor list, both in
hex (a real server would send them through its RPC or HTTP API). It then
waits for the request's notification and checks every block.

The prefill process writes its ``N`` blocks into those places with one
``write`` and a notification, which the decode side receives only after
the data is in place; then it reads the first blocks back to show reads.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random

from aiordma import Access
from aiordma.transfer import DescriptorList, start_agent

BLOCK = 4096
POOL = 2048


def block_bytes(request: int, index: int) -> bytes:
    """What block ``index`` of a request holds (so the decode side can check it)."""
    seed = hashlib.sha256(f"{request}:{index}".encode()).digest()
    return seed * (BLOCK // len(seed))


async def decode(host: str, blocks: int) -> None:
    async with await start_agent(host) as agent:
        pool = agent.alloc(BLOCK * POOL, remote=Access.REMOTE_WRITE | Access.REMOTE_READ)
        slots = random.sample(range(POOL), blocks)  # the request's blocks, scattered
        print("agent", agent.metadata().hex())
        print("blocks", pool.blocks(BLOCK).take(slots).to_bytes().hex(), flush=True)
        note = await agent.next_notification(b"request 1 ready", timeout=60)
        view = pool.view()
        bad = [i for i, slot in enumerate(slots)
               if view[slot * BLOCK : (slot + 1) * BLOCK] != block_bytes(1, i)]  # fmt: skip
        print(f"request 1: {blocks} blocks from agent {note.peer.id:#x}, "
              f"{blocks - len(bad)} verified", flush=True)  # fmt: skip
        # The prefill side reads a few blocks back before it leaves: wait for it.
        await agent.next_notification(b"request 1 read back", timeout=60)


async def prefill(metadata: str, blocks_hex: str) -> None:
    async with await start_agent() as agent:
        remote = DescriptorList.from_bytes(bytes.fromhex(blocks_hex))
        staging = agent.alloc(BLOCK * len(remote))
        view = staging.view()
        for i in range(len(remote)):
            view[i * BLOCK : (i + 1) * BLOCK] = block_bytes(1, i)
        peer = agent.peer(bytes.fromhex(metadata))
        local = staging.blocks(BLOCK)
        await agent.write(peer, local, remote, notify=b"request 1 ready", timeout=60)
        print(f"wrote {len(remote)} blocks ({local.nbytes} bytes) in one transfer")
        back = agent.alloc(BLOCK * 8)
        await agent.read(peer, back.blocks(BLOCK), remote[:8], notify=b"request 1 read back")
        same = back.view()[:] == view[: BLOCK * 8]
        print("read back 8 blocks:", "same" if same else "DIFFERENT", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    d = sub.add_parser("decode")
    d.add_argument("host")
    d.add_argument("--blocks", type=int, default=1000)
    p = sub.add_parser("prefill")
    p.add_argument("agent")
    p.add_argument("blocks")
    args = parser.parse_args()
    if args.role == "decode":
        asyncio.run(decode(args.host, args.blocks))
    else:
        asyncio.run(prefill(args.agent, args.blocks))


if __name__ == "__main__":
    main()
