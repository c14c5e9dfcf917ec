"""The bytes one side holds exposed (no device): ids, DONE, revocations, failure."""

from __future__ import annotations

import pytest

from aiordma.channel.ledger import Ledger
from aiordma.exceptions import ProtocolError


def test_done_ends_the_exposure_it_names_and_frees_its_bytes() -> None:
    ledger = Ledger(max_exposed=300)
    first, second = ledger.expose(200), ledger.expose(100)
    assert ledger.exposed_bytes == 300
    assert not ledger.room_for(1)
    ledger.done(first)
    assert ledger.exposed_bytes == 100
    assert ledger.room_for(200)
    assert not ledger.room_for(201)
    assert list(ledger.exposed) == [second]


def test_done_for_a_message_never_exposed_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not exposed"):
        Ledger(1000).done(42)


def test_a_revoked_message_stays_counted_until_the_peer_answers() -> None:
    """The peer may be reading a message when its sender revokes it: the
    exposure ends at the DONE that answers the REVOKE (or crossed it)."""
    ledger = Ledger(1000)
    msg_id = ledger.expose(50)
    assert ledger.revoke(msg_id)
    assert ledger.exposed_bytes == 50
    assert not ledger.revoke(msg_id)  # revoked already
    ledger.done(msg_id)
    assert ledger.exposed_bytes == 0
    with pytest.raises(ProtocolError):  # a second DONE is not accepted
        ledger.done(msg_id)


def test_an_unanswered_revoke_is_forgotten_once() -> None:
    ledger = Ledger(1000)
    msg_id = ledger.expose(50)
    ledger.revoke(msg_id)
    assert ledger.forget_revoked(msg_id)
    assert ledger.exposed_bytes == 0
    assert not ledger.forget_revoked(msg_id)
    with pytest.raises(ProtocolError):
        ledger.done(msg_id)
    other = ledger.expose(20)
    ledger.revoke(other)
    assert ledger.clear() == [other]
    assert ledger.exposed_bytes == 0


def test_withdrawn_send_stops_counting_without_awaiting_a_done() -> None:
    ledger = Ledger(1000)
    msg_id = ledger.expose(70)
    assert ledger.withdraw(msg_id)
    assert ledger.exposed_bytes == 0
    assert not ledger.withdraw(msg_id)
    with pytest.raises(ProtocolError):
        ledger.done(msg_id)


def test_clearing_exposures_on_failure_returns_every_id() -> None:
    ledger = Ledger(1000)
    ids = [ledger.expose(10) for _ in range(3)]
    assert sorted(ledger.clear()) == ids
    assert ledger.exposed_bytes == 0
    assert ledger.exposed == {}
