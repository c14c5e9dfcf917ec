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
import collections
import contextlib
import dataclasses
import functools
import ipaddress
import random
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from aiordma._pyverbs import verbs_errors
from aiordma._slots import SlotPool
from aiordma.completion import Opcode, WorkCompletion, completion_error, to_work_completion
from aiordma.exceptions import (
    DeviceError,
    QueuePairError,
    ResourceBusyError,
    ResourceClosedError,
)
from aiordma.memory import Access, Local, MemoryRegion, RemoteBuffer, Segment, as_segments

if TYPE_CHECKING:
    from pyverbs.cq import WC

    from aiordma.completion import CompletionQueue
    from aiordma.device import Device

# ibv_wr_opcode
_WR_RDMA_WRITE: Final = 0
_WR_RDMA_WRITE_WITH_IMM: Final = 1
_WR_SEND: Final = 2
_WR_SEND_WITH_IMM: Final = 3
_WR_RDMA_READ: Final = 4
_WR_ATOMIC_CMP_AND_SWP: Final = 5
_WR_ATOMIC_FETCH_AND_ADD: Final = 6
# ibv_send_flags
_SEND_SIGNALED: Final = 2
_SEND_INLINE: Final = 8
# ibv_qp_state
_QPS_ERR: Final = 6
_QP_STATE_MASK: Final = 1
_IBV_QPT_RC: Final = 2
_WC_SUCCESS: Final = 0

_OPNAMES: Final = {
    _WR_RDMA_WRITE: "rdma_write",
    _WR_RDMA_WRITE_WITH_IMM: "rdma_write_with_imm",
    _WR_SEND: "send",
    _WR_SEND_WITH_IMM: "send_with_imm",
    _WR_RDMA_READ: "rdma_read",
    _WR_ATOMIC_CMP_AND_SWP: "atomic_cmp_swap",
    _WR_ATOMIC_FETCH_AND_ADD: "atomic_fetch_add",
}

SIGNAL_FRACTION = 4
"""However many unsignalled requests are posted, at least every
``send_depth // SIGNAL_FRACTION``-th is signalled, so their send-queue slots
come back."""
RECV_WR_CACHE = 512
"""Single-buffer receive work requests kept for reuse, per queue pair."""

FLUSH_TIMEOUT = 5.0
"""How long :meth:`QueuePair.wait_closed` waits for flushed completions."""


@dataclass(frozen=True, slots=True)
class QueuePairOptions:
    """Sizes and transport parameters of a queue pair; the defaults suit most uses."""

    send_depth: int = 128
    recv_depth: int = 128
    max_send_sge: int = 4
    max_recv_sge: int = 4
    max_inline: int = 64
    """Sends and writes up to this many bytes are copied into the WQE (no DMA read)."""
    port: int = 1
    gid_index: int | None = None
    """Source GID; by default the port's RoCE v2 IPv4 GID."""
    path_mtu: int | None = None
    """``ibv_mtu`` enum value (1=256 ... 5=4096); by default the port's active MTU."""
    max_rd_atomic: int = 16
    """Outstanding RDMA reads/atomics, each way (clamped to the device's limits)."""
    timeout: int = 14
    """Local ACK timeout exponent: 4.096 us * 2**timeout (14 is about 67 ms)."""
    retry_cnt: int = 7
    rnr_retry: int = 6
    """Receiver-not-ready retries before failing (7 would retry forever)."""
    min_rnr_timer: int = 24
    """How long a sender facing our empty receive queue waits per retry (24 is about 41 ms)."""


def _gid_to_bytes(gid: str) -> bytes:
    return ipaddress.IPv6Address(gid).packed


def _gid_to_str(raw: bytes) -> str:
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


