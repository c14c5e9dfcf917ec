"""Transfer agents' messages and metadata (no device)."""

from __future__ import annotations

import pytest

from aiordma.exceptions import ProtocolError
from aiordma.transfer import wire
from aiordma.transfer.wire import Identity


@pytest.mark.parametrize("identity", [Identity(1), Identity(2**64 - 1, "192.0.2.1", 7471),
                                      Identity(5, "2001:db8::1", 1)])  # fmt: skip
def test_identities_round_trip_as_metadata_and_hello(identity: Identity) -> None:
    assert Identity.from_bytes(identity.to_bytes()) == identity
    assert wire.parse(wire.hello(identity)) == identity


def test_notes_carry_their_bytes() -> None:
    assert wire.parse(wire.note(b"layer 3 done")) == b"layer 3 done"
    assert wire.parse(wire.note(b"")) == b""


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"Z", "unknown transfer agent message kind"),
        (b"H" + b"AXA1", "at least"),
        (b"H" + Identity(1, "h").to_bytes()[:-1], "bytes, got"),
        (b"H" + b"NOPE" + Identity(1).to_bytes()[4:], "wrong magic"),
    ],
)
def test_bad_messages_are_protocol_errors(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        wire.parse(data)
