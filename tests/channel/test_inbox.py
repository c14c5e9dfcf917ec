"""A channel's queued messages (no device): their phases, revocations, reads
ahead, MEDIUM reassembly and BATCH splitting, and, with the channel's
credits, two sides that exchange everything in order."""

from __future__ import annotations

import random

import pytest

from aiordma.channel.inbox import TRANSITIONS, Arrival, Inbox, Owed, Phase, Step
from aiordma.channel.state import ChannelState
from aiordma.channel.wire import HEADER_SIZE, Header, Kind, pack_batch
from aiordma.exceptions import ProtocolError
from aiordma.verbs.memory import RemoteBuffer

SIZE = 256


def _inbox(buffers: int = 12) -> Inbox:
    return Inbox(memoryview(bytearray(buffers * SIZE)), SIZE, 1 << 20)


def _queue(inbox: Inbox, slot: int, header: Header, size: int = 40) -> int:
    """A message's packet arrives; how many messages may be offered to a delivery hook."""
    return inbox.arrived(slot, header, size)


def _rendezvous(msg_id: int, length: int = 100) -> Header:
    return Header(Kind.RENDEZVOUS, 0, msg_id, length, RemoteBuffer(0x1000, length, 7))


def _ids(arrivals: list[Arrival]) -> list[int]:
    return [a.header.msg_id for a in arrivals]


def test_every_phase_but_taken_can_be_left_and_nothing_leaves_taken() -> None:
    """The table has no dead end but the last, and each step it lacks raises."""
    left = {phase for phase, _ in TRANSITIONS}
    assert left == set(Phase) - {Phase.TAKEN}
    inbox = _inbox()
    _queue(inbox, 0, _rendezvous(5))
    arrival, owed = inbox.take()
    assert (arrival.phase, owed) == (Phase.TAKEN, Owed.DONE)
    for step in Step:
        with pytest.raises(RuntimeError, match=f"cannot take the step {step.name}"):
            inbox.step(arrival, step)
    assert arrival.phase == Phase.TAKEN  # a refused step changes nothing


def test_a_revoke_of_a_message_not_being_read_is_answered_at_once() -> None:
    inbox = _inbox()
    assert not _queue(inbox, 0, _rendezvous(5))  # a large message is never offered
    assert not _queue(inbox, 1, _rendezvous(6))
    inbox.revoke(5)
    assert inbox.acks_due == [5]
    inbox.revoke(99)  # already taken: its DONE crossed the REVOKE
    assert inbox.acks_due == [5]
    arrival, owed = inbox.take()
    assert (arrival.header.msg_id, owed) == (5, Owed.DROPPED)  # answered: no DONE
    arrival, owed = inbox.take()
    assert (arrival.header.msg_id, owed) == (6, Owed.DONE)
    assert inbox.acks() == [5]
    assert inbox.acks_due == []


def test_a_revoke_during_a_read_is_answered_when_the_read_ends() -> None:
    inbox = _inbox()
    _queue(inbox, 0, _rendezvous(5))
    _queue(inbox, 1, _rendezvous(6))
    inbox.read_started(inbox.ready[0])
    inbox.revoke(5)
    assert inbox.acks_due == []  # its bytes are being read: no answer yet
    assert inbox.withdrawn(inbox.ready[0])
    _, owed = inbox.take()  # the read finished: its DONE answers
    assert owed == Owed.DONE
    inbox.read_started(inbox.ready[0])
    inbox.revoke(6)
    inbox.read_stopped(inbox.ready[0])  # the read was cancelled
    assert inbox.acks_due == [6]
    _, owed = inbox.take()
    assert owed == Owed.DROPPED


