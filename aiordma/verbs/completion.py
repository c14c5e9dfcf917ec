"""Completion queues on the event loop.

Each :class:`CompletionQueue` owns a completion channel whose descriptor is
registered with its loop's ``add_reader``. When the adapter signals, the
channel's event is consumed, completions are polled in batches and handed
to whoever posted the work request, and the CQ is re-armed and polled once
more so a completion that raced with the arming is never lost: all in the
CQ's driver (compiled or pure), whose ``on_readable`` is the reader
callback itself, so a wake-up is one call into C. After a bounded number
of completions the drain yields to the loop and continues on the next
iteration, so one busy CQ cannot starve the loop. Nothing blocks and no
thread is involved.

Where an answer is expected soon, a CQ may instead spin a while before it
arms: how it waits is one :class:`~aiordma.verbs._waiters.Waiter`, chosen
once from its setting (:mod:`aiordma.verbs._waiting` decides when ``auto``
spins); the compiled core polls in C in slices of :data:`SPIN_SLICE`,
giving the loop its turn between them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import itertools
import logging
import os
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from pyverbs import enums
from pyverbs.cq import CQ, CompChannel

from aiordma import _ibv, metrics
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import (
    CompletionError,
    DeviceError,
    RemoteAccessError,
    ResourceClosedError,
)
from aiordma.lifecycle import check_loop, check_thread
from aiordma.verbs import _driver
from aiordma.verbs._completed import Opcode, WorkCompletion, from_wc
from aiordma.verbs._driver.base import ACK_BATCH, POLL_BATCH
from aiordma.verbs._driver.handles import create_with_fd
from aiordma.verbs._waiters import SPIN_SLICE, Waiter, waiter_for
from aiordma.verbs._waiting import Polling

if TYPE_CHECKING:
    from pyverbs.cq import WC
    from pyverbs.device import Context

log = logging.getLogger(__name__)

__all__ = ["ACK_BATCH", "DRAIN_BUDGET", "POLL_BATCH", "SPIN_SLICE", "CompletionHandler",
           "CompletionQueue", "Opcode", "Polling", "WorkCompletion", "completion_error",
           "default_polling", "set_polling", "to_work_completion"]  # fmt: skip

DRAIN_BUDGET = 256
"""Completions handled before the drain yields to the event loop."""


_polling: Polling | None = None
"""The process's setting from :func:`set_polling` (None: the environment's)."""


def set_polling(polling: str | float | Polling | None) -> None:
    """How completion queues made from now on wait: ``"auto"`` (the default),
    ``"off"``, a number of microseconds (a fixed window) or a :class:`Polling`;
    None goes back to the environment's ``AIORDMA_POLL``."""
    global _polling
    _polling = None if polling is None else Polling.parse(polling)


def default_polling() -> Polling:
    """The setting a new completion queue takes (:func:`set_polling`, else the environment)."""
    return _polling if _polling is not None else Polling.from_environment()


_REMOTE_ACCESS_STATUSES = frozenset({"IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR"})


def _comp_channel(context: Context) -> CompChannel:
    with verbs_errors("creating a completion channel"):
        return CompChannel(context)


def _status_name(status: int) -> str:
    try:
        return str(enums.ibv_wc_status(status).name)
    except ValueError:
        return f"IBV_WC_STATUS_{status}"


def completion_error(wc: WC, opcode: str) -> CompletionError:
    """The typed exception for a failed work completion."""
    name = _status_name(wc.status)
    cls = RemoteAccessError if name in _REMOTE_ACCESS_STATUSES else CompletionError
    return cls(wc.status, name, wc.vendor_err, opcode, wc.wr_id)


def to_work_completion(wc: WC) -> WorkCompletion:
    """The :class:`WorkCompletion` of a successful completion entry."""
    return from_wc(wc)


class CompletionHandler(Protocol):
    """Whoever posted a work request; told once when its completion arrives."""

    def complete(self, wc: WC) -> None: ...


_ABANDONED: list[tuple[CQ, CompChannel]] = []
"""The pyverbs CQ and channel of each completion queue collected without
being closed: kept until the process exits, then closed in order. The
garbage collector tears a cycle of unreachable objects down in no set
order, and a completion channel destroyed before its CQ crashes the
process; a leak, which the ``ResourceWarning`` of the unclosed object
already reports, is the lesser harm."""


def _abandon(cq: CQ, channel: CompChannel) -> None:
    if not _ABANDONED:
        atexit.register(_close_abandoned)
    _ABANDONED.append((cq, channel))


