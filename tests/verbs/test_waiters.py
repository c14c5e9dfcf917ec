"""How a completion queue waits (aiordma/verbs/_waiters.py, ``auto`` deciding
by aiordma/verbs/_waiting.py): on the host with a fake driver, loop and
clock, then on the lab device (compiled and pure)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

import aiordma
from aiordma import Access, rpc
from aiordma.verbs._waiters import (
    SPIN_SLICE,
    AutoSpinner,
    FixedWindow,
    Sleeper,
    Waiter,
    waiter_for,
)
from aiordma.verbs._waiting import AUTO_CAP, AUTO_START, Polling, WaitPolicy
from aiordma.verbs.completion import CompletionQueue, set_polling
from tests.conftest import Lab, Pair, run_peer, run_python

BUDGET = 8


class _Completion:
    """A handler that records its completion."""

    def __init__(self, done: list[int], wr_id: int) -> None:
        self._done, self._wr_id = done, wr_id

    def complete(self, wc: object) -> None:
        self._done.append(self._wr_id)


class FakeDriver:
    """A CQ on a fake clock: receive completions land at the times the test
    sets, :meth:`spin` advances the clock, an event is pending whenever an
    armed CQ got a completion. Counts what a real driver counts."""

    compiled = False

    def __init__(self) -> None:
        self.now = 0.0
        self.armed = False
        self.polling = False
        self.received = 0
        self.arms = 0
        self.event = False
        self.due: list[tuple[float, int]] = []  # (time, wr_id), in order
        self.landed: list[int] = []
        self.done: list[int] = []
        self.handlers: dict[int, Any] = {}
        self.more: Callable[[], None] = lambda: None
        self.served = 0

    def clock(self) -> float:
        return self.now

    def answer(self, after: float, wr_id: int) -> None:
        """A receive of ``wr_id`` lands ``after`` seconds from now."""
        self.handlers[wr_id] = _Completion(self.done, wr_id)
        self.due.append((self.now + after, wr_id))
        self.due.sort()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while self.due and self.due[0][0] <= self.now:
            self.landed.append(self.due.pop(0)[1])
            if self.armed:
                self.event = True

    def attach(self, handlers: dict[int, Any], report: Any, budget: int, more: Any) -> None:
        self.handlers, self.more = handlers, more

    def on_readable(self) -> None:
        self.serve(True)

    def serve(self, event: bool) -> int:
        self.served += 1
        if event:
            self.take_event()
        handled, empty = self.drain(self.handlers, BUDGET, None)
        if empty and not self.armed and not self.polling:
            self.req_notify()
            more, empty = self.drain(self.handlers, BUDGET, None)
            handled += more
        if not empty:
            self.more()  # the budget is spent: the rest on the loop's next turn
        return handled

    def take_event(self) -> bool:
        had, self.event = self.event, False
        if had:
            self.armed = False
        return had

    def req_notify(self) -> None:
        self.armed = True
        self.arms += 1
        if self.landed:
            self.event = True

    def drain(self, handlers: dict[int, Any], budget: int, report: Any) -> tuple[int, bool]:
        count = 0
        while self.landed and count < budget:
            wr_id = self.landed.pop(0)
            handlers.pop(wr_id).complete(None)
            self.received += 1
            count += 1
        return count, not self.landed

    def spin(self, seconds: float) -> bool:
        target = self.now + seconds
        if self.due and self.due[0][0] <= target:
            self.advance(self.due[0][0] - self.now)
            return True
        self.advance(seconds)
        return False

    def detach(self) -> None:
        pass


class FakeLoop:
    """The loop's ``call_soon``, run by the test; time passes only in the driver."""

    def __init__(self, driver: FakeDriver) -> None:
        self.soon: list[Callable[[], None]] = []
        self.driver = driver

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def run(self, turn: float = 10e-6, most: int = 10_000) -> int:
        """Run callbacks until none is left, each turn taking ``turn`` seconds; how many ran."""
        ran = 0
        while self.soon and ran < most:
            callback = self.soon.pop(0)
            callback()
            self.driver.advance(turn)
            ran += 1
        assert not self.soon, "the loop never went idle"
        return ran


def _auto(cap: float = AUTO_CAP) -> tuple[AutoSpinner, FakeDriver, FakeLoop]:
    driver = FakeDriver()
    loop = FakeLoop(driver)
    waiter = AutoSpinner(driver, loop, driver.handlers, None, BUDGET, driver.clock,  # type: ignore[arg-type]
                         WaitPolicy(cap, cpus=2), SPIN_SLICE)  # fmt: skip
    driver.attach(driver.handlers, None, BUDGET, waiter.yield_drain)
    driver.req_notify()
    return waiter, driver, loop