def test_a_message_read_ahead_owes_its_done_when_it_lands_and_none_when_taken() -> None:
    inbox = _inbox()
    _queue(inbox, 0, _rendezvous(5, 1000))
    _queue(inbox, 1, Header(Kind.EAGER, 0, 0, 10), 50)
    _queue(inbox, 2, _rendezvous(6, 100))
    _queue(inbox, 3, _rendezvous(7, 1000))
    _queue(inbox, 4, _rendezvous(8, 1000))
    assert _ids(inbox.unread(100)) == [5, 7, 8]  # 6 is too small
    inbox.read_started(inbox.ready[0])  # 5: its receive reads it
    seventh = inbox.ready[3]
    inbox.read_ahead(seventh, bytearray(1000))  # 7: read ahead
    assert inbox.ahead is seventh
    inbox.revoke(8)
    assert _ids(inbox.unread(0)) == [6]  # 8 was withdrawn
    assert inbox.acks_due == [8]
    inbox.revoke(7)
    assert inbox.acks_due == [8]  # 7 is being read: answered when it lands
    assert inbox.read_landed(seventh)  # landed: its DONE is due now, once
    assert seventh.phase == Phase.REVOKED
    with pytest.raises(RuntimeError, match="LAND"):
        inbox.read_landed(seventh)
    _queue(inbox, 5, _rendezvous(9, 1000))
    ninth = inbox.ready[5]
    inbox.read_ahead(ninth, bytearray(1000))  # 9: read ahead, landed, then a REVOKE
    assert inbox.read_landed(ninth)  # that crossed its DONE
    assert ninth.phase == Phase.LANDED
    inbox.revoke(9)
    assert inbox.withdrawn(ninth)  # not to be delivered: its sender gave up on it
    assert inbox.acks_due == [8]  # the DONE that went answers it: no second one
    inbox.read_stopped(inbox.ready[0])  # 5: its receive was cancelled
    assert _ids(inbox.unread(0)) == [5, 6]  # 7 was read
    for expected in (5, 0, 6):
        arrival, _ = inbox.take()
        assert arrival.header.msg_id == expected
    arrival, owed = inbox.take()
    assert (arrival.header.msg_id, owed) == (7, Owed.DROPPED)  # its DONE went when it landed
    arrival, owed = inbox.take()
    assert (arrival.header.msg_id, owed) == (8, Owed.DROPPED)  # answered when revoked
    assert inbox.ahead is ninth
    arrival, owed = inbox.take()
    assert (arrival.header.msg_id, owed) == (9, Owed.DROPPED)
    assert inbox.ahead is None  # taken, the message read ahead is forgotten


def test_a_landed_message_owes_nothing_when_taken_and_a_stopped_read_can_start_again() -> None:
    inbox = _inbox()
    _queue(inbox, 0, _rendezvous(5, 1000))
    first = inbox.ready[0]
    landed = bytearray(1000)
    inbox.read_ahead(first, landed)
    inbox.read_stopped(first)  # failed: read in its turn, as if never read ahead
    assert (first.phase, first.landed) == (Phase.ANNOUNCED, None)
    inbox.read_ahead(first, landed)
    assert inbox.read_landed(first)
    assert first.landed is landed
    arrival, owed = inbox.take()
    assert (arrival, owed, arrival.landed) == (first, Owed.NOTHING, None)
    assert inbox.freed == [0]


def test_eager_messages_need_no_done_and_the_first_in_line_is_offered() -> None:
    inbox = _inbox()
    assert _queue(inbox, 3, Header(Kind.EAGER, 0, 0, 10), 50) == 1
    assert _queue(inbox, 4, Header(Kind.EAGER, 0, 0, 10), 50) == 0  # one is ahead of it
    arrival, owed = inbox.take()
    assert (arrival.size, owed) == (50, Owed.NOTHING)
    assert inbox.freed == [3]  # its buffer, for the wire to repost