def _close_abandoned() -> None:
    while _ABANDONED:
        cq, channel = _ABANDONED.pop()
        for obj in (cq, channel):  # the CQ first; a queue pair left on it makes both fail
            with contextlib.suppress(Exception):
                obj.close()


class CompletionQueue:
    """A CQ and its completion channel, driven by one event loop.

    Queue pairs post with a ``wr_id`` from :meth:`register` and are told
    about the completion through the handler they registered. The CQ's
    capacity grows (``ibv_resize_cq``) as queue pairs reserve room for their
    send and receive queues, so it can never overflow.
    """

    def __init__(
        self,
        context: Context,
        loop: asyncio.AbstractEventLoop,
        capacity: int = 256,
        polling: Polling | None = None,
        name: str = "cq",
    ):
        self._loop = loop
        self._name = name
        setting = default_polling() if polling is None else polling
        self._setting = setting
        self._handlers: dict[int, CompletionHandler] = {}
        self._max_cqe: int = context.query_device().max_cqe
        channel, fd = create_with_fd(
            lambda: _comp_channel(context),
            "anon_inode:[infinibandevent]",
            lambda ch: getattr(ch, "fd", None),
        )
        self._channel: CompChannel | None = channel
        self._fd = fd
        try:
            os.set_blocking(fd, False)
            with verbs_errors("creating a completion queue"):
                self._cq: CQ | None = CQ(context, min(capacity, self._max_cqe), None, channel, 0)
            self._driver = _driver.cq_driver(self._cq, channel, fd)
            """The driver that takes events, arms and drains this CQ."""
            self._waiter: Waiter = waiter_for(
                setting, self._driver, loop, self._handlers, self._report, DRAIN_BUDGET
            )
            """How the CQ waits, for its life (the one place its mode is decided)."""
            self._driver.attach(self._handlers, self._report, DRAIN_BUDGET,
                                self._waiter.yield_drain)  # fmt: skip
            self._driver.req_notify()
            loop.add_reader(fd, self._waiter.reader)  # the descriptor's one reader, for good
        except BaseException:
            if getattr(self, "_cq", None) is not None:
                self._cq.close()  # type: ignore[union-attr]
            channel.close()
            raise
        self._abandon = weakref.finalize(self, _abandon, self._cq, channel)
        self._reserved = 0
        self._ids = itertools.count(1)
        if setting.spins:  # a CQ that never spins has nothing of its own to show
            metrics.watch(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this CQ's channel is registered with."""
        return self._loop

    @property
    def cq(self) -> CQ:
        """The pyverbs ``CQ`` (raises :class:`~aiordma.ResourceClosedError` once closed)."""
        if self._cq is None:
            raise ResourceClosedError("completion queue is closed")
        return self._cq

    @property
    def capacity(self) -> int:
        """Entries the CQ holds now (it grows as queue pairs reserve room)."""
        return int(self.cq.cqe)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._cq is None

    def check_loop(self) -> None:
        """Raise WrongLoopError unless called from this CQ's event loop."""
        check_loop(self._loop)

    def has_room(self, entries: int) -> bool:
        """Whether :meth:`reserve` of ``entries`` would succeed."""
        return self._reserved + entries <= self._max_cqe

    def reserve(self, entries: int) -> None:
        """Make room for ``entries`` more outstanding completions (a QP's queues)."""
        need = self._reserved + entries
        if need > self._max_cqe:
            raise DeviceError(
                errno.ENOMEM,
                f"completion queue would need {need} entries; the device allows {self._max_cqe}",
            )
        if need > self.capacity:
            with verbs_errors("resizing a completion queue"):
                self.cq.resize(min(self._max_cqe, max(need, 2 * self.capacity)))
        self._reserved = need

    def unreserve(self, entries: int) -> None:
        """Give back room reserved with :meth:`reserve` (a queue pair was destroyed)."""
        self._reserved -= entries

    @property
    def reserved(self) -> int:
        """Entries reserved by the queue pairs that use this CQ (0: none uses it)."""
        return self._reserved

    def register(self, handler: CompletionHandler) -> int:
        """A fresh ``wr_id`` whose completion will be given to ``handler``."""
        wr_id = next(self._ids)
        self._handlers[wr_id] = handler
        return wr_id

    def forget(self, wr_id: int) -> None:
        """Drop a registration whose work request was never posted."""
        self._handlers.pop(wr_id, None)

    def claim_ids(self, count: int) -> int:
        """The first of ``count`` consecutive work request ids no one else gets:
        a packet lane's, which it puts in :attr:`handlers` itself each time
        it posts one (the drain takes each entry out as it completes)."""
        first = next(self._ids)
        self._ids = itertools.count(first + count)
        return first

    @property
    def handlers(self) -> dict[int, CompletionHandler]:
        """Who gets each posted work request's completion, by ``wr_id``."""
        return self._handlers

    @property
    def compiled(self) -> bool:
        """Whether the compiled core drains this CQ (else pure Python does)."""
        return self._driver.compiled

    def _report(self, exc: Exception | None, wc: WC) -> None:
        """A handler failed, or nobody posted ``wc``: work given up when its
        queue pair was destroyed leaves flushed completions in the CQ, which
        are expected and not news; a successful one is."""
        if exc is not None:
            self._loop.call_exception_handler(
                {"message": "aiordma completion handler failed", "exception": exc}
            )
        elif wc.status == _ibv.WC_SUCCESS:
            log.warning("completion for unknown wr_id %d ignored", wc.wr_id)

    @property
    def polls(self) -> bool:
        """Whether the CQ polls for a while after any work is posted (a fixed
        window: :meth:`kick` does nothing otherwise)."""
        return self._waiter.polls

    @property
    def expects(self) -> bool:
        """Whether the CQ may spin for an answer to a two-sided send
        (:meth:`expect` does nothing otherwise)."""
        return self._waiter.expects

    @property
    def polling(self) -> Polling:
        """How this CQ waits (the process's setting when it was made)."""
        return self._setting

    @property
    def name(self) -> str:
        """The device's name and a number (``rxe0#2``): this CQ's metrics label."""
        return self._name

    @property
    def spinning(self) -> bool:
        """Whether the CQ is polling now rather than armed and asleep."""
        return self._waiter.spinning

    def waiting(self) -> dict[str, float]:
        """What the waiting policy did: expectations spun for (``spins``),
        ended by a receive (``hits``) or by the window (``misses``), misses
        whose answer came soon enough to grow the limit (``late``), not spun
        for while backing off (``skipped``), the CQ's armings (``arms``),
        the seconds spent spinning (``spun_seconds``), the current window
        (``window_seconds``; 0 until the first hit) and the longest spin
        now (``limit_seconds``); and, in every mode, the completions handed
        out (``completions``) and the wake-ups the CQ's events caused
        (``wakeups``).
        With a fixed window each window opened counts as a spin, a hit if
        it drained a completion and a miss if not.
        """
        counts = self._waiter.counts()
        counts["completions"] = self._driver.completions
        counts["wakeups"] = self._driver.wakeups
        return counts

    def _metric_sources(self) -> Iterator[tuple[dict[str, str], metrics.Stats]]:
        """For exporters: the waiting counts, labelled ``completion_queue``."""
        counts = self.waiting()
        stats = metrics.Stats("completion_queue")
        for name, key in (("spins", "spins"), ("spin_hits", "hits"), ("spin_misses", "misses"),
                          ("spins_late", "late"), ("spins_skipped", "skipped"),
                          ("arms", "arms"), ("completions", "completions"),
                          ("wakeups", "wakeups")):  # fmt: skip
            stats.counters[name] = int(counts[key])
        stats.counters["spun_microseconds"] = round(counts["spun_seconds"] * 1e6)
        stats.gauge_sources.append(lambda: {
            "spin_window_microseconds": round(counts["window_seconds"] * 1e6),
            "spin_limit_microseconds": round(counts["limit_seconds"] * 1e6)})  # fmt: skip
        yield {"completion_queue": self._name}, stats

    @property
    def expect(self) -> Callable[[], None]:
        """What to call once a two-sided send is posted: its answer (a reply,
        or the next request after a reply) may come soon. With ``auto`` the
        policy decides whether to spin for it; a fixed window polls as after
        any post. A property, so the caller keeps the compiled waiter's own
        method and calls it with no Python frame in between."""
        return self._waiter.expect

    @property
    def kick(self) -> Callable[[], None]:
        """What to call once any work is posted (a fixed window polls for its
        completion; see :attr:`polls`)."""
        return self._waiter.kick

    @property
    def pending(self) -> int:
        """Work requests posted through this CQ whose completions have not arrived."""
        return len(self._handlers)

    def close(self) -> None:
        """Unregister from the loop and destroy the CQ and channel (idempotent).

        Queue pairs using the CQ must be closed first.
        """
        cq, channel = self._cq, self._channel
        if cq is None or channel is None:
            return
        check_thread(self._loop, "CompletionQueue.close()")
        self._abandon.detach()
        self._cq = self._channel = None
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                self._loop.remove_reader(self._fd)
        self._handlers.clear()
        self._waiter.stop()
        metrics.unwatch(self)
        self._driver.detach()
        try:
            cq.close()  # acknowledges outstanding events first
        finally:
            channel.close()
