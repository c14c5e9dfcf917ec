"""Setting up a message channel's packet path: its slots, packet core and lane.

A channel's packets go out of fixed send slots of one registered region and
land in fixed receive slots of another (or of a shared receive queue's
pool); :func:`open_packet_path` sizes both from the channel's options and the
queue pair (checking them), registers them, and joins a
:class:`~aiordma.channel.packets.Packets` core to the queue pair's packet
lane, with the receive ring and staging of its RECORDs
(:mod:`~aiordma.channel.records`) when it has its own receive buffers. The
channel is what remains: the async shell over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from aiordma.channel.credits import DataCredits
from aiordma.channel.link import Lane, Link
from aiordma.channel.options import ChannelOptions, Layout
from aiordma.channel.packets import EventReport, Packets
from aiordma.channel.records import Records
from aiordma.channel.shared_receive import SharedReceiveQueue
from aiordma.metrics import Stats
from aiordma.verbs.memory import Access, MemoryRegion


class PacketPath(NamedTuple):
    """What :func:`open_packet_path` set up."""

    packets: Packets
    lane: Lane
    layout: Layout
    shared: SharedReceiveQueue | None
    regions: tuple[MemoryRegion, ...]
    """The send and (unless shared) receive regions, and the ring and
    staging ones: their owner keeps them, so they are deregistered with the
    link, releasing the views of them."""
    records: Records | None
    """The RECORDs' ring and staging (None: no ring, layout.ring was 0)."""


def open_packet_path(
    conn: Link, options: ChannelOptions, stats: Stats, report: EventReport,
    failed: Callable[[BaseException], None],
) -> PacketPath:  # fmt: skip
    """Register ``conn``'s slots for ``options`` and join their packet core
    (telling ``report`` what the shell must do) to a lane of its queue
    pair; ``failed`` is told when the lane or the shared receive queue
    stops. ValueError or TypeError names an option that cannot work."""
    qp = conn.qp
    shared = qp.shared_receive
    if shared is not None and not isinstance(shared, SharedReceiveQueue):
        raise TypeError(f"a message channel draws on an aiordma.SharedReceiveQueue, not {shared!r}")
    layout = options.layout(
        qp.options.recv_depth, qp.options.send_depth,
        None if shared is None else shared.buffer_size,
    )  # fmt: skip
    window, control_window, size = layout.window, layout.control_window, layout.buffer_size
    data: DataCredits | None = None
    recv_mr: MemoryRegion | None = None

    def on_packet(index: int, error: BaseException | None, size: int) -> None:
        """A packet landed in shared receive buffer ``index``, or failed to."""
        if error is not None:
            failed(error)
        else:
            packets.arrived(index, size)

    if shared is not None:
        data = shared.join(qp, on_packet, failed, window, control_window)
        recv_view = shared.mr.view()
    else:
        recv_mr = conn.alloc((window + control_window) * size)
        recv_view = recv_mr.view(scoped=True)
    send_mr = conn.alloc(layout.send_slots * size)
    # Views of both regions for the channel's life (the receive one until it
    # fails): one view per packet would cost more than the copy. Scoped
    # views are released when their region is, so it can be unmapped.
    packets = Packets(
        report, window, control_window, layout.send_slots, data, send_mr.view(scoped=True),
        recv_view, size, options.max_message, stats, shared, qp.loop,
    )  # fmt: skip
    records: Records | None = None
    if layout.ring and recv_mr is not None:
        # Local access only: the ring is exposed through a window bound to
        # this queue pair alone (Records.expose), never by its own rkey.
        ring_mr = conn.alloc(layout.ring, Access.LOCAL_WRITE | Access.MW_BIND)
        staging_mr = conn.alloc(layout.ring)
        records = Records(packets, ring_mr, staging_mr, report)
    lane = qp.open_lane(
        send_mr, layout.send_slots, recv_mr, 0 if recv_mr is None else window + control_window,
        size, packets.sent, packets.arrived, failed,
        None if records is None else records.written,
    )  # fmt: skip
    packets.attach(lane)
    regions: tuple[MemoryRegion, ...] = (send_mr,) if recv_mr is None else (send_mr, recv_mr)
    if records is not None:
        regions += (ring_mr, staging_mr)
    return PacketPath(packets, lane, layout, shared, regions, records)
