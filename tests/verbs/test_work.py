"""The work engine's records (aiordma/verbs/_work.py): how one posted work
request reports its outcome, to a future or to a callback. Host tests: no
device is involved until the engine posts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiordma.verbs._work import Completer, Unsignalled, Work, total_length


class Engine(Completer):
    """A completer that records what it is handed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        Completer.__init__(self, loop)
        self.handed: list[tuple[Work, Any]] = []

    def complete(self, work: Work, wc: Any) -> None:
        self.handed.append((work, wc))


def test_total_length_adds_the_segments() -> None:
    class Seg:
        def __init__(self, length: int) -> None:
            self.length = length

    assert total_length((Seg(3), Seg(5))) == 8  # type: ignore[arg-type]
    assert total_length(()) == 0


@pytest.mark.asyncio
async def test_a_completion_goes_to_the_engine_that_made_the_work() -> None:
    engine = Engine(asyncio.get_running_loop())
    work = Work(engine, None, 0, (), 8, False)
    work.complete("wc")
    assert engine.handed == [(work, "wc")]


@pytest.mark.asyncio
async def test_a_future_is_resolved_once_and_a_later_failure_is_ignored() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    work = Work(Engine(loop), future, 0, (), 8, False)
    assert not work.settled
    work.succeed(8, "result")  # type: ignore[arg-type]
    work.fail(RuntimeError("late"))
    assert work.settled
    assert future.result() == "result"


@pytest.mark.asyncio
async def test_a_quiet_failure_is_marked_retrieved() -> None:
    loop = asyncio.get_running_loop()
    quiet: asyncio.Future[Any] = loop.create_future()
    Work(Engine(loop), quiet, 0, (), 8, False).fail(RuntimeError("flushed"), quiet=True)
    assert isinstance(quiet.exception(), RuntimeError)
    assert not quiet._log_traceback  # no "never retrieved"


@pytest.mark.asyncio
async def test_a_callback_is_told_once_now_or_on_the_next_turn() -> None:
    loop = asyncio.get_running_loop()
    told: list[tuple[BaseException | None, int]] = []

    def done(exc: BaseException | None, n: int) -> None:
        told.append((exc, n))

    ok = Work(Engine(loop), None, 0, (), 8, False, done=done)
    ok.succeed(8, None)
    ok.succeed(8, None)
    ok.fail(RuntimeError("late"))
    assert told == [(None, 8)]
    assert ok.settled

    told.clear()
    error = RuntimeError("closed")
    later = Work(Engine(loop), None, 0, (), 8, False, done=done)
    later.fail(error, later=True)
    assert later.settled  # reported, though the callback runs on the next turn
    assert told == []
    await asyncio.sleep(0)
    assert told == [(error, 0)]


@pytest.mark.asyncio
async def test_a_callback_that_raises_goes_to_the_loops_exception_handler() -> None:
    loop = asyncio.get_running_loop()
    caught: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: caught.append(context))
    try:

        def done(exc: BaseException | None, n: int) -> None:
            raise ValueError("the callback's bug")

        Work(Engine(loop), None, 0, (), 8, False, done=done).succeed(8, None)
    finally:
        loop.set_exception_handler(None)
    assert [c["message"] for c in caught] == ["aiordma work callback failed"]
    assert isinstance(caught[0]["exception"], ValueError)


def test_every_nth_request_in_a_row_is_signalled_whatever_it_asks() -> None:
    account = Unsignalled(3)
    asked = [account.next(False) for _ in range(7)]
    assert asked == [True, True, False, True, True, False, True]  # unsignalled, ..., the 3rd not
    assert account.seq == 7
    assert account.next(True) is False  # asked for a signal: it gets one, and the run restarts
    assert [account.next(False), account.next(False), account.next(False)] == [True, True, False]
    account.next(False)
    account.refused()  # a refused post restarts the run too
    assert [account.next(False), account.next(False), account.next(False)] == [True, True, False]
    assert Unsignalled(0).every == 1  # a send queue of fewer entries than the fraction


@pytest.mark.asyncio
async def test_a_completion_settles_the_unsignalled_requests_before_it_in_order() -> None:
    engine = Engine(asyncio.get_running_loop())
    account = Unsignalled(8)
    works = []
    for _ in range(5):
        silent = account.next(False)
        work = Work(engine, None, 0, (), 8, False, -1, account.seq, silent)
        works.append(work)
        account.queue(work)
    assert account.is_tail(works[-1])
    assert not account.is_tail(works[0])
    assert account.settled(0) is None  # nothing was posted before position 1
    settled = []
    while (earlier := account.settled(3)) is not None:  # the completion of request 3
        settled.append(earlier)
    assert settled == works[:2]  # 1 and 2; 3, unsignalled, was its own (failed) completion
    assert account.settled(3) is None
    assert account.settled(9) is works[3]
    assert account.settled(9) is works[4]
    assert account.settled(9) is None
    assert not account.is_tail(works[4])
    account.queue(works[0])
    account.clear()
    assert account.settled(100) is None
    assert not account.is_tail(None)
