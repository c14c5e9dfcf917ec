"""Tasks nobody awaits, kept referenced until they end (the loop holds only weak ones)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

_background: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` on the running loop as a task of its own."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


def consume_outcome(fut: asyncio.Future[Any]) -> None:
    """A done-callback for work nobody awaits: its failure is no news."""
    if not fut.cancelled():
        fut.exception()
