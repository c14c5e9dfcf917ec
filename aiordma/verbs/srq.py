"""A verbs shared receive queue with a ring of posted buffers (an SRQ).

A :class:`SharedReceiveRing` posts ``buffers`` receive buffers of
``buffer_size`` bytes on one verbs SRQ. Queue pairs created with it take
their receives from there; their receive completions come to the device's
completion queue for this loop and are handed to the receiver attached for
the queue pair they arrived on (by QP number). Who owns which buffer is kept
in a :class:`ReceivePool`: a receiver reserves buffers when it attaches and
gives them back when its queue pair is gone.

The message channels' credit lending on top of it is
:class:`aiordma.SharedReceiveQueue` (``aiordma.channel.shared_receive``).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr

from aiordma import _ibv, metrics
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import DeviceError, ResourceBusyError, ResourceClosedError, again
from aiordma.lifecycle import Closable, check_thread
from aiordma.metrics import Stats
from aiordma.verbs import _driver
from aiordma.verbs._driver.base import QPDriver, SRQDriver
from aiordma.verbs.completion import CompletionQueue, completion_error
from aiordma.verbs.device import Device

if TYPE_CHECKING:
    from pyverbs.cq import WC

    from aiordma.verbs.memory import MemoryRegion
    from aiordma.verbs.queue_pair import QueuePair

log = logging.getLogger(__name__)

DEFAULT_BUFFERS: Final = 4096
DEFAULT_BUFFER_SIZE: Final = 8192

_numbers = itertools.count(1)

RingArrived = Callable[[int, BaseException | None, int], None]
"""``(buffer index, error, bytes)``: a packet landed for a channel (from the drain)."""


class ReceivePool:
    """The buffers of a shared receive queue, as tokens its receivers hold (pure logic).

    Every posted buffer is either ``free`` or a token of one member, which
    has granted it to its peer or holds a message in it. A member never
    grants more than its tokens, so the queue always has a buffer for every
    credit outstanding: no sender meets an empty queue. Each member keeps
    ``base`` tokens for as long as it is attached; beyond them it borrows
    free buffers while its peer uses all it was granted, and gives them
    back while the pool is ``pressed`` (a member found nothing to borrow),
    until a quarter of the pool is free again.
    """

    def __init__(self, buffers: int) -> None:
        if buffers < 1:
            raise ValueError("a receive pool needs at least one buffer")
        self.buffers = buffers
        self.free = buffers
        self.pressed = False

    def take(self, n: int) -> bool:
        """Take ``n`` free buffers if there are that many."""
        if self.free < n:
            return False
        self.free -= n
        return True

    def give(self, n: int) -> None:
        """``n`` buffers are free again."""
        self.free += n
        if self.pressed and self.free * 4 >= self.buffers:  # a quarter free again
            self.pressed = False

    def borrow(self) -> bool:
        """Take one free buffer for a member beyond its base (False: none, and
        the pool is now pressed)."""
        if self.free > 0 and not self.pressed:
            self.free -= 1
            return True
        self.pressed = True
        return False


@dataclass(slots=True)
class _Receiver:
    """What receives a queue pair's packets, and what it gives back when it goes."""

    arrived: RingArrived
    failed: Callable[[BaseException], None]
    release: Callable[[], int]


class _Buffer:
    """The completion handler of one pool buffer (made once, reused at every post)."""

    __slots__ = ("index", "pool")

    def __init__(self, pool: SharedReceiveRing, index: int) -> None:
        self.pool = pool
        self.index = index

    def complete(self, wc: WC) -> None:
        self.pool._completed(self.index, wc)