def test_a_batch_is_split_and_its_last_message_holds_the_buffer() -> None:
    inbox = _inbox()
    bodies = [b"one", b"two", b"three"]
    sizes = [len(b) for b in bodies]
    payload = pack_batch(bodies, sizes, sum(sizes) + 8 * len(bodies))
    inbox.view[2 * SIZE + HEADER_SIZE : 2 * SIZE + HEADER_SIZE + len(payload)] = payload
    header = Header(Kind.BATCH, 0, len(bodies), len(payload))
    assert _queue(inbox, 2, header, HEADER_SIZE + len(payload)) == 3  # all offered
    assert [a.phase for a in inbox.ready] == [Phase.COPIED] * 3
    assert [a.slot for a in inbox.ready] == [-1, -1, 2]
    assert [inbox.small_body(a, None) for a in inbox.ready] == bodies
    for _ in bodies:
        inbox.take()
    assert inbox.freed == [2]
    assert _queue(inbox, 3, Header(Kind.EAGER, 0, 0, 10), 50) == 1
    assert _queue(inbox, 2, header, HEADER_SIZE + len(payload)) == 0  # one is ahead


def _medium(inbox: Inbox, slot: int, length: int, first: int, head: int = 0) -> None:
    """The first packet of a medium message of ``length`` body bytes lands,
    carrying ``head`` head bytes and ``first`` body bytes."""
    header = Header(Kind.MEDIUM, 0, 0, length, head_length=head)
    assert not _queue(inbox, slot, header, HEADER_SIZE + head + first)  # never offered


def test_a_medium_message_collects_its_pieces_until_whole() -> None:
    inbox = _inbox()
    _medium(inbox, 3, 100, 40, head=5)
    arrival = inbox.ready[0]
    assert arrival.pieces is not None
    assert (arrival.slot, arrival.missing, list(arrival.pieces)) == (3, 60, [])
    assert inbox.filling is arrival
    assert not _queue(inbox, 5, Header(Kind.PIECE, 0, 0, 50), HEADER_SIZE + 50)
    assert not _queue(inbox, 1, Header(Kind.PIECE, 0, 0, 10), HEADER_SIZE + 10)
    assert (arrival.missing, list(arrival.pieces)) == (0, [(5, 50), (1, 10)])
    assert inbox.filling is None
    # The receiver frees each buffer as it copies it out, before the message is whole.
    target = memoryview(bytearray(100))
    head, offset = inbox.begin_medium(arrival, target)
    assert (len(head), offset, arrival.phase, inbox.freed) == (5, 40, Phase.TAKING, [3])
    assert inbox.copy_pieces(arrival, target, offset) == 100
    assert inbox.freed == [3, 5, 1]
    taken, owed = inbox.take()
    assert (taken, owed) == (arrival, Owed.NOTHING)
    assert inbox.freed == [3, 5, 1]  # take() freed nothing twice
    assert not inbox.ready
    assert _queue(inbox, 2, Header(Kind.EAGER, 0, 0, 5)) == 1  # the next is offered as usual


def test_a_cancelled_medium_receive_is_kept_and_resumed() -> None:
    inbox = _inbox()
    _medium(inbox, 0, 100, 40)
    arrival = inbox.ready[0]
    target = memoryview(bytearray(100))
    head, offset = inbox.begin_medium(arrival, target)
    with pytest.raises(RuntimeError, match="BEGIN"):  # one receive at a time
        inbox.begin_medium(arrival, target)
    inbox.keep(arrival, head, target, offset)
    assert (arrival.phase, arrival.copied) == (Phase.KEPT, bytes(40))
    assert inbox.begin_medium(arrival, memoryview(bytearray(100))) == (b"", 40)
    assert (arrival.phase, arrival.copied) == (Phase.TAKING, None)


