"""A message channel's protocol state (no device): arrivals, revocations, credits."""

from __future__ import annotations

import random

import pytest

from aiordma.channel.state import ChannelState
from aiordma.channel.wire import HEADER_SIZE, LAST_CREDIT, Header, Hello, Kind
from aiordma.exceptions import ProtocolError, ProtocolMismatchError
from aiordma.verbs.memory import RemoteBuffer


def _fresh() -> ChannelState:
    return ChannelState(window=8, control_window=4)


def _state() -> ChannelState:
    """A side that said HELLO and heard the peer's (same windows)."""
    state = _fresh()
    slot, _ = _sent(state.hello(1 << 20, 4))
    state.sent(slot)
    _control(state, Header(Kind.HELLO, 8, 4 << 32 | 8, 1 << 20, control_credits=1))
    return state


def _sent(packet: tuple[int, Header] | None) -> tuple[int, Header]:
    assert packet is not None, "the packet could not go"
    return packet


def _control(state: ChannelState, header: Header) -> int:
    """A control packet arrives: the id of the exposure it ended (0: none)."""
    ended, offer, repost = state.arrived(0, header, HEADER_SIZE)
    assert (offer, repost) == (False, True)
    return ended


def _queue(state: ChannelState, slot: int, header: Header, size: int = 40) -> bool:
    """A message arrives; whether it may be offered to a delivery hook."""
    ended, offer, repost = state.arrived(slot, header, size)
    assert (ended, repost) == (0, False)
    return offer


def _rendezvous(msg_id: int, length: int = 100) -> Header:
    return Header(Kind.RENDEZVOUS, 0, msg_id, length, RemoteBuffer(0x1000, length, 7))


def test_done_reports_the_message_it_names_and_done_for_zero_is_refused() -> None:
    """Whether the id was exposed is the ledger's to say (tests/channel/test_ledger.py)."""
    state = _state()
    assert _control(state, Header(Kind.DONE, 0, 42)) == 42
    with pytest.raises(ProtocolError, match="message 0"):
        _control(state, Header(Kind.DONE, 0, 0))


def test_a_revoke_of_a_message_not_being_read_is_answered_at_once() -> None:
    state = _state()
    assert not _queue(state, 0, _rendezvous(5))  # a large message is never offered
    assert not _queue(state, 1, _rendezvous(6))
    _control(state, Header(Kind.REVOKE, 0, 5))
    assert state.acks_due == [5]
    _control(state, Header(Kind.REVOKE, 0, 99))  # already taken: its DONE crossed the REVOKE
    assert state.acks_due == [5]
    arrival, done_due = state.take()
    assert (arrival.header.msg_id, arrival.revoked, done_due) == (5, True, False)
    arrival, done_due = state.take()
    assert (arrival.header.msg_id, arrival.revoked, done_due) == (6, False, True)


def test_a_revoke_during_a_read_is_answered_when_the_read_ends() -> None:
    state = _state()
    _queue(state, 0, _rendezvous(5))
    _queue(state, 1, _rendezvous(6))
    state.ready[0].reading = True
    _control(state, Header(Kind.REVOKE, 0, 5))
    assert state.acks_due == []  # its bytes are being read: no answer yet
    arrival, done_due = state.take()  # the read finished: its DONE answers
    assert (arrival.revoked, done_due) == (True, True)
    state.ready[0].reading = True
    _control(state, Header(Kind.REVOKE, 0, 6))
    state.read_stopped(state.ready[0])  # the read was cancelled
    assert state.acks_due == [6]
    arrival, done_due = state.take()
    assert (arrival.revoked, done_due) == (True, False)


def test_a_message_read_ahead_owes_its_done_when_it_lands_and_none_when_taken() -> None:
    state = _state()
    _queue(state, 0, _rendezvous(5, 1000))
    _queue(state, 1, Header(Kind.EAGER, 0, 0, 10), 50)
    _queue(state, 2, _rendezvous(6, 100))
    _queue(state, 3, _rendezvous(7, 1000))
    _queue(state, 4, _rendezvous(8, 1000))
    assert [a.header.msg_id for a in state.unread(100)] == [5, 7, 8]  # 6 is too small
    state.ready[0].reading = True  # 5: its receive reads it
    state.ready[3].reading = True  # 7: read ahead
    _control(state, Header(Kind.REVOKE, 0, 8))
    assert [a.header.msg_id for a in state.unread(0)] == [6]  # 8 was withdrawn
    assert state.acks_due == [8]
    _control(state, Header(Kind.REVOKE, 0, 7))
    assert state.acks_due == [8]  # 7 is being read: answered when it lands
    seventh = state.ready[3]
    assert state.read_ended(seventh)  # landed: its DONE is due now, once
    assert (seventh.reading, seventh.revoked) == (False, True)
    assert not state.read_ended(seventh)
    _queue(state, 5, _rendezvous(9, 1000))
    ninth = state.ready[5]
    ninth.reading = True  # 9: read ahead, landed, then a REVOKE that crossed its DONE
    assert state.read_ended(ninth)
    _control(state, Header(Kind.REVOKE, 0, 9))
    assert ninth.revoked  # not to be delivered: its sender gave up on it
    assert state.acks_due == [8]  # the DONE that went answers it: no second one
    state.ready[0].reading = False  # 5: its receive was cancelled
    assert [a.header.msg_id for a in state.unread(0)] == [5, 6]  # 7 was read
    for expected in (5, 0, 6):
        arrival, _ = state.take()
        assert arrival.header.msg_id == expected
    arrival, done_due = state.take()
    assert (arrival.header.msg_id, done_due) == (7, False)  # its DONE went when it landed


