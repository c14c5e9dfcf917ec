"""The channel's packet core with no device: two :class:`Packets` over fake
lanes (tests/channel/conftest.py), on whichever path is active; on a device
the channel's own tests cover the same paths through the verbs."""

from __future__ import annotations

import asyncio

import pytest

from aiordma.channel.inbox import Arrival, Phase
from aiordma.channel.packets import NO_CREDIT, NO_ROOM, POSTED, Event
from aiordma.channel.wire import ENTRY_SIZE, HEADER_SIZE, Hello, Kind
from aiordma.exceptions import ProtocolError, RdmaError
from aiordma.verbs.memory import RemoteBuffer
from tests.channel.conftest import (
    MAX_MESSAGE,
    Side,
    flush,
    header_kind,
    medium_begun,
    pair,
    receive_all,
    send_medium,
    settled,
)


def test_hello_fits_each_side_to_the_smaller_buffers_and_announces_the_limit(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = pair(loop, size=512, b_size=256)
    assert a.packets.eager_limit == b.packets.eager_limit == 256 - HEADER_SIZE
    assert [hello.buffer_size for hello in a.reported(Event.HEARD)] == [256]  # type: ignore[attr-defined]
    assert [hello.buffer_size for hello in b.reported(Event.HEARD)] == [512]  # type: ignore[attr-defined]
    assert a.packets.peer_max_message == b.packets.peer_max_message == MAX_MESSAGE


def test_small_messages_flow_in_order_and_a_slow_receiver_holds_the_sender(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The sender spends one credit a message and stops when the window is
    spent; the receiver's takes return the credits and a credit update
    brings them back. Everything arrives once, in order, and no packet
    meets an empty receive queue (the fake lane checks)."""
    a, b = pair(loop, window=4)
    sent, got = 0, []
    for _ in range(30):
        while a.outbox.send_eager(b"", b"m%03d" % sent, 4):
            sent += 1
        assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"x") == NO_CREDIT
        flush(a, b)
        got += receive_all(b)
        flush(a, b)  # the credit update
    assert sent > 30 * 3  # the credits came back every round
    assert got == [b"m%03d" % i for i in range(sent)]
    settled(a)
    settled(b)
    assert a.reported(Event.FAILED) == b.reported(Event.BROKEN) == []
    # No data went a's way to carry b's credits: each round's came in a packet
    # of its own, and each side counts what the other sent.
    assert b.stats.counters["credit_updates_sent"] >= 30
    assert a.stats.counters["credit_updates_received"] == b.stats.counters["credit_updates_sent"]
    assert b.stats.counters["credit_updates_received"] == a.stats.counters["credit_updates_sent"]


def test_a_message_goes_into_the_callers_buffer(loop: asyncio.AbstractEventLoop) -> None:
    a, b = pair(loop)
    assert a.outbox.send_eager(b"hd", b"payload", 7)
    flush(a, b)
    arrival = b.packets.inbox.first()
    assert arrival is not None
    assert b.packets.inbox.head(arrival) == b"hd"
    assert b.packets.take_eager(bytearray(3)) is None  # too short: left queued
    into = bytearray(10)
    assert b.packets.take_eager(into) == 7
    assert into[:7] == b"payload"
    assert b.packets.inbox.first() is None


def test_a_full_send_queue_holds_a_packet_and_a_credit_update_waits_for_room(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = pair(loop, window=4, send_depth=2)
    assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"1") == POSTED
    assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"2") == POSTED
    assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"3") == NO_ROOM
    assert not a.outbox.send_eager(b"", b"3", 1)
    flush(a, b)
    b.lane.in_flight = [(0, b"")] * 2  # b's send queue is full (nothing real in it)
    assert receive_all(b) == [b"1", b"2"]
    assert b.reported(Event.WAIT_ROOM) == [None]  # half the window is owed
    assert b.packets.room_pending
    b.lane.in_flight = []
    b.packets.room_came()
    assert not b.packets.room_pending
    assert [header_kind(data) for _, data in b.lane.in_flight] == [Kind.CREDIT]


def test_a_medium_message_larger_than_the_window_flows_piece_by_piece(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Ten packets' worth through a window of four: each piece taken gives
    its buffer back at once, so the rest can come."""
    a, b = pair(loop, window=4)
    body = bytes(range(256)) * 8
    offset = send_medium(a, body)
    assert offset < len(body)  # the window stopped it
    flush(a, b)
    arrival = b.packets.inbox.first()
    assert arrival is not None
    assert arrival.header.kind == Kind.MEDIUM
    target = memoryview(bytearray(len(body)))
    head, filled = b.packets.begin_medium(arrival, target)
    assert head == b"h"
    for _ in range(50):
        filled = b.packets.take_pieces(arrival, target, filled)
        flush(a, b)  # credits back to a
        offset = a.outbox.send_pieces(memoryview(body), offset, len(body))
        flush(a, b)
        if filled == len(body):
            break
    assert filled == len(body)
    assert bytes(target) == body
    b.packets.consumed()
    assert b.packets.inbox.first() is None
    flush(a, b)
    settled(a)
    settled(b)


def test_a_cancelled_medium_receive_keeps_what_it_copied(loop: asyncio.AbstractEventLoop) -> None:
    a, b = pair(loop, window=8)
    body = b"abcdefgh" * 100
    assert send_medium(a, body) == len(body)
    flush(a, b)
    arrival = b.packets.inbox.first()
    assert arrival is not None
    target = memoryview(bytearray(len(body)))
    head, filled = b.packets.begin_medium(arrival, target)
    b.packets.inbox.keep(arrival, head, target, filled)  # cancelled here
    again = memoryview(bytearray(len(body)))
    head, resumed = b.packets.begin_medium(arrival, again)
    assert (head, resumed) == (b"h", filled)
    assert b.packets.take_pieces(arrival, again, resumed) == len(body)
    assert bytes(again) == body


def test_a_batch_holds_its_credit_until_its_last_message_is_taken(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A reader that falls behind still holds its sender back: a batch's
    messages are copied out at once, but its credit comes back with the last."""
    a, b = pair(loop, window=2, send_slots=8)
    bodies = [b"m%02d" % i for i in range(57)]  # 19 fit one 256-byte packet
    sizes = [len(body) for body in bodies]
    assert (256 - HEADER_SIZE) // (ENTRY_SIZE + 3) == 19
    sent = a.outbox.send_eagers(bodies, sizes, 0, False)
    assert sent == 38  # two batches: the window
    flush(a, b)
    got = [b.packets.take_eager(None) for _ in range(37)]  # all but the second's last
    flush(a, b)
    assert a.outbox.send_eagers(bodies, sizes, sent, False) == 57  # the first's credit
    assert a.outbox.send_eagers(bodies, sizes, 0, False) == 0  # the window spent again
    flush(a, b)
    got += receive_all(b)
    assert got == bodies
    flush(a, b)
    settled(a)
    settled(b)


def test_queued_small_messages_are_taken_together_up_to_a_limit_or_a_larger_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """``take_eagers``: the small messages at the head of the queue, in
    order, at most ``limit``, stopping before a MEDIUM one, a receive
    ahead or none; each counted and its buffer handled as one taken alone."""
    a, b = pair(loop, window=8, send_slots=8)
    bodies = [b"s%d" % i for i in range(5)]
    assert a.outbox.send_eagers(bodies, [2] * 5, 0, False) == 5
    send_medium(a, b"M" * 600)
    assert a.outbox.send_eagers([b"after"], [5], 0, False) == 1
    flush(a, b)
    assert b.packets.take_eagers(2) == bodies[:2]
    b.packets.turn(False, 1)  # a receive ahead holds the turn
    assert b.packets.take_eagers(10) == []
    b.packets.turn(False, -1)
    assert b.packets.take_eagers(10) == bodies[2:]  # the MEDIUM message stops it
    assert b.stats.counters["messages_received"] == 5
    assert b.packets.take_eagers(10) == []
    assert b.packets.take_medium(bytearray(600)) == 600
    assert b.packets.take_eagers(10) == [b"after"]
    assert b.packets.take_eagers(10) == []
    flush(a, b)
    settled(a)
    settled(b)


def test_the_hook_is_offered_each_message_of_a_batch_in_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Those it takes never reach a receive; from the first it refuses on,
    the rest are queued in order."""
    a, b = pair(loop)
    offered: list[bytes] = []

    def hook(head: bytes, body: memoryview) -> bool:
        offered.append(bytes(body))
        return not offered[-1].startswith(b"q")

    b.packets.deliver = hook
    receiving = b.packets.waiting.arrivals()
    bodies = [b"a1", b"a2", b"a3"]
    assert a.outbox.send_eagers(bodies, [2, 2, 2], 0, False) == 3
    flush(a, b)
    assert offered == bodies
    assert not receiving.done()
    assert b.packets.inbox.first() is None
    bodies = [b"b1", b"q2", b"b3"]
    assert a.outbox.send_eagers(bodies, [2, 2, 2], 0, False) == 3
    flush(a, b)
    assert offered[3:] == [b"b1", b"q2"]
    assert receiving.done()
    assert receive_all(b) == [b"q2", b"b3"]
    flush(a, b)
    settled(a)
    settled(b)
    assert b.stats.counters["messages_received"] == 6


def test_a_failed_side_keeps_the_messages_of_a_batch(loop: asyncio.AbstractEventLoop) -> None:
    a, b = pair(loop)
    bodies = [b"one", b"two", b"three"]
    assert a.outbox.send_eagers(bodies, [3, 3, 5], 0, False) == 3
    flush(a, b)
    assert b.packets.take_eager(None) == b"one"
    b.packets.fail()
    kept = []
    while (arrival := b.packets.inbox.first()) is not None:
        kept.append(b.packets.inbox.small_body(arrival, None))
        b.packets.consumed()
    assert kept == [b"two", b"three"]


def test_pieces_that_land_while_filling_are_copied_and_wake_the_task_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """While a receive fills a MEDIUM message, its pieces are copied as they
    land (their buffers posted again at once) and its task is woken only
    when the body is whole; a sender waiting for credits is woken as before."""
    a, b = pair(loop, window=4, send_slots=8)
    body = bytes(range(256)) * 8
    offset, arrival, target, filled = medium_begun(a, b, body)
    b.packets.inbox.fill(arrival, target, filled)
    receiving = b.packets.waiting.arrivals()
    changed = b.packets.waiting.changed()
    flush(a, b)  # credits back to a
    for _ in range(10):
        offset = a.outbox.send_pieces(memoryview(body), offset, len(body))
        flush(a, b)  # they land and are copied
        if offset == len(body):
            break
        assert not receiving.done()  # not woken for a piece
    assert changed.done()  # woken by the credits its copies gave back
    assert receiving.done()  # whole
    assert b.packets.inbox.filled() == len(body)
    assert bytes(target) == body
    b.packets.consumed()
    flush(a, b)
    settled(a)
    settled(b)


def test_a_failed_side_keeps_what_arrived_whole(loop: asyncio.AbstractEventLoop) -> None:
    """Small messages and whole MEDIUM ones stay readable after a failure,
    as TCP keeps what it received; one still missing pieces does not."""
    a, b = pair(loop, window=16, send_slots=16)
    assert a.outbox.send_eager(b"", b"first", 5)
    whole = b"w" * 600
    assert send_medium(a, whole) == len(whole)
    assert a.outbox.send_eager(b"k", b"second", 6)
    flush(a, b)
    partial = b"p" * 2000
    send_medium(a, partial)
    a.lane.in_flight.pop()  # its last piece never comes
    flush(a, b)
    b.packets.fail()
    assert b.packets.failed
    bodies = []
    while (arrival := b.packets.inbox.first()) is not None:
        head = b.packets.inbox.head(arrival)
        bodies.append((head, b.packets.inbox.small_body(arrival, None)))
        b.packets.consumed()
    assert bodies == [(b"", b"first"), (b"h", whole), (b"k", b"second")]
    assert b.packets.inbox.queued() == 1  # the message missing a piece is not readable
    assert a.outbox.send_eager(b"", b"late", 4)
    flush(a, b)
    assert b.packets.inbox.queued() == 1  # nothing is read after the failure


def _announced(a: Side, b: Side, msg_id: int, head: bytes) -> Arrival:
    """``a`` announces a large message (RENDEZVOUS); it arrives at ``b``,
    which starts reading it."""
    remote = RemoteBuffer(0x1000, 5000, 7)
    assert a.packets.try_send(Kind.RENDEZVOUS, msg_id, 5000, remote, head, None) == POSTED
    flush(a, b)
    arrival = b.packets.inbox.first()
    assert arrival is not None
    assert (arrival.header.remote, b.packets.inbox.head(arrival)) == (remote, head)
    b.packets.inbox.read_started(arrival)
    return arrival


def test_a_large_message_taken_owes_its_sender_a_done_that_ends_its_exposure(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = pair(loop)
    _announced(a, b, 9, b"hd")
    b.packets.consumed()
    assert b.reported(Event.DONE_DUE) == [9]
    assert b.packets.try_send(Kind.DONE, 9, 0, None, b"", None) == POSTED
    flush(a, b)
    assert a.reported(Event.ENDED) == [9]


def test_a_revoke_during_a_read_is_answered_once_the_read_stops(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = pair(loop)
    arrival = _announced(a, b, 3, b"")
    assert a.packets.try_send(Kind.REVOKE, 3, 0, None, b"", None) == POSTED
    flush(a, b)
    assert b.packets.inbox.acks() == []  # reading: not answered yet
    b.packets.inbox.read_stopped(arrival)
    assert b.packets.inbox.acks() == [3]
    assert arrival.phase == Phase.REVOKED


def test_a_malformed_packet_is_reported_as_broken(loop: asyncio.AbstractEventLoop) -> None:
    _, b = pair(loop)
    slot = b.lane.posted.popleft()  # a packet lands there: garbage
    b.recv[slot * b.size : slot * b.size + HEADER_SIZE] = b"\xff" * HEADER_SIZE
    b.packets.arrived(slot, HEADER_SIZE)
    (error,) = b.reported(Event.BROKEN)
    assert isinstance(error, ProtocolError)
    assert b.packets.failed


def test_a_failed_post_fails_the_side_and_frees_its_slot(loop: asyncio.AbstractEventLoop) -> None:
    a, _ = pair(loop)
    a.lane.broken = True
    free = len(a.packets.state.free_slots)
    with pytest.raises(RdmaError):
        a.outbox.send_eager(b"", b"x", 1)
    assert len(a.packets.state.free_slots) == free
    (error,) = a.reported(Event.FAILED)
    assert isinstance(error, RdmaError)
    assert a.packets.failed
    assert not a.outbox.send_eager(b"", b"x", 1)


def test_a_hello_the_shell_refuses_is_not_applied(loop: asyncio.AbstractEventLoop) -> None:
    """A peer speaking another protocol: the shell fails the side when told
    of its HELLO, and the HELLO's limit and grants are never taken in."""
    a, b = Side(loop), Side(loop, refuse_hello=True)
    a.lane.peer, b.lane.peer = b.lane, a.lane
    assert a.packets.send_hello(MAX_MESSAGE, Hello(a.size, "other").pack())
    flush(a, b)
    assert b.packets.failed
    assert b.packets.peer_max_message is None
    assert b.packets.credits() == Side(loop).packets.credits()  # no grant taken in


def test_a_message_the_hook_takes_wakes_no_receiving_task(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A small message the delivery hook takes never reaches a receive: a
    task waiting for the next message stays asleep (one wake-up a message
    less for request/reply protocols). One the hook refuses is queued and
    wakes it; a task waiting for any change is woken either way."""
    a, b = pair(loop)
    taken: list[bytes] = []

    def hook(head: bytes, body: memoryview) -> bool:
        taken.append(bytes(body))
        return not taken[-1].startswith(b"q")  # "queue me" is refused

    b.packets.deliver = hook
    receiving, changed = b.packets.waiting.arrivals(), b.packets.waiting.changed()
    assert a.outbox.send_eager(b"", b"take me", 7)
    flush(a, b)
    assert taken[-1] == b"take me"
    assert not receiving.done()
    assert changed.done()
    assert b.packets.inbox.first() is None
    assert a.outbox.send_eager(b"", b"queue me", 8)
    flush(a, b)
    assert receiving.done()  # refused by the hook: queued for a receive
    assert receive_all(b) == [b"queue me"]
    flush(a, b)
    settled(a)
    settled(b)


def test_a_whole_medium_message_is_taken_in_one_call(loop: asyncio.AbstractEventLoop) -> None:
    """``take_medium``: every piece in, nobody ahead, a buffer that holds it:
    copied whole and every buffer given back, with no turn; otherwise -1,
    changing nothing, for the slow path."""
    a, b = pair(loop, window=8)
    body = b"abcdefgh" * 100
    offset = send_medium(a, body)
    assert offset == len(body)
    flush(a, b)
    arrival = b.packets.inbox.first()
    assert arrival is not None
    assert arrival.header.kind == Kind.MEDIUM
    assert b.packets.take_medium(bytearray(len(body) - 1)) == -1  # too short: the slow path says so
    assert b.packets.take_medium(b"x" * len(body)) == -1  # not a buffer it takes
    b.packets.turn(False, 1)  # a receive ahead holds the turn
    assert b.packets.take_medium(bytearray(len(body))) == -1
    b.packets.turn(False, -1)
    assert b.packets.inbox.first() is arrival  # nothing taken
    into = memoryview(bytearray(len(body) + 10))
    assert b.packets.take_medium(into) == len(body)
    assert bytes(into[: len(body)]) == body
    assert b.packets.inbox.first() is None
    assert b.stats.counters["messages_received"] == 1
    flush(a, b)
    settled(a)
    settled(b)


def test_a_medium_message_still_arriving_is_left_to_the_slow_path(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = pair(loop, window=4)
    body = bytes(range(256)) * 8
    offset = send_medium(a, body)
    assert offset < len(body)  # the window stopped it: pieces still to come
    flush(a, b)
    assert b.packets.take_medium(bytearray(len(body))) == -1
    arrival = b.packets.inbox.first()
    assert arrival is not None
    assert arrival.missing > 0
