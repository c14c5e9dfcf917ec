"""Reliable-connected queue pairs whose work requests are coroutines.

Every posted work request is registered with the device's completion queue
under a fresh ``wr_id``; its completion resolves an ``asyncio.Future``.
Sends and writes may be posted unsignalled (``signaled=False``): the send
queue completes in order, so their futures resolve when a later signalled
request completes, and a failure still reports itself. The work request's
local memory stays referenced (and its memory regions counted as busy) until
that completion arrives, whatever happens to the awaiting task: cancelling
an await abandons only the wait."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar

from pyverbs.qp import QP, QPAttr

from aiordma import _ibv
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import DeviceError, ResourceBusyError, ResourceClosedError
from aiordma.lifecycle import Closable, check_thread, consume_outcome
from aiordma.verbs import _qp_setup
from aiordma.verbs._bulk import BulkRun
from aiordma.verbs._engine import SIGNAL_FRACTION, WorkEngine, closed_error
from aiordma.verbs._lane import Failed, LaneArrived, LaneWritten, PacketLane, Sent
from aiordma.verbs._work import Done, SendRequest, total_length
from aiordma.verbs.completion import WorkCompletion
from aiordma.verbs.endpoint import Endpoint, gid_to_bytes
from aiordma.verbs.memory import (
    Access,
    Local,
    MemoryRegion,
    RemoteBuffer,
    Segment,
    as_segments,
    check_remote,
    check_segments,
    check_writable,
)
from aiordma.verbs.options import (
    QueuePairOptions,
    Read,
    Send,
    SendOp,
    Write,
    atomic_word,
    check_imm,
)
from aiordma.verbs.window import MemoryWindow, check_bind, start_bind

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyverbs.srq import SRQ

    from aiordma.verbs._driver.base import QPDriver
    from aiordma.verbs._lifecycle import Owner
    from aiordma.verbs._room import QueueRoom
    from aiordma.verbs.completion import CompletionQueue


class ReceiveSource(Protocol):
    """What a queue pair needs from the shared receive queue it takes its
    receives from (:class:`~aiordma.verbs.srq.SharedReceiveRing`).

    Call order: ``_attach -> [_qp_closing] -> _qp_destroyed``, once per queue pair.
    """

    @property
    def device(self) -> Owner: ...

    @property
    def cq(self) -> CompletionQueue: ...

    @property
    def srq(self) -> SRQ: ...

    def is_closing(self) -> bool: ...

    def _attach(self, qp: QueuePair, driver: QPDriver) -> None: ...

    def _qp_closing(self, qp_num: int, error: BaseException) -> None: ...

    def _qp_destroyed(self, qp_num: int) -> None: ...


__all__ = [
    "FLUSH_TIMEOUT",
    "SIGNAL_FRACTION",
    "Endpoint",
    "QueuePair",
    "QueuePairOptions",
    "Read",
    "Send",
    "SendOp",
    "Write",
]

FLUSH_TIMEOUT = 5.0
"""How long :meth:`QueuePair.wait_closed` waits for flushed completions."""


BULK_WINDOW: Final = 64
"""Records of a bulk run posted at once (:meth:`QueuePair.start_bulk`), at most."""


def check_same_device(what: str, theirs: Owner, ours: Owner) -> None:
    """ValueError unless ``what`` (made on ``theirs``) is on ``ours``: each
    :class:`Device` has its own protection domain, and verbs objects of one
    cannot serve another's queue pairs, even on the same adapter."""
    if theirs is ours:
        return
    if theirs.name != ours.name:
        raise ValueError(f"{what} is on {theirs.name}, and this is on {ours.name}")
    raise ValueError(
        f"{what} was made with another Device object for {ours.name}: each Device has "
        "its own protection domain, and a queue pair works only with what is in its "
        f"own. Make both with one Device (Device.shared({ours.name!r}), or pass the same "
        "object as device=)"
    )


def check_registered_on(device: Owner, region: MemoryRegion) -> None:
    """ValueError for memory registered on another device (or another
    :class:`Device` of the same one) than ``device``: its lkey means nothing
    in that device's protection domain, and the adapter would fail the work."""
    if not device._holds(region):
        raise ValueError(
            f"{region!r} is registered on another Device than this queue pair's "
            f"({device.name}): register it on the connection's device "
            "(conn.register(), or conn.device.register())"
        )


