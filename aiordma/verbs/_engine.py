# cython: annotation_typing=True
"""The work-request engine of one queue pair: validated work in, futures out.

:class:`WorkEngine` owns a pyverbs ``QP`` handle and everything between "a
validated list of segments and an opcode" and "a future resolved or
failed": posting work requests, tracking them by ``wr_id`` on the
completion queue, resolving their futures when completions arrive, settling
unsignalled sends, and failing or flushing what is pending when the queue
pair fails or closes. It starts no tasks. On the checked path it checks
nothing the caller should have: :class:`~aiordma.QueuePair` validates
arguments and waits for queue room (``sq``/``rq``), then calls
:meth:`WorkEngine.post_sends` or :meth:`WorkEngine.post_recvs`.

It posts through its queue pair's driver (``aiordma.verbs._driver``),
compiled or pure, and never asks which; what the driver cannot post (a
memory-window bind, rare) its caller posts through pyverbs inside
:meth:`WorkEngine.post_with`. Every post ends the same way (``_posted``):
its regions held busy, its work tracked by ``wr_id``, an unsignalled send
queued for settling; the records themselves are in ``_work.py``.

Every awaited verb passes through here, so the module is compiled when the
build could (``_engine.pxd``; see :mod:`aiordma._compiled`): a single
awaited operation on plain arguments (:meth:`WorkEngine.quick_send`,
:meth:`WorkEngine.quick_recvs`, and a transfer agent's single block,
:meth:`WorkEngine.quick_block`) is checked, recorded and posted in one call,
and its completion resolves the future from the drain with no Python in
between; what is not plain goes back to the checked path.

Call order: ``(quick_* | post_* | open_lane | start_bulk | complete)* ->
close -> complete* -> destroy`` (``close`` once; ``complete`` from the
CQ's drain, also for flushed work).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any

from pyverbs.qp import QPAttr

from aiordma import _ibv, metrics
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import DeviceError, QueuePairError, ResourceClosedError
from aiordma.lifecycle import check_loop, consume_outcome
from aiordma.metrics import Stats, record
from aiordma.verbs import _driver
from aiordma.verbs._bulk import BulkRun, Starved
from aiordma.verbs._completed import Opcode, WorkCompletion, from_wc
from aiordma.verbs._lane import Failed, LaneArrived, LaneWritten, PacketLane, Sent
from aiordma.verbs._room import QueueRoom
from aiordma.verbs._work import Completer, Done, SendRequest, Unsignalled, Work, total_length
from aiordma.verbs.completion import completion_error
from aiordma.verbs.memory import Access, MemoryRegion, RemoteBuffer, Segment

if TYPE_CHECKING:
    from pyverbs.cq import WC
    from pyverbs.pd import PD
    from pyverbs.qp import QP

    from aiordma import _cython_shim as cython
    from aiordma.verbs.completion import CompletionQueue
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

SIGNAL_FRACTION = 4
"""However many unsignalled requests are posted, at least every
``send_depth // SIGNAL_FRACTION``-th is signalled, so their send-queue entries
come back."""
ID_BLOCK = 4096
"""Work request ids an engine claims from its CQ at once (one Python call per block)."""

_SIGNALED = cython.declare(cython.int, _ibv.SEND_SIGNALED)  # C integers for typed code
_INLINE = cython.declare(cython.int, _ibv.SEND_INLINE)
_WR_SEND = cython.declare(cython.int, _ibv.WR_SEND)
_WR_SEND_IMM = cython.declare(cython.int, _ibv.WR_SEND_WITH_IMM)
_WR_WRITE_IMM = cython.declare(cython.int, _ibv.WR_RDMA_WRITE_WITH_IMM)
_WR_READ = cython.declare(cython.int, _ibv.WR_RDMA_READ)
_LOCAL_WRITE = cython.declare(cython.int, int(Access.LOCAL_WRITE))
_SUCCESS = cython.declare(cython.int, _ibv.WC_SUCCESS)
__all__ = ["ID_BLOCK", "SIGNAL_FRACTION", "WorkEngine", "closed_error"]


def closed_error() -> BaseException:
    """The error pending and later work gets once its queue pair is closed."""
    return ResourceClosedError("queue pair is closed")


@cython.cfunc
def _hold(mrs: tuple[MemoryRegion, ...]) -> None:
    """Mark ``mrs`` busy until their work's completion (:func:`_let_go`).
    The one busy-memory rule of every post: the regions were found open
    just before it, by the quick paths' test or :meth:`WorkEngine._ready`."""
    for mr in mrs:
        mr._inflight += 1


