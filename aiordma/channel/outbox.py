# cython: annotation_typing=True
"""How a channel's messages become packets on the send side.

:class:`Outbox` frames each message for :class:`~aiordma.channel.packets.Packets`
(the wire): one EAGER packet for a small message, one BATCH packet for
neighbours that fit one together (one credit, one work request), and for
a MEDIUM message its first packet and then PIECEs, as far as the send
queue, the send slots and the credits let them go, each call's packets
posted as one chain. It holds no state of its own: what it may send is
the wire's to say. Compiled (``outbox.pxd``), the one-call path
:meth:`Outbox.send_eager` runs in C from the application to the verbs.

Call order: any of its methods, any number of times, while the channel has
not failed (afterwards they send nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiordma import metrics
from aiordma.channel.buffers import Body
from aiordma.channel.packets import POSTED, Packets
from aiordma.channel.wire import ENTRY_SIZE, Header, Kind, pack_batch
from aiordma.metrics import Stats, tally

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

Bytes = bytes | bytearray
View = memoryview  # (an alias: typed with it, Cython would check its own memoryview type)

_POSTED = cython.declare(cython.int, POSTED)


@cython.cclass
class Outbox:
    """Frames messages into ``packets``; counts those sent in ``stats``."""

    def __init__(self, packets: Packets, stats: Stats) -> None:
        self.packets = packets
        self._stats = stats

    @cython.cfunc
    def _sent(self, size: cython.Py_ssize_t) -> None:
        """Count a message of ``size`` bytes sent, with no Python frame."""
        if metrics._on:
            tally(self._stats.counters, "messages_sent", "bytes_sent", size)

    @cython.ccall
    def send_eager(self, head: Bytes, body: Body, size: cython.Py_ssize_t) -> cython.bint:
        """Send a message of one packet (``head`` and ``body`` of ``size``
        bytes, which fit) now, if nobody waits ahead and the send queue, a
        send slot and a credit are there; False if it must wait its turn."""
        packets = self.packets
        if packets.senders or packets.failed:
            return False
        if packets.try_send(Kind.EAGER, 0, size, None, head, body) != _POSTED:
            return False
        self._sent(size)
        return True

    @cython.ccall
    def send_eagers(
        self, bodies: Sequence[Body], sizes: Sequence[int], start: cython.Py_ssize_t,
        in_turn: cython.bint,
    ) -> cython.Py_ssize_t:  # fmt: skip
        """Post the small messages ``bodies[start:]`` (``sizes`` bytes each,
        each fitting one packet with no head) that can go now, as one chain;
        returns the index of the first not sent. Neighbours that fit one
        packet together go as one BATCH. Sends nothing if others wait for
        the send turn, unless the caller holds it (``in_turn``)."""
        packets = self.packets
        count: cython.Py_ssize_t = len(bodies)
        i: cython.Py_ssize_t = start
        n: cython.Py_ssize_t
        total: cython.Py_ssize_t
        entry: cython.Py_ssize_t = ENTRY_SIZE
        if (packets.senders and not in_turn) or packets.failed or i >= count:
            return i
        packets.hold()
        try:
            while i < count and not packets.failed:
                n = 0
                total = 0
                while i + n < count and total + entry + sizes[i + n] <= packets.eager_limit:
                    total += entry + sizes[i + n]
                    n += 1
                if n > 1:
                    batch = pack_batch(bodies[i : i + n], sizes[i : i + n], total)
                    if packets.try_send(Kind.BATCH, n, total, None, b"", batch) != _POSTED:
                        break
                else:
                    n = 1
                    if packets.try_send(Kind.EAGER, 0, sizes[i], None, b"", bodies[i]) != _POSTED:
                        break
                while n > 0:
                    self._sent(sizes[i])
                    i += 1
                    n -= 1
        finally:
            packets.flush()
        return i

    @cython.ccall
    def send_medium(self, head: Bytes, view: View, size: cython.Py_ssize_t) -> cython.Py_ssize_t:
        """Post a MEDIUM message's first packet (``head`` and the start of its
        body ``view`` of ``size`` bytes) and the PIECEs that can go with it
        now, as one chain; returns how far the body is sent (0: the first
        packet cannot go yet, nothing was posted). The caller holds the send
        turn."""
        packets = self.packets
        room: cython.Py_ssize_t = packets.eager_limit - len(head)
        offset: cython.Py_ssize_t = 0
        packets.hold()
        try:
            if packets.try_send(Kind.MEDIUM, 0, size, None, head, view[:room]) == _POSTED:
                offset = self._pieces(view, room, size)
        finally:
            packets.flush()
        return offset

    @cython.ccall
    def send_pieces(
        self, view: View, offset: cython.Py_ssize_t, size: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """Post the PIECEs of a MEDIUM message (its body ``view`` of ``size``
        bytes, sent up to ``offset``) that can go now, as one chain; returns
        how far it is sent. The caller holds the send turn and waits for
        whatever stops it."""
        self.packets.hold()
        try:
            offset = self._pieces(view, offset, size)
        finally:
            self.packets.flush()
        return offset

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _pieces(
        self, view: View, offset: cython.Py_ssize_t, size: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """:meth:`send_pieces`' staging, inside the hold."""
        packets = self.packets
        limit: cython.Py_ssize_t = packets.eager_limit
        n: cython.Py_ssize_t
        slot: cython.int
        header: Header
        while offset < size and not packets.failed and packets.lane.send_room():
            n = min(limit, size - offset)
            packet = packets.state.send(Kind.PIECE, 0, n, None, 0)
            if packet is None:
                break
            slot, header = packet
            packets.post(slot, header, b"", view[offset : offset + n])
            offset += n
        return offset
