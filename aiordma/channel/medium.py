"""Sending a medium message: too large for one packet, so copied as one
RECORD into the peer's ring (:mod:`~aiordma.channel.records`) when it holds
it, else through the send slots as a MEDIUM message.

A RECORD goes at once when nobody waits for the send turn and what it needs
is there, else in the turn once it is; it is all or nothing, so a cancelled
send sent nothing.

Its first packet (MEDIUM) carries the head and the body's first bytes;
PIECEs bring the rest, each copied into a send slot as credit allows and
posted with the others that can go at once as one chain (one doorbell
for each grant of credit, :class:`~aiordma.channel.outbox.Outbox`), so
nothing is registered or exposed for it (larger bodies go by
:mod:`~aiordma.channel.rendezvous`). The receiving side's half is
:meth:`~aiordma.channel.inbox.Inbox.begin_medium` and
:meth:`~aiordma.channel.inbox.Inbox.copy_pieces`.

Once the first packet went the message goes whole: cancelled, the rest is
copied and sent by a task that holds the send turn until it is done.
"""

from __future__ import annotations

import asyncio
import logging

from aiordma.channel.buffers import Body, buffer_view
from aiordma.channel.outbox import Outbox
from aiordma.channel.records import Records
from aiordma.channel.sender import Sender
from aiordma.channel.wire import Kind
from aiordma.exceptions import RdmaError, ResourceClosedError
from aiordma.lifecycle import spawn

log = logging.getLogger(__name__)


async def send_record(sender: Sender, records: Records, head: bytes, data: Body, size: int) -> None:
    """Send ``head`` and ``data`` (``size`` bytes) as one RECORD."""
    with buffer_view(data) as view:
        if not records.busy() and records.send(head, view, size):
            return
        await sender.take_turn()
        try:
            stalled = False
            while not records.send(head, view, size):
                stalled = await sender.wait_to_post(stalled)
        finally:
            sender.end_turn()


async def send_medium(sender: Sender, outbox: Outbox, head: bytes, data: Body, size: int) -> None:
    """Send ``head`` and ``data`` (``size`` bytes) as one MEDIUM message."""
    await sender.take_turn()
    handed = False
    try:
        with buffer_view(data) as view:
            offset, stalled = 0, False
            try:
                # Each call posts what can go now as one chain (one doorbell),
                # the first packet and then PIECEs; between calls, wait for
                # what the next packet needs.
                while not (offset := outbox.send_medium(head, view, size)):
                    stalled = await sender.wait_to_post(stalled)
                while offset < size:
                    stalled = await sender.wait_to_post(stalled)
                    offset = outbox.send_pieces(view, offset, size)
            except asyncio.CancelledError:
                if offset:  # begun: the peer must get all of it
                    spawn(_finish(sender, outbox.packets.eager_limit, bytes(view[offset:size])))
                    handed = True
                raise
    finally:
        if not handed:
            sender.end_turn()


async def _finish(sender: Sender, limit: int, rest: bytes) -> None:
    """The end of a MEDIUM message whose send was cancelled, in PIECEs of up
    to ``limit`` bytes; ends the send turn."""
    try:
        view, offset = memoryview(rest), 0
        while offset < len(rest):
            piece = view[offset : offset + limit]
            await sender.post(Kind.PIECE, 0, len(piece), None, b"", piece)
            offset += len(piece)
    except (RdmaError, ResourceClosedError, ConnectionError) as exc:
        log.debug("could not finish a cancelled message: %r", exc)
    finally:
        sender.end_turn()
