"""Fixtures and fakes the channel tests share.

:class:`Side` is one channel side's packet core over a :class:`FakeLane`, on
plain bytearrays: a fake lane delivers a posted send into the peer's oldest
posted receive slot when the test says so, as the adapter would (in order,
each completion once), and fails the test if a packet meets an empty
receive queue. Tests on them run on whichever path is active (compiled in
the one-host suite, interpreted in the pure-path set).
"""

from __future__ import annotations

import asyncio
import collections
import errno
from collections.abc import Iterator

import pytest

from aiordma.channel.inbox import Arrival
from aiordma.channel.outbox import Outbox
from aiordma.channel.packets import Event, Packets
from aiordma.channel.wire import Header, Hello, Kind
from aiordma.exceptions import RdmaError
from aiordma.metrics import Stats
from tests.conftest import Lab, start_peer_server

MAX_MESSAGE = 1 << 20


@pytest.fixture(scope="module")
def checksum_server(lab: Lab) -> Iterator[int]:
    """The port of a peer process that answers each message with its checksum."""
    yield from start_peer_server(lab, "checksums")


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
        self.outbox = Outbox(self.packets, self.stats)
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


def pair(
    loop: asyncio.AbstractEventLoop, b_size: int | None = None, **sizes: int
) -> tuple[Side, Side]:
    """Two sides of ``sizes`` (b's buffers of ``b_size`` if given) whose HELLOs went and landed."""
    a = Side(loop, **sizes)  # type: ignore[arg-type]
    b = Side(loop, **{**sizes, "size": b_size or sizes.get("size", 256)})  # type: ignore[arg-type]
    a.lane.peer, b.lane.peer = b.lane, a.lane
    for side in (a, b):
        assert side.packets.send_hello(MAX_MESSAGE, Hello(side.size, "").pack())
    flush(a, b)
    return a, b


def settled(side: Side) -> None:
    """Nothing is lost: every receive slot is posted again, every send slot free."""
    assert sorted(side.lane.posted) == list(range(len(side.recv) // side.size))
    assert len(side.packets.state.free_slots) == len(side.send) // side.size


def flush(*sides: Side) -> None:
    """Deliver until nothing is in flight on any side."""
    while sum(side.lane.deliver() for side in sides):
        pass


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def header_kind(packet: bytes) -> Kind:
    return Header.unpack(packet, MAX_MESSAGE).kind


def send_medium(side: Side, body: bytes) -> int:
    """What :func:`aiordma.channel.medium.send_medium` does while credit
    lasts: the MEDIUM packet, then PIECEs; returns how far it got."""
    offset = side.outbox.send_medium(b"h", memoryview(body), len(body))
    assert offset >= side.packets.eager_limit - 1  # at least its first packet went
    return offset


def medium_begun(a: Side, b: Side, body: bytes) -> tuple[int, Arrival, memoryview, int]:
    """``a`` sends ``body`` as a MEDIUM message as far as credit lets it, and
    ``b`` takes what landed: how far ``a`` sent, the arrival, ``b``'s target
    and how far it is filled."""
    offset = a.outbox.send_medium(b"h", memoryview(body), len(body))
    flush(a, b)
    arrival = b.packets.inbox.first()
    assert arrival is not None
    target = memoryview(bytearray(len(body)))
    _, filled = b.packets.begin_medium(arrival, target)
    return offset, arrival, target, b.packets.take_pieces(arrival, target, filled)


def receive_all(side: Side) -> list[bytes]:
    got = []
    while (body := side.packets.take_eager(None)) is not None:
        assert isinstance(body, bytes)
        got.append(body)
    return got
