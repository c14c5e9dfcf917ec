"""Starting a coroutine eagerly and finishing it in a task only if it suspends (no device)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from aiordma.rpc._eager import start_eagerly

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")


@pytest.mark.asyncio
async def test_a_coroutine_that_never_suspends_finishes_before_returning() -> None:
    ran: list[str] = []

    async def handler() -> None:
        ran.append("all of it")

    assert start_eagerly(asyncio.get_running_loop(), handler()) is None
    assert ran == ["all of it"]


@pytest.mark.asyncio
async def test_a_suspended_coroutine_gets_results_and_errors_as_in_a_task() -> None:
    loop = asyncio.get_running_loop()
    value: asyncio.Future[int] = loop.create_future()
    failure: asyncio.Future[int] = loop.create_future()
    log: list[object] = []

    async def handler() -> None:
        log.append("started")
        log.append(await value)
        await asyncio.sleep(0)  # a bare yield in between
        try:
            await failure
        except KeyError as exc:
            log.append(exc.args[0])

    task = start_eagerly(loop, handler())
    assert task is not None
    assert log == ["started"]
    await asyncio.sleep(0)  # the task now waits on the still pending future
    value.set_result(7)
    failure.set_exception(KeyError("missing"))
    await asyncio.wait_for(task, 5)
    assert log == ["started", 7, "missing"]


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    cleaned: list[bool] = []

    async def handler() -> None:
        try:
            await never
        finally:
            cleaned.append(never.cancelled())

    task = start_eagerly(loop, handler())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_context_changes_stay_inside_the_call() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    inside: list[str] = []

    async def handler() -> None:
        seen.set("handler")
        await gate
        inside.append(seen.get())

    task = start_eagerly(loop, handler())
    assert task is not None
    assert seen.get() == ""  # the caller's context is untouched
    gate.set_result(None)
    await asyncio.wait_for(task, 5)
    assert inside == ["handler"]


@pytest.mark.asyncio
@pytest.mark.both_loops("exception handler")
async def test_a_failing_first_step_is_reported_not_raised() -> None:
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))

    async def handler() -> None:
        raise RuntimeError("bug")

    assert start_eagerly(loop, handler()) is None
    assert [str(e) for e in reported] == ["bug"]
