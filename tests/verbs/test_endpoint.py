"""Endpoint and GID text forms (pure logic)."""

from __future__ import annotations

import pytest

from aiordma import Endpoint


def test_endpoint_round_trips() -> None:
    ep = Endpoint(qp_num=0x11, psn=0xABCDEF, gid=bytes(range(16)), lid=7)
    assert Endpoint.from_bytes(ep.to_bytes()) == ep
    with pytest.raises(ValueError, match="Endpoint"):
        Endpoint.from_bytes(b"short")
