"""Fixtures the channel tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Lab, start_peer_server


@pytest.fixture(scope="module")
def checksum_server(lab: Lab) -> Iterator[int]:
    """The port of a peer process that answers each message with its checksum."""
    yield from start_peer_server(lab, "checksums")
