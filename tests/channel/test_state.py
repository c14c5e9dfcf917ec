"""A message channel's protocol state (no device): arrivals, exposures, credits."""

from __future__ import annotations

import pytest

from aiordma.channel.state import ChannelState, Cost
from aiordma.channel.wire import Header, Hello, Kind
from aiordma.exceptions import ProtocolError, ProtocolMismatchError
from aiordma.verbs.memory import RemoteBuffer


def _fresh(max_exposed: int = 1000) -> ChannelState:
    return ChannelState(window=8, control_window=4, max_exposed=max_exposed)


def _state(max_exposed: int = 1000) -> ChannelState:
    """A side that said HELLO and heard the peer's (same windows)."""
    state = _fresh(max_exposed)
    state.posted(Cost.CONTROL_UPDATE, Kind.HELLO)
    state.control.granted(1)  # as if the peer returned the HELLO's credit at once
    state.received(Header(Kind.HELLO, 8, 4 << 32 | 8, 1 << 20))
    return state


def _rendezvous(msg_id: int, length: int = 100) -> Header:
    return Header(Kind.RENDEZVOUS, 0, msg_id, length, RemoteBuffer(0x1000, length, 7))


def test_done_ends_the_exposure_it_names_and_frees_its_bytes() -> None:
    state = _state(max_exposed=300)
    first, second = state.expose(200), state.expose(100)
    assert state.exposed_bytes == 300
    assert not state.room_for(1)
    assert state.received(Header(Kind.DONE, 0, first)) == first
    assert state.exposed_bytes == 100
    assert state.room_for(200)
    assert not state.room_for(201)
    assert list(state.exposed) == [second]


def test_done_for_a_message_never_exposed_is_a_protocol_error() -> None:
    state = _state()
    with pytest.raises(ProtocolError, match="not exposed"):
        state.received(Header(Kind.DONE, 0, 42))


def test_a_revoked_message_stays_counted_until_the_peer_answers() -> None:
    """The peer may be reading a message when its sender revokes it: the
    exposure ends at the DONE that answers the REVOKE (or crossed it)."""
    state = _state()
    msg_id = state.expose(50)
    assert state.revoke(msg_id)
    assert state.exposed_bytes == 50
    assert not state.revoke(msg_id)  # revoked already
    assert state.received(Header(Kind.DONE, 0, msg_id)) == msg_id
    assert state.exposed_bytes == 0
    with pytest.raises(ProtocolError):  # a second DONE is not accepted
        state.received(Header(Kind.DONE, 0, msg_id))


def test_an_unanswered_revoke_is_forgotten_once() -> None:
    state = _state()
    msg_id = state.expose(50)
    state.revoke(msg_id)
    assert state.forget_revoked(msg_id)
    assert state.exposed_bytes == 0
    assert not state.forget_revoked(msg_id)
    with pytest.raises(ProtocolError):
        state.received(Header(Kind.DONE, 0, msg_id))
    other = state.expose(20)
    state.revoke(other)
    assert state.clear_exposures() == [other]
    assert state.exposed_bytes == 0


def test_withdrawn_send_stops_counting_without_awaiting_a_done() -> None:
    state = _state()
    msg_id = state.expose(70)
    assert state.withdraw(msg_id)
    assert state.exposed_bytes == 0
    assert not state.withdraw(msg_id)
    with pytest.raises(ProtocolError):
        state.received(Header(Kind.DONE, 0, msg_id))


def test_clearing_exposures_on_failure_returns_every_id() -> None:
    state = _state()
    ids = [state.expose(10) for _ in range(3)]
    assert sorted(state.clear_exposures()) == ids
    assert state.exposed_bytes == 0
    assert state.exposed == {}


def test_a_revoke_of_a_message_not_being_read_is_answered_at_once() -> None:
    state = _state()
    state.queue(0, _rendezvous(5), 40)
    state.queue(1, _rendezvous(6), 40)
    assert state.is_message(_rendezvous(5))
    state.received(Header(Kind.REVOKE, 0, 5))
    assert state.acks_due == [5]
    state.received(Header(Kind.REVOKE, 0, 99))  # already taken: its DONE crossed the REVOKE
    assert state.acks_due == [5]
    arrival, done_due = state.consumed()
    assert (arrival.header.msg_id, arrival.revoked, done_due) == (5, True, False)
    arrival, done_due = state.consumed()
    assert (arrival.header.msg_id, arrival.revoked, done_due) == (6, False, True)


def test_a_revoke_during_a_read_is_answered_when_the_read_ends() -> None:
    state = _state()
    state.queue(0, _rendezvous(5), 40)
    state.queue(1, _rendezvous(6), 40)
    state.ready[0].reading = True
    state.received(Header(Kind.REVOKE, 0, 5))
    assert state.acks_due == []  # its bytes are being read: no answer yet
    arrival, done_due = state.consumed()  # the read finished: its DONE answers
    assert (arrival.revoked, done_due) == (True, True)
    state.ready[0].reading = True
    state.received(Header(Kind.REVOKE, 0, 6))
    state.read_stopped(state.ready[0])  # the read was cancelled
    assert state.acks_due == [6]
    arrival, done_due = state.consumed()
    assert (arrival.revoked, done_due) == (True, False)


