"""The channel's packet core with no device: two :class:`Packets` over fake lanes.

Each side's slots are plain bytearrays; a fake lane delivers a posted send
into the peer's oldest posted receive slot when the test says so, as the
adapter would (in order, each completion once), and fails the test if a
packet meets an empty receive queue. These run on whichever path is active
(compiled in the one-host suite, interpreted in the pure-path set); on a
device the channel's own tests cover the same paths through the verbs.
"""

from __future__ import annotations

import asyncio
import collections
import errno
from collections.abc import Iterator

import pytest

from aiordma.channel.packets import NO_CREDIT, NO_ROOM, POSTED, Event, Packets
from aiordma.channel.state import Arrival
from aiordma.channel.wire import ENTRY_SIZE, HEADER_SIZE, Header, Hello, Kind
from aiordma.exceptions import DeviceError, ProtocolError, RdmaError
from aiordma.metrics import Stats
from aiordma.verbs.memory import RemoteBuffer

MAX_MESSAGE = 1 << 20


class FakeLane:
    """A queue pair's packet lane, on bytes: sends wait in flight until
    :meth:`deliver` lands them in the peer's posted receive slots."""

    def __init__(self, send_depth: int) -> None:
        self.send_depth = send_depth
        self.posted: collections.deque[int] = collections.deque()
        self.in_flight: list[tuple[int, bytes]] = []
        self.side: Side
        self.peer: FakeLane
        self.broken = False
        self.staged: list[tuple[int, bytes]] | None = None
        """Sends held for one chain, between hold() and flush()."""
        self.chains: list[int] = []
        """How many sends each flush() posted."""
        self.refuse_after: int | None = None
        """flush() refuses the sends after this many (an errno, as a provider might)."""
        self.unposted: list[int] = []

    def send(self, slot: int, length: int) -> None:
        if self.broken:
            raise RdmaError("the fake queue pair is broken")
        assert self.send_room(), "posted past the send queue's room"
        size = self.side.size
        packet = (slot, bytes(self.side.send[slot * size : slot * size + length]))
        (self.in_flight if self.staged is None else self.staged).append(packet)

    def hold(self) -> None:
        assert self.staged is None, "hold() nested"
        self.staged = []

    def flush(self) -> int:
        assert self.staged is not None, "flush() without hold()"
        staged, self.staged = self.staged, None
        posted = len(staged) if self.refuse_after is None else min(self.refuse_after, len(staged))
        if staged:
            self.chains.append(posted)
        self.in_flight += staged[:posted]
        self.unposted = [slot for slot, _ in staged[posted:]]
        return errno.ENOMEM if self.unposted else 0

    def recv(self, slot: int) -> None:
        assert slot not in self.posted, f"receive slot {slot} posted twice"
        self.posted.append(slot)

    def send_room(self) -> bool:
        return len(self.in_flight) + len(self.staged or ()) < self.send_depth

    def deliver(self) -> int:
        """Land every packet in flight at the peer, in order; how many went."""
        went = self.in_flight
        self.in_flight = []
        peer = self.peer.side
        for slot, data in went:
            assert self.peer.posted, "a packet met an empty receive queue"
            landing = self.peer.posted.popleft()
            start = landing * peer.size
            peer.recv[start : start + len(data)] = data
            peer.packets.arrived(landing, len(data))
            self.side.packets.sent(slot)
        return len(went)


