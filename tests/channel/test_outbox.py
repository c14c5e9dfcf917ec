"""Messages framed into packets (no device): BATCH packets, MEDIUM chains,
chains the provider refuses; two packet cores over fake lanes (conftest)."""

from __future__ import annotations

import asyncio
import errno

import pytest

from aiordma.channel.packets import Event
from aiordma.channel.wire import ENTRY_SIZE, HEADER_SIZE
from aiordma.exceptions import DeviceError
from tests.channel.conftest import flush, medium_begun, pair, receive_all, settled


def test_a_medium_message_goes_as_one_chain_as_far_as_credit_lets_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Its first packet and the PIECEs that can go at once are posted as one
    chain; what credit later lets go goes as another."""
    a, b = pair(loop, window=4, send_slots=8)
    body = bytes(range(256)) * 8  # 9 packets
    offset, *_ = medium_begun(a, b, body)
    assert a.lane.chains == [4]  # the MEDIUM and 3 PIECEs: the window's 4 credits
    flush(a, b)  # the credits back
    offset = a.outbox.send_pieces(memoryview(body), offset, len(body))
    assert a.lane.chains == [4, 4]


def test_small_messages_go_as_one_chain_while_credit_lasts(loop: asyncio.AbstractEventLoop) -> None:
    a, b = pair(loop, window=4, send_slots=8)
    bodies = [bytes([i]) * (150 + i) for i in range(6)]  # no two share a packet (BATCH)
    sizes = [len(body) for body in bodies]
    assert a.outbox.send_eagers(bodies, sizes, 0, False) == 4  # the window's 4 credits
    assert a.lane.chains == [4]
    a.packets.turn(True, 1)  # another send waits for the turn: nothing jumps it...
    assert a.outbox.send_eagers(bodies, sizes, 4, False) == 4
    flush(a, b)
    for i in range(4):
        assert b.packets.take_eager(None) == bodies[i]
    flush(a, b)  # the credits back
    assert a.outbox.send_eagers(bodies, sizes, 4, True) == 6  # ...unless it holds the turn
    assert a.lane.chains == [4, 2]
    assert a.stats.counters["messages_sent"] == 6


def test_small_messages_that_fit_together_go_as_one_batch_packet(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Neighbours that fit one packet share it (one credit, one work
    request); each arrives as a message of its own, in order, counted once
    on each side, and the buffer goes back once the last is taken."""
    a, b = pair(loop, window=4, send_slots=8)
    room = 256 - HEADER_SIZE
    bodies = [b"", b"x", b"yy" * 20, b"z" * (room - 3 * ENTRY_SIZE - 41 - 150), b"w" * 150]
    sizes = [len(body) for body in bodies]
    assert a.outbox.send_eagers(bodies, sizes, 0, False) == 5
    assert a.lane.chains == [2]  # four fill one packet exactly; the fifth goes alone
    assert a.packets.state.data.available == 2
    flush(a, b)
    assert b.packets.inbox.queued() == 5
    posted = len(b.lane.posted)
    assert [b.packets.take_eager(None) for _ in range(3)] == bodies[:3]
    assert len(b.lane.posted) == posted  # the batch's buffer is held for its last message
    assert receive_all(b) == bodies[3:]
    flush(a, b)
    settled(a)
    settled(b)
    assert a.stats.counters["messages_sent"] == b.stats.counters["messages_received"] == 5
    assert a.stats.counters["bytes_sent"] == b.stats.counters["bytes_received"] == sum(sizes)


def test_a_medium_message_waits_when_its_first_packet_cannot_go(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, _ = pair(loop, window=4, send_slots=8)
    for n in range(4):  # spend the window
        assert a.outbox.send_eager(b"", b"x", 1), n
    assert a.outbox.send_medium(b"h", memoryview(b"m" * 600), 600) == 0
    assert a.lane.staged is None  # the hold ended; nothing staged or posted
    assert len(a.lane.in_flight) == 4


def test_a_chain_the_provider_refuses_in_part_fails_the_channel(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The slots of what did not go are free again, the rest went, and the
    channel fails with the provider's errno (the credits are spent)."""
    a, _ = pair(loop, window=8, send_slots=8)
    a.lane.refuse_after = 2
    free = len(a.packets.state.free_slots)
    with pytest.raises(DeviceError) as caught:
        a.outbox.send_medium(b"h", memoryview(b"m" * 1200), 1200)  # 5 packets
    assert caught.value.errno == errno.ENOMEM
    assert [kind for kind, _ in a.events if kind == Event.FAILED] == [Event.FAILED]
    assert len(a.lane.in_flight) == 2
    # 5 slots taken, 3 given back: the 2 that went stay busy until their completions.
    assert len(a.packets.state.free_slots) == free - 2