def test_pieces_out_of_place_are_protocol_errors() -> None:
    inbox = _inbox()
    with pytest.raises(ProtocolError, match="no medium message"):
        _queue(inbox, 0, Header(Kind.PIECE, 0, 0, 10), HEADER_SIZE + 10)
    inbox = _inbox()
    _medium(inbox, 0, 100, 40)
    with pytest.raises(ProtocolError, match="of 61 bytes where 60 are missing"):
        _queue(inbox, 1, Header(Kind.PIECE, 0, 0, 61), HEADER_SIZE + 61)
    for header in (Header(Kind.EAGER, 0, 0, 5), _rendezvous(3), Header(Kind.MEDIUM, 0, 0, 99)):
        with pytest.raises(ProtocolError, match="60 bytes still missing"):
            inbox.arrived(1, header, HEADER_SIZE + 5)
    inbox.revoke(3)  # control packets may come between
    assert inbox.filling is inbox.ready[0]


def test_closing_saves_what_arrived_whole_and_hands_back_the_buffers_held() -> None:
    inbox = _inbox()
    inbox.view[HEADER_SIZE : HEADER_SIZE + 5] = b"small"
    _queue(inbox, 0, Header(Kind.EAGER, 0, 0, 5), HEADER_SIZE + 5)
    _queue(inbox, 1, _rendezvous(4))
    _medium(inbox, 2, 100, 40)
    _queue(inbox, 3, Header(Kind.PIECE, 0, 0, 60), HEADER_SIZE + 60)
    _medium(inbox, 4, 100, 40)  # still missing 60 bytes
    held = inbox.close(True, True)
    assert sorted(held) == [0, 1, 2, 3, 4]
    assert [a.phase for a in inbox.ready] == [
        Phase.COPIED, Phase.ANNOUNCED, Phase.COPIED, Phase.IN_BUFFER,
    ]  # fmt: skip
    assert inbox.small_body(inbox.ready[0], None) == b"small"
    assert inbox.unread(0) == []
    assert inbox.close(True, True) == []  # once
    first = inbox.first()
    assert first is not None
    inbox.take()
    assert inbox.first() is None  # the large message is not readable any more


class _Side:
    """One side of a simulated channel: its credits and inbox, receive
    buffers posted and packets sent whose completions have not come."""

    def __init__(self, window: int, control_window: int) -> None:
        self.state = ChannelState(window, control_window)
        self.inbox = Inbox(memoryview(bytearray(SIZE)), SIZE, 1 << 20)
        self.posted = window + control_window
        self.unsettled: list[int] = []
        self.to_send = 0
        self.taken: list[int] = []

    def post(self, packet: tuple[int, Header] | None, wire: list[Header]) -> bool:
        if packet is None:
            return False
        slot, header = packet
        self.unsettled.append(slot)
        wire.append(header)
        return True

    def pump(self, wire: list[Header]) -> None:
        while self.post(self.state.update(), wire):
            pass

    def land(self, header: Header, size: int) -> None:
        """A packet lands in buffer 0 (only what it says is read)."""
        assert self.posted > 0, "a packet met an empty receive queue"
        self.posted -= 1
        _, repost = self.state.arrived(header)
        if not repost:
            self.inbox.arrived(0, header, size)
        self.posted += repost

    def give_back(self) -> None:
        """Repost what the inbox freed, as the wire does."""
        for _ in self.inbox.freed:
            assert self.state.emptied()
            self.posted += 1
        self.inbox.freed = []


