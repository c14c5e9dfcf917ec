"""A channel's RECORDs: medium messages written whole into the peer's receive ring.

A message too large for one packet but at most a quarter of the peer's
ring travels as one RDMA WRITE WITH IMMEDIATE: header, head and body, from
a staging region of this side into the peer's ring, where the receive
completion it consumes says it landed (:mod:`~aiordma.channel.ring` has
the rules both sides keep). One work request and one completion per side,
against a first packet and a PIECE per buffer's worth.

Each side's ring is a region of its own, registered for local access only
and exposed through a type 2 memory window bound to the connection's queue
pair, for writing only: its rkey works on no other queue pair, and the
window ends with the connection. :meth:`Records.expose` binds it; the
HELLO carries it (:class:`~aiordma.channel.wire.Hello`); a side without
memory windows of that type announces none, and the peer's medium messages
to it go in pieces.

Call order: ``expose -> heard -> (send | written)*``; ``written`` is the
lane's callback for receives that a write consumed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from aiordma.channel.packets import Event, EventReport, Packets
from aiordma.channel.ring import ALIGN, RingOwner, RingWriter
from aiordma.channel.wire import HEADER_SIZE, Kind, read_packet, write_packet
from aiordma.exceptions import DeviceError, ProtocolError
from aiordma.verbs.memory import Access, MemoryRegion, RemoteBuffer, Segment
from aiordma.verbs.queue_pair import QueuePair
from aiordma.verbs.window import MemoryWindow

log = logging.getLogger(__name__)


def _report_nothing(event: Event, value: object) -> None:
    """A failed channel's records report nothing."""


Write = Callable[[Segment, RemoteBuffer, int, Callable[[BaseException | None, int], None]], None]
"""How a record is posted (:meth:`aiordma.QueuePair.post_write_callback`)."""


class Records:
    """The RECORDs of one channel side: ``ring`` (registered with
    ``MW_BIND``) receives the peer's, ``staging`` holds this side's until
    their writes complete; ``packets`` is the side's packet core,
    ``report`` its shell."""

    def __init__(
        self, packets: Packets, ring: MemoryRegion, staging: MemoryRegion, report: EventReport
    ) -> None:
        self._packets = packets
        self._state = packets.state
        self._ring = ring
        self._staging = staging
        self._staged = RingWriter(staging.length)
        """The staging region's space: taken by a record, given back at its completion."""
        self._staging_view = staging.view(scoped=True)
        self._report = report
        self._peer: RemoteBuffer | None = None
        self._write: Write | None = None
        self.window: MemoryWindow | None = None
        """The window exposing the ring, once bound."""
        packets.inbox.ring_view = ring.view(scoped=True)
        self._state.ring_in = RingOwner(ring.length)

    def let_go(self) -> None:
        """The channel failed: report nothing more to it (no reference back to it)."""
        self._report = _report_nothing
        self.window = None

    # -- setting up ----------------------------------------------------------

    def expose(self, qp: QueuePair) -> RemoteBuffer | None:
        """Bind the ring's window on ``qp`` (established) for the HELLO that
        follows; None (and no ring on this side) where the device has no
        type 2 windows, or the bind cannot be posted."""
        self._write = qp.post_write_callback
        try:
            window = qp.bind_window_nowait(self._ring, Access.REMOTE_WRITE)
        except (DeviceError, ValueError, TypeError) as exc:
            log.debug("no receive ring on %r: %r", qp, exc)
            self._state.ring_in = None
            return None
        if window.type != 2:  # a type 1 window would open the ring to the whole domain
            window.invalidate()
            self._state.ring_in = None
            return None
        self.window = window
        return window.remote

    def heard(self, ring: RemoteBuffer | None) -> None:
        """The peer's HELLO announced ``ring`` (None: it has none)."""
        if ring is not None:
            self._peer = ring
            self._state.ring_out = RingWriter(ring.length)

    # -- sending -------------------------------------------------------------

    def busy(self) -> bool:
        """Whether sends wait for the send turn (a new one must queue behind them)."""
        return self._packets.senders > 0

    def send(self, head: bytes | bytearray, body: memoryview, size: int) -> bool:
        """Write a message (``head`` and ``body`` of ``size`` bytes, which
        :meth:`ChannelState.fits_ring <aiordma.channel.state.ChannelState.fits_ring>`
        said fits) now if the send queue, a data credit, the peer's ring
        space and staging space are there; False (nothing taken) if not.
        The caller holds the send turn, or nobody waits for it. If the post
        fails, so does the channel (what it took cannot be given back)."""
        packets = self._packets
        peer = self._peer
        total = HEADER_SIZE + len(head) + size
        if (
            peer is None
            or packets.failed
            or not packets.lane.send_room()
            or not self._staged.room_for(total)
        ):
            return False
        granted = self._state.record(size, len(head))
        if granted is None:
            return False
        header, place = granted
        staged = self._staged.reserve(total)
        assert staged is not None
        assert self._write is not None
        try:
            length = write_packet(self._staging_view, staged.offset, total, header, head, body)
            self._write(
                self._staging.segment(staged.offset, length),
                peer[place.offset : place.offset + length],
                place.sequence,
                functools.partial(self._written_out, staged.taken),
            )
        except BaseException as exc:
            self._report(Event.FAILED, exc)
            raise
        return True

    def _written_out(self, taken: int, error: BaseException | None, _: int) -> None:
        """A record's write completed (or failed): its staging space is free."""
        self._staged.grant(taken // ALIGN)
        if error is not None:
            self._report(Event.FAILED, error)
        elif not self._packets.failed:
            self._packets.pump()  # a send waiting for staging space may go

    # -- receiving -----------------------------------------------------------

    def written(self, slot: int, sequence: int, size: int) -> None:
        """The lane's callback: the peer's write of ``size`` bytes with
        immediate ``sequence`` consumed receive slot ``slot``. Checks the
        record, queues its message and reposts the slot at once."""
        packets = self._packets
        if packets.failed:
            return
        try:
            offset = self._state.ring_arrived(sequence, size)
            header = read_packet(packets.inbox.ring_view, offset, size, size, packets.max_message)
            if header.kind != Kind.RECORD:
                raise ProtocolError(f"a {header.kind.name} packet written into the ring")
            ended, _ = self._state.arrived(header)
            packets.inbox.arrived_record(header, offset, size)
        except (ProtocolError, ValueError) as err:
            self._report(Event.BROKEN, err)
            return
        if not packets.repost(slot):
            return  # the channel failed
        if ended:
            self._report(Event.ENDED, ended)
        packets.pump()