_ENDPOINT_FORMAT: Final = struct.Struct("<II16sH")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a peer needs to connect to a queue pair without rdma_cm.

    Exchanged out of band (a socket, a file), as the classic pingpong tools
    do: QP number, starting packet sequence number, GID and LID.
    """

    qp_num: int
    psn: int
    gid: bytes
    lid: int = 0

    SIZE: ClassVar[int] = _ENDPOINT_FORMAT.size

    def to_bytes(self) -> bytes:
        """Pack into ``Endpoint.SIZE`` bytes, to send to the peer."""
        return _ENDPOINT_FORMAT.pack(self.qp_num, self.psn, self.gid, self.lid)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Endpoint:
        """Unpack what :meth:`to_bytes` made; raises ValueError on a wrong length."""
        if len(data) != cls.SIZE:
            raise ValueError(f"a packed Endpoint is {cls.SIZE} bytes, got {len(data)}")
        return cls(*_ENDPOINT_FORMAT.unpack(data))


@dataclass(frozen=True, slots=True)
class Send:
    """A send (optionally with 32-bit immediate data) for :meth:`QueuePair.post_batch`.

    ``signaled=False`` asks for no completion entry of its own (selective
    signalling): its future resolves when a later signalled request on the
    same queue pair completes, which saves the adapter a completion and the
    event loop a wake-up. It still fails at once if it fails. See
    :meth:`QueuePair.flush_sends`.
    """

    local: Local
    imm: int | None = None
    inline: bool | None = None
    signaled: bool = True


@dataclass(frozen=True, slots=True)
class Write:
    """An RDMA write (optionally with immediate data) for :meth:`QueuePair.post_batch`.

    ``signaled`` works as for :class:`Send`.
    """

    local: Local
    remote: RemoteBuffer
    imm: int | None = None
    inline: bool | None = None
    signaled: bool = True


@dataclass(frozen=True, slots=True)
class Read:
    """An RDMA read into ``local`` for :meth:`QueuePair.post_batch`."""

    local: Local
    remote: RemoteBuffer


SendOp = Send | Write | Read
"""What :meth:`QueuePair.post_batch` accepts: a :class:`Send`, :class:`Write` or :class:`Read`."""


class _Work:
    """One posted work request: the future to resolve and the memory to keep alive."""

    __slots__ = ("future", "opcode", "qp", "recv", "scratch", "segments", "seq", "silent")

    def __init__(
        self,
        qp: QueuePair,
        future: asyncio.Future[WorkCompletion],
        opcode: int,
        segments: tuple[Segment, ...],
        recv: bool,
        scratch: int | None = None,
        seq: int = 0,
        silent: bool = False,
    ) -> None:
        self.qp = qp
        self.future = future
        self.opcode = opcode
        self.segments = segments
        self.recv = recv
        self.scratch = scratch
        self.seq = seq
        """Position on the send queue (send-side work only)."""
        self.silent = silent
        """Posted unsignalled: no completion entry unless it fails."""

    def complete(self, wc: WC) -> None:
        self.qp._complete(self, wc)


@dataclass(frozen=True, slots=True)
class _Built:
    opcode: int
    segments: tuple[Segment, ...]
    flags: int
    imm: int | None = None
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    signaled: bool = True


class _SendChain:
    """Reusable send work requests, linked once, each with one SGE.

    Building pyverbs ``SendWR``/``SGE`` objects costs more than posting them,
    and pyverbs (44 to at least 64) never frees their C buffers (their
    ``__dealloc`` is misnamed). ``ibv_post_send`` copies what it is given, so
    a queue pair keeps a list of them, each linked to the next and the last
    to nothing: posting ``k`` requests fills the last ``k`` and posts from
    the first of those. Each WR's scatter list points at its own SGE, whose
    fields are rewritten per post. The list grows, at its front, on demand.
    """

    __slots__ = ("sges", "wrs")

    def __init__(self) -> None:
        self.sges: list[SGE] = []
        self.wrs: list[SendWR] = []

    @staticmethod
    def supported() -> bool:
        wr = SendWR(num_sge=1, sg=[SGE(0, 0, 0)])
        try:
            wr.sg_list = SGE(0, 0, 0)
        except AttributeError:  # a pyverbs without the setter: build WRs per post
            return False
        return True

    def take(self, count: int) -> list[SendWR]:
        """The last ``count`` requests of the chain (the first is the one to post)."""
        while len(self.wrs) < count:
            sge = SGE(0, 0, 0)
            wr = SendWR(num_sge=1, sg=[sge])
            wr.sg_list = sge
            if self.wrs:
                wr.next_wr = self.wrs[0]
            self.sges.insert(0, sge)
            self.wrs.insert(0, wr)
        return self.wrs[len(self.wrs) - count :]

    def fill(
        self, index: int, wr_id: int, opcode: int, flags: int, seg: Segment, imm: int
    ) -> SendWR:
        """Rewrite request ``index`` of the chain for one post and return it."""
        sge, wr = self.sges[index], self.wrs[index]
        sge.addr = seg.addr
        sge.length = seg.length
        sge.lkey = seg.lkey
        wr.wr_id = wr_id
        wr.opcode = opcode
        wr.send_flags = flags
        wr.num_sge = 1
        wr.imm_data = imm
        return wr


_CHAIN_SUPPORTED = _SendChain.supported()


def _closed_error() -> BaseException:
    return ResourceClosedError("queue pair is closed")


def _check_imm(imm: int | None) -> None:
    if imm is not None and not 0 <= imm < 1 << 32:
        raise ValueError("immediate data must fit in 32 bits (0 <= imm < 2**32)")


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _total(segments: tuple[Segment, ...]) -> int:
    return sum(seg.length for seg in segments)


class QueuePair:
    """A reliable-connected (RC) queue pair driven by the event loop.

    Create with :meth:`aiordma.Device.create_qp`, connect with
    :meth:`connect` (or through rdma_cm), then await its operations. When the
    send or receive queue is full, posting waits for room. A failed work
    request raises :class:`CompletionError`; once the queue pair has failed,
    every pending and later operation raises too.
    """

    def __init__(
        self, device: Device, cq: CompletionQueue, options: QueuePairOptions | None = None
    ) -> None:
        opts = options or QueuePairOptions()
        attrs = device.attributes
        for name in ("send_depth", "recv_depth"):
            if not 0 < getattr(opts, name) <= attrs.max_qp_wr:
                raise ValueError(f"{name} must be between 1 and {attrs.max_qp_wr}")
        for name in ("max_send_sge", "max_recv_sge"):
            if not 0 < getattr(opts, name) <= attrs.max_sge:
                raise ValueError(f"{name} must be between 1 and {attrs.max_sge}")
        self.options = opts
        self.device = device
        self._cq = cq
        self._loop = cq.loop
        self._rd_atomic = max(1, min(opts.max_rd_atomic, attrs.max_qp_rd_atom))
        cq.reserve(opts.send_depth + opts.recv_depth)
        try:
            init = QPInitAttr(
                qp_type=_IBV_QPT_RC,
                scq=cq.cq,
                rcq=cq.cq,
                cap=QPCap(
                    max_send_wr=opts.send_depth,
                    max_recv_wr=opts.recv_depth,
                    max_send_sge=opts.max_send_sge,
                    max_recv_sge=opts.max_recv_sge,
                    max_inline_data=opts.max_inline,
                ),
                sq_sig_all=0,
            )
            attr = QPAttr(port_num=opts.port)
            # Memory regions carry the least-privilege grants; the QP allows all kinds.
            attr.qp_access_flags = int(Access.LOCAL_WRITE | Access.REMOTE | Access.REMOTE_ATOMIC)
            with verbs_errors(f"creating a queue pair on {device.name}"):
                self._qp: QP | None = QP(device.pd, init, attr)
        except BaseException:
            cq.unreserve(opts.send_depth + opts.recv_depth)
            raise
        self.qp_num: int = self._qp.qp_num
        self.psn: int = random.getrandbits(24)
        self.remote_endpoint: Endpoint | None = None
        self._connected = False
        self._sq = SlotPool(opts.send_depth)
        self._rq = SlotPool(opts.recv_depth)
        self._works: dict[int, _Work] = {}
        self._drained: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._closing = False
        self._close_error: Callable[[], BaseException] = _closed_error
        self._scratch: MemoryRegion | None = None
        self._scratch_free: list[int] = []
        self._chain = _SendChain() if _CHAIN_SUPPORTED else None
        self._recv_wrs: dict[tuple[int, int, int], RecvWR] = {}
        self._send_seq = 0
        self._silent: collections.deque[tuple[int, _Work]] = collections.deque()
        self._silent_run = 0
        self._signal_every = max(1, opts.send_depth // SIGNAL_FRACTION)
        self._last_send: _Work | None = None

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
        return Endpoint(self.qp_num, self.psn, _gid_to_bytes(gid), lid)

    # -- state -------------------------------------------------------------

    @property
    def state_name(self) -> str:
        """The QP's state as the device reports it (``RESET``, ``RTS``, ``ERR``...)."""
        if self._qp is None:
            return "DESTROYED"
        if self._closing:
            return "CLOSING"
        if self._failure is not None:
            return "ERROR"
        return "CONNECTED" if self._connected else "INIT"

    def is_closing(self) -> bool:
        """True once :meth:`close` was called (or the QP failed and is closing)."""
        return self._closing or self._qp is None

    @property
    def pending(self) -> int:
        """Posted work requests whose completions have not arrived yet."""
        return len(self._works)

    @property
    def sends_in_flight(self) -> int:
        """Send-queue work requests posted and not yet completed."""
        return self._sq.size - self._sq.free

    @property
    def qp(self) -> QP:
        """The pyverbs ``QP`` (for what aiordma does not wrap)."""
        if self._qp is None:
            raise ResourceClosedError("queue pair is closed")
        return self._qp

    def connect(self, remote: Endpoint) -> None:
        """Move to RTS, connected to the queue pair described by ``remote``."""
        qp = self.qp
        opts = self.options
        attr = QPAttr(port_num=opts.port)
        attr.path_mtu = opts.path_mtu or self.device.context.query_port(opts.port).active_mtu
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn = remote.psn
        attr.max_dest_rd_atomic = self._rd_atomic
        attr.min_rnr_timer = opts.min_rnr_timer
        route = GlobalRoute(dgid=GID(_gid_to_str(remote.gid)), sgid_index=self.gid_index)
        attr.ah_attr = AHAttr(port_num=opts.port, is_global=1, gr=route, dlid=remote.lid)
        attr.timeout = opts.timeout
        attr.retry_cnt = opts.retry_cnt
        attr.rnr_retry = opts.rnr_retry
        attr.sq_psn = self.psn
        attr.max_rd_atomic = min(self._rd_atomic, self.device.attributes.max_qp_init_rd_atom)
        try:
            qp.to_rtr(attr)
            qp.to_rts(attr)
        except PyverbsError as exc:
            raise DeviceError(getattr(exc, "error_code", 0), f"cannot connect QP: {exc}") from exc
        self.remote_endpoint = remote
        self._connected = True

    def _modify(self, attr: QPAttr, mask: int, what: str) -> None:
        try:
            self.qp.modify(attr, mask)
        except PyverbsError as exc:
            code = getattr(exc, "error_code", 0)
            raise DeviceError(code, f"cannot move QP {self.qp_num} to {what}: {exc}") from exc

    def _connected_by_cm(self) -> None:
        self._connected = True

    def _check_usable(self) -> None:
        self._cq.check_loop()
        if self._closing or self._qp is None:
            raise self._close_error()
        if self._failure is not None:
            raise QueuePairError(f"queue pair failed earlier: {self._failure}") from self._failure

    # -- send side ---------------------------------------------------------

    def _inline_flag(self, opcode: int, segments: tuple[Segment, ...], inline: bool | None) -> int:
        if inline is False or opcode not in (_WR_SEND, _WR_SEND_WITH_IMM, _WR_RDMA_WRITE,
                                             _WR_RDMA_WRITE_WITH_IMM):  # fmt: skip
            return 0
        size = _total(segments)
        if inline and size > self.options.max_inline:
            raise ValueError(f"{size} bytes exceed the queue pair's max_inline of "
                             f"{self.options.max_inline}")  # fmt: skip
        return _SEND_INLINE if size <= self.options.max_inline else 0

    def _check_sges(self, segments: tuple[Segment, ...], limit: int) -> None:
        if not segments:
            raise ValueError("a work request needs at least one segment")
        if len(segments) > limit:
            raise ValueError(f"{len(segments)} segments exceed the queue pair's limit of {limit}")
        for seg in segments:
            seg.mr._check_open()

    @staticmethod
    def _check_writable(segments: tuple[Segment, ...], what: str) -> None:
        for seg in segments:
            if not seg.mr.access & Access.LOCAL_WRITE:
                raise ValueError(
                    f"{what} writes into local memory: register it with Access.LOCAL_WRITE"
                )

    def _build(self, op: SendOp) -> _Built:
        segments = as_segments(op.local)
        self._check_sges(segments, self.options.max_send_sge)
        if isinstance(op, Send):
            _check_imm(op.imm)
            opcode = _WR_SEND if op.imm is None else _WR_SEND_WITH_IMM
            flags = self._inline_flag(opcode, segments, op.inline)
            return _Built(opcode, segments, flags, op.imm, signaled=op.signaled)
        size = _total(segments)
        if size > op.remote.length:
            raise ValueError(
                f"{size} local bytes do not fit the {op.remote.length}-byte remote buffer"
            )
        if isinstance(op, Write):
            _check_imm(op.imm)
            opcode = _WR_RDMA_WRITE if op.imm is None else _WR_RDMA_WRITE_WITH_IMM
            flags = self._inline_flag(opcode, segments, op.inline)
            return _Built(opcode, segments, flags, op.imm, op.remote.addr, op.remote.rkey,
                          signaled=op.signaled)  # fmt: skip
        if isinstance(op, Read):
            self._check_writable(segments, "rdma_read")
            return _Built(_WR_RDMA_READ, segments, 0, None, op.remote.addr, op.remote.rkey)
        raise TypeError(f"not a send-side operation: {op!r}")

    async def post_batch(self, ops: Sequence[SendOp]) -> list[asyncio.Future[WorkCompletion]]:
        """Post many sends/writes/reads, chained into as few ``ibv_post_send`` calls as room allows.

        Returns one future per operation, in order; they resolve as the
        completions arrive. Waits for send-queue room when needed.
        """
        self._check_usable()
        built = [self._build(op) for op in ops]
        futures: list[asyncio.Future[WorkCompletion]] = []
        size = self._sq.size
        for start in range(0, len(built), size):
            chunk = built[start : start + size]
            await self._sq.acquire(len(chunk))
            futures += self._post_send_now(chunk)
        return futures

    def post_batch_nowait(self, ops: Sequence[SendOp]) -> list[asyncio.Future[WorkCompletion]]:
        """:meth:`post_batch` without waiting: raises :class:`ResourceBusyError`
        (and posts nothing) when the send queue has no room for all of ``ops``."""
        self._check_usable()
        built = [self._build(op) for op in ops]
        if not self._sq.try_acquire(len(built)):
            raise ResourceBusyError(f"send queue has no room for {len(built)} work requests")
        return self._post_send_now(built)

    async def wait_send_room(self, n: int = 1) -> None:
        """Wait until ``n`` send-queue slots are free (they are not taken)."""
        await self._sq.acquire(n)
        self._sq.release(n)

    async def _one(self, op: _Built) -> asyncio.Future[WorkCompletion]:
        self._check_usable()
        if not self._sq.try_acquire(1):
            await self._sq.acquire(1)
        return self._post_send_now([op])[0]

    def _post_send_now(self, chunk: Sequence[_Built]) -> list[asyncio.Future[WorkCompletion]]:
        """Post ``chunk`` (its send-queue slots already taken) as one linked list."""
        try:
            self._check_usable()
        except BaseException:
            self._sq.release(len(chunk))
            raise
        qp = self.qp
        cq = self._cq
        works: list[tuple[int, _Work]] = []
        wrs: list[SendWR] = []
        chain = self._chain
        base = 0
        if chain is not None and all(len(b.segments) <= 1 for b in chunk):
            first = chain.take(len(chunk))[0]
            base = len(chain.wrs) - len(chunk)
        else:
            chain = None
        for b in chunk:
            fut: asyncio.Future[WorkCompletion] = self._loop.create_future()
            scratch = None
            segments = b.segments
            if b.opcode in (_WR_ATOMIC_FETCH_AND_ADD, _WR_ATOMIC_CMP_AND_SWP):
                scratch = self._scratch_free.pop()
                assert self._scratch is not None
                segments = (self._scratch[scratch : scratch + 8],)
            self._send_seq += 1
            silent = not b.signaled and self._silent_run + 1 < self._signal_every
            self._silent_run = self._silent_run + 1 if silent else 0
            work = _Work(self, fut, b.opcode, segments, False, scratch, self._send_seq, silent)
            wr_id = cq.register(work)
            imm = 0 if b.imm is None else socket.htonl(b.imm)
            flags = b.flags if silent else _SEND_SIGNALED | b.flags
            if chain is not None:
                wr = chain.fill(base + len(wrs), wr_id, b.opcode, flags, segments[0], imm)
            else:
                sges = [SGE(s.addr, s.length, s.lkey) for s in segments]
                wr = SendWR(wr_id=wr_id, opcode=b.opcode, num_sge=len(sges), sg=sges,
                            send_flags=flags, imm_data=imm)  # fmt: skip
                if wrs:
                    wrs[-1].next_wr = wr
            if b.opcode in (_WR_ATOMIC_FETCH_AND_ADD, _WR_ATOMIC_CMP_AND_SWP):
                wr.set_wr_atomic(b.rkey, b.remote_addr, b.compare_add, b.swap)
            elif b.opcode not in (_WR_SEND, _WR_SEND_WITH_IMM):
                wr.set_wr_rdma(b.rkey, b.remote_addr)
            works.append((wr_id, work))
            wrs.append(wr)
        try:
            qp.post_send(first if chain is not None else wrs[0])
        except PyverbsRDMAError as exc:
            self._unpost(works, self._sq)
            self._silent_run = 0
            raise DeviceError(exc.error_code, f"ibv_post_send failed: {exc}") from exc
        cq.kick()
        self._last_send = works[-1][1]
        self._silent.extend(item for item in works if item[1].silent)
        return self._track(works)

    def _track(self, works: Sequence[tuple[int, _Work]]) -> list[asyncio.Future[WorkCompletion]]:
        """Record posted work and mark its memory busy until the completion arrives."""
        for wr_id, work in works:
            self._works[wr_id] = work
            for seg in work.segments:
                seg.mr._acquire()
        return [work.future for _, work in works]

    def _unpost(self, works: Sequence[tuple[int, _Work]], pool: SlotPool) -> None:
        """Undo the bookkeeping of a chain the provider refused.

        Everything is validated before posting, so what remains to fail is the
        QP's state, which providers check on the first work request: the
        whole chain is taken as not posted. (pyverbs' ``bad_wr`` cannot be
        used: it copies the failed WR, SGE list pointer included, and frees
        that list a second time.)
        """
        for wr_id, work in works:
            self._cq.forget(wr_id)
            if work.scratch is not None:
                self._scratch_free.append(work.scratch)
            work.future.cancel()
        pool.release(len(works))

    async def post_send(self, local: Local, *, imm: int | None = None,
                        inline: bool | None = None) -> WorkCompletion:  # fmt: skip
        """Send ``local`` to the peer's next posted receive; resolves when acknowledged."""
        return await (await self._one(self._build(Send(local, imm, inline))))

    async def send_with_imm(self, local: Local, imm: int) -> WorkCompletion:
        """Send with 32-bit immediate data, delivered in the receiver's completion."""
        return await self.post_send(local, imm=imm)

    async def rdma_write(self, local: Local, remote: RemoteBuffer, *, imm: int | None = None,
                         inline: bool | None = None) -> WorkCompletion:  # fmt: skip
        """Write ``local`` into the peer's ``remote`` buffer.

        With ``imm`` the write also consumes one of the peer's posted
        receives, whose completion carries the immediate data.
        """
        return await (await self._one(self._build(Write(local, remote, imm, inline))))

    async def rdma_read(self, local: Local, remote: RemoteBuffer) -> WorkCompletion:
        """Read the peer's ``remote`` buffer into ``local`` (``len(local)`` bytes)."""
        return await (await self._one(self._build(Read(local, remote))))

    def _atomic_remote(self, remote: RemoteBuffer) -> RemoteBuffer:
        if not self.device.attributes.atomic:
            raise DeviceError(95, f"{self.device.name} does not support atomic operations")
        if remote.length < 8 or remote.addr % 8:
            raise ValueError("atomics need an 8-byte aligned remote buffer of at least 8 bytes")
        return remote[:8]

    def _ensure_scratch(self) -> None:
        if self._scratch is None:
            self._scratch = self.device.alloc(8 * self.options.send_depth)
            self._scratch_free = list(range(0, 8 * self.options.send_depth, 8))

    async def atomic_fetch_add(self, remote: RemoteBuffer, add: int) -> int:
        """Atomically add ``add`` to the 64-bit word at ``remote``; returns the old value."""
        r = self._atomic_remote(remote)
        b = _Built(_WR_ATOMIC_FETCH_AND_ADD, (), 0, None, r.addr, r.rkey, add & (2**64 - 1))
        return await self._atomic_result(b)

    async def atomic_cmp_swap(self, remote: RemoteBuffer, compare: int, swap: int) -> int:
        """Atomically replace the 64-bit word at ``remote`` with ``swap`` if it equals
        ``compare``; returns the old value (the swap happened iff it equals ``compare``)."""
        r = self._atomic_remote(remote)
        mask = 2**64 - 1
        b = _Built(_WR_ATOMIC_CMP_AND_SWP, (), 0, None, r.addr, r.rkey, compare & mask, swap & mask)
        return await self._atomic_result(b)

    async def _atomic_result(self, b: _Built) -> int:
        self._ensure_scratch()
        wc = await (await self._one(b))
        assert wc.atomic_value is not None
        return wc.atomic_value

    # -- receive side ------------------------------------------------------

    async def post_recv_batch(
        self, locals_: Sequence[Local]
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post receives for ``locals_``; one future per buffer, resolved when a message lands."""
        self._check_usable()
        seglists = [as_segments(local) for local in locals_]
        for segs in seglists:
            self._check_sges(segs, self.options.max_recv_sge)
            self._check_writable(segs, "post_recv")
        futures: list[asyncio.Future[WorkCompletion]] = []
        size = self._rq.size
        for start in range(0, len(seglists), size):
            chunk = seglists[start : start + size]
            await self._rq.acquire(len(chunk))
            futures += self._post_recv_now(chunk)
        return futures

    def post_recv_nowait(self, locals_: Sequence[Local]) -> list[asyncio.Future[WorkCompletion]]:
        """:meth:`post_recv_batch` without waiting: raises :class:`ResourceBusyError`
        (and posts nothing) when the receive queue has no room for all of them."""
        self._check_usable()
        seglists = [as_segments(local) for local in locals_]
        for segs in seglists:
            self._check_sges(segs, self.options.max_recv_sge)
            self._check_writable(segs, "post_recv")
        if not self._rq.try_acquire(len(seglists)):
            raise ResourceBusyError(f"receive queue has no room for {len(seglists)} buffers")
        return self._post_recv_now(seglists)

    async def post_recv(self, local: Local) -> WorkCompletion:
        """Post one receive buffer and wait for the message that lands in it."""
        (fut,) = await self.post_recv_batch([local])
        return await fut

    def _post_recv_now(
        self, chunk: Sequence[tuple[Segment, ...]]
    ) -> list[asyncio.Future[WorkCompletion]]:
        try:
            self._check_usable()
        except BaseException:
            self._rq.release(len(chunk))
            raise
        works: list[tuple[int, _Work]] = []
        wrs: list[RecvWR] = []
        for segments in chunk:
            fut: asyncio.Future[WorkCompletion] = self._loop.create_future()
            work = _Work(self, fut, -1, segments, True)
            wr_id = self._cq.register(work)
            if len(chunk) == 1 and len(segments) == 1:
                wr = self._single_recv(wr_id, segments[0])
            else:
                sges = [SGE(s.addr, s.length, s.lkey) for s in segments]
                wr = RecvWR(wr_id=wr_id, num_sge=len(sges), sg=sges)
            if wrs:
                wrs[-1].next_wr = wr
            works.append((wr_id, work))
            wrs.append(wr)
        try:
            self.qp.post_recv(wrs[0])
        except PyverbsRDMAError as exc:
            self._unpost(works, self._rq)
            raise DeviceError(exc.error_code, f"ibv_post_recv failed: {exc}") from exc
        return self._track(works)

    def _single_recv(self, wr_id: int, seg: Segment) -> RecvWR:
        """A receive WR for one buffer, reused whenever that buffer is posted alone.

        pyverbs copies the scatter list into the WR when it is built (and
        never frees it), so a buffer posted again and again, as message
        channels do, is served by one object; such WRs are never chained.
        """
        key = (seg.addr, seg.length, seg.lkey)
        wr = self._recv_wrs.get(key)
        if wr is None:
            wr = RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(*key)])
            if len(self._recv_wrs) < RECV_WR_CACHE:
                self._recv_wrs[key] = wr
        else:
            wr.wr_id = wr_id
        return wr

    # -- completions -------------------------------------------------------

    def _complete(self, work: _Work, wc: WC) -> None:
        if not work.recv:
            self._settle_silent(work.seq)
        self._finish(wc.wr_id, work)
        fut = work.future
        if wc.status == _WC_SUCCESS:
            if not fut.done():
                result = to_work_completion(wc)
                if work.scratch is not None:
                    assert self._scratch is not None
                    raw = self._scratch.view()[work.scratch : work.scratch + 8]
                    value = int.from_bytes(raw, sys.byteorder)
                    result = dataclasses.replace(result, atomic_value=value)
                fut.set_result(result)
        else:
            opname = "recv" if work.recv else _OPNAMES.get(work.opcode, str(work.opcode))
            exc: BaseException = completion_error(wc, opname)
            if not exc.flushed:  # type: ignore[attr-defined]
                self._fail(exc)
            elif self._closing:
                exc = self._close_error()
            if not fut.done():
                fut.set_exception(exc)
        if work.scratch is not None:
            self._scratch_free.append(work.scratch)
        if not self._works and self._drained is not None:
            self._drained.set()

    def _finish(self, wr_id: int, work: _Work) -> None:
        self._works.pop(wr_id, None)
        for seg in work.segments:
            seg.mr._release()
        (self._rq if work.recv else self._sq).release(1)

    def _settle_silent(self, seq: int) -> None:
        """A send-queue completion arrived for request ``seq``: the send queue
        completes in order, so every unsignalled request before it succeeded."""
        silent = self._silent
        while silent and silent[0][1].seq <= seq:
            wr_id, work = silent.popleft()
            if work.seq == seq:
                break  # its own (failed) completion: handled by the caller
            self._cq.forget(wr_id)
            self._finish(wr_id, work)
            if not work.future.done():
                opcode = Opcode.SEND if work.opcode in (_WR_SEND, _WR_SEND_WITH_IMM) else (
                    Opcode.RDMA_WRITE)  # fmt: skip
                length = _total(work.segments)
                work.future.set_result(WorkCompletion(wr_id, opcode, length, None, self.qp_num))

    def _silent_tail(self) -> bool:
        """Whether the newest send-side request is unsignalled (and pending)."""
        last = self._last_send
        return last is not None and bool(self._silent) and self._silent[-1][1] is last

    def _report_silent_tail(self) -> None:
        """Post a signalled zero-length RDMA write behind an unsignalled tail, so
        the tail is accounted for even if nothing else is ever posted."""
        if not self._silent_tail() or self._failure is not None or not self._sq.try_acquire(1):
            return
        with contextlib.suppress(DeviceError, QueuePairError, ResourceClosedError):
            self._post_marker()

    def _post_marker(self) -> None:
        """Post a signalled zero-length RDMA write (its send-queue slot already
        acquired): it touches no remote memory, and its completion settles
        every unsignalled request before it."""
        self._ensure_scratch()
        assert self._scratch is not None
        (marker,) = self._post_send_now([_Built(_WR_RDMA_WRITE, (self._scratch.segment(0, 0),), 0)])
        marker.add_done_callback(_retrieve)  # nobody awaits it; a flush is no news

    async def flush_sends(self) -> None:
        """Wait until every send-side request posted so far has completed.

        If the newest is unsignalled, a zero-length signalled RDMA write
        (which touches no remote memory) is posted behind it so its
        completion is reported. Raises if one of them failed, or if the queue
        pair has failed or is closed.
        """
        self._check_usable()
        last = self._last_send
        if last is None or last.future.done():
            return
        if self._silent_tail():
            await self._sq.acquire(1)
            if self._silent_tail():
                self._post_marker()
            else:
                self._sq.release(1)
        await asyncio.shield(last.future)

    def _fail(self, exc: BaseException) -> None:
        """The QP is in the error state: refuse new work; pending work will flush."""
        if self._failure is None:
            self._failure = exc
            err = QueuePairError(f"queue pair failed: {exc}")
            err.__cause__ = exc
            self._sq.fail(err)
            self._rq.fail(err)

    # -- closing -----------------------------------------------------------

    def close(self) -> None:
        """Start closing: fail pending awaits now, flush the queues (idempotent).

        Await :meth:`wait_closed` for the flush to finish and the QP to be
        destroyed; buffers of pending work stay referenced until then.
        """
        self._close(_closed_error)

    def _close(self, error: Callable[[], BaseException]) -> None:
        """:meth:`close`, failing pending and later work with ``error()``."""
        if self._closing or self._qp is None:
            return
        self._report_silent_tail()
        self._closing = True
        self._close_error = error
        err = error()
        self._sq.fail(err)
        self._rq.fail(err)
        for work in self._works.values():
            if not work.future.done():
                work.future.set_exception(err)
                work.future.exception()  # a consequence of closing: not worth a log line
        if not self._works:
            self.destroy()
            return
        try:
            attr = QPAttr()
            attr.qp_state = _QPS_ERR
            self._qp.modify(attr, _QP_STATE_MASK)
        except PyverbsError:
            self.destroy()

    async def wait_closed(self) -> None:
        """Wait until a closing queue pair has flushed and been destroyed."""
        if self._qp is None:
            return
        if self._works and not self._loop.is_closed():
            self._drained = asyncio.Event()
            try:
                async with asyncio.timeout(FLUSH_TIMEOUT):
                    await self._drained.wait()
            except TimeoutError:
                pass
        self.destroy()

    def destroy(self) -> None:
        """Destroy the QP now, without waiting for flushes (idempotent)."""
        qp, self._qp = self._qp, None
        if qp is None:
            return
        self._closing = True
        err = self._close_error()
        self._sq.fail(err)
        self._rq.fail(err)
        for wr_id, work in self._works.items():
            self._cq.forget(wr_id)
            for seg in work.segments:
                seg.mr._release()
            if not work.future.done():
                work.future.set_exception(err)
                work.future.exception()  # a consequence of closing: not worth a log line
        self._works.clear()
        self._silent.clear()
        self._last_send = None
        try:
            qp.close()
        finally:
            if not self._cq.closed:
                self._cq.unreserve(self.options.send_depth + self.options.recv_depth)
            if self._scratch is not None:
                self._scratch.close()
            self.device._forget_qp(self)
            self.device._release_cq(self._cq)

    async def __aenter__(self) -> QueuePair:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


async def connect_loopback_pair(
    device: Device, options: QueuePairOptions | None = None
) -> tuple[QueuePair, QueuePair]:
    """Two queue pairs on ``device`` connected to each other (for tests and examples)."""
    a = device.create_qp(options)
    try:
        b = device.create_qp(options)
    except BaseException:
        a.destroy()
        raise
    try:
        a.connect(b.local_endpoint)
        b.connect(a.local_endpoint)
    except BaseException:
        a.destroy()
        b.destroy()
        raise
    return a, b
