# cython: annotation_typing=True
"""``auto``'s spin for one completion queue: the waiting policy acted on.

:class:`~aiordma.verbs._waiting.WaitPolicy` decides (pure logic); a
:class:`Spinner` carries the decision out against the CQ's driver: after a
two-sided send it spins for the expected receive in slices of
``slice_seconds`` between the loop's other work, drains what came, tells
the policy whether the spin hit or missed, and times a missed answer until
it arrives. The sends that ask for a spin and the loop turns that spin are
on every message's path, so the module is compiled when the build could
(``_spinner.pxd``; see :mod:`aiordma._compiled`): with the compiled driver
a spin runs no Python frame.

Call order: ``expect* -> stop`` (``expect`` after each two-sided send; the
spin's own steps, scheduled on the loop, end with ``stop``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiordma.verbs._waiting import WaitPolicy

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
    from aiordma.verbs._driver.base import CQDriver, Report
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

_now = time.monotonic
"""The spin's clock: uvloop's ``loop.time()`` counts whole milliseconds,
longer than the windows it would time."""


@cython.cclass
class Spinner:
    """The spin of one CQ: its ``driver`` polled and drained (``handlers``,
    ``report``, at most ``budget`` completions per turn, then
    ``yield_drain()``) on ``loop``, whose reader for ``fd`` it swaps while
    a missed answer is timed; ``policy`` decides each window."""

    def __init__(
        self, policy: WaitPolicy, driver: CQDriver, loop: asyncio.AbstractEventLoop, fd: int,
        handlers: dict[int, Any], report: Report, budget: cython.int,
        yield_drain: Callable[[], None], slice_seconds: cython.double,
    ) -> None:  # fmt: skip
        self.policy = policy
        self._driver = driver
        self._loop = loop
        self._fd = fd
        self._handlers = handlers
        self._report = report
        self._budget = budget
        self._yield_drain = yield_drain
        self._slice = slice_seconds
        self.polling = False
        """Whether a spin is under way (the CQ is left unarmed meanwhile)."""
        self.spun = 0.0
        """Seconds spent spinning so far."""
        self._stopped = False
        self._expecting = False
        self._spin_from = 0.0
        self._late = False  # a missed answer is being timed by _on_late
        self._in_spin = False  # _step is draining: it settles its expectation itself
        self._again = False  # a send was posted during that drain
        self._window = 0.0
        self._poll_until = 0.0
        self._received_before = 0

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
        now: cython.double = _now()
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
            now: cython.double = _now()
            if not self._poll_until:
                self._poll_until = now + self._window
            left: cython.double = self._poll_until - now
            if left > 0:
                driver.spin(min(self._slice, left))
                self.spun += _now() - now
            self._in_spin = True
            try:
                self._drain()
            finally:
                self._in_spin = False
            if self._stopped:
                self.polling = False
                return
            if driver.received != self._received_before:
                self._expecting = False
                self.policy.hit(_now() - self._spin_from)
                if self._again:
                    self._again = False
                    self.expect()  # the send posted during the drain: a new window
                self._loop.call_soon(self._step)  # the turn the woken task may post in
                return
            if _now() < self._poll_until:
                self._loop.call_soon(self._step)
                return
            self._expecting = False
            self._again = False  # what was expected then is what just missed
            self.policy.miss()
            self._late = True
            self._loop.add_reader(self._fd, self._on_late)
        self.polling = False
        driver.polling = False
        driver.serve(False)  # drain, arm, drain again
        if self._late and driver.received != self._received_before:
            self._end_late(_now() - self._spin_from)

    @cython.cfunc
    def _drain(self) -> None:
        """Hand out what came, unarmed, until the CQ is empty or the budget
        is spent (then the CQ's drain continues on the loop's next turn)."""
        handled: cython.int = 0
        while not self._stopped:
            count, empty = self._driver.drain(self._handlers, self._budget - handled,
                                              self._report)  # fmt: skip
            handled += count
            if empty or self._stopped:
                return
            if handled >= self._budget:
                self._yield_drain()
                return

    def _on_late(self) -> None:
        """The reader while a missed answer is awaited: times its arrival,
        so the policy can tell a near miss from a long wait."""
        now: cython.double = _now()
        driver = self._driver
        driver.on_readable()
        if not self._stopped and driver.received != self._received_before:
            self._end_late(now - self._spin_from)

    @cython.cfunc
    def _end_late(self, waited: cython.double) -> None:
        """Stop timing a missed answer; ``waited``: when it came (< 0: unknown)."""
        self._late = False
        if not self._stopped:
            self._loop.add_reader(self._fd, self._driver.on_readable)
        if waited >= 0:
            self.policy.answered(waited)

    def stop(self) -> None:
        """The CQ is closing: spin no more (a scheduled step finds this and ends)."""
        self._stopped = True