_T = TypeVar("_T")


async def _post_in_chunks(
    room: QueueRoom, items: list[_T],
    post: Callable[[list[_T]], list[asyncio.Future[WorkCompletion]]],
) -> list[asyncio.Future[WorkCompletion]]:  # fmt: skip
    """Post ``items`` in chunks the queue can hold, each once ``room`` has
    room for it (no wait when it has); one future per item, in order."""
    futures: list[asyncio.Future[WorkCompletion]] = []
    size = room.size
    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        if not room.try_acquire(len(chunk)):  # no coroutine when there is room
            await room.acquire(len(chunk))
        futures += post(chunk)
    return futures


class QueuePair(Closable):
    """A reliable-connected (RC) queue pair driven by the event loop.

    Create with :meth:`aiordma.Device.create_qp`, connect with
    :meth:`connect` (or through rdma_cm), then await its operations. When the
    send or receive queue is full, posting waits for room. A failed work
    request raises :class:`CompletionError`; once the queue pair has failed,
    every pending and later operation raises too.

    Which way to post, by who posts:

    * applications: the awaited verbs (:meth:`post_send`, :meth:`rdma_write`,
      :meth:`rdma_read`, the atomics, :meth:`post_recv`), or lists of them
      (:meth:`post_batch`, :meth:`post_recv_batch`, and their ``_nowait``
      forms that refuse rather than wait);
    * a message channel: :meth:`open_lane`, fixed slots posted from the
      completion drain, no future per packet;
    * transfer agents (through ``aiordma.channel.start_bulk``): a table of
      one-sided requests, :meth:`start_bulk`, or one block, :meth:`post_block`;
    * a connection's keepalive: :meth:`post_probe`; receives handed to a
      callback: :meth:`post_recv_callback`.
    """

    kind: ClassVar[str] = "queue pair"

    def __init__(
        self,
        device: Owner,
        options: QueuePairOptions | None = None,
        shared_receive: ReceiveSource | None = None,
    ) -> None:
        opts = options or QueuePairOptions()
        self._rd_atomic = _qp_setup.check_limits(opts, device)
        self.options = opts
        self.device = device
        self.shared_receive = shared_receive
        """The :class:`~aiordma.SharedReceiveQueue` this QP receives from (None: its own queue)."""
        recv_cq = None
        if shared_receive is not None:
            check_same_device("the shared receive queue", shared_receive.device, device)
            if shared_receive.is_closing():
                raise ResourceClosedError("the shared receive queue is closed")
            recv_cq = shared_receive.cq
        self._reserved = opts.send_depth + (0 if shared_receive else opts.recv_depth)
        cq = self._cq = device._lease_cq(self._reserved)
        self._loop = cq.loop
        recv_cq = recv_cq or cq
        try:
            srq = shared_receive.srq if shared_receive is not None else None
            qp = _qp_setup.create(device, opts, cq.cq, recv_cq.cq, srq)
        except BaseException:
            device._release_cq(cq, self._reserved)
            raise
        self.qp_num: int = qp.qp_num
        self.psn: int = random.getrandbits(24)
        self.remote_endpoint: Endpoint | None = None
        self._connected = False
        self._engine = WorkEngine(
            qp, cq, opts.send_depth, opts.recv_depth, device.alloc, recv_cq=recv_cq,
            pd=device.pd, max_inline=opts.max_inline,
        )  # fmt: skip
        if shared_receive is not None:
            shared_receive._attach(self, self._engine.driver)
        device._adopt(self)
        self._stats = self._engine.stats
        self._stats.gauge_sources.append(self._work_posted)
        self._windows: set[MemoryWindow] = set()
        """Windows this QP bound: revoked when it is destroyed (a type 2
        window would otherwise keep the QP alive in the kernel)."""

    def __repr__(self) -> str:
        return f"<QueuePair qp_num={self.qp_num} {self.state_name}>"

    @functools.cached_property
    def gid_index(self) -> int:
        """Source GID index used by :meth:`connect` (rdma_cm picks its own)."""
        opts = self.options
        return opts.gid_index if opts.gid_index is not None else self.device.gid_index(opts.port)

    @functools.cached_property
    def local_endpoint(self) -> Endpoint:
        """What the peer needs to :meth:`connect` to this queue pair."""
        ctx = self.device.context
        gid = ctx.query_gid(self.options.port, self.gid_index).gid
        lid = ctx.query_port(self.options.port).lid
        return Endpoint(self.qp_num, self.psn, gid_to_bytes(gid), lid)

    # -- state -------------------------------------------------------------

    @property
    def completion_queue(self) -> CompletionQueue:
        """The completion queue this queue pair's work completes on (shared
        with the other queue pairs of its device and loop)."""
        return self._cq

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this queue pair's completions arrive on (it belongs to it)."""
        return self._loop

    @property
    def state_name(self) -> str:
        """The QP's state as the device reports it (``RESET``, ``RTS``, ``ERR``...)."""
        engine = self._engine
        if engine.qp is None:
            return "DESTROYED"
        if engine.closing:
            return "CLOSING"
        if engine.failure is not None:
            return "ERROR"
        return "CONNECTED" if self._connected else "INIT"

    def is_closing(self) -> bool:
        """True once :meth:`close` was called (or the QP failed and is closing)."""
        return self._engine.closing or self._engine.qp is None

    @property
    def pending(self) -> int:
        """Posted work requests whose completions have not arrived yet."""
        return self._engine.pending()

    @property
    def sends_in_flight(self) -> int:
        """Send-queue work requests posted and not yet completed."""
        sq = self._engine.sq
        return sq.size - sq.free

    @property
    def qp(self) -> QP:
        """The pyverbs ``QP`` (for what aiordma does not wrap)."""
        qp = self._engine.qp
        if qp is None:
            raise ResourceClosedError("queue pair is closed")
        return qp

    def connect(self, remote: Endpoint) -> None:
        """Move to RTS, connected to the queue pair described by ``remote``."""
        attr = _qp_setup.connect_attr(self.device, self.options, remote, self.psn,
                                      self.gid_index, self._rd_atomic)  # fmt: skip
        qp = self.qp
        with verbs_errors(f"connecting QP {self.qp_num} to QP {remote.qp_num}"):
            qp.to_rtr(attr)
            qp.to_rts(attr)
        self.remote_endpoint = remote
        self._connected = True

    def _move_to_rts(self, rtr: QPAttr, rtr_mask: int, rts: QPAttr, rts_mask: int) -> None:
        """Internal entry for rdma_cm set-up (:mod:`aiordma.cm._setup`): apply the
        RTR then RTS attributes rdma_cm computed for this connection."""
        for attr, mask, what in ((rtr, rtr_mask, "RTR"), (rts, rts_mask, "RTS")):
            with verbs_errors(f"moving QP {self.qp_num} to {what}"):
                self.qp.modify(attr, mask)
        self._connected = True

    # -- send side ---------------------------------------------------------

    def _inline_flag(self, opcode: int, segments: tuple[Segment, ...], inline: bool | None) -> int:
        if inline is False or opcode not in _ibv.INLINE_OPCODES:
            return 0
        size = total_length(segments)
        limit = self.options.max_inline
        if inline and size > limit:
            raise ValueError(f"{size} bytes exceed the queue pair's max_inline of {limit}")
        return _ibv.SEND_INLINE if size <= limit else 0

    def _build(self, op: SendOp) -> SendRequest:
        """Validate ``op`` into a request the engine can post."""
        if not isinstance(op, Send | Write | Read):
            raise TypeError(f"not a send-side operation (Send, Write or Read): {op!r}")
        segments = as_segments(op.local)
        check_segments(segments, self.options.max_send_sge)
        self._check_device(segments)
        if isinstance(op, Send):
            check_imm(op.imm)
            opcode = _ibv.WR_SEND if op.imm is None else _ibv.WR_SEND_WITH_IMM
            flags = self._inline_flag(opcode, segments, op.inline)
            return SendRequest(opcode, segments, flags, op.imm, signaled=op.signaled)
        size = total_length(segments)
        check_remote(op.remote)
        if size > op.remote.length:
            raise ValueError(
                f"{size} local bytes do not fit the {op.remote.length}-byte remote buffer"
            )
        if isinstance(op, Write):
            check_imm(op.imm)
            opcode = _ibv.WR_RDMA_WRITE if op.imm is None else _ibv.WR_RDMA_WRITE_WITH_IMM
            flags = self._inline_flag(opcode, segments, op.inline)
            return SendRequest(opcode, segments, flags, op.imm, op.remote.addr, op.remote.rkey,
                               signaled=op.signaled)  # fmt: skip
        check_writable(segments, "rdma_read")
        return SendRequest(_ibv.WR_RDMA_READ, segments, 0, None, op.remote.addr, op.remote.rkey)

    async def post_batch(self, ops: Sequence[SendOp]) -> list[asyncio.Future[WorkCompletion]]:
        """Post many sends/writes/reads, chained into as few ``ibv_post_send`` calls as room allows.

        Returns one future per operation, in order; they resolve as the
        completions arrive. Waits for send-queue room when needed.
        """
        engine = self._engine
        quick = engine.quick_sends(ops, Send)  # plain sends: checked and posted in one call
        if quick is not None:
            return quick
        engine.check_usable()
        built = [self._build(op) for op in ops]
        self._stats.add("ops:batched", len(built))
        return await _post_in_chunks(engine.sq, built, engine.post_sends)

    def post_batch_nowait(self, ops: Sequence[SendOp]) -> list[asyncio.Future[WorkCompletion]]:
        """:meth:`post_batch` without waiting: raises :class:`ResourceBusyError`
        (and posts nothing) when the send queue has no room for all of ``ops``."""
        engine = self._engine
        engine.check_usable()
        built = [self._build(op) for op in ops]
        if not engine.sq.try_acquire(len(built)):
            raise ResourceBusyError(f"send queue has no room for {len(built)} work requests")
        self._stats.add("ops:batched", len(built))
        return engine.post_sends(built)

    def post_probe(self, done: Done) -> None:
        """Ask the peer's adapter for an acknowledgement: a signalled
        zero-length RDMA write, which touches no memory on either side.

        ``done(None, 0)`` reports the acknowledgement; ``done(error, 0)``
        that the transport gave up (``IBV_WC_RETRY_EXC_ERR`` once the
        retries of ``timeout`` and ``retry_cnt`` ran out: the peer machine
        or the path to it is gone). What connection keepalives are made of.
        Raises :class:`ResourceBusyError` when the send queue is full.
        """
        engine = self._engine
        if not engine.sq.try_acquire(1):
            engine.check_usable()
            raise ResourceBusyError("send queue is full")
        engine.post_probe(done)

    def _ready_probes(self) -> None:
        """Register what :meth:`post_probe` needs now (internal entry for
        connections with keepalive), so no registration happens mid-life."""
        self._engine.ensure_scratch()

    def post_write_callback(
        self, local: Segment, remote: RemoteBuffer, imm: int, done: Done
    ) -> None:
        """Post one signalled RDMA write with immediate ``imm`` of ``local``
        to the start of ``remote``; ``done(error, 0)`` is called from the
        completion drain (``(None, 0)`` once the peer's adapter took it; it
        must not raise), and the peer gets a receive completion carrying
        ``imm``. Raises :class:`ResourceBusyError` when the send queue is full.
        What a message channel's RECORDs are."""
        if local.mr.closed:
            raise ResourceClosedError("cannot write from a closed memory region")
        if local.length > remote.length:
            raise ValueError(f"{local.length} bytes do not fit the {remote.length} of {remote!r}")
        engine = self._engine
        if not engine.sq.try_acquire(1):
            engine.check_usable()
            raise ResourceBusyError("send queue is full")
        engine.post_send_to(
            local,
            True,
            done,
            _ibv.WR_RDMA_WRITE_WITH_IMM,
            imm & 0xFFFFFFFF,
            remote.addr,
            remote.rkey,
        )

    def post_recv_callback(self, local: Segment, done: Done) -> None:
        """Post one receive into a registered segment; ``done(error,
        byte_len)`` is called from the completion drain when a message lands
        (``(None, byte_len)`` on success, ``(error, 0)`` on failure; it
        must not raise). Raises :class:`ResourceBusyError` when the receive
        queue is full."""
        engine = self._engine
        self._check_own_receives()
        if local.mr.closed:
            raise ResourceClosedError("cannot receive into a closed memory region")
        if not local.mr.access & Access.LOCAL_WRITE:
            raise ValueError("post_recv needs memory registered with Access.LOCAL_WRITE")
        if not engine.rq.try_acquire(1):
            engine.check_usable()
            raise ResourceBusyError("receive queue is full")
        engine.post_recv_to(local, done)

    def open_lane(
        self, send_mr: MemoryRegion, sends: int, recv_mr: MemoryRegion | None, recvs: int,
        slot_size: int, sent: Sent, arrived: LaneArrived, failed: Failed,
        written: LaneWritten | None = None,
    ) -> PacketLane:  # fmt: skip
        """Fixed send and receive slots for one owner's packets, posted and
        completed with no work record or future per packet (see
        ``aiordma/verbs/_lane.py``): what :class:`~aiordma.MessageChannel`
        sends and receives through.

        ``sends`` slots of ``slot_size`` bytes from the start of ``send_mr``
        and ``recvs`` from the start of ``recv_mr`` (which takes that many
        receive-queue slots for the lane's life). ``sent(slot)``,
        ``arrived(slot, byte_len)``, ``written(slot, imm, byte_len)`` (an RDMA
        write with immediate consumed the slot; None: the peer may not write)
        and ``failed(error)`` are called from the completion drain and must
        not raise. The lane stops with the queue
        pair; its regions stay busy (:attr:`MemoryRegion.inflight`) until
        the queue pair is destroyed.
        """
        if recvs:
            self._check_own_receives()
        for mr in (send_mr, recv_mr):
            if mr is not None and mr.closed:
                raise ResourceClosedError("cannot use a closed memory region for packets")
        if recv_mr is not None and not recv_mr.access & Access.LOCAL_WRITE:
            raise ValueError("packets land only in memory registered with Access.LOCAL_WRITE")
        return self._engine.open_lane(
            send_mr, sends, recv_mr, recvs, slot_size, sent, arrived, failed, written
        )

    def start_bulk(
        self, write: bool, table: Any, count: int, mrs: tuple[MemoryRegion, ...],
        done: Done, *, window: int = BULK_WINDOW, chunk: int | None = None,
    ) -> BulkRun:  # fmt: skip
        """Start RDMA WRITEs (or READs) of ``count`` records of ``table``, all
        their local memory in ``mrs``, with no Python per record (see
        ``aiordma/verbs/_bulk.py``): what transfer agents move descriptor
        lists with.

        ``table`` holds :mod:`aiordma.bulk_table` records (the caller
        checked every address against its region). At most
        ``window`` records are posted at once (bounded by the send queue), in
        chunks of ``chunk`` (a quarter of the window by default) whose last is
        signalled. ``done(error, tag)`` is called once from the completion
        drain when every posted record is settled: ``error`` is None or the
        first failure, ``tag`` the failed record's tag (-1: none). The
        returned run's :meth:`~BulkRun.cancel` stops posting; ``done`` still
        waits for what was posted. ``mrs`` stay busy until then.
        """
        engine = self._engine
        engine.check_usable()
        for mr in mrs:
            if mr.closed:
                raise ResourceClosedError("cannot move data through a closed memory region")
            if not write and not mr.access & Access.LOCAL_WRITE:
                raise ValueError(
                    "RDMA reads land only in memory registered with Access.LOCAL_WRITE"
                )
        window = max(1, min(window, engine.sq.size))
        chunk = max(1, min(chunk or window // 4, window))
        holder: list[BulkRun] = []
        loop = self.loop

        async def room(n: int) -> None:
            try:
                await engine.sq.acquire(n)
            except BaseException as exc:
                holder[0].fail_wait(exc)
                raise
            holder[0].resume(n)

        def starved(n: int) -> None:
            task = loop.create_task(room(n))
            task.add_done_callback(consume_outcome)  # its error was handed on already

        opcode = _ibv.WR_RDMA_WRITE if write else _ibv.WR_RDMA_READ
        self._stats.add("ops:bulk_write" if write else "ops:bulk_read")
        run = engine.start_bulk(opcode, table, count, window, chunk, mrs, done, starved)
        holder.append(run)  # before any wait for room starts: that is a task
        return run

    def post_block(
        self, write: bool, mr: MemoryRegion, addr: int, length: int, remote_addr: int, rkey: int
    ) -> asyncio.Future[WorkCompletion] | None:
        """One RDMA WRITE (or READ) of ``length`` bytes at ``addr`` inside
        ``mr`` to (from) the peer's ``remote_addr`` under ``rkey``, everything
        checked by the caller as for :meth:`start_bulk`: posted now, and its
        future returned, if the queue pair is usable and has a free send
        slot; else None, having done nothing (use :meth:`start_bulk`). What a
        transfer agent moves a single block with."""
        opcode = _ibv.WR_RDMA_WRITE if write else _ibv.WR_RDMA_READ
        counter = "ops:bulk_write" if write else "ops:bulk_read"
        return self._engine.quick_block(opcode, mr, addr, length, remote_addr, rkey, counter)

    def send_room(self) -> bool:
        """Whether a send posted now finds room in the send queue (nobody
        waits ahead and a slot is free); posting may still fail if the
        queue pair failed."""
        return self._engine.sq.can_acquire(1)

    async def wait_send_room(self, n: int = 1) -> None:
        """Wait until ``n`` send-queue slots are free (they are not taken)."""
        sq = self._engine.sq
        await sq.acquire(n)
        sq.release(n)

    def stats(self) -> dict[str, Any]:
        """What this queue pair did, as plain data (see :mod:`aiordma.metrics`):
        awaited verbs by kind (``ops:rdma_read``...) with their latency,
        batched and received work requests, windows bound, failed
        completions by status (``errors:IBV_WC_...``), and work flushed once
        the QP was in the error state (``flushed``, apart: every close flushes).
        Whatever the metrics setting, its gauges count every work request
        posted, by any path: ``posted_sends`` (send-queue requests),
        ``posted_receives`` (on its own receive queue) and ``send_doorbells``
        (posts of one or more send-queue requests)."""
        return self._stats.snapshot()

    def _work_posted(self) -> dict[str, int]:
        driver = self._engine.driver
        return {
            "posted_sends": driver.sends,
            "posted_receives": driver.receives,
            "send_doorbells": driver.doorbells,
        }

    async def _run(self, kind: str, request: SendRequest) -> WorkCompletion:
        """Post ``request`` (waiting for send-queue room) and await its
        completion, counted as ``kind`` and timed from posting to completion
        while metrics are on: the checked path of a single awaited verb."""
        engine = self._engine
        engine.check_usable()
        if not engine.sq.try_acquire(1):
            await engine.sq.acquire(1)
        return await engine.post_sends([request], kind)[0]

    async def post_send(self, local: Local, *, imm: int | None = None,
                        inline: bool | None = None) -> WorkCompletion:  # fmt: skip
        """Send ``local`` to the peer's next posted receive; resolves when acknowledged."""
        opcode = _ibv.WR_SEND if imm is None else _ibv.WR_SEND_WITH_IMM
        if inline is None:
            fut = self._engine.quick_send(opcode, local, None, imm, "send")
            if fut is not None:
                return await fut
        return await self._run("send", self._build(Send(local, imm, inline)))

    async def send_with_imm(self, local: Local, imm: int) -> WorkCompletion:
        """Send with 32-bit immediate data, delivered in the receiver's completion."""
        return await self.post_send(local, imm=imm)

    async def rdma_write(self, local: Local, remote: RemoteBuffer, *, imm: int | None = None,
                         inline: bool | None = None) -> WorkCompletion:  # fmt: skip
        """Write ``local`` into the peer's ``remote`` buffer.

        With ``imm`` the write also consumes one of the peer's posted
        receives, whose completion carries the immediate data.
        """
        opcode = _ibv.WR_RDMA_WRITE if imm is None else _ibv.WR_RDMA_WRITE_WITH_IMM
        if inline is None:
            fut = self._engine.quick_send(opcode, local, remote, imm, "rdma_write")
            if fut is not None:
                return await fut
        return await self._run("rdma_write", self._build(Write(local, remote, imm, inline)))

    async def rdma_read(self, local: Local, remote: RemoteBuffer) -> WorkCompletion:
        """Read the peer's ``remote`` buffer into ``local`` (``len(local)`` bytes)."""
        fut = self._engine.quick_send(_ibv.WR_RDMA_READ, local, remote, None, "rdma_read")
        if fut is not None:
            return await fut
        return await self._run("rdma_read", self._build(Read(local, remote)))

    def _atomic_remote(self, remote: RemoteBuffer) -> RemoteBuffer:
        check_remote(remote)
        if not self.device.attributes.atomic:
            raise DeviceError(95, f"{self.device.name} does not support atomic operations")
        if remote.length < 8 or remote.addr % 8:
            raise ValueError("atomics need an 8-byte aligned remote buffer of at least 8 bytes")
        return remote[:8]

    async def atomic_fetch_add(self, remote: RemoteBuffer, add: int) -> int:
        """Atomically add ``add`` to the 64-bit word at ``remote``; returns the old value."""
        r = self._atomic_remote(remote)
        request = SendRequest(
            _ibv.WR_ATOMIC_FETCH_AND_ADD, (), 0, None, r.addr, r.rkey, atomic_word(add, "add")
        )
        return await self._atomic_result(request)

    async def atomic_cmp_swap(self, remote: RemoteBuffer, compare: int, swap: int) -> int:
        """Atomically replace the 64-bit word at ``remote`` with ``swap`` if it equals
        ``compare``; returns the old value (the swap happened iff it equals ``compare``)."""
        r = self._atomic_remote(remote)
        request = SendRequest(
            _ibv.WR_ATOMIC_CMP_AND_SWP, (), 0, None, r.addr, r.rkey,
            atomic_word(compare, "compare"), atomic_word(swap, "swap"),
        )  # fmt: skip
        return await self._atomic_result(request)

    async def _atomic_result(self, request: SendRequest) -> int:
        self._engine.ensure_scratch()
        wc = await self._run(_ibv.WR_NAMES[request.opcode], request)
        assert wc.atomic_value is not None
        return wc.atomic_value

    async def bind_window(
        self, local: MemoryRegion | Segment, access: Access = Access.REMOTE_READ
    ) -> MemoryWindow:
        """Bind a memory window over ``local``: remote access to exactly
        those bytes, with its own rkey, revocable at once with
        :meth:`MemoryWindow.invalidate`.

        ``local``'s region must have been registered on this queue pair's
        device with ``Access.MW_BIND`` (and ``LOCAL_WRITE`` for a writable
        window); ``access`` is remote access only. Type 2 windows (where the
        device has them) work only through this queue pair. Returns once the
        window is bound. Raises ``ValueError``/``TypeError`` for what cannot
        be bound, and :class:`~aiordma.DeviceError` (``EOPNOTSUPP``) on a
        device without memory windows.
        """
        segment, access, kind = check_bind(self.device, self._engine, local, access)
        engine = self._engine
        if not engine.sq.try_acquire(1):
            await engine.sq.acquire(1)
        window = self._bind(segment, access, kind)
        try:
            await asyncio.shield(window.bound)
        except BaseException:
            window.invalidate()  # once the bind is over, if it is not yet
            raise
        return window

    def bind_window_nowait(
        self, local: MemoryRegion | Segment, access: Access = Access.REMOTE_READ
    ) -> MemoryWindow:
        """:meth:`bind_window` without waiting for the bind to complete.

        The window's rkey works for the peer once the bind has run, and the
        send queue runs in order: a send posted after this call reaches the
        peer after the window is bound, so the rkey may travel in it. The
        bind's outcome is ``window.bound``. Raises
        :class:`~aiordma.ResourceBusyError` when the send queue is full.
        """
        segment, access, kind = check_bind(self.device, self._engine, local, access)
        if not self._engine.sq.try_acquire(1):
            raise ResourceBusyError("send queue is full: no room to bind a memory window")
        return self._bind(segment, access, kind)

    def _bind(self, segment: Segment, access: Access, kind: int) -> MemoryWindow:
        """Allocate a window and post its bind (one send-queue slot already taken)."""
        window = start_bind(self.device, self._engine, segment, access, kind, self.qp_num,
                            self._windows)  # fmt: skip
        self._stats.add("ops:bind_window")
        return window

    async def flush_sends(self) -> None:
        """Wait until every send-side request posted so far has completed.

        If the newest is unsignalled, a zero-length signalled RDMA write
        (which touches no remote memory) is posted behind it so its
        completion is reported. Raises if one of them failed, or if the queue
        pair has failed or is closed.
        """
        engine = self._engine
        engine.check_usable()
        last = engine.last_send
        if last is None or last.settled:
            return
        if last.future is None or engine.silent_tail():
            # Callback work has no future to await, and an unsignalled tail
            # reports nothing: a marker's completion (the send queue
            # completes in order) says when everything before it is done.
            await engine.sq.acquire(1)
            if not last.settled:
                await asyncio.shield(engine.post_marker())
                return
            engine.sq.release(1)
        if last.future is not None:
            await asyncio.shield(last.future)

    # -- receive side ------------------------------------------------------

    def _check_own_receives(self) -> None:
        if self.shared_receive is not None:
            raise ValueError(
                f"{self!r} receives from a shared receive queue: its message channel "
                "takes its packets from there, and nothing can be posted on the QP"
            )

    def _recv_lists(self, locals_: Sequence[Local]) -> list[tuple[Segment, ...]]:
        self._check_own_receives()
        self._engine.check_usable()
        seglists = [as_segments(local) for local in locals_]
        for segs in seglists:
            check_segments(segs, self.options.max_recv_sge)
            check_writable(segs, "post_recv")
            self._check_device(segs)
        return seglists

    def _check_device(self, segments: tuple[Segment, ...]) -> None:
        for seg in segments:
            check_registered_on(self.device, seg.mr)

    async def post_recv_batch(
        self, locals_: Sequence[Local]
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post receives for ``locals_``; one future per buffer, resolved when a message lands."""
        if self.shared_receive is None:
            quick = self._engine.quick_recvs(locals_)
            if quick is not None:
                return quick
        seglists = self._recv_lists(locals_)
        engine = self._engine
        self._stats.add("ops:recv", len(seglists))
        return await _post_in_chunks(engine.rq, seglists, engine.post_recvs)

    def post_recv_nowait(self, locals_: Sequence[Local]) -> list[asyncio.Future[WorkCompletion]]:
        """:meth:`post_recv_batch` without waiting: raises :class:`ResourceBusyError`
        (and posts nothing) when the receive queue has no room for all of them."""
        seglists = self._recv_lists(locals_)
        if not self._engine.rq.try_acquire(len(seglists)):
            raise ResourceBusyError(f"receive queue has no room for {len(seglists)} buffers")
        self._stats.add("ops:recv", len(seglists))
        return self._engine.post_recvs(seglists)

    async def post_recv(self, local: Local) -> WorkCompletion:
        """Post one receive buffer and wait for the message that lands in it."""
        (fut,) = await self.post_recv_batch([local])
        return await fut

    # -- closing -----------------------------------------------------------

    def close(self) -> None:
        """Start closing: fail pending awaits now, flush the queues (idempotent).

        Await :meth:`wait_closed` for the flush to finish and the QP to be
        destroyed; buffers of pending work stay referenced until then.
        """
        check_thread(self._loop, "QueuePair.close()")
        self._close(closed_error)

    def _close(self, error: Callable[[], BaseException]) -> None:
        """:meth:`close`, failing pending and later work with ``error()``."""
        if self.is_closing():
            return
        flushed = self._engine.close(error)
        if self.shared_receive is not None:
            self.shared_receive._qp_closing(self.qp_num, error())
        if flushed:
            self.destroy()

    async def wait_closed(self) -> None:
        """Wait until a closing queue pair has flushed and been destroyed."""
        engine = self._engine
        if engine.qp is None:
            return
        if engine.pending() and not self._loop.is_closed():
            if engine.drained is None or engine.drained.done():
                engine.drained = self._loop.create_future()
            try:
                async with asyncio.timeout(FLUSH_TIMEOUT):
                    await asyncio.shield(engine.drained)
            except TimeoutError:
                pass
        self.destroy()

    def destroy(self) -> None:
        """Destroy the QP now, without waiting for flushes (idempotent)."""
        if self._engine.qp is None:
            return
        try:
            for window in list(self._windows):
                window.invalidate()
            self._engine.destroy()
        finally:
            if self.shared_receive is not None:
                self.shared_receive._qp_destroyed(self.qp_num)
            self.device._disown(self)
            self.device._release_cq(self._cq, self._reserved)

    def _owner_closing(self) -> None:
        self.destroy()

    def _unclosed(self) -> bool:
        return self._engine.qp is not None
