# cython: annotation_typing=True
"""How one completion queue waits between completions: one interface, three modes.

A :class:`Waiter` is chosen once, when the CQ is made (:func:`waiter_for`,
from its :class:`~aiordma.verbs._waiting.Polling` setting): :class:`Sleeper`
(``off``: arm and sleep, each completion a wake-up), :class:`FixedWindow`
(poll for a fixed window after any work is posted) or :class:`AutoSpinner`
(``auto``: spin for an expected answer when
:class:`~aiordma.verbs._waiting.WaitPolicy` says so, timing the answers it
missed). The CQ asks nothing of the mode afterwards: it registers the
waiter's :attr:`~Waiter.reader` for its descriptor once (the descriptor's
one owner), hands the driver :meth:`~Waiter.yield_drain`, and gives the
work paths :meth:`~Waiter.kick` and :meth:`~Waiter.expect` when the waiter
:attr:`~Waiter.polls` or :attr:`~Waiter.expects`.

Every waiter drains with the same :meth:`Waiter._drain_unarmed` and reads
time from the ``clock`` it is given, so host tests run them with a fake
driver, loop and clock. The sends that ask for a spin and the loop turns
that spin are on every message's path, so the module is compiled when the
build could (``_waiters.pxd``; see :mod:`aiordma._compiled`): with the
compiled driver a spin runs no Python frame.

Call order: ``(reader | kick | expect | yield_drain)* -> stop``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiordma.verbs._waiting import Polling, WaitPolicy

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
    from aiordma.verbs._driver.base import CQDriver, Report
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

Clock = Callable[[], float]

monotonic: Clock = time.monotonic
"""The waiters' clock by default: uvloop's ``loop.time()`` counts whole
milliseconds, longer than the windows it would time."""

SPIN_SLICE = 50e-6
"""Seconds the compiled core spins on an empty CQ per round of polling, before
the loop runs its other work."""


@cython.cclass
class Waiter:
    """How a CQ waits: its ``driver`` drained (``handlers``, ``report``, at
    most ``budget`` completions per turn of ``loop``), time read from
    ``clock``. This base is ``off``'s behaviour; the modes that spin
    override what they change."""

    def __init__(
        self, driver: CQDriver, loop: asyncio.AbstractEventLoop, handlers: dict[int, Any],
        report: Report, budget: cython.int, clock: Clock,
    ) -> None:  # fmt: skip
        self._driver = driver
        self._loop = loop
        self._handlers = handlers
        self._report = report
        self._budget = budget
        self._clock = clock
        self._stopped = False
        self._drain_scheduled = False
        self.polls = False
        """Whether :meth:`kick` is to be called after any work is posted."""
        self.expects = False
        """Whether :meth:`expect` is to be called after a two-sided send."""

    @property
    def reader(self) -> Callable[[], None]:
        """The loop's reader callback for the CQ's descriptor."""
        return self._driver.on_readable

    @property
    def spinning(self) -> bool:
        """Whether the CQ is polling now rather than armed and asleep."""
        return False

    def counts(self) -> dict[str, float]:
        """What the waiting did (see ``CompletionQueue.waiting``)."""
        return {"spins": 0, "hits": 0, "misses": 0, "late": 0, "skipped": 0,
                "arms": self._driver.arms, "spun_seconds": 0.0, "window_seconds": 0.0,
                "limit_seconds": 0.0}  # fmt: skip

    @cython.ccall
    def kick(self) -> None:
        """Work was posted (only called when :attr:`polls`)."""

    @cython.ccall
    def expect(self) -> None:
        """A two-sided send was posted: its answer may come soon (only called
        when :attr:`expects`)."""

    def stop(self) -> None:
        """The CQ is closing: drain and spin no more (a scheduled step finds this and ends)."""
        self._stopped = True

    @cython.ccall
    def yield_drain(self) -> None:
        """The drain's budget is spent: continue on the loop's next turn."""
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._scheduled_drain)

    def _scheduled_drain(self) -> None:
        self._drain_scheduled = False
        if not self._stopped:
            self.drain()

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def drain(self) -> cython.int:
        """Hand out completions until the CQ is empty, arm it unless a spin
        holds it unarmed, and drain again; how many were handled."""
        return self._driver.serve(False)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _drain_unarmed(self) -> cython.int:
        """Hand out what came, leaving the CQ as it is, until it is empty or
        the budget is spent (then the drain continues on the loop's next
        turn, :meth:`yield_drain`); how many were handled."""
        handled: cython.int = 0
        count: cython.int
        empty: cython.bint
        while not self._stopped:
            count, empty = self._driver.drain(self._handlers, self._budget - handled,
                                              self._report)  # fmt: skip
            handled += count
            if empty or self._stopped:
                break
            if handled >= self._budget:
                self.yield_drain()
                break
        return handled


@cython.cclass
class Sleeper(Waiter):
    """``off``: the CQ is always armed, and each wake-up is the driver's one call."""