def test_eager_messages_need_no_done_and_the_first_in_line_is_offered() -> None:
    state = _state()
    assert _queue(state, 3, Header(Kind.EAGER, 0, 0, 10), 50)
    assert not _queue(state, 4, Header(Kind.EAGER, 0, 0, 10), 50)  # one is ahead of it
    arrival, done_due = state.take()
    assert (arrival.slot, arrival.size, done_due) == (3, 50, False)
    assert state.data.owed == 1  # its buffer is counted reposted


def test_hello_announces_the_peers_limit_windows_and_first_grants() -> None:
    state = _fresh()
    assert state.peer_max_message is None
    assert (state.data.available, state.control.available) == (0, 4)
    _control(state, Header(Kind.HELLO, 16, 6 << 32 | 16, 1 << 20, control_credits=2))
    assert state.peer_max_message == 1 << 20
    assert (state.data.limit, state.control.limit) == (16, 6)
    assert (state.data.available, state.control.available) == (16, 6)
    with pytest.raises(ProtocolError, match="second HELLO"):
        _control(state, Header(Kind.HELLO, 0, 6 << 32 | 16, 1 << 20))


def test_our_hello_carries_our_windows_and_grants_them() -> None:
    state = _fresh()
    slot, hello = _sent(state.hello(4096, 12))
    assert (hello.kind, hello.length, hello.msg_id) == (Kind.HELLO, 4096, 4 << 32 | 8)
    assert hello.head_length == 12  # its body: the buffer size and protocol
    assert (hello.credits, hello.control_credits) == (8, 0)
    assert state.said_hello
    assert (state.data.owed, state.control.available) == (0, 3)
    assert slot not in state.free_slots
    state.sent(slot)
    assert slot in state.free_slots


def test_nothing_goes_before_our_hello() -> None:
    state = _fresh()
    _control(state, Header(Kind.HELLO, 8, 4 << 32 | 8, 100))  # the peer's came first
    for kind in (Kind.EAGER, Kind.RENDEZVOUS, Kind.DONE, Kind.CREDIT, Kind.CONTROL_CREDIT):
        assert state.send(kind) is None
    assert state.update() is None
    _sent(state.hello(100, 4))
    assert state.send(Kind.EAGER) is not None


def test_packets_carry_the_credits_owed_and_spend_theirs() -> None:
    state = _state()
    for slot in range(3):
        _queue(state, slot, Header(Kind.EAGER, 0, 0, 5))
        state.take()
    _control(state, Header(Kind.DONE, 0, 1))
    _, eager = _sent(state.send(Kind.EAGER, 0, 5, None, head_length=2))
    # 3 data buffers; 2 control ones (the peer's HELLO and the DONE)
    assert (eager.kind, eager.length, eager.head_length) == (Kind.EAGER, 5, 2)
    assert (eager.credits, eager.control_credits, eager.flags) == (3, 2, 0)
    assert (state.data.owed, state.control.owed, state.data.available) == (0, 0, 7)


def test_the_last_data_credit_is_flagged() -> None:
    state = _state()
    for _ in range(7):
        _sent(state.send(Kind.EAGER))
    _, last = _sent(state.send(Kind.EAGER))
    assert last.flags == LAST_CREDIT
    assert state.send(Kind.EAGER) is None  # no credit left: nothing changes
    assert state.data.available == 0


def test_a_credit_update_falls_due_after_half_a_window() -> None:
    state = _state()
    _sent(state.send(Kind.EAGER))  # carries the HELLO's control credit back
    for slot in range(3):
        _queue(state, slot, Header(Kind.EAGER, 0, 0, 5))
        state.take()
    assert not state.update_due()
    assert state.update() is None
    _queue(state, 3, Header(Kind.EAGER, 0, 0, 5))
    state.take()
    assert state.update_due()
    _, update = _sent(state.update())
    assert (update.kind, update.credits) == (Kind.CREDIT, 4)
    assert not state.update_due()
    assert state.update() is None