def test_eager_messages_need_no_done() -> None:
    state = _state()
    state.queue(3, Header(Kind.EAGER, 0, 0, 10), 50)
    arrival, done_due = state.consumed()
    assert (arrival.slot, done_due) == (3, False)


def test_hello_announces_the_peers_limit_windows_and_first_grants() -> None:
    state = _fresh()
    assert state.peer_max_message is None
    assert (state.data.available, state.control.available) == (0, 4)
    state.received(Header(Kind.HELLO, 16, 6 << 32 | 16, 1 << 20, control_credits=2))
    assert state.peer_max_message == 1 << 20
    assert (state.data.limit, state.control.limit) == (16, 6)
    assert (state.data.available, state.control.available) == (16, 6)
    assert not state.is_message(Header(Kind.HELLO, 0))
    with pytest.raises(ProtocolError, match="second HELLO"):
        state.received(Header(Kind.HELLO, 0, 6 << 32 | 16, 1 << 20))


def test_our_hello_carries_our_windows_and_grants_them() -> None:
    state = _fresh()
    hello = state.stamp(state.hello(4096), 0)
    assert (hello.kind, hello.length, hello.msg_id) == (Kind.HELLO, 4096, 4 << 32 | 8)
    assert (hello.credits, hello.control_credits) == (8, 0)
    state.reposted(Header(Kind.EAGER, 0))  # cannot happen before HELLO, but no update may go
    assert state.update_due() is None
    state.posted(Cost.CONTROL, Kind.HELLO)
    assert state.said_hello
    assert state.data.owed == 0


def test_grants_beyond_the_announced_windows_are_refused() -> None:
    state = _fresh()
    with pytest.raises(ValueError, match="granted 1 data credits"):
        state.received(Header(Kind.CREDIT, 1))  # before any HELLO: no window known
    with pytest.raises(ValueError, match="granted 9 data credits"):
        _fresh().received(Header(Kind.HELLO, 9, 4 << 32 | 8, 100))


def test_packets_carry_the_credits_owed_and_spend_theirs() -> None:
    state = _state()
    for _ in range(3):
        state.reposted(Header(Kind.EAGER, 0))
    state.reposted(Header(Kind.DONE, 0))
    stamped = state.stamp(Header(Kind.EAGER, 0, 0, 5), head_length=2)
    assert (stamped.credits, stamped.control_credits, stamped.head_length) == (3, 1, 2)
    assert state.data.owed == 3  # stamping alone changes nothing
    state.posted(Cost.DATA, Kind.EAGER)
    assert (state.data.owed, state.control.owed, state.data.available) == (0, 0, 7)


def test_a_credit_update_falls_due_after_half_a_window() -> None:
    state = _state()
    for _ in range(3):
        state.reposted(Header(Kind.EAGER, 0))
    assert state.update_due() is None
    state.reposted(Header(Kind.EAGER, 0))
    assert state.update_due() == (Kind.CREDIT, Cost.CONTROL)
    state.posted(Cost.CONTROL, Kind.CREDIT)
    assert state.update_due() is None


def test_nothing_is_affordable_without_a_free_send_slot() -> None:
    state = _state()
    assert state.affordable(Cost.DATA)
    state.free_slots.clear()
    assert not any(state.affordable(cost) for cost in Cost)


def test_impossible_credit_grants_are_refused() -> None:
    state = _state()
    with pytest.raises(ValueError, match="granted"):
        state.received(Header(Kind.CREDIT, 1))  # nothing was spent


def test_nothing_goes_before_our_hello() -> None:
    state = _fresh()
    assert not any(state.affordable(cost) for cost in Cost)
    state.posted(Cost.CONTROL, Kind.HELLO)
    assert state.affordable(Cost.CONTROL)


def test_peers_naming_different_protocols_are_refused_and_plain_takes_any() -> None:
    state = _fresh()
    with pytest.raises(ProtocolMismatchError) as info:
        state.heard(Hello(4096, "aiordma.streams"), "aiordma.rpc", "192.0.2.1:7")
    assert (info.value.ours, info.value.theirs) == ("aiordma.rpc", "aiordma.streams")
    assert "192.0.2.1:7 speaks 'aiordma.streams'" in str(info.value)
    assert "this side 'aiordma.rpc'" in str(info.value)
    assert state.peer_buffer_size is None
    state.heard(Hello(4096, "aiordma.streams"), "", "the peer")
    assert state.peer_buffer_size == 4096
    _fresh().heard(Hello(256, ""), "aiordma.rpc", "the peer")