@cython.cclass
class FixedWindow(Waiter):
    """A fixed ``window`` of seconds: after any post or completion the CQ
    polls (in slices of :data:`SPIN_SLICE`) until nothing came for that
    long, then arms."""

    def __init__(
        self, driver: CQDriver, loop: asyncio.AbstractEventLoop, handlers: dict[int, Any],
        report: Report, budget: cython.int, clock: Clock, window: cython.double,
    ) -> None:  # fmt: skip
        super().__init__(driver, loop, handlers, report, budget, clock)
        self.polls = self.expects = True
        self._window = window
        self._polling = False
        self._poll_until = 0.0
        self._hit = False
        """Whether the window now open has drained a completion."""
        self._hits = 0
        """Windows that drained a completion (those that did not: misses)."""
        self._misses = 0
        self._spun = 0.0

    @property
    def reader(self) -> Callable[[], None]:
        return self._readable

    @property
    def spinning(self) -> bool:
        return self._polling

    def counts(self) -> dict[str, float]:
        """Each window opened counts as a spin, a hit if it drained a
        completion and a miss if not."""
        return {"spins": self._hits + self._misses + self._polling, "hits": self._hits,
                "misses": self._misses, "late": 0, "skipped": 0, "arms": self._driver.arms,
                "spun_seconds": self._spun, "window_seconds": self._window,
                "limit_seconds": self._window}  # fmt: skip

    def _readable(self) -> None:
        if self._stopped:
            return
        self._driver.take_event()  # one event per arming: another keeps the fd readable
        self.drain()

    @cython.ccall
    def kick(self) -> None:
        """Work was posted: poll for its completion for the window."""
        if not self._polling and not self._stopped:
            self._polling = True
            self._hit = False
            self._poll_until = self._clock() + self._window
            self._loop.call_soon(self._step)

    @cython.ccall
    def expect(self) -> None:
        """A fixed window polls after a two-sided send as after any post."""
        self.kick()

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def drain(self) -> cython.int:
        """Hand out completions; once the CQ is empty, poll for the window if
        work is in flight, else arm it (and drain again)."""
        return self._settle(True)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _settle(self, keep_polling: cython.bint) -> cython.int:
        handled: cython.int = 0
        while not self._stopped:
            handled += self._drain_unarmed()
            if self._drain_scheduled or self._stopped or self._driver.armed:
                break
            if keep_polling and self._handlers:
                self.kick()
                if self._polling:
                    break
            # Arm, then poll again: a completion that arrived between the
            # empty poll and the arming raises no event.
            self._driver.req_notify()
        return handled

    def _step(self) -> None:
        """One round of polling between the loop's other work; arms once
        nothing came for the window."""
        if self._stopped:
            self._polling = False
            return
        began: cython.double = self._clock()
        self._driver.spin(min(SPIN_SLICE, max(0.0, self._poll_until - began)))
        now: cython.double = self._clock()
        self._spun += now - began
        if self._drain_unarmed():
            self._hit = True
            now = self._clock()
            self._poll_until = now + self._window
        if self._handlers and now < self._poll_until:
            self._loop.call_soon(self._step)
            return
        self._polling = False
        if self._hit:
            self._hits += 1
        else:
            self._misses += 1
        self._settle(False)