def test_no_update_is_due_before_our_hello() -> None:
    state = _fresh()
    state.data.owed = state.data.window  # as if every data buffer came back
    assert state.data.should_send_update()
    assert not state.update_due()  # the HELLO carries the first grants
    _, hello = _sent(state.hello(1 << 20, 4))
    assert hello.credits == state.data.window
    assert not state.update_due()


def test_control_credits_go_back_once_half_the_control_window_is_owed() -> None:
    state = _state()  # the peer's HELLO left one control buffer owed
    assert state.update() is None
    _control(state, Header(Kind.CONTROL_CREDIT, 0))  # owed 2 of 4, not because of data
    assert state.update() is None
    _control(state, Header(Kind.DONE, 0, 1))
    _, update = _sent(state.update())
    assert (update.kind, update.control_credits) == (Kind.CONTROL_CREDIT, 3)


def test_nothing_goes_without_a_free_send_slot() -> None:
    state = _state()
    taken = state.free_slots[:]
    state.free_slots.clear()
    assert all(state.send(kind) is None for kind in Kind if kind != Kind.HELLO)
    state.sent(taken[0])
    slot, _ = _sent(state.send(Kind.EAGER))
    assert slot == taken[0]


def test_the_last_control_credit_is_kept_for_an_update() -> None:
    state = _state()
    for _ in range(3):
        _sent(state.send(Kind.DONE, 1))
    assert state.control.available == 1
    assert state.send(Kind.REVOKE, 2) is None
    for slot in range(4):  # half a data window consumed: an update is due
        _queue(state, slot, Header(Kind.EAGER, 0, 0, 5))
        state.take()
    assert state.send(Kind.CREDIT) is None  # an update for data costs a data-grade credit
    assert state.update() is None
    _control(state, Header(Kind.CREDIT, 0))
    assert state.update() is None
    _control(state, Header(Kind.CREDIT, 0))  # half the control window owed
    _, update = _sent(state.update())  # the control window's own update may take the last
    assert (update.kind, update.credits, update.control_credits) == (Kind.CONTROL_CREDIT, 4, 2)
    assert state.control.available == 0


def test_impossible_credit_grants_are_refused() -> None:
    state = _state()
    with pytest.raises(ValueError, match="granted"):
        _control(state, Header(Kind.CREDIT, 1))  # nothing was spent


def test_after_a_failure_taken_buffers_are_not_counted_back() -> None:
    state = _state()
    _queue(state, 0, Header(Kind.EAGER, 0, 0, 5))
    state.fail()
    state.take()
    assert state.data.owed == 0


def test_peers_naming_different_protocols_are_refused_and_plain_takes_any() -> None:
    with pytest.raises(ProtocolMismatchError) as info:
        Hello(4096, "aiordma.streams").check_protocol("aiordma.rpc", "192.0.2.1:7")
    assert (info.value.ours, info.value.theirs) == ("aiordma.rpc", "aiordma.streams")
    assert "192.0.2.1:7 speaks 'aiordma.streams'" in str(info.value)
    assert "this side 'aiordma.rpc'" in str(info.value)
    Hello(4096, "aiordma.streams").check_protocol("", "the peer")
    Hello(256, "").check_protocol("aiordma.rpc", "the peer")


class _Side:
    """One side of a simulated channel: its state, receive buffers posted
    and packets sent whose completions have not come."""

    def __init__(self, window: int, control_window: int) -> None:
        self.state = ChannelState(window, control_window)
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

    def land(self, header: Header) -> None:
        assert self.posted > 0, "a packet met an empty receive queue"
        self.posted -= 1
        _, _, repost = self.state.arrived(0, header, HEADER_SIZE + header.length)
        self.posted += repost


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
            if side.state.ready:
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
            side.land(wires[id(side)].pop(0))
        elif move == "take":
            arrival, done_due = side.state.take()
            assert not done_due
            side.posted += 1
            side.taken.append(arrival.header.msg_id)
        else:
            side.state.sent(side.unsettled.pop(rng.randrange(len(side.unsettled))))
        side.pump(wire)
    assert a.taken == b.taken == list(range(300))
    for side in (a, b):
        assert side.posted == side.state.buffers  # every buffer went back
        assert len(side.state.free_slots) == side.state.send_slots


def _medium(state: ChannelState, slot: int, length: int, first: int, head: int = 0) -> None:
    """The first packet of a medium message of ``length`` body bytes lands,
    carrying ``head`` head bytes and ``first`` body bytes."""
    header = Header(Kind.MEDIUM, 0, 0, length, head_length=head)
    assert not _queue(state, slot, header, HEADER_SIZE + head + first)  # never offered


