"""The driver over pyverbs' Python API: the path without the compiled core.

It does what ``_core.pyx`` does, with pyverbs objects: it reuses them where
it can (they cost more to build than to post, and pyverbs never frees their
C buffers) and turns a refused post into the provider's errno.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.wr import SGE, RecvWR, SendWR

from aiordma import _ibv, bulk_table
from aiordma.verbs._driver.base import ACK_BATCH, POLL_BATCH, Report

if TYPE_CHECKING:
    from pyverbs.cq import CQ, CompChannel
    from pyverbs.qp import QP
    from pyverbs.srq import SRQ

RECV_WR_CACHE: Final = 512
"""Single-buffer receive work requests kept for reuse, per queue pair (an
SRQ keeps one for each of its buffers)."""


class PureCQDriver:
    """:class:`~.base.CQDriver` through pyverbs' ``CQ`` and ``CompChannel``."""

    compiled = False

    def __init__(self, cq: CQ, channel: CompChannel) -> None:
        self._cq: CQ | None = cq
        self._channel: CompChannel | None = channel
        self._unacked = 0
        self.armed = False
        self.polling = False
        self.received = 0
        self.arms = 0
        self.completions = 0
        self.wakeups = 0
        self._handlers: dict[int, Any] = {}
        self._report: Report | None = None
        self._budget = 1
        self._more: Callable[[], None] | None = None

    def attach(
        self, handlers: dict[int, Any], report: Report, budget: int, more: Callable[[], None]
    ) -> None:
        self._handlers, self._report, self._budget, self._more = handlers, report, budget, more

    def on_readable(self) -> None:
        self.serve(True)

    def serve(self, event: bool) -> int:
        if self._cq is None or self._report is None or self._more is None:
            return 0
        if event:
            self.take_event()
        handled = 0
        while self._cq is not None:
            count, empty = self.drain(self._handlers, self._budget - handled, self._report)
            handled += count
            if self._cq is None:  # a handler closed the CQ
                break
            if empty:
                if self.armed or self.polling:
                    break
                self.req_notify()
            elif handled >= self._budget:
                self._more()
                break
        return handled

    def take_event(self) -> bool:
        cq, channel = self._cq, self._channel
        if cq is None or channel is None:
            raise ValueError("the completion queue driver was detached")
        try:
            channel.get_cq_event(cq)
        except PyverbsRDMAError as exc:
            if exc.error_code in (errno.EAGAIN, errno.EWOULDBLOCK):
                return False
            raise
        self.armed = False  # one event per arming
        self.wakeups += 1
        self._unacked += 1
        if self._unacked >= ACK_BATCH:  # pyverbs acknowledges the rest when it closes the CQ
            cq.ack_events(self._unacked)
            self._unacked = 0
        return True

    def req_notify(self) -> None:
        if self._cq is None:
            raise ValueError("the completion queue driver was detached")
        self._cq.req_notify()
        self.armed = True
        self.arms += 1

    def drain(self, handlers: dict[int, Any], budget: int, report: Report) -> tuple[int, bool]:
        handled = 0
        while (cq := self._cq) is not None:  # None: a handler closed the CQ
            count, wcs = cq.poll(POLL_BATCH)
            self.completions += count
            for wc in wcs:
                if wc.status == _ibv.WC_SUCCESS and wc.opcode & _ibv.WC_RECV:
                    self.received += 1
                handler = handlers.pop(wc.wr_id, None)
                if handler is None:
                    report(None, wc)
                    continue
                try:
                    handler.complete(wc)
                except Exception as exc:  # a handler bug must not kill the loop
                    report(exc, wc)
            handled += count
            if count < POLL_BATCH:
                return handled, True
            if handled >= budget:
                return handled, False
        return handled, True

    def spin(self, seconds: float) -> bool:
        return False  # spinning in Python would cost more than the event it saves

    def detach(self) -> None:
        self._cq = self._channel = None
        self._handlers, self._report, self._more = {}, None, None