@pytest.mark.parametrize("seed", range(20))
def test_two_sides_driven_by_the_events_exchange_everything_in_order(seed: int) -> None:
    """Both sides send 300 messages, each event at a random moment; no packet
    meets an empty receive queue, nothing stalls, order is kept."""
    rng = random.Random(seed)
    a, b = _Side(8, 4), _Side(6, 5)
    wires: dict[int, list[Header]] = {id(a): [], id(b): []}  # packets in flight to a side
    for side, peer in ((a, b), (b, a)):
        side.post(side.state.hello(1 << 20, 4), wires[id(peer)])
        side.to_send = 300
    for _ in range(100_000):
        moves = []
        for side, peer in ((a, b), (b, a)):
            if side.to_send:
                moves.append(("send", side, peer))
            if wires[id(side)]:
                moves.append(("land", side, peer))
            if side.inbox.ready:
                moves.append(("take", side, peer))
            if side.unsettled:
                moves.append(("settle", side, peer))
        if not moves:
            break
        move, side, peer = rng.choice(moves)
        wire = wires[id(peer)]
        if move == "send":
            sent = 300 - side.to_send
            if side.post(side.state.send(Kind.EAGER, sent, 8), wire):
                side.to_send -= 1
        elif move == "land":
            header = wires[id(side)].pop(0)
            side.land(header, HEADER_SIZE + header.length)
        elif move == "take":
            arrival, owed = side.inbox.take()
            assert owed == Owed.NOTHING
            side.give_back()
            side.taken.append(arrival.header.msg_id)
        else:
            side.state.sent(side.unsettled.pop(rng.randrange(len(side.unsettled))))
        side.pump(wire)
    assert a.taken == b.taken == list(range(300))
    for side in (a, b):
        assert side.posted == side.state.buffers  # every buffer went back
        assert len(side.state.free_slots) == side.state.send_slots


@pytest.mark.parametrize("seed", range(10))
def test_medium_messages_larger_than_the_window_flow_piece_by_piece(seed: int) -> None:
    """Messages of up to three windows of pieces: the receiver frees each
    buffer as it copies it, credits flow back, nothing stalls and no
    packet meets an empty receive queue."""
    rng = random.Random(seed)
    a, b = _Side(4, 4), _Side(4, 4)
    wires: dict[int, list[Header]] = {id(a): [], id(b): []}
    for side, peer in ((a, b), (b, a)):
        side.post(side.state.hello(1 << 20, 4), wires[id(peer)])
    messages = [rng.randrange(2, 13) for _ in range(20)]  # pieces per message
    to_send = [(i, n) for i, n in enumerate(messages)]
    sent_pieces = 0  # of the message a is sending
    received: list[int] = []
    target = memoryview(bytearray(13 * 10))
    filled = -1  # how far b's first queued message is copied out (-1: not begun)
    for _ in range(100_000):
        moves: list[tuple[str, _Side]] = []
        if to_send:
            moves.append(("send", a))
        for side in (a, b):
            if wires[id(side)]:
                moves.append(("land", side))
            if side.unsettled:
                moves.append(("settle", side))
        if b.inbox.ready:
            moves.append(("copy", b))
        if not moves:
            break
        move, side = rng.choice(moves)
        if move == "send":
            index, pieces = to_send[0]
            kind = Kind.MEDIUM if sent_pieces == 0 else Kind.PIECE
            length = pieces * 10 if kind == Kind.MEDIUM else 10
            if a.post(a.state.send(kind, index, length, None, 0), wires[id(b)]):
                sent_pieces += 1
                if sent_pieces == pieces:
                    to_send.pop(0)
                    sent_pieces = 0
        elif move == "copy":
            arrival = b.inbox.ready[0]
            if filled < 0:
                _, filled = b.inbox.begin_medium(arrival, target)
            else:
                filled = b.inbox.copy_pieces(arrival, target, filled)
            b.give_back()
            if filled == arrival.header.length:
                b.inbox.take()
                received.append(arrival.header.msg_id)
                filled = -1
        else:
            if move == "land":
                header = wires[id(side)].pop(0)
                carried = 10 if header.kind in (Kind.MEDIUM, Kind.PIECE) else 0
                size = HEADER_SIZE + (carried or header.length)
                if header.kind == Kind.HELLO:
                    size = HEADER_SIZE + header.head_length
                side.land(header, size)
            else:
                side.state.sent(side.unsettled.pop(rng.randrange(len(side.unsettled))))
        for side, peer in ((a, b), (b, a)):
            side.pump(wires[id(peer)])
    assert received == list(range(len(messages)))
    assert b.posted == b.state.buffers