def test_each_setting_chooses_its_waiter_once() -> None:
    driver = FakeDriver()
    loop = FakeLoop(driver)
    made = {
        mode: waiter_for(Polling.parse(mode), driver, loop, {}, None, BUDGET)  # type: ignore[arg-type]
        for mode in ("off", "auto", "250")
    }
    assert [type(w) for w in made.values()] == [Sleeper, AutoSpinner, FixedWindow]
    assert [(w.polls, w.expects) for w in made.values()] == [
        (False, False), (False, WaitPolicy().enabled), (True, True),
    ]  # fmt: skip
    assert made["off"].reader == driver.on_readable  # off: the driver serves each wake-up


def test_an_answer_within_the_window_is_a_hit_and_the_queue_then_arms() -> None:
    waiter, driver, loop = _auto()
    reader = waiter.reader
    driver.answer(100e-6, 1)
    waiter.expect()
    assert waiter.spinning
    assert driver.polling
    loop.run()
    assert driver.done == [1]
    counts = waiter.counts()
    assert (counts["spins"], counts["hits"], counts["misses"]) == (1, 1, 0)
    assert 0 < counts["spun_seconds"] < AUTO_START
    assert not waiter.spinning
    assert not driver.polling
    assert waiter.reader == reader  # one reader for the descriptor, never swapped


def test_a_miss_is_timed_by_the_reader_and_grows_the_limit() -> None:
    waiter, driver, loop = _auto()
    driver.answer(AUTO_START + 200e-6, 1)  # after the first window, within the cap
    waiter.expect()
    loop.run()
    counts = waiter.counts()
    assert (counts["hits"], counts["misses"], counts["late"]) == (0, 1, 0)
    assert driver.armed
    assert not driver.done
    driver.advance(300e-6)
    assert driver.event  # the descriptor became readable: the loop calls the reader
    waiter.reader()
    assert driver.done == [1]
    counts = waiter.counts()
    assert counts["late"] == 1  # a near miss: the limit grows to meet it
    assert counts["limit_seconds"] > AUTO_START


def test_a_send_from_the_spins_own_drain_is_spun_for_not_counted_a_miss() -> None:
    waiter, driver, loop = _auto()
    answered: list[int] = []

    class Replying:
        def complete(self, wc: object) -> None:  # the request is handled: a reply goes
            answered.append(1)
            driver.answer(50e-6, 2)
            waiter.expect()

    driver.handlers[1] = Replying()
    driver.due.append((driver.now + 50e-6, 1))
    waiter.expect()
    loop.run()
    assert answered == [1]
    assert driver.done == [2]
    counts = waiter.counts()
    assert (counts["spins"], counts["hits"], counts["misses"]) == (2, 2, 0)


def test_a_stopped_spinner_spins_no_more() -> None:
    waiter, driver, loop = _auto()
    driver.answer(1e-3, 1)
    waiter.expect()
    waiter.stop()
    assert loop.run() == 1  # the scheduled step finds it stopped and ends
    assert not waiter.spinning
    assert driver.done == []
    waiter.expect()
    assert not loop.soon


def test_a_fixed_window_polls_after_a_post_and_counts_hits_and_misses() -> None:
    driver = FakeDriver()
    loop = FakeLoop(driver)
    waiter = FixedWindow(driver, loop, driver.handlers, None, BUDGET, driver.clock, 200e-6)  # type: ignore[arg-type]
    driver.attach(driver.handlers, None, BUDGET, waiter.yield_drain)
    driver.req_notify()
    driver.answer(50e-6, 1)
    waiter.kick()
    assert waiter.spinning
    loop.run()
    assert driver.done == [1]
    assert not waiter.spinning
    assert driver.armed
    waiter.kick()  # nothing in flight: the window closes at once, a miss
    loop.run()
    counts = waiter.counts()
    assert (counts["spins"], counts["hits"], counts["misses"]) == (2, 1, 1)
    assert counts["window_seconds"] == counts["limit_seconds"] == 200e-6


def test_a_drain_past_its_budget_yields_to_the_loop_and_finishes_there() -> None:
    waiter, driver, loop = _auto()
    for wr_id in range(BUDGET + 3):
        driver.answer(0.0, wr_id)
    driver.advance(0.0)
    waiter.reader()  # the driver serves one budget, then asks the waiter for more
    assert len(driver.done) == BUDGET
    loop.run()
    assert len(driver.done) == BUDGET + 3
    assert isinstance(waiter, Waiter)