class SharedReceiveRing(Closable):
    """``buffers`` receive buffers of ``buffer_size`` bytes posted on one
    verbs shared receive queue, for the queue pairs created with it.

    Each packet goes to the receiver :meth:`attach`-ed for its queue pair
    (or to the one message :meth:`expect`-ed before that). Close it after
    those queue pairs: ``close()`` refuses new ones at once and releases
    everything once the last one is gone (await :meth:`wait_closed`);
    :meth:`aclose` and ``async with`` close them too.
    """

    kind: ClassVar[str] = "shared receive queue"

    def __init__(
        self,
        device: Device | None = None,
        *,
        buffers: int = DEFAULT_BUFFERS,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        least: int = 1,
    ) -> None:
        device = device or Device.shared()
        attrs = device.attributes
        if buffer_size <= 0:
            raise ValueError(f"buffer_size must be positive, not {buffer_size}")
        limit = min(attrs.max_cqe, _srq_limit(device))
        if not least <= buffers <= limit:
            raise ValueError(
                f"buffers must be between {least} (one receiver's need) and {limit} "
                f"(what {device.name} allows in one shared receive queue and its "
                f"completion queue), not {buffers}"
            )
        self.device = device
        self.buffers = buffers
        self.buffer_size = buffer_size
        self.credits = ReceivePool(buffers)
        """Who owns the buffers (a :class:`~aiordma.verbs.srq.ReceivePool`)."""
        self._loop = asyncio.get_running_loop()
        self._members: dict[int, _Receiver] = {}
        self._expected: dict[int, asyncio.Future[bytes]] = {}
        """One message awaited on a queue pair before its channel joins (the
        authentication handshake), by QP number."""
        self._qps: dict[int, QueuePair] = {}
        self._closing = False
        self._closed = self._loop.create_future()
        self._stats = Stats("shared_receive", self._gauges)
        # The device's CQ for this loop (the one its queue pairs' sends use,
        # while it has room): receives and sends then wake the loop once.
        self._cq = device._lease_cq(buffers)
        self._wr_ids = [0] * buffers
        """The ``wr_id`` each buffer is posted under (forgotten at close)."""
        self._srq: SRQ | None = None
        self._mr: MemoryRegion | None = None
        try:
            with verbs_errors(f"creating a shared receive queue on {device.name}"):
                self._srq = SRQ(device.pd, SrqInitAttr(SrqAttr(max_wr=buffers, max_sge=1)))
            self._driver: SRQDriver = _driver.srq_driver(self._srq)
            self._mr = device.alloc(buffers * buffer_size)
            self._handlers = [_Buffer(self, i) for i in range(buffers)]
            self._base, self._lkey = self._mr.addr, self._mr.lkey
            for index in range(buffers):
                self._post(index)
        except BaseException:
            self._release()
            raise
        device._adopt(self)
        self._name = f"{device.name}#{next(_numbers)}"
        metrics.watch(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._members)} channels"
        return (
            f"<{type(self).__name__} {self.buffers} x {self.buffer_size} B, "
            f"{self.credits.free} free, {state}>"
        )

    # -- what channels use -------------------------------------------------

    @property
    def mr(self) -> MemoryRegion:
        """The registration holding every buffer (buffer ``i`` starts at ``i * buffer_size``)."""
        if self._mr is None:
            raise ResourceClosedError("the shared receive queue is closed")
        return self._mr

    @property
    def cq(self) -> CompletionQueue:
        """The completion queue every receive from this pool completes on."""
        return self._cq

    @property
    def srq(self) -> SRQ:
        """The pyverbs ``SRQ``."""
        if self._srq is None:
            raise ResourceClosedError("the shared receive queue is closed")
        return self._srq

    def _attach(self, qp: QueuePair, driver: QPDriver) -> None:
        """A queue pair receiving from this pool was created (internal); its
        ``driver`` may give the SRQ's handle to a compiled driver."""
        if self._closing:
            raise ResourceClosedError("the shared receive queue is closed")
        self._qps[qp.qp_num] = qp
        if self._srq is not None:
            self._driver = _driver.srq_driver(self._srq, self._driver, driver)

    def attach(
        self, qp: QueuePair, arrived: RingArrived, failed: Callable[[BaseException], None],
        reserve: int, release: Callable[[], int],
    ) -> None:  # fmt: skip
        """Send ``qp``'s packets to ``arrived`` (``(buffer index, error, bytes)``)
        and tell ``failed`` when its queue pair closes.

        Takes ``reserve`` free buffers for it (ResourceBusyError if the pool
        has not that many); when the queue pair is gone, ``release()`` says
        how many buffers it owns then, and they are free again.
        """
        if self._closing:
            raise ResourceClosedError("the shared receive queue is closed")
        if self._qps.get(qp.qp_num) is not qp:
            raise ValueError(f"{qp!r} does not receive from this shared receive queue")
        if qp.qp_num in self._members:
            raise ValueError(f"{qp!r} already has a channel on this shared receive queue")
        if not self.credits.take(reserve):
            self._stats.add("refused")
            raise ResourceBusyError(
                f"the shared receive queue has {self.credits.free} free buffers of "
                f"{self.buffers}; another channel needs {reserve}: make it larger "
                "(buffers=) or serve fewer connections"
            )
        self._members[qp.qp_num] = _Receiver(arrived, failed, release)

    def expect(self, qp: QueuePair) -> asyncio.Future[bytes]:
        """The next packet to arrive on ``qp``, before any channel joins for it
        (the authentication handshake's message). It takes a free buffer
        until it arrives (ResourceBusyError if none is free)."""
        if self._closing:
            raise ResourceClosedError("the shared receive queue is closed")
        if self._qps.get(qp.qp_num) is not qp:
            raise ValueError(f"{qp!r} does not receive from this shared receive queue")
        if qp.qp_num in self._members or qp.qp_num in self._expected:
            raise ValueError(f"{qp!r} already has a receiver on this shared receive queue")
        if not self.credits.take(1):
            self._stats.add("refused")
            raise ResourceBusyError(
                f"the shared receive queue has no free buffer of {self.buffers} for a handshake"
            )
        message: asyncio.Future[bytes] = self._loop.create_future()
        self._expected[qp.qp_num] = message
        return message

    def _unexpect(self, qp_num: int) -> asyncio.Future[bytes] | None:
        message = self._expected.pop(qp_num, None)
        if message is not None:
            self.credits.give(1)
        return message

    def repost(self, index: int) -> None:
        """Post buffer ``index`` again."""
        if self._srq is None:
            return
        self._post(index)

    # -- completions -------------------------------------------------------

    def _post(self, index: int) -> None:
        wr_id = self._wr_ids[index] = self._cq.register(self._handlers[index])
        size = self.buffer_size
        rc = self._driver.post_recv(wr_id, self._base + index * size, size, self._lkey)
        if rc:
            self._cq.forget(wr_id)
            raise DeviceError(rc, f"ibv_post_srq_recv failed: {errno.errorcode.get(rc, rc)}")

    def _completed(self, index: int, wc: WC) -> None:
        """A buffer's receive completed: hand it to its channel, or post it again."""
        if self._expected:
            message = self._unexpect(wc.qp_num)
            if message is not None:
                if wc.status != _ibv.WC_SUCCESS:
                    message.set_exception(completion_error(wc, "recv"))
                else:
                    start = index * self.buffer_size
                    with self.mr.view() as whole:
                        message.set_result(bytes(whole[start : start + wc.byte_len]))
                self.repost(index)
                return
        member = self._members.get(wc.qp_num)
        if wc.status != _ibv.WC_SUCCESS:
            error = completion_error(wc, "recv")
            self._stats.add("flushed" if error.flushed else "errors:" + error.status_name)
            self.repost(index)
            if member is not None and not error.flushed:
                member.failed(error)
            return
        if member is None:  # its channel is gone (or never came): nobody will read it
            self._stats.add("orphans")
            self.repost(index)
            return
        member.arrived(index, None, wc.byte_len)

    # -- queue pairs ending ------------------------------------------------

    def _qp_closing(self, qp_num: int, error: BaseException) -> None:
        """A member's queue pair is closing: nothing more will arrive for it
        (an SRQ's buffers are not flushed), so its channel is told here."""
        message = self._unexpect(qp_num)
        if message is not None and not message.done():
            message.set_exception(again(error, error.__traceback__))
        member = self._members.get(qp_num)
        if member is not None:
            member.failed(error)

    def _qp_destroyed(self, qp_num: int) -> None:
        """A queue pair receiving from the pool is gone: its channel's buffers are free."""
        self._qps.pop(qp_num, None)
        message = self._unexpect(qp_num)
        if message is not None and not message.done():
            message.set_exception(ResourceClosedError("the queue pair was destroyed"))
        member = self._members.pop(qp_num, None)
        if member is not None:
            self.credits.give(member.release())
        if self._closing and not self._qps:
            self._release()

    # -- metrics and closing -----------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The pool as plain data: gauges ``buffers``, ``free`` (buffers no
        channel owns), ``channels`` and ``pressed`` (1 while a channel found
        nothing to borrow); counters ``refused`` (channels that found no
        room), ``orphans`` (packets for a channel already gone) and failed
        receives by status."""
        return self._stats.snapshot()

    def _metric_sources(self) -> Iterator[tuple[dict[str, str], Stats]]:
        """For exporters: labelled ``pool``, the device's name and a number."""
        yield {"pool": self._name}, self._stats

    def _gauges(self) -> dict[str, int]:
        return {
            "buffers": self.buffers,
            "free": self.credits.free,
            "channels": len(self._members),
            "pressed": int(self.credits.pressed),
        }

    @property
    def closed(self) -> bool:
        """True once everything is released."""
        return self._closed.done()

    def is_closing(self) -> bool:
        """True once :meth:`close` was called (new queue pairs are refused)."""
        return self._closing

    def _unclosed(self) -> bool:
        return not self._closed.done()

    def close(self) -> None:
        """Refuse new queue pairs; release everything once the last one using
        the pool is destroyed (at once if none is)."""
        if self._closing:
            return
        check_thread(self._loop, "SharedReceiveQueue.close()")
        self._closing = True
        if not self._qps:
            self._release()

    async def wait_closed(self) -> None:
        """Wait until :meth:`close` has released everything."""
        await asyncio.shield(self._closed)

    def _owner_closing(self) -> None:
        self._release()

    def _release(self) -> None:
        self._closing = True
        if self._closed.done():
            return
        srq, self._srq = self._srq, None
        mr, self._mr = self._mr, None
        try:
            if srq is not None:
                self._driver.detach()
                srq.close()
        finally:
            cq = self._cq
            for wr_id in self._wr_ids:  # the SRQ's buffers are gone without completions
                cq.forget(wr_id)
            self.device._release_cq(cq, self.buffers)
            if mr is not None:
                mr.close()
            self.device._disown(self)
            metrics.unwatch(self)
            if not self._closed.done():
                self._closed.set_result(None)

    async def aclose(self) -> None:
        """:meth:`close`, then close the queue pairs still receiving from the
        pool (their connections fail, as when their device goes) and wait
        until everything is released."""
        self.close()
        for qp in list(self._qps.values()):
            qp.close()
            await qp.wait_closed()
        await self.wait_closed()


def _srq_limit(device: Device) -> int:
    return int(device.context.query_device().max_srq_wr)
