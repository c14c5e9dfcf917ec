"""The loop check every per-message operation makes (host only: no device).

It runs compiled or pure (``AIORDMA_PURE=1``); both must refuse a call
from another loop even once a loop has been confirmed in the thread.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from aiordma.exceptions import WrongLoopError
from aiordma.lifecycle import check_loop


def test_a_call_from_no_running_loop_is_refused() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(WrongLoopError, match="another event loop"):
            check_loop(loop)
    finally:
        loop.close()


def test_the_running_loop_passes_and_another_is_refused() -> None:
    other = asyncio.new_event_loop()

    async def main() -> None:
        check_loop(asyncio.get_running_loop())
        check_loop(asyncio.get_running_loop())  # the confirmed loop: the quick answer
        with pytest.raises(WrongLoopError):
            check_loop(other)

    try:
        asyncio.run(main())
    finally:
        other.close()


def test_a_loop_confirmed_earlier_in_the_thread_is_refused_once_it_stopped() -> None:
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(_check_running())
        # The first loop was confirmed in this thread, but no longer runs:
        # a call for it from a second loop's task is not taken as its own.
        with pytest.raises(WrongLoopError):
            asyncio.run(_check(first))
    finally:
        first.close()


def test_a_loop_confirmed_in_another_thread_is_refused_here() -> None:
    ready, release = threading.Event(), threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve() -> None:
        check_loop(asyncio.get_running_loop())
        loops.append(asyncio.get_running_loop())
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(10)
        # The other thread's loop runs, and was confirmed there: not from here.
        with pytest.raises(WrongLoopError):
            asyncio.run(_check(loops[0]))
    finally:
        release.set()
        thread.join(10)
    assert not thread.is_alive()


async def _check_running() -> None:
    check_loop(asyncio.get_running_loop())


async def _check(loop: asyncio.AbstractEventLoop) -> None:
    check_loop(loop)