@contextlib.asynccontextmanager
async def _apart(lab: Lab, polling: str) -> AsyncIterator[Pair]:
    """Two connected queue pairs on two ``Device`` objects: each side has a
    completion queue of its own, as two processes would, made with ``polling``."""
    set_polling(polling)
    try:
        async with aiordma.Device(lab.device) as one, aiordma.Device(lab.device) as two:
            a, b = one.create_qp(), two.create_qp()
            a.connect(b.local_endpoint)
            b.connect(a.local_endpoint)
            assert a.completion_queue is not b.completion_queue
            yield a, b
    finally:
        set_polling(None)


@pytest_asyncio.fixture
async def apart(lab: Lab) -> AsyncIterator[Pair]:
    """:func:`_apart` with ``auto``."""
    async with _apart(lab, "auto") as pair:
        yield pair


async def _ping_pong(pair: Pair, rounds: int, think: float = 0.0) -> None:
    """``rounds`` request-and-reply exchanges of 64 B written as the tutorial
    does; the responder takes ``think`` seconds before each reply."""
    a, b = pair
    abuf, bbuf = a.device.alloc(64), b.device.alloc(64)
    for _ in range(rounds):
        request = asyncio.ensure_future(b.post_recv(bbuf))
        reply = asyncio.ensure_future(a.post_recv(abuf))
        await asyncio.sleep(0)  # both receives posted before the send: no RNR retry
        await a.post_send(abuf)
        await asyncio.wait_for(request, 30)
        if think:
            await asyncio.sleep(think)  # the responder's pace is what is tested
        await b.post_send(bbuf)
        await asyncio.wait_for(reply, 30)


async def _settled(cq: CompletionQueue) -> dict[str, float]:
    """The CQ's counts once it has stopped spinning and armed."""
    async with asyncio.timeout(10):
        while cq.spinning:  # noqa: ASYNC110 - the spin ends by itself, raising no event
            await asyncio.sleep(0)
    return cq.waiting()


@pytest.mark.asyncio
async def test_a_ping_pong_spins_for_answers_and_an_idle_queue_never_does(apart: Pair) -> None:
    a, b = apart
    assert a.completion_queue.expects, "auto spins only with more than one usable CPU"
    await _ping_pong(apart, 20)
    counts = await _settled(a.completion_queue)
    assert counts["spins"] >= 1  # the first expectation always spins, at the cap
    assert counts["spins"] == counts["hits"] + counts["misses"]
    assert counts["spins"] + counts["skipped"] == 20  # one expectation per request
    idle = await _settled(b.completion_queue)
    await asyncio.sleep(0.3)  # idle time is the subject
    assert a.completion_queue.waiting() == counts  # no spin, no wake-up, no arming
    assert b.completion_queue.waiting() == idle
    sources = aiordma.metrics.collect()
    exported = {labels.get("completion_queue"): stats.counters for labels, stats in sources}
    mine = exported[a.completion_queue.name]
    assert (mine["spins"], mine["spin_hits"], mine["arms"]) == (
        counts["spins"], counts["hits"], counts["arms"])  # fmt: skip


@pytest.mark.asyncio
async def test_a_reply_sent_from_the_drain_is_spun_for_not_counted_a_miss(lab: Lab) -> None:
    """An RPC handler that returns at once replies from inside the
    completion drain, while its queue spins for the request: the spin
    counts its hit, then spins for the next request. It used to record a
    miss for that next expectation without spinning: every hit paired with
    a miss, half the spins, idle or busy. Real misses are the policy
    learning the client's pace (the window starts at AUTO_START and is
    trimmed to twice the mean wait), fewer than a fifth of the spins here
    even beside a busy CPU; how many requests get a spin at all depends on
    the machine (a credit update can be the answer a spin takes), so the
    share is what is asserted, not a count of hits. The counts are taken
    from the first request on: the queue may be shared with earlier tests."""
    service = rpc.Service()
    before: dict[CompletionQueue, dict[str, float]] = {}

    @service.method()
    async def echo(payload: bytes) -> bytes:
        cq = rpc.current_connection().qp.completion_queue
        before.setdefault(cq, cq.waiting())
        return payload

    set_polling("auto:50000")
    try:
        async with await rpc.start_server(service, lab.addr, 0) as server:
            await run_peer("calls", lab.addr, str(server.addresses[0][1]), "echo", "30")
            ((cq, first),) = before.items()
            after = await _settled(cq)
    finally:
        set_polling(None)
    counts = {key: after[key] - first[key] for key in ("spins", "hits", "misses")}
    assert counts["spins"] == counts["hits"] + counts["misses"]
    assert counts["spins"] >= 10, counts  # it spun for a third of the requests at least
    assert counts["misses"] <= counts["spins"] // 4, counts  # the fault: half


