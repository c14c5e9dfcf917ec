"""Receive buffers that the message channels of many connections share (an SRQ).

Without it, every message channel posts its own receive buffers, sized for
its busiest moment: 40 buffers of 8 KiB per connection by default, most of
them idle at any time. A :class:`SharedReceiveQueue` posts one pool of
buffers on a verbs shared receive queue; the queue pairs of connections made
with it take their receives from there, and their completions come to the
device's completion queue (the one their sends use), from which each is
handed to the channel of the queue pair it arrived on (by QP number).

Flow control stays credit-based (see :class:`aiordma.channel.credits.ReceivePool`):
each channel owns a few buffers for as long as it lives (``base_credits``
for data, plus its control window), borrows free buffers while its peer
uses every credit it has, and gives them back as the peer slows down or
when another channel needs them. A channel never grants a credit without a
buffer behind it, so a sender never meets an empty receive queue (no
receiver-not-ready retries), and a slow reader still holds its own sender
back: what it has not read keeps its buffers, and nothing more is granted.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import SGE, RecvWR

from aiordma import _ibv, metrics
from aiordma._pyverbs import verbs_errors
from aiordma.channel.credits import CONTROL_BASE, ReceivePool, SharedDataCredits
from aiordma.channel.wire import HEADER_SIZE
from aiordma.exceptions import DeviceError, ResourceBusyError, ResourceClosedError
from aiordma.metrics import Stats
from aiordma.verbs.completion import CompletionQueue, completion_error
from aiordma.verbs.device import Device

if TYPE_CHECKING:
    from pyverbs.cq import WC

    from aiordma.verbs.memory import MemoryRegion
    from aiordma.verbs.queue_pair import QueuePair

log = logging.getLogger(__name__)

DEFAULT_BUFFERS: Final = 4096
DEFAULT_BUFFER_SIZE: Final = 8192
DEFAULT_BASE_CREDITS: Final = 2
"""Data credits each channel keeps for as long as it lives, whatever the others do."""

_numbers = itertools.count(1)

Arrived = Callable[[int, BaseException | None, int], None]
"""``(buffer index, error, bytes)``: a packet landed for a channel (from the drain)."""


@dataclass(slots=True)
class _Member:
    """A channel drawing on the pool: where its packets go, and what it owns."""

    arrived: Arrived
    failed: Callable[[BaseException], None]
    credits: SharedDataCredits
    control: int


class _Buffer:
    """The completion handler of one pool buffer (made once, reused at every post)."""

    __slots__ = ("index", "pool")

    def __init__(self, pool: SharedReceiveQueue, index: int) -> None:
        self.pool = pool
        self.index = index

    def complete(self, wc: WC) -> None:
        self.pool._completed(self.index, wc)


class SharedReceiveQueue:
    """A pool of ``buffers`` receive buffers of ``buffer_size`` bytes on one
    shared receive queue, for the message channels of many connections.

    Pass it as ``shared_receive=`` to :func:`aiordma.start_channel_server`,
    :func:`aiordma.open_channel` (or, lower down, to
    :func:`aiordma.start_server`/:func:`aiordma.connect` with a channel made
    in ``prepare``): those connections' queue pairs receive from it, and
    their channels use it. Each channel needs ``base_credits`` plus its
    control window (4) buffers while it lives; a connection arriving when
    the pool cannot give them is refused (:class:`ResourceBusyError`).

    Create it on the loop that runs the connections, on their device (the
    shared default device by default). Close it after them: ``close()``
    refuses new connections at once and releases everything once the last
    queue pair using it is gone (await :meth:`wait_closed`); :meth:`aclose`
    and ``async with`` close those queue pairs too.
    """

    def __init__(
        self,
        device: Device | None = None,
        *,
        buffers: int = DEFAULT_BUFFERS,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        base_credits: int = DEFAULT_BASE_CREDITS,
    ) -> None:
        device = device or Device.shared()
        attrs = device.attributes
        if buffer_size <= HEADER_SIZE:
            raise ValueError(f"buffer_size must exceed the {HEADER_SIZE}-byte message header")
        if base_credits < 1:
            raise ValueError("base_credits must be at least 1")
        limit = min(attrs.max_cqe, _srq_limit(device))
        if not base_credits + CONTROL_BASE <= buffers <= limit:
            raise ValueError(
                f"buffers must be between {base_credits + CONTROL_BASE} (one channel's "
                f"need) and {limit} (what {device.name} allows in one shared receive "
                f"queue and its completion queue), not {buffers}"
            )
        self.device = device
        self.buffers = buffers
        self.buffer_size = buffer_size
        self.base_credits = base_credits
        self.credits = ReceivePool(buffers)
        """The pool's buffers as credits (see :class:`aiordma.channel.credits.ReceivePool`)."""
        self._loop = asyncio.get_running_loop()
        self._members: dict[int, _Member] = {}
        self._expected: dict[int, asyncio.Future[bytes]] = {}
        """One message awaited on a queue pair before its channel joins (the
        authentication handshake), by QP number."""
        self._qps: dict[int, QueuePair] = {}
        self._closing = False
        self._closed = self._loop.create_future()
        self._stats = Stats("shared_receive", self._gauges)
        # The device's CQ for this loop (the one its queue pairs' sends use,
        # while it has room): receives and sends then wake the loop once.
        self._cq = device.completion_queue(buffers)
        self._cq.reserve(buffers)
        self._wr_ids = [0] * buffers
        """The ``wr_id`` each buffer is posted under (forgotten at close)."""
        self._srq: SRQ | None = None
        self._mr: MemoryRegion | None = None
        try:
            with verbs_errors(f"creating a shared receive queue on {device.name}"):
                self._srq = SRQ(device.pd, SrqInitAttr(SrqAttr(max_wr=buffers, max_sge=1)))
            self._mr = device.alloc(buffers * buffer_size)
            self._handlers = [_Buffer(self, i) for i in range(buffers)]
            addr, lkey = self._base, self._lkey = self._mr.addr, self._mr.lkey
            self._wrs = [
                RecvWR(num_sge=1, sg=[SGE(addr + i * buffer_size, buffer_size, lkey)])
                for i in range(buffers)
            ]
            for index in range(buffers):
                self._post(index, None)
        except BaseException:
            self._release()
            raise
        device._srqs.add(self)
        self._name = f"{device.name}#{next(_numbers)}"
        metrics.watch(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._members)} channels"
        return (
            f"<SharedReceiveQueue {self.buffers} x {self.buffer_size} B, "
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

    def _attach(self, qp: QueuePair) -> None:
        """A queue pair receiving from this pool was created (internal)."""
        if self._closing:
            raise ResourceClosedError("the shared receive queue is closed")
        self._qps[qp.qp_num] = qp

    def join(
        self, qp: QueuePair, arrived: Callable[[int, BaseException | None, int], None],
        failed: Callable[[BaseException], None], window: int, control_window: int,
    ) -> SharedDataCredits:  # fmt: skip
        """Let the channel on ``qp`` draw on the pool: its packets go to
        ``arrived``, and ``failed`` is told when its queue pair closes.

        Takes its base and control buffers (ResourceBusyError if the pool has
        not that many free); returns the credits it grants its peer.
        """
        if self._closing:
            raise ResourceClosedError("the shared receive queue is closed")
        if self._qps.get(qp.qp_num) is not qp:
            raise ValueError(f"{qp!r} does not receive from this shared receive queue")
        if qp.qp_num in self._members:
            raise ValueError(f"{qp!r} already has a channel on this shared receive queue")
        need = self.base_credits + control_window
        if not self.credits.take(need):
            self._stats.add("refused")
            raise ResourceBusyError(
                f"the shared receive queue has {self.credits.free} free buffers of "
                f"{self.buffers}; another channel needs {need}: make it larger "
                "(buffers=) or serve fewer connections"
            )
        credits = SharedDataCredits(
            max(window, self.base_credits), pool=self.credits, base=self.base_credits
        )
        self._members[qp.qp_num] = _Member(arrived, failed, credits, control_window)
        return credits

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

    def repost(self, index: int, via: QueuePair | None = None) -> None:
        """Post buffer ``index`` again (through ``via``'s compiled handle if it has one)."""
        if self._srq is None:
            return
        self._post(index, via)

    # -- completions -------------------------------------------------------

    def _post(self, index: int, via: QueuePair | None) -> None:
        wr_id = self._wr_ids[index] = self._cq.register(self._handlers[index])
        engine = via._engine if via is not None else None
        if engine is not None and engine.driver is not None and engine.qp is not None:
            size = self.buffer_size
            rc = engine.driver.post_srq_recv(wr_id, self._base + index * size, size, self._lkey)
            if rc:
                self._cq.forget(wr_id)
                raise DeviceError(rc, f"ibv_post_srq_recv failed: {errno.errorcode.get(rc, rc)}")
            return
        wr = self._wrs[index]
        wr.wr_id = wr_id
        try:
            with verbs_errors("posting to a shared receive queue"):
                self.srq.post_recv(wr)
        except BaseException:
            self._cq.forget(wr_id)
            raise

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
            message.set_exception(error)
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
            self.credits.give(member.credits.leave() + member.control)
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

    def close(self) -> None:
        """Refuse new queue pairs; release everything once the last one using
        the pool is destroyed (at once if none is)."""
        if self._closing:
            return
        self._closing = True
        if not self._qps:
            self._release()

    async def wait_closed(self) -> None:
        """Wait until :meth:`close` has released everything."""
        await asyncio.shield(self._closed)

    def _release(self) -> None:
        self._closing = True
        if self._closed.done():
            return
        srq, self._srq = self._srq, None
        mr, self._mr = self._mr, None
        try:
            if srq is not None:
                srq.close()
        finally:
            cq = self._cq
            for wr_id in self._wr_ids:  # the SRQ's buffers are gone without completions
                cq.forget(wr_id)
            if not cq.closed:
                cq.unreserve(self.buffers)
                self.device._release_cq(cq)
            if mr is not None:
                mr.close()
            self.device._srqs.discard(self)
            metrics.unwatch(self)
            if not self._closed.done():
                self._closed.set_result(None)

    async def __aenter__(self) -> SharedReceiveQueue:
        return self

    async def aclose(self) -> None:
        """:meth:`close`, then close the queue pairs still receiving from the
        pool (their connections fail, as when their device goes) and wait
        until everything is released."""
        self.close()
        for qp in list(self._qps.values()):
            qp.close()
            await qp.wait_closed()
        await self.wait_closed()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _srq_limit(device: Device) -> int:
    return int(device.context.query_device().max_srq_wr)
