"""A study peer for tests/benchmarks/test_peer.py: echoes each request."""

from __future__ import annotations

import asyncio
import sys

from benchmarks.peer import answer, requests


async def main() -> None:
    async for request in requests({"argv": sys.argv[2:]}):
        answer({"echo": request})


if __name__ == "__main__":
    asyncio.run(main())