class Side:
    """One channel side's packet core, its slots, lane and what it reported."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, *, window: int = 4, control: int = 4,
        size: int = 256, send_slots: int = 8, send_depth: int = 8, refuse_hello: bool = False,
    ) -> None:  # fmt: skip
        self.size = size
        self.refuse_hello = refuse_hello
        self.send = bytearray(send_slots * size)
        self.recv = bytearray((window + control) * size)
        self.events: list[tuple[Event, object]] = []
        self.stats = Stats("channel")
        self.packets = Packets(
            self.report, window, control, send_slots, None, memoryview(self.send),
            memoryview(self.recv), size, MAX_MESSAGE, self.stats, None, loop,
        )  # fmt: skip
        self.lane = FakeLane(send_depth)
        self.lane.side = self
        self.packets.attach(self.lane)
        self.packets.post_receives()

    def report(self, event: Event, value: object) -> None:
        self.events.append((event, value))
        if event in (Event.FAILED, Event.BROKEN) or (event == Event.HEARD and self.refuse_hello):
            self.packets.fail()

    def reported(self, event: Event) -> list[object]:
        return [value for kind, value in self.events if kind == event]


def _pair(
    loop: asyncio.AbstractEventLoop, b_size: int | None = None, **sizes: int
) -> tuple[Side, Side]:
    """Two sides of ``sizes`` (b's buffers of ``b_size`` if given) whose HELLOs went and landed."""
    a = Side(loop, **sizes)  # type: ignore[arg-type]
    b = Side(loop, **{**sizes, "size": b_size or sizes.get("size", 256)})  # type: ignore[arg-type]
    a.lane.peer, b.lane.peer = b.lane, a.lane
    for side in (a, b):
        assert side.packets.send_hello(MAX_MESSAGE, Hello(side.size, "").pack())
    _flush(a, b)
    return a, b


def _settled(side: Side) -> None:
    """Nothing is lost: every receive slot is posted again, every send slot free."""
    assert sorted(side.lane.posted) == list(range(len(side.recv) // side.size))
    assert len(side.packets.state.free_slots) == len(side.send) // side.size


def _flush(*sides: Side) -> None:
    """Deliver until nothing is in flight on any side."""
    while sum(side.lane.deliver() for side in sides):
        pass


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _receive_all(side: Side) -> list[bytes]:
    got = []
    while (body := side.packets.take_eager(None)) is not None:
        assert isinstance(body, bytes)
        got.append(body)
    return got


def test_hello_fits_each_side_to_the_smaller_buffers_and_announces_the_limit(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = _pair(loop, size=512, b_size=256)
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
    a, b = _pair(loop, window=4)
    sent, got = 0, []
    for _ in range(30):
        while a.packets.send_eager(b"", b"m%03d" % sent, 4):
            sent += 1
        assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"x") == NO_CREDIT
        _flush(a, b)
        got += _receive_all(b)
        _flush(a, b)  # the credit update
    assert sent > 30 * 3  # the credits came back every round
    assert got == [b"m%03d" % i for i in range(sent)]
    _settled(a)
    _settled(b)
    assert a.reported(Event.FAILED) == b.reported(Event.BROKEN) == []
    # No data went a's way to carry b's credits: each round's came in a packet
    # of its own, and each side counts what the other sent.
    assert b.stats.counters["credit_updates_sent"] >= 30
    assert a.stats.counters["credit_updates_received"] == b.stats.counters["credit_updates_sent"]
    assert b.stats.counters["credit_updates_received"] == a.stats.counters["credit_updates_sent"]


def test_a_message_goes_into_the_callers_buffer(loop: asyncio.AbstractEventLoop) -> None:
    a, b = _pair(loop)
    assert a.packets.send_eager(b"hd", b"payload", 7)
    _flush(a, b)
    arrival = b.packets.first()
    assert arrival is not None
    assert b.packets.head(arrival) == b"hd"
    assert b.packets.take_eager(bytearray(3)) is None  # too short: left queued
    into = bytearray(10)
    assert b.packets.take_eager(into) == 7
    assert into[:7] == b"payload"
    assert b.packets.first() is None


def test_a_full_send_queue_holds_a_packet_and_a_credit_update_waits_for_room(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = _pair(loop, window=4, send_depth=2)
    assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"1") == POSTED
    assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"2") == POSTED
    assert a.packets.try_send(Kind.EAGER, 0, 1, None, b"", b"3") == NO_ROOM
    assert not a.packets.send_eager(b"", b"3", 1)
    _flush(a, b)
    b.lane.in_flight = [(0, b"")] * 2  # b's send queue is full (nothing real in it)
    assert _receive_all(b) == [b"1", b"2"]
    assert b.reported(Event.WAIT_ROOM) == [None]  # half the window is owed
    assert b.packets.room_pending
    b.lane.in_flight = []
    b.packets.room_came()
    assert not b.packets.room_pending
    assert [header_kind(data) for _, data in b.lane.in_flight] == [Kind.CREDIT]


def header_kind(packet: bytes) -> Kind:
    return Header.unpack(packet, MAX_MESSAGE).kind


def _send_medium(side: Side, body: bytes) -> int:
    """What :func:`aiordma.channel.medium.send_medium` does while credit
    lasts: the MEDIUM packet, then PIECEs; returns how far it got."""
    offset = side.packets.send_medium(b"h", memoryview(body), len(body))
    assert offset >= side.packets.eager_limit - 1  # at least its first packet went
    return offset


def test_a_medium_message_larger_than_the_window_flows_piece_by_piece(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Ten packets' worth through a window of four: each piece taken gives
    its buffer back at once, so the rest can come."""
    a, b = _pair(loop, window=4)
    body = bytes(range(256)) * 8
    offset = _send_medium(a, body)
    assert offset < len(body)  # the window stopped it
    _flush(a, b)
    arrival = b.packets.first()
    assert arrival is not None
    assert arrival.header.kind == Kind.MEDIUM
    target = memoryview(bytearray(len(body)))
    head, filled = b.packets.begin_medium(arrival, target)
    assert head == b"h"
    for _ in range(50):
        filled = b.packets.take_pieces(arrival, target, filled)
        _flush(a, b)  # credits back to a
        offset = a.packets.send_pieces(memoryview(body), offset, len(body))
        _flush(a, b)
        if filled == len(body):
            break
    assert filled == len(body)
    assert bytes(target) == body
    b.packets.consumed()
    assert b.packets.first() is None
    _flush(a, b)
    _settled(a)
    _settled(b)


def test_a_cancelled_medium_receive_keeps_what_it_copied(loop: asyncio.AbstractEventLoop) -> None:
    a, b = _pair(loop, window=8)
    body = b"abcdefgh" * 100
    assert _send_medium(a, body) == len(body)
    _flush(a, b)
    arrival = b.packets.first()
    assert arrival is not None
    target = memoryview(bytearray(len(body)))
    head, filled = b.packets.begin_medium(arrival, target)
    b.packets.keep_taken(arrival, head, target, filled)  # cancelled here
    again = memoryview(bytearray(len(body)))
    head, resumed = b.packets.begin_medium(arrival, again)
    assert (head, resumed) == (b"h", filled)
    assert b.packets.take_pieces(arrival, again, resumed) == len(body)
    assert bytes(again) == body


def _medium_begun(a: Side, b: Side, body: bytes) -> tuple[int, Arrival, memoryview, int]:
    """``a`` sends ``body`` as a MEDIUM message as far as credit lets it, and
    ``b`` takes what landed: how far ``a`` sent, the arrival, ``b``'s target
    and how far it is filled."""
    offset = a.packets.send_medium(b"h", memoryview(body), len(body))
    _flush(a, b)
    arrival = b.packets.first()
    assert arrival is not None
    target = memoryview(bytearray(len(body)))
    _, filled = b.packets.begin_medium(arrival, target)
    return offset, arrival, target, b.packets.take_pieces(arrival, target, filled)


def test_a_medium_message_goes_as_one_chain_as_far_as_credit_lets_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Its first packet and the PIECEs that can go at once are posted as one
    chain; what credit later lets go goes as another."""
    a, b = _pair(loop, window=4, send_slots=8)
    body = bytes(range(256)) * 8  # 9 packets
    offset, *_ = _medium_begun(a, b, body)
    assert a.lane.chains == [4]  # the MEDIUM and 3 PIECEs: the window's 4 credits
    _flush(a, b)  # the credits back
    offset = a.packets.send_pieces(memoryview(body), offset, len(body))
    assert a.lane.chains == [4, 4]


def test_small_messages_go_as_one_chain_while_credit_lasts(loop: asyncio.AbstractEventLoop) -> None:
    a, b = _pair(loop, window=4, send_slots=8)
    bodies = [bytes([i]) * (150 + i) for i in range(6)]  # no two share a packet (BATCH)
    sizes = [len(body) for body in bodies]
    assert a.packets.send_eagers(bodies, sizes, 0, False) == 4  # the window's 4 credits
    assert a.lane.chains == [4]
    a.packets.turn(True, 1)  # another send waits for the turn: nothing jumps it...
    assert a.packets.send_eagers(bodies, sizes, 4, False) == 4
    _flush(a, b)
    for i in range(4):
        assert b.packets.take_eager(None) == bodies[i]
    _flush(a, b)  # the credits back
    assert a.packets.send_eagers(bodies, sizes, 4, True) == 6  # ...unless it holds the turn
    assert a.lane.chains == [4, 2]
    assert a.stats.counters["messages_sent"] == 6


def test_small_messages_that_fit_together_go_as_one_batch_packet(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Neighbours that fit one packet share it (one credit, one work
    request); each arrives as a message of its own, in order, counted once
    on each side, and the buffer goes back once the last is taken."""
    a, b = _pair(loop, window=4, send_slots=8)
    room = 256 - HEADER_SIZE
    bodies = [b"", b"x", b"yy" * 20, b"z" * (room - 3 * ENTRY_SIZE - 41 - 150), b"w" * 150]
    sizes = [len(body) for body in bodies]
    assert a.packets.send_eagers(bodies, sizes, 0, False) == 5
    assert a.lane.chains == [2]  # four fill one packet exactly; the fifth goes alone
    assert a.packets.state.data.available == 2
    _flush(a, b)
    assert b.packets.queued() == 5
    posted = len(b.lane.posted)
    assert [b.packets.take_eager(None) for _ in range(3)] == bodies[:3]
    assert len(b.lane.posted) == posted  # the batch's buffer is held for its last message
    assert _receive_all(b) == bodies[3:]
    _flush(a, b)
    _settled(a)
    _settled(b)
    assert a.stats.counters["messages_sent"] == b.stats.counters["messages_received"] == 5
    assert a.stats.counters["bytes_sent"] == b.stats.counters["bytes_received"] == sum(sizes)


def test_a_batch_holds_its_credit_until_its_last_message_is_taken(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A reader that falls behind still holds its sender back: a batch's
    messages are copied out at once, but its credit comes back with the last."""
    a, b = _pair(loop, window=2, send_slots=8)
    bodies = [b"m%02d" % i for i in range(57)]  # 19 fit one 256-byte packet
    sizes = [len(body) for body in bodies]
    assert (256 - HEADER_SIZE) // (ENTRY_SIZE + 3) == 19
    sent = a.packets.send_eagers(bodies, sizes, 0, False)
    assert sent == 38  # two batches: the window
    _flush(a, b)
    got = [b.packets.take_eager(None) for _ in range(37)]  # all but the second's last
    _flush(a, b)
    assert a.packets.send_eagers(bodies, sizes, sent, False) == 57  # the first's credit
    assert a.packets.send_eagers(bodies, sizes, 0, False) == 0  # the window spent again
    _flush(a, b)
    got += _receive_all(b)
    assert got == bodies
    _flush(a, b)
    _settled(a)
    _settled(b)


def test_queued_small_messages_are_taken_together_up_to_a_limit_or_a_larger_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """``take_eagers``: the small messages at the head of the queue, in
    order, at most ``limit``, stopping before a MEDIUM one, a receive
    ahead or none; each counted and its buffer handled as one taken alone."""
    a, b = _pair(loop, window=8, send_slots=8)
    bodies = [b"s%d" % i for i in range(5)]
    assert a.packets.send_eagers(bodies, [2] * 5, 0, False) == 5
    _send_medium(a, b"M" * 600)
    assert a.packets.send_eagers([b"after"], [5], 0, False) == 1
    _flush(a, b)
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
    _flush(a, b)
    _settled(a)
    _settled(b)


def test_the_hook_is_offered_each_message_of_a_batch_in_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Those it takes never reach a receive; from the first it refuses on,
    the rest are queued in order."""
    a, b = _pair(loop)
    offered: list[bytes] = []

    def hook(head: bytes, body: memoryview) -> bool:
        offered.append(bytes(body))
        return not offered[-1].startswith(b"q")

    b.packets.deliver_to(hook)
    receiving = b.packets.arrivals()
    bodies = [b"a1", b"a2", b"a3"]
    assert a.packets.send_eagers(bodies, [2, 2, 2], 0, False) == 3
    _flush(a, b)
    assert offered == bodies
    assert not receiving.done()
    assert b.packets.first() is None
    bodies = [b"b1", b"q2", b"b3"]
    assert a.packets.send_eagers(bodies, [2, 2, 2], 0, False) == 3
    _flush(a, b)
    assert offered[3:] == [b"b1", b"q2"]
    assert receiving.done()
    assert _receive_all(b) == [b"q2", b"b3"]
    _flush(a, b)
    _settled(a)
    _settled(b)
    assert b.stats.counters["messages_received"] == 6


def test_a_failed_side_keeps_the_messages_of_a_batch(loop: asyncio.AbstractEventLoop) -> None:
    a, b = _pair(loop)
    bodies = [b"one", b"two", b"three"]
    assert a.packets.send_eagers(bodies, [3, 3, 5], 0, False) == 3
    _flush(a, b)
    assert b.packets.take_eager(None) == b"one"
    b.packets.fail()
    kept = []
    while (arrival := b.packets.first()) is not None:
        kept.append(b.packets.small_body(arrival, None))
        b.packets.consumed()
    assert kept == [b"two", b"three"]


def test_a_medium_message_waits_when_its_first_packet_cannot_go(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, _ = _pair(loop, window=4, send_slots=8)
    for n in range(4):  # spend the window
        assert a.packets.send_eager(b"", b"x", 1), n
    assert a.packets.send_medium(b"h", memoryview(b"m" * 600), 600) == 0
    assert a.lane.staged is None  # the hold ended; nothing staged or posted
    assert len(a.lane.in_flight) == 4


def test_a_chain_the_provider_refuses_in_part_fails_the_channel(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The slots of what did not go are free again, the rest went, and the
    channel fails with the provider's errno (the credits are spent)."""
    a, _ = _pair(loop, window=8, send_slots=8)
    a.lane.refuse_after = 2
    free = len(a.packets.state.free_slots)
    with pytest.raises(DeviceError) as caught:
        a.packets.send_medium(b"h", memoryview(b"m" * 1200), 1200)  # 5 packets
    assert caught.value.errno == errno.ENOMEM
    assert [kind for kind, _ in a.events if kind == Event.FAILED] == [Event.FAILED]
    assert len(a.lane.in_flight) == 2
    # 5 slots taken, 3 given back: the 2 that went stay busy until their completions.
    assert len(a.packets.state.free_slots) == free - 2


def test_pieces_that_land_while_filling_are_copied_and_wake_the_task_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """While a receive fills a MEDIUM message, its pieces are copied as they
    land (their buffers posted again at once) and its task is woken only
    when the body is whole; a sender waiting for credits is woken as before."""
    a, b = _pair(loop, window=4, send_slots=8)
    body = bytes(range(256)) * 8
    offset, arrival, target, filled = _medium_begun(a, b, body)
    b.packets.fill(arrival, target, filled)
    receiving = b.packets.arrivals()
    changed = b.packets.changed()
    _flush(a, b)  # credits back to a
    for _ in range(10):
        offset = a.packets.send_pieces(memoryview(body), offset, len(body))
        _flush(a, b)  # they land and are copied
        if offset == len(body):
            break
        assert not receiving.done()  # not woken for a piece
    assert changed.done()  # woken by the credits its copies gave back
    assert receiving.done()  # whole
    assert b.packets.filled() == len(body)
    assert bytes(target) == body
    b.packets.consumed()
    _flush(a, b)
    _settled(a)
    _settled(b)


def test_a_failed_side_keeps_what_arrived_whole(loop: asyncio.AbstractEventLoop) -> None:
    """Small messages and whole MEDIUM ones stay readable after a failure,
    as TCP keeps what it received; one still missing pieces does not."""
    a, b = _pair(loop, window=16, send_slots=16)
    assert a.packets.send_eager(b"", b"first", 5)
    whole = b"w" * 600
    assert _send_medium(a, whole) == len(whole)
    assert a.packets.send_eager(b"k", b"second", 6)
    _flush(a, b)
    partial = b"p" * 2000
    _send_medium(a, partial)
    a.lane.in_flight.pop()  # its last piece never comes
    _flush(a, b)
    b.packets.fail()
    assert b.packets.failed
    bodies = []
    while (arrival := b.packets.first()) is not None:
        head = b.packets.head(arrival)
        bodies.append((head, b.packets.small_body(arrival, None)))
        b.packets.consumed()
    assert bodies == [(b"", b"first"), (b"h", whole), (b"k", b"second")]
    assert b.packets.queued() == 1  # the message missing a piece is not readable
    assert a.packets.send_eager(b"", b"late", 4)
    _flush(a, b)
    assert b.packets.queued() == 1  # nothing is read after the failure


def _announced(a: Side, b: Side, msg_id: int, head: bytes) -> Arrival:
    """``a`` announces a large message (RENDEZVOUS); it arrives at ``b``,
    which starts reading it."""
    remote = RemoteBuffer(0x1000, 5000, 7)
    assert a.packets.try_send(Kind.RENDEZVOUS, msg_id, 5000, remote, head, None) == POSTED
    _flush(a, b)
    arrival = b.packets.first()
    assert arrival is not None
    assert (arrival.header.remote, b.packets.head(arrival)) == (remote, head)
    b.packets.read_started(arrival)
    return arrival


def test_a_large_message_taken_owes_its_sender_a_done_that_ends_its_exposure(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = _pair(loop)
    _announced(a, b, 9, b"hd")
    b.packets.consumed()
    assert b.reported(Event.DONE_DUE) == [9]
    assert b.packets.try_send(Kind.DONE, 9, 0, None, b"", None) == POSTED
    _flush(a, b)
    assert a.reported(Event.ENDED) == [9]


def test_a_revoke_during_a_read_is_answered_once_the_read_stops(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = _pair(loop)
    arrival = _announced(a, b, 3, b"")
    assert a.packets.try_send(Kind.REVOKE, 3, 0, None, b"", None) == POSTED
    _flush(a, b)
    assert b.packets.acks() == []  # reading: not answered yet
    b.packets.read_stopped(arrival)
    assert b.packets.acks() == [3]
    assert arrival.revoked


def test_a_malformed_packet_is_reported_as_broken(loop: asyncio.AbstractEventLoop) -> None:
    _, b = _pair(loop)
    slot = b.lane.posted.popleft()  # a packet lands there: garbage
    b.recv[slot * b.size : slot * b.size + HEADER_SIZE] = b"\xff" * HEADER_SIZE
    b.packets.arrived(slot, HEADER_SIZE)
    (error,) = b.reported(Event.BROKEN)
    assert isinstance(error, ProtocolError)
    assert b.packets.failed


def test_a_failed_post_fails_the_side_and_frees_its_slot(loop: asyncio.AbstractEventLoop) -> None:
    a, _ = _pair(loop)
    a.lane.broken = True
    free = len(a.packets.state.free_slots)
    with pytest.raises(RdmaError):
        a.packets.send_eager(b"", b"x", 1)
    assert len(a.packets.state.free_slots) == free
    (error,) = a.reported(Event.FAILED)
    assert isinstance(error, RdmaError)
    assert a.packets.failed
    assert not a.packets.send_eager(b"", b"x", 1)


def test_a_hello_the_shell_refuses_is_not_applied(loop: asyncio.AbstractEventLoop) -> None:
    """A peer speaking another protocol: the shell fails the side when told
    of its HELLO, and the HELLO's limit and grants are never taken in."""
    a, b = Side(loop), Side(loop, refuse_hello=True)
    a.lane.peer, b.lane.peer = b.lane, a.lane
    assert a.packets.send_hello(MAX_MESSAGE, Hello(a.size, "other").pack())
    _flush(a, b)
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
    a, b = _pair(loop)
    taken: list[bytes] = []

    def hook(head: bytes, body: memoryview) -> bool:
        taken.append(bytes(body))
        return not taken[-1].startswith(b"q")  # "queue me" is refused

    b.packets.deliver_to(hook)
    receiving, changed = b.packets.arrivals(), b.packets.changed()
    assert a.packets.send_eager(b"", b"take me", 7)
    _flush(a, b)
    assert taken[-1] == b"take me"
    assert not receiving.done()
    assert changed.done()
    assert b.packets.first() is None
    assert a.packets.send_eager(b"", b"queue me", 8)
    _flush(a, b)
    assert receiving.done()  # refused by the hook: queued for a receive
    assert _receive_all(b) == [b"queue me"]
    _flush(a, b)
    _settled(a)
    _settled(b)


def test_a_whole_medium_message_is_taken_in_one_call(loop: asyncio.AbstractEventLoop) -> None:
    """``take_medium``: every piece in, nobody ahead, a buffer that holds it:
    copied whole and every buffer given back, with no turn; otherwise -1,
    changing nothing, for the slow path."""
    a, b = _pair(loop, window=8)
    body = b"abcdefgh" * 100
    offset = _send_medium(a, body)
    assert offset == len(body)
    _flush(a, b)
    arrival = b.packets.first()
    assert arrival is not None
    assert arrival.header.kind == Kind.MEDIUM
    assert b.packets.take_medium(bytearray(len(body) - 1)) == -1  # too short: the slow path says so
    assert b.packets.take_medium(b"x" * len(body)) == -1  # not a buffer it takes
    b.packets.turn(False, 1)  # a receive ahead holds the turn
    assert b.packets.take_medium(bytearray(len(body))) == -1
    b.packets.turn(False, -1)
    assert b.packets.first() is arrival  # nothing taken
    into = memoryview(bytearray(len(body) + 10))
    assert b.packets.take_medium(into) == len(body)
    assert bytes(into[: len(body)]) == body
    assert b.packets.first() is None
    assert b.stats.counters["messages_received"] == 1
    _flush(a, b)
    _settled(a)
    _settled(b)


def test_a_medium_message_still_arriving_is_left_to_the_slow_path(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = _pair(loop, window=4)
    body = bytes(range(256)) * 8
    offset = _send_medium(a, body)
    assert offset < len(body)  # the window stopped it: pieces still to come
    _flush(a, b)
    assert b.packets.take_medium(bytearray(len(body))) == -1
    arrival = b.packets.first()
    assert arrival is not None
    assert arrival.missing > 0