@cython.cfunc
def _let_go(mr: MemoryRegion) -> None:
    """``mr._release()``, without its Python frame unless it may wake a closer."""
    inflight: cython.Py_ssize_t = mr._inflight
    if inflight > 1 or mr._idle is None:
        mr._inflight = inflight - 1
    else:
        mr._release()


_OP_COUNTERS: dict[str, str] = {
    kind: "ops:" + kind
    for kind in (
        "send",
        "rdma_write",
        "rdma_read",
        *(_ibv.WR_NAMES[op] for op in _ibv.ATOMIC_OPCODES),
    )
}
"""The counter of each awaited verb, named once rather than per operation."""


@cython.cclass
class WorkEngine(Completer):
    """Posts, tracks and completes the work requests of one pyverbs ``QP``.

    ``sq`` and ``rq`` count free send- and receive-queue entries: callers take
    them (waiting if they must) before :meth:`post_sends` /
    :meth:`post_recvs`, and completions give them back. ``alloc(size)``
    registers local scratch memory (atomic results and the marker write of
    :meth:`post_marker`) on first need. ``pd`` is the protection domain the
    queue pair is in: the quick paths post only from regions registered there.
    """

    def __init__(
        self,
        qp: QP,
        cq: CompletionQueue,
        send_depth: int,
        recv_depth: int,
        alloc: Callable[[int], MemoryRegion],
        recv_cq: CompletionQueue | None = None,
        pd: PD | None = None,
        max_inline: int = 0,
    ) -> None:
        self.qp = qp
        """The pyverbs handle (None once destroyed)."""
        self.qp_num = qp.qp_num
        self.cq = cq
        self.sq = QueueRoom(send_depth)
        self.rq = QueueRoom(recv_depth)
        self.works: dict[int, Work] = {}
        """Posted work whose completion has not arrived, by ``wr_id``."""
        self.failure: BaseException | None = None
        """The first failed completion, once the queue pair is in the error state."""
        self.closing = False
        self.close_error: Callable[[], BaseException] = closed_error
        self.drained: asyncio.Future[None] | None = None
        """Set by a closer waiting for :attr:`works` to empty; resolved when it does."""
        self.last_send: Work | None = None
        self.posters: list[PacketLane | BulkRun] = []
        """The compiled posters it made and that still run: packet lanes
        (:meth:`open_lane`) and bulk runs (:meth:`start_bulk`)."""
        Completer.__init__(self, cq.loop)
        self._alloc = alloc
        self._pd = pd
        self._max_inline = max_inline
        self._scratch: MemoryRegion | None = None
        self._scratch_free: list[int] = []
        self.driver = _driver.qp_driver(qp, cq._driver, (recv_cq or cq)._driver)
        """What posts this QP's work requests."""
        self._post_one = self.driver.post_send
        self._post_recv = self.driver.post_recv
        self._handlers = cq.handlers
        self._kick = cq.kick if cq.polls else None
        """What to tell the CQ after a one-sided post, if it polls a fixed window."""
        self._expect = cq.expect if cq.expects else None
        """What to tell the CQ after a two-sided send, if it may spin for the answer."""
        self._next_id = 0
        self._last_id = 0
        """This engine's block of work request ids: ``[_next_id, _last_id)``."""
        self._thread = 0
        """The thread the loop was last confirmed running in (:meth:`_usable_now`)."""
        self._unsignalled = Unsignalled(send_depth // SIGNAL_FRACTION)
        self.stats = Stats("queue_pair")
        """Operations by kind, errors by status, latency of awaited verbs."""

    # -- state -------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise unless work may be posted now (right loop, open, not failed)."""
        self.cq.check_loop()
        if self.closing or self.qp is None:
            raise self.close_error()
        if self.failure is not None:
            raise self.failed_error()

    @cython.cfunc
    def _usable_now(self) -> cython.bint:
        """Whether work may be posted now, by the quick paths' test: open,
        not failed, and called from the thread the CQ's loop was confirmed
        running in while it runs (else the checked path says what is wrong)."""
        if self.closing or self.qp is None or self.failure is not None:
            return False
        if self._thread == get_ident() and self.loop.is_running():
            return True
        try:
            check_loop(self.loop)
        except Exception:
            return False
        self._thread = get_ident()
        return True

    def failed_error(self, flushed: BaseException | None = None) -> QueuePairError:
        """The error of work refused or flushed by a QP in the error state,
        naming the first failure (its cause), or the flush if none was seen."""
        first = self.failure or flushed
        error = QueuePairError(f"queue pair failed earlier: {first}")
        error.__cause__ = first
        return error

    def _fail(self, exc: BaseException) -> None:
        """The QP is in the error state: refuse new work; pending work will flush."""
        if self.failure is None:
            self.failure = exc
            err = QueuePairError(f"queue pair failed: {exc}")
            err.__cause__ = exc
            self.sq.fail(err)
            self.rq.fail(err)
            for poster in self.posters:
                poster.stop()

    # -- records -------------------------------------------------------------

    @cython.cfunc
    def _register(self, work: Work) -> cython.ulonglong:
        """A fresh ``wr_id`` whose completion the CQ's drain gives to ``work``."""
        if self._next_id == self._last_id:
            self._next_id = self.cq.claim_ids(ID_BLOCK)
            self._last_id = self._next_id + ID_BLOCK
        wr_id: cython.ulonglong = self._next_id
        self._next_id += 1
        self._handlers[wr_id] = work
        work.wr_id = wr_id
        return wr_id

    @cython.cfunc
    def _timed(self, work: Work, kind: str | None) -> None:
        """Count an awaited verb as ``kind`` and time it from now to its
        completion, while metrics are on."""
        if kind is not None and metrics._on:
            self.stats.counters[_OP_COUNTERS[kind]] += 1
            work.kind = kind
            work.started = time.perf_counter()

    @cython.cfunc
    def _plain(self, local: object, writable: cython.bint) -> MemoryRegion | None:
        """The region of ``local`` (a :class:`MemoryRegion`, or a
        :class:`Segment` of one) when the quick paths may post from it: open,
        registered in this protection domain, and writable if asked. None
        otherwise (the caller takes the checked path)."""
        mr: Any = local.mr if type(local) is Segment else local
        if type(mr) is not MemoryRegion or mr._mr is None or mr._pd is not self._pd:
            return None
        if writable and not int(mr.access) & _LOCAL_WRITE:
            return None
        return mr

    @cython.cfunc
    def _posted(self, work: Work) -> None:
        """The tail of every post the provider took: the work's memory held
        busy and the work tracked by its id until its completion, an
        unsignalled send queued for a later completion to settle."""
        _hold(work.mrs)
        self.works[work.wr_id] = work
        if work.silent:
            self._unsignalled.queue(work)

    @cython.cfunc
    # ``list``, not ``list[Work]``: Cython reads a parametrised list on a
    # cfunc as another type than the .pxd's ``list``.
    def _chain_posted(self, works: list, room: QueueRoom, rc: cython.int) -> None:  # type: ignore[type-arg]
        """After a chain's post: every work :meth:`_posted`, or, if the
        provider refused it (``rc``), none, and its error raised."""
        if rc:
            raise self._refused(works, room, rc)
        for work in works:
            self._posted(work)

    @cython.cfunc
    def _tell_cq(self, answered: cython.bint) -> None:
        """Work was posted: a send the peer answers (``answered``) may be
        spun for; one-sided work only keeps a fixed polling window going."""
        if answered:
            if self._expect is not None:
                self._expect()
        elif self._kick is not None:
            self._kick()

    def _ready(self, room: QueueRoom, taken: int, mrs: list[MemoryRegion]) -> None:
        """The checked paths' test just before posting: the queue pair usable
        and every region still open (one may have been deregistered while
        the caller waited for room); else the ``taken`` entries of ``room``
        go back and the error is raised."""
        try:
            self.check_usable()
            for mr in mrs:
                mr._check_open()
        except BaseException:
            room.release(taken)
            raise

    # -- send side ---------------------------------------------------------

    def ensure_scratch(self) -> None:
        """Register the scratch memory atomics land in (one 8-byte word per send-queue entry)."""
        if self._scratch is None:
            self._scratch = self._alloc(8 * self.sq.size)
            self._scratch_free = list(range(0, 8 * self.sq.size, 8))

    @cython.ccall
    def quick_send(
        self, opcode: cython.int, local: object, remote: object, imm: object, kind: str
    ) -> asyncio.Future[WorkCompletion] | None:
        """Post one send, RDMA write or RDMA read of ``local`` (a
        :class:`MemoryRegion` or a :class:`Segment` of one) and return its
        future, when everything is plain: the queue pair usable from here,
        the region open and registered in its protection domain (writable,
        for a read), ``remote`` a :class:`RemoteBuffer` it fits (for writes
        and reads), ``imm`` None or 32 bits, and a send-queue entry free.
        Sends and writes that fit ``max_inline`` go inline. Returns None,
        having done nothing, otherwise: the caller takes the checked path,
        which waits for room and raises what is wrong. ``kind`` names the
        counter and latency histogram of an awaited verb (see
        :meth:`QueuePair.stats`)."""
        mr = self._plain(local, opcode == _WR_READ)
        if mr is None or not self._usable_now():
            return None
        length: cython.longlong = local.length  # type: ignore[attr-defined]
        addr: cython.ulonglong = mr.addr
        if type(local) is Segment:
            addr += local.offset
        flags: cython.int = _SIGNALED
        raddr: cython.ulonglong = 0
        rkey: cython.uint = 0
        if imm is not None and (type(imm) is not int or not 0 <= imm < 1 << 32):
            return None
        if opcode != _WR_SEND and opcode != _WR_SEND_IMM:
            if type(remote) is not RemoteBuffer or length > remote.length:
                return None
            raddr = remote.addr
            rkey = remote.rkey
        if opcode != _WR_READ and length <= self._max_inline:
            flags |= _INLINE
        return self._post_quick(opcode, mr, addr, length, flags, 0 if imm is None else imm,
                                raddr, rkey, kind)  # fmt: skip

    @cython.ccall
    def quick_block(
        self, opcode: cython.int, mr: MemoryRegion, addr: cython.ulonglong,
        length: cython.longlong, raddr: cython.ulonglong, rkey: cython.uint, counter: str,
    ) -> asyncio.Future[WorkCompletion] | None:  # fmt: skip
        """Post one RDMA write or read of ``length`` bytes at ``addr``, inside
        ``mr``, to or from the peer's ``raddr`` (all checked by the caller, as
        for :meth:`start_bulk`) and return its future, when the queue pair is
        usable from here, ``mr`` open (writable, for a read) and a send-queue
        entry free; None otherwise, having done nothing. ``counter`` counts it."""
        if self._plain(mr, opcode == _WR_READ) is None or not self._usable_now():
            return None
        flags: cython.int = _SIGNALED
        if opcode != _WR_READ and length <= self._max_inline:
            flags |= _INLINE
        fut = self._post_quick(opcode, mr, addr, length, flags, 0, raddr, rkey, None)
        if fut is not None and metrics._on:
            self.stats.counters[counter] += 1
        return fut

    @cython.ccall
    def quick_sends(self, ops: Any, send_type: Any) -> list[asyncio.Future[WorkCompletion]] | None:
        """Post ``ops`` (a list or tuple of ``send_type``, :class:`Send`) as
        one chain and return their futures, when every one is plain: a
        :class:`MemoryRegion` or a :class:`Segment` of one, open and
        registered in this protection domain, ``imm`` None or 32 bits,
        ``inline`` left to the queue pair (inline if it fits ``max_inline``);
        the queue pair usable from here and send-queue room for all. Returns
        None, having done nothing, otherwise: the caller takes the checked
        path, which waits for room and raises what is wrong."""
        if type(ops) is not list and type(ops) is not tuple:
            return None
        count: cython.Py_ssize_t = len(ops)
        if count == 0 or count > self.sq.size or not self._usable_now():
            return None
        op: Any
        for op in ops:
            if type(op) is not send_type or op.inline is not None:
                return None
            imm = op.imm
            if imm is not None and (type(imm) is not int or not 0 <= imm < 1 << 32):
                return None
            if self._plain(op.local, False) is None:
                return None
        if not self.sq.try_acquire(count):
            return None
        works: list[Work] = []
        requests: list[tuple[Any, ...]] = []
        futures: list[asyncio.Future[WorkCompletion]] = []
        length: cython.longlong
        flags: cython.int
        for op in ops:
            local = op.local
            length = local.length
            imm = op.imm
            opcode: cython.int = _WR_SEND if imm is None else _WR_SEND_IMM
            fut = self.loop.create_future()
            silent: cython.bint = self._unsignalled.next(op.signaled)
            mrs = (local.mr if type(local) is Segment else local,)
            work = Work(self, fut, opcode, mrs, length, False, -1, self._unsignalled.seq, silent)
            wr_id = self._register(work)
            flags = _INLINE if length <= self._max_inline else 0
            if not silent:
                flags |= _SIGNALED
            works.append(work)
            requests.append((wr_id, opcode, flags, 0 if imm is None else imm, (local,), 0, 0, 0, 0))
            futures.append(fut)
        self._chain_posted(works, self.sq, self.driver.post_sends(requests))
        self.last_send = works[-1]
        if metrics._on:
            self.stats.counters["ops:batched"] += count
        self._tell_cq(True)
        return futures

    @cython.cfunc
    def _post_quick(
        self, opcode: cython.int, mr: MemoryRegion, addr: cython.ulonglong,
        length: cython.longlong, flags: cython.int, imm: cython.uint, raddr: cython.ulonglong,
        rkey: cython.uint, kind: str | None,
    ) -> asyncio.Future[WorkCompletion] | None:  # fmt: skip
        """The posting of the quick paths (everything checked): a future, or
        None when the send queue has no free entry."""
        if not self.sq.try_acquire(1):
            return None
        fut = self.loop.create_future()
        self._unsignalled.next(True)
        work = Work(self, fut, opcode, (mr,), length, False, -1, self._unsignalled.seq)
        wr_id = self._register(work)
        rc = self._post_one(wr_id, opcode, flags, addr, length, mr.lkey, imm, raddr, rkey)
        if rc:
            raise self._refused([work], self.sq, rc)
        self._posted(work)
        self.last_send = work
        self._timed(work, kind)
        self._tell_cq(opcode in (_WR_SEND, _WR_SEND_IMM, _WR_WRITE_IMM))
        return fut

    def post_sends(
        self, chunk: Sequence[SendRequest], kind: str | None = None
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post ``chunk`` (its send-queue entries already taken) as one linked list.

        Atomics need :meth:`ensure_scratch` to have been called. Returns one
        future per request (a single awaited verb's counted and timed as
        ``kind``). Raises (giving the entries back, posting nothing) when the
        queue pair is not usable, a region was closed meanwhile, or the
        provider refuses.
        """
        self._ready(self.sq, len(chunk), [seg.mr for b in chunk for seg in b.segments])
        works: list[Work] = []
        requests: list[tuple[Any, ...]] = []
        for b in chunk:
            work, flags = self._new_send(b)
            works.append(work)
            segments = b.segments if work.scratch < 0 else (self._scratch_word(work.scratch),)
            requests.append((work.wr_id, b.opcode, flags, b.imm or 0, segments,
                             b.remote_addr, b.rkey, b.compare_add, b.swap))  # fmt: skip
        self._chain_posted(works, self.sq, self.driver.post_sends(requests))
        self.last_send = works[-1]
        self._tell_cq(any(w.opcode in _ibv.ANSWERED_OPCODES for w in works))
        if kind is not None and len(works) == 1:
            self._timed(works[0], kind)
        return [work.future for work in works if work.future is not None]

    def _scratch_word(self, offset: int) -> Segment:
        assert self._scratch is not None
        return self._scratch[offset : offset + 8]

    def _new_send(self, b: SendRequest) -> tuple[Work, int]:
        """Book-keeping for one send-side request: its work (registered) and flags."""
        fut: asyncio.Future[WorkCompletion] = self.loop.create_future()
        scratch = -1
        mrs = tuple(seg.mr for seg in b.segments)
        if b.opcode in _ibv.ATOMIC_OPCODES:
            assert self._scratch is not None
            scratch = self._scratch_free.pop()
            mrs = (self._scratch,)
        silent = self._unsignalled.next(b.signaled)
        work = Work(self, fut, b.opcode, mrs, total_length(b.segments), False, scratch,
                    self._unsignalled.seq, silent)  # fmt: skip
        self._register(work)
        return work, b.flags if silent else _ibv.SEND_SIGNALED | b.flags

    def _refused(self, works: Sequence[Work], room: QueueRoom, rc: int) -> DeviceError:
        """Undo work whose post the provider refused; the error to raise."""
        self._unpost(works, room)
        if room is self.sq:
            self._unsignalled.refused()
            return DeviceError(rc, f"ibv_post_send failed: {os.strerror(rc)}")
        return DeviceError(rc, f"ibv_post_recv failed: {os.strerror(rc)}")

    def post_send_to(
        self,
        seg: Segment,
        signaled: bool,
        done: Done,
        opcode: int = _ibv.WR_SEND,
        imm: int = 0,
        remote_addr: int = 0,
        rkey: int = 0,
    ) -> None:
        """Post one send of ``seg`` (its send-queue entry already taken) whose
        outcome goes to ``done`` from the drain, with no future, no request
        object and no per-post validation beyond the queue pair's state.
        ``opcode`` may also be a zero-length RDMA write (a probe: no remote
        address or key is needed for zero bytes), or an RDMA write with
        immediate ``imm`` to ``remote_addr`` under ``rkey``."""
        self._ready(self.sq, 1, [seg.mr])
        silent = self._unsignalled.next(signaled)
        work = Work(self, None, opcode, (seg.mr,), seg.length, False, -1, self._unsignalled.seq,
                    silent, done)  # fmt: skip
        wr_id = self._register(work)
        flags = 0 if silent else _ibv.SEND_SIGNALED
        rc = self.driver.post_send(
            wr_id, opcode, flags, seg.addr, seg.length, seg.lkey, imm, remote_addr, rkey
        )
        if rc:
            raise self._refused([work], self.sq, rc)
        self._posted(work)
        self.last_send = work
        self._tell_cq(opcode in (_WR_SEND, _WR_WRITE_IMM))

    def post_with(
        self, seg: Segment, opcode: int, post: Callable[[int], int]
    ) -> tuple[asyncio.Future[WorkCompletion], int]:
        """Post one signalled request over ``seg`` (its send-queue entry
        already taken) that the driver cannot: ``post(wr_id)`` posts it
        through pyverbs and returns what the caller wants back (a window
        bind's rkey), raising :class:`DeviceError` when refused. Returns
        the request's future and that value."""
        self._ready(self.sq, 1, [seg.mr])
        self._unsignalled.next(True)
        work = Work(self, self.loop.create_future(), opcode, (seg.mr,), seg.length, False, -1,
                    self._unsignalled.seq)  # fmt: skip
        wr_id = self._register(work)
        try:
            value = post(wr_id)
        except BaseException:
            self._unpost([work], self.sq)
            self._unsignalled.refused()
            raise
        self._posted(work)
        self.last_send = work
        self._tell_cq(False)
        assert work.future is not None
        return work.future, value

    def post_probe(self, done: Done) -> None:
        """Post a signalled zero-length RDMA write (its send-queue entry
        already taken) whose acknowledgement, or failure, goes to ``done``."""
        try:
            self.ensure_scratch()
        except BaseException:
            self.sq.release(1)
            raise
        assert self._scratch is not None
        self.post_send_to(self._scratch.segment(0, 0), True, done, _ibv.WR_RDMA_WRITE)

    def post_recv_to(self, seg: Segment, done: Done) -> None:
        """Post one receive into ``seg`` (its receive-queue entry already
        taken) whose outcome goes to ``done`` from the drain."""
        self._ready(self.rq, 1, [seg.mr])
        work = Work(self, None, -1, (seg.mr,), seg.length, True, done=done)
        wr_id = self._register(work)
        rc = self.driver.post_recv(wr_id, seg.addr, seg.length, seg.lkey)
        if rc:
            raise self._refused([work], self.rq, rc)
        self._posted(work)

    def silent_tail(self) -> bool:
        """Whether the newest send-side request is unsignalled (and pending)."""
        return self._unsignalled.is_tail(self.last_send)

    def post_marker(self) -> asyncio.Future[WorkCompletion]:
        """Post a signalled zero-length RDMA write (its send-queue entry already
        acquired): it touches no remote memory, and its completion settles
        every unsignalled request before it."""
        self.ensure_scratch()
        assert self._scratch is not None
        marker_request = SendRequest(_ibv.WR_RDMA_WRITE, (self._scratch.segment(0, 0),), 0)
        (marker,) = self.post_sends([marker_request])
        marker.add_done_callback(consume_outcome)  # maybe nobody awaits it; a flush is no news
        return marker

    def _report_silent_tail(self) -> None:
        """Post a marker behind an unsignalled tail, so the tail is accounted
        for even if nothing else is ever posted."""
        if not self.silent_tail() or self.failure is not None or not self.sq.try_acquire(1):
            return
        with contextlib.suppress(DeviceError, QueuePairError, ResourceClosedError):
            self.post_marker()

    # -- receive side ------------------------------------------------------

    @cython.ccall
    def quick_recvs(self, locals_: object) -> list[asyncio.Future[WorkCompletion]] | None:
        """Post one receive into each of ``locals_`` (a list or tuple of
        :class:`MemoryRegion` or :class:`Segment`) and return their futures,
        when everything is plain: the queue pair usable from here, every
        region open, writable and registered in its protection domain, and
        receive-queue entries free for all. Returns None, having done nothing,
        otherwise (the caller takes the checked path)."""
        if type(locals_) is not list and type(locals_) is not tuple:
            return None
        count: cython.Py_ssize_t = len(locals_)
        if count == 0 or count > self.rq.size or not self._usable_now():
            return None
        for local in locals_:
            if self._plain(local, True) is None:
                return None
        if not self.rq.try_acquire(count):
            return None
        futures: list[asyncio.Future[WorkCompletion]] = []
        addr: cython.ulonglong
        for local in locals_:
            mr = local.mr if type(local) is Segment else local
            addr = mr.addr
            if type(local) is Segment:
                addr += local.offset
            fut = self.loop.create_future()
            work = Work(self, fut, -1, (mr,), local.length, True)
            wr_id = self._register(work)
            rc = self._post_recv(wr_id, addr, work.length, mr.lkey)
            if rc:
                self.rq.release(count - len(futures) - 1)  # the rest were never posted
                raise self._refused([work], self.rq, rc)
            self._posted(work)
            futures.append(fut)
        if metrics._on:
            self.stats.counters["ops:recv"] += count
        return futures

    def post_recvs(
        self, chunk: Sequence[tuple[Segment, ...]]
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post one receive per scatter list (receive-queue entries already taken)."""
        self._ready(self.rq, len(chunk), [seg.mr for segments in chunk for seg in segments])
        works: list[Work] = []
        requests: list[tuple[int, tuple[Segment, ...]]] = []
        for segments in chunk:
            work = Work(self, self.loop.create_future(), -1, tuple(s.mr for s in segments),
                        total_length(segments), True)  # fmt: skip
            requests.append((self._register(work), segments))
            works.append(work)
        self._chain_posted(works, self.rq, self.driver.post_recvs(requests))
        return [work.future for work in works if work.future is not None]

    # -- tracking ----------------------------------------------------------

    def _unpost(self, works: Sequence[Work], room: QueueRoom) -> None:
        """Undo the bookkeeping of a chain the provider refused.

        Everything is validated before posting, so what remains to fail is the
        QP's state, which providers check on the first work request: the
        whole chain is taken as not posted. (pyverbs' ``bad_wr`` cannot be
        used: it copies the failed WR, SGE list pointer included, and frees
        that list a second time.)
        """
        for work in works:
            self._handlers.pop(work.wr_id, None)
            if work.scratch >= 0:
                self._scratch_free.append(work.scratch)
            if work.future is not None:
                work.future.cancel()
            work.reported = True  # the caller gets the error
        room.release(len(works))

    # -- completions -------------------------------------------------------

    @cython.ccall
    def complete(self, work: Work, wc: Any) -> None:
        """The completion of ``work`` arrived: resolve or fail its future."""
        if not work.recv:
            self._settle_silent(work.seq)
        self._finish(wc.wr_id, work)
        if work.kind is not None and metrics._on:
            record(self.stats.histograms, work.kind, time.perf_counter() - work.started)
        if wc.status == _SUCCESS:
            if work.future is None:
                work.succeed(wc.byte_len, None)
            elif not work.future.done():
                value = None
                if work.scratch >= 0:
                    assert self._scratch is not None
                    raw = self._scratch.view()[work.scratch : work.scratch + 8]
                    value = int.from_bytes(raw, sys.byteorder)
                work.future.set_result(from_wc(wc, value))
        else:
            opname = "recv" if work.recv else _ibv.WR_NAMES.get(work.opcode, str(work.opcode))
            exc, flushed = self._failed_completion(wc, opname)
            work.fail(exc, quiet=flushed)  # a dropped flushed future is no news
        if work.scratch >= 0:
            self._scratch_free.append(work.scratch)
        if self.drained is not None and not self.works:
            self.poster_idle()

    def _failed_completion(self, wc: WC, opname: str) -> tuple[BaseException, bool]:
        """The error a failed completion reports, and whether it was a flush
        (the QP was in the error state: a consequence, not a new failure)."""
        exc: BaseException = completion_error(wc, opname)
        flushed: bool = exc.flushed  # type: ignore[attr-defined]
        if not flushed:
            self.stats.add("errors:" + exc.status_name)  # type: ignore[attr-defined]
            self._fail(exc)
        else:
            self.stats.add("flushed")
            exc = self.close_error() if self.closing else self.failed_error(exc)
        return exc, flushed

    # -- packet lanes --------------------------------------------------------

    def open_lane(
        self, send_mr: MemoryRegion, sends: int, recv_mr: MemoryRegion | None, recvs: int,
        slot_size: int, sent: Sent, arrived: LaneArrived, failed: Failed,
        written: LaneWritten | None = None,
    ) -> PacketLane:  # fmt: skip
        """A :class:`PacketLane` over these slots (see there), stopped,
        flushed and detached with this queue pair."""
        self.check_usable()
        lane = PacketLane(
            self, send_mr, sends, recv_mr, recvs, slot_size, sent, arrived, failed, written
        )
        self.posters.append(lane)
        return lane

    def start_bulk(
        self, opcode: int, table: Any, count: int, window: int, chunk: int,
        mrs: tuple[MemoryRegion, ...], done: Done, starved: Starved,
    ) -> BulkRun:  # fmt: skip
        """A :class:`BulkRun` of ``count`` records of ``table`` (see there),
        started, stopped and detached with this queue pair."""
        self.check_usable()
        run = BulkRun(self, opcode, table, count, window, chunk, mrs, done, starved)
        self.posters.append(run)
        run.start()
        return run

    def poster_error(self, wc: WC, opcode: int) -> BaseException:
        """What a poster's failed completion of an ``opcode`` request (-1: a
        receive) tells its owner; the queue pair fails unless it was a flush."""
        opname = "recv" if opcode < 0 else _ibv.WR_NAMES.get(opcode, str(opcode))
        return self._failed_completion(wc, opname)[0]

    def poster_finished(self, poster: Any) -> None:
        """A bulk run ended: forget it (the engine may have already)."""
        with contextlib.suppress(ValueError):
            self.posters.remove(poster)
        self.poster_idle()

    def pending(self) -> int:
        """Posted work whose completion is still due (the posters' included)."""
        return len(self.works) + sum(poster.outstanding for poster in self.posters)

    def poster_idle(self) -> None:
        """Something completed: a closer waiting for the flush may go on."""
        if self.drained is not None and not self.drained.done() and not self.pending():
            self.drained.set_result(None)

    @cython.cfunc
    def _finish(self, wr_id: cython.ulonglong, work: Work) -> None:
        self.works.pop(wr_id, None)
        for mr in work.mrs:
            _let_go(mr)
        (self.rq if work.recv else self.sq).release(1)

    @cython.cfunc
    def _settle_silent(self, seq: cython.longlong) -> None:
        """A send-queue completion arrived for request ``seq``: the send queue
        completes in order, so every unsignalled request before it succeeded."""
        work: Work | None
        while (work := self._unsignalled.settled(seq)) is not None:
            wr_id = work.wr_id
            self._handlers.pop(wr_id, None)
            self._finish(wr_id, work)
            result = None
            if work.future is not None:
                opcode = Opcode.SEND if work.opcode in _ibv.SEND_OPCODES else Opcode.RDMA_WRITE
                result = WorkCompletion(wr_id, opcode, work.length, None, self.qp_num)
            work.succeed(work.length, result)

    # -- closing -----------------------------------------------------------

    def close(self, error: Callable[[], BaseException]) -> bool:
        """Fail pending and later work with ``error()`` and move the QP to the
        error state so the adapter flushes what was posted.

        Returns True when the QP can be destroyed now (nothing to flush, or
        the state change failed), False when flush completions are due.
        """
        self._report_silent_tail()
        self.closing = True
        self.close_error = error
        err = error()
        self.sq.fail(err)
        self.rq.fail(err)
        for work in list(self.works.values()):
            work.fail(err, later=True, quiet=True)
        for poster in self.posters:
            poster.stop()
        if not self.pending() or self.qp is None:
            return True
        try:
            with verbs_errors("moving a queue pair to the error state"):
                attr = QPAttr()
                attr.qp_state = _ibv.QPS_ERR
                self.qp.modify(attr, _ibv.QP_STATE)
        except DeviceError:
            return True
        return False

    def destroy(self) -> None:
        """Forget pending work (failing its futures), destroy the QP and the
        scratch memory (idempotent)."""
        qp, self.qp = self.qp, None
        if qp is None:
            return
        self.closing = True
        err = self.close_error()
        self.sq.fail(err)
        self.rq.fail(err)
        for wr_id, work in self.works.items():
            self._handlers.pop(wr_id, None)
            for mr in work.mrs:
                mr._release()
        works = list(self.works.values())
        self.works.clear()
        for work in works:
            work.fail(err, later=True, quiet=True)
        self._unsignalled.clear()
        self.last_send = None
        posters, self.posters = self.posters, []
        for poster in posters:
            poster.detach(err)
        self.driver.detach()
        try:
            qp.close()
        finally:
            if self._scratch is not None:
                self._scratch.close()
