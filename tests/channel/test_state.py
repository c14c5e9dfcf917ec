"""A message channel's protocol state (no device): credits, send slots, HELLOs.

The queued messages are the inbox's (tests/channel/test_inbox.py).
"""

from __future__ import annotations

import pytest

from aiordma.channel.state import ChannelState
from aiordma.channel.wire import LAST_CREDIT, Header, Hello, Kind
from aiordma.exceptions import ProtocolError, ProtocolMismatchError


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
    ended, repost = state.arrived(header)
    assert repost
    return ended


def _taken(state: ChannelState) -> None:
    """A small message arrives and is taken: its buffer is counted reposted."""
    assert state.arrived(Header(Kind.EAGER, 0, 0, 5)) == (0, False)
    assert state.emptied()


def test_done_reports_the_message_it_names_and_done_for_zero_is_refused() -> None:
    """Whether the id was exposed is the ledger's to say (tests/channel/test_ledger.py)."""
    state = _state()
    assert _control(state, Header(Kind.DONE, 0, 42)) == 42
    with pytest.raises(ProtocolError, match="message 0"):
        _control(state, Header(Kind.DONE, 0, 0))


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
    for _ in range(3):
        _taken(state)
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
    for _ in range(3):
        _taken(state)
    assert not state.update_due()
    assert state.update() is None
    _taken(state)
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
    for _ in range(4):  # half a data window consumed: an update is due
        _taken(state)
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


def test_after_a_failure_emptied_buffers_are_not_counted_back() -> None:
    state = _state()
    assert state.arrived(Header(Kind.EAGER, 0, 0, 5)) == (0, False)
    state.fail()
    assert not state.emptied()
    assert state.data.owed == 0


def test_peers_naming_different_protocols_are_refused_and_plain_takes_any() -> None:
    with pytest.raises(ProtocolMismatchError) as info:
        Hello(4096, "aiordma.streams").check_protocol("aiordma.rpc", "192.0.2.1:7")
    assert (info.value.ours, info.value.theirs) == ("aiordma.rpc", "aiordma.streams")
    assert "192.0.2.1:7 speaks 'aiordma.streams'" in str(info.value)
    assert "this side 'aiordma.rpc'" in str(info.value)
    Hello(4096, "aiordma.streams").check_protocol("", "the peer")
    Hello(256, "").check_protocol("aiordma.rpc", "the peer")


def test_medium_packets_spend_data_credits_and_the_last_says_so() -> None:
    state = _state()
    kinds = [Kind.MEDIUM] + [Kind.PIECE] * 7
    headers = [_sent(state.send(kind, 0, 10, None, 0))[1] for kind in kinds]
    assert [h.flags for h in headers] == [0] * 7 + [LAST_CREDIT]
    assert state.send(Kind.PIECE, 0, 10) is None  # out of data credit
    assert state.data.available == 0
    assert state.control.available == 4