@pytest.mark.asyncio
async def test_one_sided_work_never_spins(apart: Pair) -> None:
    a, b = apart
    target = b.device.alloc(4096, Access.REMOTE_READ | Access.REMOTE_WRITE)
    local = a.device.alloc(4096)
    before = a.completion_queue.waiting()
    for _ in range(10):
        await a.rdma_write(local, target.remote())
        await a.rdma_read(local, target.remote())
    after = await _settled(a.completion_queue)
    assert (after["spins"], after["skipped"]) == (before["spins"], before["skipped"])
    assert after["arms"] > before["arms"]  # it slept for each


@pytest.mark.asyncio
async def test_answers_that_come_late_turn_spinning_off(apart: Pair) -> None:
    """Replies 20 ms late miss every spin at the cap: the queue backs off,
    spinning for the 1st, 3rd and 7th of 12 expectations only."""
    a, _ = apart
    await _ping_pong(apart, 12, think=0.02)
    counts = await _settled(a.completion_queue)
    assert counts["hits"] == 0
    assert counts["misses"] == counts["spins"] == 3
    assert counts["skipped"] == 9
    assert counts["window_seconds"] == 0


@pytest.mark.asyncio
async def test_answers_a_little_late_grow_the_spin_until_it_meets_them(lab: Lab) -> None:
    """Replies 5 ms after each request, with a cap of 50 ms: the first spin
    (at the starting limit) misses, its late answer grows the limit, and
    later spins meet the replies without backing off."""
    async with _apart(lab, "auto:50000") as (a, b):
        await _ping_pong((a, b), 12, think=0.005)
        counts = await _settled(a.completion_queue)
    assert counts["late"] >= 1
    assert counts["hits"] >= 1
    assert counts["skipped"] == 0
    assert counts["limit_seconds"] > AUTO_START


@pytest.mark.asyncio
async def test_a_fixed_window_counts_its_spins_and_the_time_they_took(lab: Lab) -> None:
    """Issue 81: with a fixed window waiting() said spins 0, hits 0 and
    spun_seconds 0.0 after a ping-pong, so its CPU could not be seen. Each
    window opened is a spin: a hit if it drained a completion."""
    async with _apart(lab, "20000") as (a, b):  # 20 ms: the answers come within it
        assert a.completion_queue.polling == Polling("fixed", 20e-3)
        await _ping_pong((a, b), 12)
        counts = await _settled(a.completion_queue)
    assert counts["spins"] >= 1, counts
    assert counts["spins"] == counts["hits"] + counts["misses"], counts
    assert counts["hits"] >= 1, counts
    assert counts["spun_seconds"] > 0, counts
    async with _apart(lab, "1") as (a, b):  # 1 us: nothing comes that soon
        await _ping_pong((a, b), 12)
        counts = await _settled(a.completion_queue)
    assert counts["spins"] >= 12, counts  # a window per request posted at least
    assert counts["misses"] >= 12, counts


ONE_CPU = """
import asyncio, os, sys
import aiordma

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

async def main() -> None:
    async with aiordma.Device(sys.argv[1]) as one, aiordma.Device(sys.argv[1]) as two:
        a, b = one.create_qp(), two.create_qp()
        a.connect(b.local_endpoint)
        b.connect(a.local_endpoint)
        abuf, bbuf = one.alloc(64), two.alloc(64)
        for _ in range(10):
            request = asyncio.ensure_future(b.post_recv(bbuf))
            reply = asyncio.ensure_future(a.post_recv(abuf))
            await asyncio.sleep(0)
            await a.post_send(abuf)
            await request
            await b.post_send(bbuf)
            await reply
        one, two = a.completion_queue, b.completion_queue
        print(one.expects, one.waiting()["spins"], two.waiting()["spins"])

asyncio.run(main())
"""


def test_one_usable_cpu_never_spins(lab: Lab) -> None:
    done = run_python(["-c", ONE_CPU, lab.device], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "0", "0"]
