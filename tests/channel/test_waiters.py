"""The tasks waiting on a channel side (no device): who a wake-up reaches."""

from __future__ import annotations

import asyncio

from aiordma.channel.waiters import Waiters


def test_a_wake_reaches_every_waiter_once_and_receivers_only_when_asked() -> None:
    loop = asyncio.new_event_loop()
    try:
        waiting = Waiters(loop)
        changed, arrivals = waiting.changed(), waiting.arrivals()
        cancelled = waiting.changed()
        cancelled.cancel()  # a task that gave up: skipped, not an error
        waiting.wake(False)
        assert changed.done()
        assert not arrivals.done()  # a message a hook took: no receiving task wakes
        assert (waiting.changes, waiting.receiving) == ([], [arrivals])
        later = waiting.changed()
        waiting.wake(True)
        assert arrivals.done()
        assert later.done()
        assert (waiting.changes, waiting.receiving) == ([], [])
        waiting.wake(True)  # nobody waits: nothing to do
    finally:
        loop.close()
