"""Start a coroutine now, and make a task of it only if it suspends.

A small RPC handler usually finishes without waiting for anything (with
the message channel's fast paths, even its reply goes out without a task
switch). Creating a task for it costs a loop iteration before it starts
and another wake-up to finish it. Python 3.12 has eager tasks for this;
3.11, which Debian's pyverbs is built for, does not, so this module steps
the coroutine once by hand and, if it suspended, hands it to a task that
goes on driving it exactly as a task would have.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any


def start_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]
) -> asyncio.Task[None] | None:
    """Run ``coro`` until it first suspends: None if it finished, else the
    task now running the rest (in the same copy of the context)."""
    context = contextvars.copy_context()
    try:
        yielded = context.run(coro.send, None)
    except StopIteration:
        return None
    except Exception as exc:  # a bug: report it as a failed task would be
        loop.call_exception_handler({"message": "eagerly started coroutine failed",
                                     "exception": exc})  # fmt: skip
        return None
    return loop.create_task(_resume(coro, yielded), context=context)


async def _resume(coro: Coroutine[Any, Any, None], yielded: Any) -> None:
    """Drive ``coro`` from where it suspended on ``yielded`` (what its await gave up)."""
    while True:
        value: Any = None
        error: BaseException | None = None
        try:
            if yielded is None:  # a bare yield: let the loop turn once
                await asyncio.sleep(0)
            else:
                # The coroutine marked the future it gave up as being waited
                # for, which a task clears on receiving it; so must we, or
                # awaiting it again is refused.
                yielded._asyncio_future_blocking = False
                value = await yielded
        except BaseException as exc:  # the coroutine decides what it means
            error = exc
        try:
            yielded = coro.throw(error) if error is not None else coro.send(value)
        except StopIteration:
            return