class _RecvCache:
    """Receive work requests for single buffers, reused whenever that buffer
    is posted alone (pyverbs copies the scatter list in when a WR is built)."""

    __slots__ = ("_limit", "_wrs")

    def __init__(self, limit: int | None = RECV_WR_CACHE) -> None:
        self._limit = limit
        self._wrs: dict[tuple[int, int, int], RecvWR] = {}

    def get(self, wr_id: int, addr: int, length: int, lkey: int) -> RecvWR:
        key = (addr, length, lkey)
        wr = self._wrs.get(key)
        if wr is None:
            wr = RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(addr, length, lkey)])
            if self._limit is None or len(self._wrs) < self._limit:
                self._wrs[key] = wr
        else:
            wr.wr_id = wr_id
        return wr


class _SendChain:
    """Reusable send work requests, linked once, each with one SGE.

    ``ibv_post_send`` copies what it is given, so a queue pair keeps a list
    of them, each linked to the next and the last to nothing: posting ``k``
    requests fills the last ``k`` and posts from the first of those. Each
    WR's scatter list points at its own SGE, whose fields are rewritten per
    post. The list grows, at its front, on demand.
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

    def fill(self, index: int, wr_id: int, opcode: int, flags: int, seg: Any, imm: int) -> SendWR:
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


_CHAIN_SUPPORTED: Final = _SendChain.supported()


class _Single:
    """One buffer, in the shape of a segment."""

    __slots__ = ("addr", "length", "lkey")

    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self.addr, self.length, self.lkey = addr, length, lkey


class PureQPDriver:
    """:class:`~.base.QPDriver` through pyverbs' ``QP``."""

    compiled = False

    def __init__(self, qp: QP) -> None:
        self._qp: QP | None = qp
        self._chain = _SendChain() if _CHAIN_SUPPORTED else None
        self._recvs = _RecvCache()
        self.sends = 0
        self.receives = 0
        self.doorbells = 0

    def _sent(self, rc: int, count: int) -> int:
        if not rc:  # pyverbs does not say which request it refused: none counted
            self.sends += count
            self.doorbells += 1
        return rc

    def _received(self, rc: int, count: int) -> int:
        if not rc:
            self.receives += count
        return rc

    def _live(self) -> QP:
        if self._qp is None:
            raise ValueError("the queue pair driver was detached")
        return self._qp

    def post_sends(self, requests: Sequence[tuple[Any, ...]]) -> int:
        qp = self._live()
        chain = self._chain
        if chain is not None and all(len(r[4]) <= 1 for r in requests):
            first = chain.take(len(requests))[0]
            base = len(chain.wrs) - len(requests)
        else:
            chain = None
        wrs: list[SendWR] = []
        for wr_id, opcode, flags, imm, segments, remote_addr, rkey, compare_add, swap in requests:
            imm = socket.htonl(imm)
            if chain is not None:
                wr = chain.fill(base + len(wrs), wr_id, opcode, flags, segments[0], imm)
            else:
                sges = [SGE(s.addr, s.length, s.lkey) for s in segments]
                wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=len(sges), sg=sges,
                            send_flags=flags, imm_data=imm)  # fmt: skip
                if wrs:
                    wrs[-1].next_wr = wr  # appended below, after its remote part
            if opcode in _ibv.ATOMIC_OPCODES:
                wr.set_wr_atomic(rkey, remote_addr, compare_add, swap)
            elif opcode not in _ibv.SEND_OPCODES:
                wr.set_wr_rdma(rkey, remote_addr)
            wrs.append(wr)
        return self._sent(_posted(qp.post_send, first if chain is not None else wrs[0]), len(wrs))

    def post_table(
        self, first_id: int, ring: int, opcode: int, table: Any, start: int, count: int
    ) -> int:
        qp = self._live()
        if count <= 0:
            return 0
        if start < 0 or (start + count) * bulk_table.LAYOUT.record_words > len(table) or ring == 0:
            raise ValueError("records outside the table")
        wrs: list[SendWR] = []
        for r in range(start, start + count):
            rec = bulk_table.record(table, r)
            sge = SGE(rec.local_addr, rec.length, rec.lkey)
            wr = SendWR(wr_id=first_id + r % ring, opcode=opcode, num_sge=1, sg=[sge],
                        send_flags=_ibv.SEND_SIGNALED if r == start + count - 1 else 0)  # fmt: skip
            wr.set_wr_rdma(rec.rkey, rec.remote_addr)
            _link(wrs, wr)
        return self._sent(_posted(qp.post_send, wrs[0]), count)

    def post_send(
        self,
        wr_id: int,
        opcode: int,
        flags: int,
        addr: int,
        length: int,
        lkey: int,
        imm: int = 0,
        remote_addr: int = 0,
        rkey: int = 0,
    ) -> int:
        return self.post_sends(
            [(wr_id, opcode, flags, imm, (_Single(addr, length, lkey),), remote_addr, rkey, 0, 0)]
        )

    def post_send_list(
        self, ids: list[int], flags: list[int], addrs: list[int], lengths: list[int], lkey: int
    ) -> tuple[int, int]:
        if not (len(ids) == len(flags) == len(addrs) == len(lengths)):
            raise ValueError("a send list's columns differ in length")
        requests = [
            (wr_id, _ibv.WR_SEND, flag, 0, (_Single(addr, length, lkey),), 0, 0, 0, 0)
            for wr_id, flag, addr, length in zip(ids, flags, addrs, lengths, strict=True)
        ]
        rc = self.post_sends(requests) if requests else 0
        # pyverbs does not say which request it refused: count none as posted.
        return rc, 0 if rc else len(requests)

    def post_recv(self, wr_id: int, addr: int, length: int, lkey: int) -> int:
        wr = self._recvs.get(wr_id, addr, length, lkey)
        return self._received(_posted(self._live().post_recv, wr), 1)

    def post_recvs(self, requests: Sequence[tuple[int, Sequence[Any]]]) -> int:
        if len(requests) == 1 and len(requests[0][1]) == 1:
            wr_id, (seg,) = requests[0]
            return self.post_recv(wr_id, seg.addr, seg.length, seg.lkey)
        qp = self._live()
        wrs: list[RecvWR] = []
        for wr_id, segments in requests:
            sges = [SGE(s.addr, s.length, s.lkey) for s in segments]
            _link(wrs, RecvWR(wr_id=wr_id, num_sge=len(sges), sg=sges))
        return self._received(_posted(qp.post_recv, wrs[0]), len(wrs))

    def detach(self) -> None:
        self._qp = None


class PureSRQDriver:
    """:class:`~.base.SRQDriver` through pyverbs' ``SRQ``."""

    compiled = False

    def __init__(self, srq: SRQ) -> None:
        self._srq: SRQ | None = srq
        self._recvs = _RecvCache(limit=None)  # bounded by the SRQ's own buffers
        self.receives = 0

    def post_recv(self, wr_id: int, addr: int, length: int, lkey: int) -> int:
        if self._srq is None:
            raise ValueError("the shared receive queue driver was detached")
        rc = _posted(self._srq.post_recv, self._recvs.get(wr_id, addr, length, lkey))
        if not rc:
            self.receives += 1
        return rc

    def detach(self) -> None:
        self._srq = None


def _link(wrs: list[Any], wr: Any) -> None:
    """Append ``wr`` to the chain ``wrs`` (the previous one points at it)."""
    if wrs:
        wrs[-1].next_wr = wr
    wrs.append(wr)


def _posted(post: Callable[[Any], object], wr: Any) -> int:
    """0 once ``post(wr)`` took the chain, else the provider's errno: the
    one place a refusal from pyverbs becomes the driver's return code."""
    try:
        post(wr)
    except PyverbsRDMAError as exc:
        return exc.error_code or errno.EINVAL
    return 0