def test_a_medium_message_collects_its_pieces_until_whole() -> None:
    state = _state()
    _medium(state, 3, 100, 40, head=5)
    arrival = state.ready[0]
    assert arrival.pieces is not None
    assert (arrival.slot, arrival.missing, list(arrival.pieces)) == (3, 60, [])
    assert state.filling is arrival
    assert not _queue(state, 5, Header(Kind.PIECE, 0, 0, 50), HEADER_SIZE + 50)
    assert not _queue(state, 1, Header(Kind.PIECE, 0, 0, 10), HEADER_SIZE + 10)
    assert (arrival.missing, list(arrival.pieces)) == (0, [(5, 50), (1, 10)])
    assert state.filling is None
    # The receiver gives each buffer back as it copies it out, before the message is whole.
    assert state.piece_taken()
    assert state.piece_taken()
    assert state.data.owed == 2
    arrival.slot = -1  # the first buffer went back already
    taken, done_due = state.take()
    assert taken is arrival
    assert not done_due
    assert state.data.owed == 2  # take() counted nothing twice
    assert not state.ready
    assert _queue(state, 2, Header(Kind.EAGER, 0, 0, 5))  # the next message is offered as usual


def test_pieces_out_of_place_are_protocol_errors() -> None:
    state = _state()
    with pytest.raises(ProtocolError, match="no medium message"):
        _queue(state, 0, Header(Kind.PIECE, 0, 0, 10), HEADER_SIZE + 10)
    state = _state()
    _medium(state, 0, 100, 40)
    with pytest.raises(ProtocolError, match="of 61 bytes where 60 are missing"):
        _queue(state, 1, Header(Kind.PIECE, 0, 0, 61), HEADER_SIZE + 61)
    for header in (Header(Kind.EAGER, 0, 0, 5), _rendezvous(3), Header(Kind.MEDIUM, 0, 0, 99)):
        with pytest.raises(ProtocolError, match="60 bytes still missing"):
            state.arrived(1, header, HEADER_SIZE + 5)
    assert _control(state, Header(Kind.CREDIT, 0)) == 0  # control packets may go between


def test_after_a_failure_pieces_are_not_counted_back() -> None:
    state = _state()
    _medium(state, 0, 100, 40)
    state.fail()
    assert not state.piece_taken()
    assert state.data.owed == 0


def test_medium_packets_spend_data_credits_and_the_last_says_so() -> None:
    state = _state()
    kinds = [Kind.MEDIUM] + [Kind.PIECE] * 7
    headers = [_sent(state.send(kind, 0, 10, None, 0))[1] for kind in kinds]
    assert [h.flags for h in headers] == [0] * 7 + [LAST_CREDIT]
    assert state.send(Kind.PIECE, 0, 10) is None  # out of data credit
    assert state.data.available == 0
    assert state.control.available == 4


@pytest.mark.parametrize("seed", range(10))
def test_medium_messages_larger_than_the_window_flow_piece_by_piece(seed: int) -> None:
    """Messages of up to three windows of pieces: the receiver gives each
    buffer back as it copies it, credits flow back, nothing stalls and no
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
    copied = 0  # pieces of b's first queued message copied out
    for _ in range(100_000):
        moves: list[tuple[str, _Side]] = []
        if to_send:
            moves.append(("send", a))
        for side in (a, b):
            if wires[id(side)]:
                moves.append(("land", side))
            if side.unsettled:
                moves.append(("settle", side))
        if b.state.ready:
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
            arrival = b.state.ready[0]
            assert arrival.pieces is not None
            if copied == 0:
                assert b.state.piece_taken()
                b.posted += 1
                copied = 1
            elif arrival.pieces:
                arrival.pieces.popleft()
                assert b.state.piece_taken()
                b.posted += 1
                copied += 1
            if copied == messages[arrival.header.msg_id]:
                arrival.slot = -1
                b.state.take()
                received.append(arrival.header.msg_id)
                copied = 0
        else:
            if move == "land":
                header = wires[id(side)].pop(0)
                assert side.posted > 0, "a packet met an empty receive queue"
                side.posted -= 1
                carried = 10 if header.kind in (Kind.MEDIUM, Kind.PIECE) else 0
                size = HEADER_SIZE + (carried or header.length)
                if header.kind == Kind.HELLO:
                    size = HEADER_SIZE + header.head_length
                _, _, repost = side.state.arrived(0, header, size)
                side.posted += repost
            else:
                side.state.sent(side.unsettled.pop(rng.randrange(len(side.unsettled))))
        for side, peer in ((a, b), (b, a)):
            side.pump(wires[id(peer)])
    assert received == list(range(len(messages)))
    assert b.posted == b.state.buffers