@cython.cclass
class AutoSpinner(Waiter):
    """``auto``: after a two-sided send, spin for the expected receive in
    slices of ``slice_seconds`` between the loop's other work when
    ``policy`` says so, tell it whether the spin hit or missed, and time a
    missed answer until it arrives."""

    def __init__(
        self, driver: CQDriver, loop: asyncio.AbstractEventLoop, handlers: dict[int, Any],
        report: Report, budget: cython.int, clock: Clock, policy: WaitPolicy,
        slice_seconds: cython.double,
    ) -> None:  # fmt: skip
        super().__init__(driver, loop, handlers, report, budget, clock)
        self.policy = policy
        self.expects = policy.enabled
        self._slice = slice_seconds
        self.polling = False
        """Whether a spin is under way (the CQ is left unarmed meanwhile)."""
        self.spun = 0.0
        """Seconds spent spinning so far."""
        self._expecting = False
        self._spin_from = 0.0
        self._late = False  # a missed answer is being timed by the reader
        self._in_spin = False  # _step is draining: it settles its expectation itself
        self._again = False  # a send was posted during that drain
        self._window = 0.0
        self._poll_until = 0.0
        self._received_before = 0

    @property
    def reader(self) -> Callable[[], None]:
        return self._readable

    @property
    def spinning(self) -> bool:
        return self.polling

    def counts(self) -> dict[str, float]:
        policy = self.policy
        return {"spins": policy.spins, "hits": policy.hits, "misses": policy.misses,
                "late": policy.late, "skipped": policy.skipped, "arms": self._driver.arms,
                "spun_seconds": self.spun, "window_seconds": policy.window,
                "limit_seconds": policy.limit}  # fmt: skip

    def _readable(self) -> None:
        """A wake-up; while a missed answer is awaited, its arrival is timed,
        so the policy can tell a near miss from a long wait."""
        driver = self._driver
        if not self._late:
            driver.on_readable()
            return
        now: cython.double = self._clock()
        driver.on_readable()
        if not self._stopped and driver.received != self._received_before:
            self._end_late(now - self._spin_from)

    @cython.ccall
    def expect(self) -> None:
        """A two-sided send was posted: its answer (a reply, or the next
        request after a reply) may come soon; the policy decides whether
        to spin for it."""
        if self._stopped:
            return
        if self._in_spin and self._expecting:
            # Posted from the spin's own drain (a reply or credits for what it
            # handed out): the spin settles its expectation, then starts this one.
            self._again = True
            return
        driver = self._driver
        now: cython.double = self._clock()
        if self._late:  # the missed answer came by another path, or not yet
            came: cython.bint = driver.received != self._received_before
            self._end_late(now - self._spin_from if came else -1.0)
        if self._expecting:
            if driver.received == self._received_before:
                return  # the answer to an earlier send is still awaited
            # The answer came through an event before the spin saw it.
            self._expecting = False
            self.policy.hit(now - self._spin_from)
        window: cython.double = self.policy.start()
        if window <= 0:
            return
        self._expecting = True
        self._spin_from = now
        self._received_before = driver.received
        self._window = window
        self._poll_until = 0.0  # the window starts with the first round of spinning
        if not self.polling:
            self.polling = True
            driver.polling = True
            self._loop.call_soon(self._step)

    def _step(self) -> None:
        """One round of the spin: ends at the expected receive (a hit) or
        the window's end (a miss). After a hit the CQ polls one more turn
        of the loop, so the task it woke can post its next request without
        the CQ arming in between."""
        driver = self._driver
        if self._stopped:
            self.polling = False
            return
        if self._expecting:
            now: cython.double = self._clock()
            if not self._poll_until:
                self._poll_until = now + self._window
            left: cython.double = self._poll_until - now
            if left > 0:
                driver.spin(min(self._slice, left))
                self.spun += self._clock() - now
            self._in_spin = True
            try:
                self._drain_unarmed()
            finally:
                self._in_spin = False
            if self._stopped:
                self.polling = False
                return
            if driver.received != self._received_before:
                self._expecting = False
                self.policy.hit(self._clock() - self._spin_from)
                if self._again:
                    self._again = False
                    self.expect()  # the send posted during the drain: a new window
                self._loop.call_soon(self._step)  # the turn the woken task may post in
                return
            if self._clock() < self._poll_until:
                self._loop.call_soon(self._step)
                return
            self._expecting = False
            self._again = False  # what was expected then is what just missed
            self.policy.miss()
            self._late = True  # the reader times its arrival
        self.polling = False
        driver.polling = False
        driver.serve(False)  # drain, arm, drain again
        if self._late and driver.received != self._received_before:
            self._end_late(self._clock() - self._spin_from)

    @cython.cfunc
    def _end_late(self, waited: cython.double) -> None:
        """Stop timing a missed answer; ``waited``: when it came (< 0: unknown)."""
        self._late = False
        if waited >= 0:
            self.policy.answered(waited)


def waiter_for(
    setting: Polling, driver: CQDriver, loop: asyncio.AbstractEventLoop,
    handlers: dict[int, Any], report: Report, budget: int, clock: Clock = monotonic,
) -> Waiter:  # fmt: skip
    """The waiter a CQ made with ``setting`` keeps for its life."""
    if setting.mode == "fixed":
        return FixedWindow(driver, loop, handlers, report, budget, clock, setting.window)
    if setting.mode == "auto":
        return AutoSpinner(driver, loop, handlers, report, budget, clock,
                           WaitPolicy(setting.window), SPIN_SLICE)  # fmt: skip
    return Sleeper(driver, loop, handlers, report, budget, clock)
