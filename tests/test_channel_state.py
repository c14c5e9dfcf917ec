"""A message channel's protocol state (no device): arrivals, exposures, credits."""

from __future__ import annotations

import pytest

from aiordma.channel_state import ChannelState, Cost
from aiordma.exceptions import ProtocolError
from aiordma.memory import RemoteBuffer
from aiordma.wire import Header, Kind


def _state(max_exposed: int = 1000) -> ChannelState:
    return ChannelState(window=8, control_window=4, max_exposed=max_exposed)


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


def test_a_done_crossing_a_revoke_is_accepted_once() -> None:
    state = _state()
    msg_id = state.expose(50)
    assert state.revoke(msg_id)
    assert state.exposed_bytes == 0
    assert not state.revoke(msg_id)  # already ended
    assert state.received(Header(Kind.DONE, 0, msg_id)) is None
    with pytest.raises(ProtocolError):  # a second DONE is not
        state.received(Header(Kind.DONE, 0, msg_id))


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


def test_revoke_marks_the_queued_message_and_no_done_is_due_for_it() -> None:
    state = _state()
    state.queue(0, _rendezvous(5), 40)
    state.queue(1, _rendezvous(6), 40)
    assert state.is_message(_rendezvous(5))
    state.received(Header(Kind.REVOKE, 0, 5))
    arrival, done_due = state.consumed()
    assert (arrival.header.msg_id, arrival.revoked, done_due) == (5, True, False)
    arrival, done_due = state.consumed()
    assert (arrival.header.msg_id, arrival.revoked, done_due) == (6, False, True)


def test_eager_messages_need_no_done() -> None:
    state = _state()
    state.queue(3, Header(Kind.EAGER, 0, 0, 10), 50)
    arrival, done_due = state.consumed()
    assert (arrival.slot, done_due) == (3, False)


def test_hello_announces_the_peers_limit() -> None:
    state = _state()
    assert state.peer_max_message is None
    state.received(Header(Kind.HELLO, 0, 0, 1 << 20))
    assert state.peer_max_message == 1 << 20
    assert not state.is_message(Header(Kind.HELLO, 0))


def test_packets_carry_the_credits_owed_and_spend_theirs() -> None:
    state = _state()
    for _ in range(3):
        state.reposted(Header(Kind.EAGER, 0))
    state.reposted(Header(Kind.DONE, 0))
    stamped = state.stamp(Header(Kind.EAGER, 0, 0, 5), head_length=2)
    assert (stamped.credits, stamped.control_credits, stamped.head_length) == (3, 1, 2)
    assert state.data.owed == 3  # stamping alone changes nothing
    state.posted(Cost.DATA)
    assert (state.data.owed, state.control.owed, state.data.available) == (0, 0, 7)


def test_a_credit_update_falls_due_after_half_a_window() -> None:
    state = _state()
    for _ in range(3):
        state.reposted(Header(Kind.EAGER, 0))
    assert state.update_due() is None
    state.reposted(Header(Kind.EAGER, 0))
    assert state.update_due() == (Kind.CREDIT, Cost.CONTROL)
    state.posted(Cost.CONTROL)
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
